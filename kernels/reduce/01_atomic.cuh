// Rung 1 — sum by one global atomicAdd per element.
//
// out = sum_i x[i]; out must be zero before the launch (the host memsets it).
// Every element is a read-modify-write on one address in L2, so the whole reduction is
// serialised at the atomic unit: throughput is bounded by atomics per second on one address,
// not by memory bandwidth. Float addition is not associative and the arrival order varies, so
// the result varies from run to run (the only non-deterministic rung).
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

inline constexpr int kSumThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kSumThreads) sum_atomic_kernel(const __grid_constant__ SumPassParams p) {
  const T* in = static_cast<const T*>(p.in);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride)
    atomicAdd(p.out, to_float(in[i]));
}

}  // namespace flashlab::kernels
