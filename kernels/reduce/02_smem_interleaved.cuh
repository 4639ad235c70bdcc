// Rung 2 — shared-memory tree, interleaved addressing.
//
// Each thread loads one element into shared memory; the block then halves the live values
// log2(kSumThreads) times: at step s, thread t (t a multiple of 2s) adds sdata[t + s]. Block
// b writes its sum to out[b]; the host runs passes (n -> n/256 -> ... -> 1) until one value
// is left, so the result is deterministic for a given n.
// Changes from rung 1: no atomics; adds happen in a tree. Limits: the `t % (2s)` test leaves
// most threads of each warp idle (divergence) and the active threads hit shared memory with a
// stride of 2s words (bank conflicts); only half the threads add even at the first step.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/reduce/01_atomic.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_smem_interleaved_kernel(const __grid_constant__ SumPassParams p) {
  __shared__ float sdata[kSumThreads];  // (kSumThreads,)
  const T* in = static_cast<const T*>(p.in);
  const int t = threadIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSumThreads + t;
  sdata[t] = i < p.n ? to_float(in[i]) : 0.f;
  __syncthreads();
  for (int s = 1; s < kSumThreads; s *= 2) {
    if (t % (2 * s) == 0) sdata[t] += sdata[t + s];
    __syncthreads();
  }
  if (t == 0) p.out[blockIdx.x] = sdata[0];
}

}  // namespace flashlab::kernels
