// Rung 6 — one-pass grid reduction (single launch).
//
// Changes from rung 5: the second launch is folded into the first. Each block writes its
// partial, makes it visible device-wide (__threadfence), and takes a ticket from a global
// counter (atomicAdd). The block that draws the last ticket knows every partial is written;
// it sums them in index order (so the result is deterministic for a fixed grid), writes the
// result, and resets the counter to zero for the next call. Saves one launch and its gap,
// which matters for small and medium n.
#pragma once

#include "kernels/common/reduce.cuh"
#include "kernels/reduce/05_vec_multi.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

template <typename T>
__global__ void __launch_bounds__(kSumThreads) sum_one_pass_kernel(const __grid_constant__ SumOnePassParams p) {
  __shared__ bool is_last;
  const int64_t rank = static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  const float block_sum =
      block_reduce_sum<kSumThreads>(thread_partial_sum(static_cast<const T*>(p.in), p.n, rank,
                                                       static_cast<int64_t>(gridDim.x) * kSumThreads));
  if (threadIdx.x == 0) {
    p.partials[blockIdx.x] = block_sum;
    __threadfence();  // partial visible to the last block before the ticket is taken
    is_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // acquire side: see every other block's partial
  float acc = 0.f;
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kSumThreads)
    acc += __ldcg(p.partials + i);  // L2 read: partials were written by other SMs
  const float total = block_reduce_sum<kSumThreads>(acc);
  if (threadIdx.x == 0) {
    *p.out = total;
    *p.counter = 0u;
  }
}

}  // namespace flashlab::kernels
