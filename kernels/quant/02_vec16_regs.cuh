// Rung 2 — dynamic quantization with the row held in registers: one read (top rung).
//
// Changes from rung 1: each thread loads its kQuantVecsPerThread 16-byte vectors of the row
// (4 x fp32 / 8 x fp16 or bf16 each), all loads issued before the first use, keeps them in
// registers across block_all_reduce_max, then divides them by the scale and stores each vector
// as one packed 4- or 8-byte word of 8-bit codes (e4m3 pairs through one cvt.rn.satfinite.e4m3x2
// each). The input crosses the memory system once; stores are wide and streaming.
// The block size follows the row: threads x kQuantVecsPerThread x Vec<T>::kN covers cols
// (cols 4096 bf16: 128 threads; fp32: 256). Same rounding as rung 1, bit for bit.
// Precondition (the host takes rung 1 otherwise): cols a multiple of Vec<T>::kN, rows of the
// input 16-byte aligned, rows of q aligned to Vec<T>::kN bytes, and cols at most
// kQuantVecsPerThread x kQuantRegsMaxThreads vectors.
// The division: IEEE x / scale per element costs a reciprocal (MUFU), two Newton steps, a
// range check (FCHK) and a branch; the scale is the same for the whole row, so RowDivisor takes
// the refined reciprocal once and each element pays only the quotient's multiply and two FMA
// corrections: the same arithmetic as div.rn's fast path, bit for bit the same quotient.
// Per tensor (kPerTensor): scales[0] from absmax_scale_kernel, no reduction.
// Limits: at the bandwidth roofline for LLM widths; for few or short rows, the launch and one
// block barrier per row; per tensor, the second launch re-reads the whole input.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/common/divide.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/quant/01_scalar.cuh"
#include "kernels/quant/params.h"

namespace flashlab::kernels {

inline constexpr int kQuantVecsPerThread = 4;
inline constexpr int kQuantRegsMaxThreads = 512;  // covers cols <= 8192 fp32 / 16384 fp16, bf16

// Four quotients -> four codes in one little-endian word (element 0 in the low byte).
template <QuantFormat F>
__device__ __forceinline__ uint32_t quantize_pack4(float a, float b, float c, float d) {
  if constexpr (F == QuantFormat::kE4M3) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  } else {
    // Clamp and round as quantize_one, then two cvt.pack.sat.s8 pack the four (already in
    // range) integers: the second packs (b, a) below the 16 bits of (d, c) from the first.
    const auto code = [](float v) { return __float2int_rn(fminf(fmaxf(v, -kInt8Max), kInt8Max)); };
    uint32_t hi, w;
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, 0;" : "=r"(hi) : "r"(code(d)), "r"(code(c)));
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(w) : "r"(code(b)), "r"(code(a)), "r"(hi));
    return w;
  }
}

// One vector of kN inputs -> kN codes stored as one kN-byte streaming store.
template <typename T, QuantFormat F>
__device__ __forceinline__ void quantize_store_vec(uint8_t* q, const Vec<T>& x, const RowDivisor& div) {
  constexpr int kN = Vec<T>::kN;
  static_assert(kN == 4 || kN == 8, "fp32 (4 per vector) or 16-bit inputs (8 per vector)");
  uint32_t w[kN / 4];
#pragma unroll
  for (int j = 0; j < kN / 4; ++j)
    w[j] = quantize_pack4<F>(div(to_float(x.v[4 * j])), div(to_float(x.v[4 * j + 1])), div(to_float(x.v[4 * j + 2])),
                             div(to_float(x.v[4 * j + 3])));
  if constexpr (kN == 4) __stcs(reinterpret_cast<unsigned int*>(q), w[0]);
  else __stcs(reinterpret_cast<uint2*>(q), make_uint2(w[0], w[1]));
}

template <typename T>
__device__ __forceinline__ float absmax_vec(const Vec<T>& x) {
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) m = fmaxf(m, fabsf(to_float(x.v[j])));
  return m;
}

template <typename T, QuantFormat F, bool kPerTensor>
__global__ void __launch_bounds__(kQuantRegsMaxThreads) quantize_vec16_regs_kernel(const __grid_constant__ QuantParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.cols / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;  // (cols,)
  uint8_t* q = static_cast<uint8_t*>(p.q) + r * p.q_stride;           // (cols,)
  V x[kQuantVecsPerThread];  // (kQuantVecsPerThread, kN): this thread's share of the row
#pragma unroll
  for (int k = 0; k < kQuantVecsPerThread; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) x[k] = load_vec(in + i * V::kN);
  }
  float scale;
  if constexpr (kPerTensor) {
    scale = p.scales[0];
  } else {
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < kQuantVecsPerThread; ++k)
      if (k * static_cast<int64_t>(blockDim.x) + threadIdx.x < nvec) amax = fmaxf(amax, absmax_vec(x[k]));
    scale = quant_scale<F>(block_all_reduce_max(amax));
    if (threadIdx.x == 0) p.scales[r] = scale;
  }
  const RowDivisor div(scale);
#pragma unroll
  for (int k = 0; k < kQuantVecsPerThread; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) quantize_store_vec<T, F>(q + i * V::kN, x[k], div);
  }
}

}  // namespace flashlab::kernels
