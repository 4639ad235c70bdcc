// Rung 3 — shared-memory tree, sequential addressing.
//
// Changes from rung 2: at each step the lower half of the live threads (t < s) adds the upper
// half (sdata[t] += sdata[t + s]), s = 128, 64, ..., 1. Active threads are contiguous, so whole
// warps either work or retire (no divergence until s < 32), and consecutive threads touch
// consecutive words (no bank conflicts). Still one element per thread, one pass per factor of
// 256, and 8 barriers per block: the load phase is short compared with the tree.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/reduce/01_atomic.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_smem_sequential_kernel(const __grid_constant__ SumPassParams p) {
  __shared__ float sdata[kSumThreads];  // (kSumThreads,)
  const T* in = static_cast<const T*>(p.in);
  const int t = threadIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSumThreads + t;
  sdata[t] = i < p.n ? to_float(in[i]) : 0.f;
  __syncthreads();
  for (int s = kSumThreads / 2; s > 0; s >>= 1) {
    if (t < s) sdata[t] += sdata[t + s];
    __syncthreads();
  }
  if (t == 0) p.out[blockIdx.x] = sdata[0];
}

}  // namespace flashlab::kernels
