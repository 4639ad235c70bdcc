// Rung 2 — vector add with 16-byte vector loads, several vectors in flight per thread.
//
// Changes from rung 1: each thread moves Vec<T> (16 bytes: 4 x fp32 or 8 x bf16) per access,
// and handles kUnroll vectors per loop trip with all 2*kUnroll loads issued before the first
// add, so each thread keeps 2*kUnroll*16 bytes in flight. Output uses streaming stores.
// Layout: the range is cut into tiles of kUnroll*blockDim vectors; within a tile, access k of
// thread t is vector k*blockDim + t, so each warp instruction touches 512 contiguous bytes.
// Precondition (checked by the host for this rung): a, b, out 16-byte aligned, n a multiple
// of Vec<T>::kN. Rung 3 lifts it.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/elementwise/01_grid_stride.cuh"
#include "kernels/elementwise/params.h"

namespace flashlab::kernels {

inline constexpr int kVectorAddUnroll = 4;
// Not capped with __launch_bounds__ min-blocks: at 4 blocks/SM (64 registers) the bf16 kernel
// spilled 66 bytes, at 3 blocks/SM (80 registers) 8 bytes (ptxas, sm_90a).

// Adds nvec aligned vectors starting at a/b/out; the grid strides over tiles of
// kUnroll * blockDim vectors. Full tiles run with no bounds checks (every load of a trip is
// issued back to back); the one partial tile, if any, is done by a single block with checks.
template <typename T>
__device__ __forceinline__ void vector_add_vec_body(const T* a, const T* b, T* out, int64_t nvec) {
  using V = Vec<T>;
  constexpr int kU = kVectorAddUnroll;
  const int64_t tile = static_cast<int64_t>(kU) * blockDim.x;
  const int64_t full_tiles = nvec / tile;
  for (int64_t t = blockIdx.x; t < full_tiles; t += gridDim.x) {
    const int64_t base = t * tile + threadIdx.x;
    V va[kU], vb[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      va[k] = load_vec(a + (base + k * blockDim.x) * V::kN);
      vb[k] = load_vec(b + (base + k * blockDim.x) * V::kN);
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) store_vec(out + (base + k * blockDim.x) * V::kN, add_vec(va[k], vb[k]));
  }
  if (blockIdx.x == full_tiles % gridDim.x) {
    for (int64_t i = full_tiles * tile + threadIdx.x; i < nvec; i += blockDim.x)
      store_vec(out + i * V::kN, add_vec(load_vec(a + i * V::kN), load_vec(b + i * V::kN)));
  }
}

template <typename T>
__global__ void __launch_bounds__(kVectorAddThreads)
    vector_add_vec16_kernel(const __grid_constant__ VectorAddParams p) {
  vector_add_vec_body(static_cast<const T*>(p.a), static_cast<const T*>(p.b),
                      static_cast<T*>(p.out), p.n / Vec<T>::kN);
}

}  // namespace flashlab::kernels
