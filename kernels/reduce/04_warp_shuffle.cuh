// Rung 4 — warp shuffles only, no shared memory.
//
// Changes from rung 3: each warp reduces its 32 elements with warp_reduce_sum (5 register
// shuffles, no barrier, no shared memory) and lane 0 writes one partial per warp, so a pass
// shrinks n by 32 instead of 256. The tree is now free, which exposes the real cost: one
// element per thread means each thread has a single 4-byte (or 2-byte) load in flight, far too
// few bytes to cover DRAM latency; and the extra passes re-read n/32 partials.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/reduce/01_atomic.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

inline constexpr int kSumWarpsPerBlock = kSumThreads / kWarpSize;

template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_warp_shuffle_kernel(const __grid_constant__ SumPassParams p) {
  const T* in = static_cast<const T*>(p.in);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  const float v = warp_reduce_sum(i < p.n ? to_float(in[i]) : 0.f);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kSumWarpsPerBlock + threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0 && warp * kWarpSize < p.n) p.out[warp] = v;
}

}  // namespace flashlab::kernels
