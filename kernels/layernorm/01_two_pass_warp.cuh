// Rung 1 — LayerNorm, one warp per row, textbook two-pass statistics.
//
// out[r, c] = (x[r, c] - mean_r) * rsqrt(var_r + eps) * w[c] + b[c], fp32, rounded once, with
// mean_r = sum_c x / hidden and var_r = sum_c (x - mean_r)^2 / hidden (biased).
// Steps, warp r takes row r, lane l columns l, l + 32, ... (coalesced):
//   1. sum x               -> warp_reduce_sum -> mean
//   2. sum (x - mean)^2    -> warp_reduce_sum -> var (numerically safe: no E[x^2] - E[x]^2)
//   3. write (x - mean) * rstd * w + b
// The starting point is a warp per row (rmsnorm's rung 2) rather than a thread per row:
// the uncoalesced loop is already measured in docs/ladder/rmsnorm.md.
// Limits: three reads of the row (the second and third from L1/L2 at best) and scalar
// accesses (2 bytes per lane for bf16): few bytes in flight per SM.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/layernorm/params.h"

namespace flashlab::kernels {

inline constexpr int kLayerNormWarpThreads = 256;  // 8 rows per block

// y = (x - mean) * rstd * w[c] (+ b[c]), rounded once.
template <typename T, bool kBias>
__device__ __forceinline__ T layernorm_scale(float x, float mean, float rstd, const T* w, const T* b, int64_t c) {
  const float y = (x - mean) * rstd * to_float(w[c]);
  return from_float<T>(kBias ? y + to_float(b[c]) : y);
}

template <typename T, bool kBias>
__global__ void __launch_bounds__(kLayerNormWarpThreads) layernorm_two_pass_warp_kernel(
    const __grid_constant__ LayerNormParams p) {
  constexpr int kRowsPerBlock = kLayerNormWarpThreads / kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= p.rows) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarpSize;
  const T* x = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  const float inv_n = 1.f / static_cast<float>(p.hidden);
  float s = 0.f;
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) s += to_float(x[c]);
  const float mean = warp_reduce_sum(s) * inv_n;
  float ss = 0.f;
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) {
    const float d = to_float(x[c]) - mean;
    ss += d * d;
  }
  const float rstd = rsqrt_rn(warp_reduce_sum(ss) * inv_n + p.eps);
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) out[c] = layernorm_scale<T, kBias>(to_float(x[c]), mean, rstd, w, b, c);
}

}  // namespace flashlab::kernels
