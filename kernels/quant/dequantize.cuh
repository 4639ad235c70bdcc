// Dequantize (not a ladder): out[r, c] = q[r, c] * scale, fp32 product rounded once to T, with
// scale = scales[r] (per token) or scales[0] (per tensor).
//
// Tiles of one row x (kDequantThreads x kN) columns, block b taking tiles b, b + gridDim.x, ...
// kVec: each thread loads 8 codes as one 8-byte word and writes 8 outputs as 16-byte vectors
// (cols a multiple of 8, q rows 8-byte aligned, out rows 16-byte aligned); else one element
// per thread. Purely bandwidth-bound: 1 byte in, 2-4 bytes out per element.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/quant/01_scalar.cuh"
#include "kernels/quant/params.h"

namespace flashlab::kernels {

inline constexpr int kDequantThreads = 256;
inline constexpr int kDequantVecCodes = 8;  // codes per thread per tile on the vector path

template <QuantFormat F>
__device__ __forceinline__ float decode_q(uint8_t b) {
  if constexpr (F == QuantFormat::kE4M3) {
    __nv_fp8_e4m3 v;
    v.__x = b;
    return static_cast<float>(v);
  } else {
    return static_cast<float>(static_cast<int8_t>(b));
  }
}

template <typename T, QuantFormat F, bool kVec>
__global__ void __launch_bounds__(kDequantThreads) dequantize_kernel(const __grid_constant__ DequantParams p) {
  constexpr int kPer = kVec ? kDequantVecCodes : 1;
  constexpr int64_t kTile = static_cast<int64_t>(kDequantThreads) * kPer;
  static_assert(!kVec || (kPer * sizeof(T)) % kVecBytes == 0, "8 outputs fill whole 16-byte vectors");
  const int64_t tiles_per_row = (p.cols + kTile - 1) / kTile;
  const int64_t tiles = p.rows * tiles_per_row;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r = t / tiles_per_row;
    const int64_t c = (t - r * tiles_per_row) * kTile + static_cast<int64_t>(threadIdx.x) * kPer;
    if (c >= p.cols) continue;
    const float scale = p.scales[p.per_tensor ? 0 : r];
    const uint8_t* q = static_cast<const uint8_t*>(p.q) + r * p.q_stride + c;  // (kPer,)
    T* out = static_cast<T*>(p.out) + r * p.out_stride + c;                     // (kPer,)
    if constexpr (kVec) {
      const uint2 w = *reinterpret_cast<const uint2*>(q);
      const uint32_t words[2] = {w.x, w.y};
      constexpr int kN = Vec<T>::kN;
      Vec<T> y[kPer / kN];  // (kPer / kN, kN)
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        y[j / kN].v[j % kN] = from_float<T>(decode_q<F>(static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)))) * scale);
#pragma unroll
      for (int v = 0; v < kPer / kN; ++v) store_vec(out + v * kN, y[v]);
    } else {
      out[0] = from_float<T>(decode_q<F>(q[0]) * scale);
    }
  }
}

}  // namespace flashlab::kernels
