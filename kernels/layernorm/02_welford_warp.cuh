// Rung 2 — LayerNorm, one warp per row, one statistics pass with Welford.
//
// Changes from rung 1: steps 1 and 2 become one pass. Each lane keeps a WelfordState
// {count, mean, m2} over its columns (welford_update per value), and the 32 states are merged
// with warp_welford_combine (5 shuffle rounds of 3 floats, Chan's formula). Mean and variance
// come out of one read, still without E[x^2] - E[x]^2; the write pass is the second read.
// Also the path of rung 3 for rows that are not 16-byte aligned or not whole vectors.
// Limits: a division per value in the update; scalar accesses and one warp per row leave few
// bytes in flight; the write pass re-reads the row from L1/L2.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/welford.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/layernorm/01_two_pass_warp.cuh"
#include "kernels/layernorm/params.h"

namespace flashlab::kernels {

template <typename T, bool kBias>
__global__ void __launch_bounds__(kLayerNormWarpThreads) layernorm_welford_warp_kernel(
    const __grid_constant__ LayerNormParams p) {
  constexpr int kRowsPerBlock = kLayerNormWarpThreads / kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= p.rows) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarpSize;
  const T* x = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  WelfordState st{};
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) st = welford_update(st, to_float(x[c]));
  st = warp_welford_combine(st);
  const float mean = st.mean, rstd = rsqrt_rn(welford_variance(st) + p.eps);
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) out[c] = layernorm_scale<T, kBias>(to_float(x[c]), mean, rstd, w, b, c);
}

}  // namespace flashlab::kernels
