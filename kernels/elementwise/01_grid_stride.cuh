// Rung 1 — vector add, grid-stride scalar loop.
//
// out[i] = a[i] + b[i], computed in fp32 and rounded to T once.
// Steps: each thread starts at its global index and strides by the whole grid, so any grid
// size covers any n and a grid sized to the machine (a few blocks per SM) amortises launch and
// block start-up. Every access is one element: 4 bytes (fp32) or 2 bytes (bf16) per thread per
// instruction. Coalesced, but the number of load/store instructions per byte is what limits
// it next, most of all for bf16.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/elementwise/params.h"

namespace flashlab::kernels {

inline constexpr int kVectorAddThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kVectorAddThreads)
    vector_add_grid_stride_kernel(const __grid_constant__ VectorAddParams p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace flashlab::kernels
