// Rung 2 — RMSNorm, one warp per row, warp-shuffle reduction.
//
// Changes from rung 1: the 32 lanes of a warp split a row (lane l takes columns l, l+32, ...),
// so each warp load instruction reads 32 consecutive elements (coalesced), and the sum of
// squares is combined with warp_reduce_sum (5 register shuffles, no shared memory, no
// barrier). The second walk re-reads the row, which the first walk just brought into L1/L2.
// Also the fused variant: x = round(input + residual) is stored to `residual` in the first
// walk, and the second walk reads it back (the same rounded values the sum of squares used).
// Limits: scalar accesses (2 bytes per lane for bf16) and a single warp per row leave few
// bytes in flight per SM; the second walk is a second pass over L2.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/norm/01_naive.cuh"
#include "kernels/norm/params.h"

namespace flashlab::kernels {

inline constexpr int kRmsNormWarpThreads = 256;  // 8 rows per block

template <typename T, bool kFused, bool kGemma>
__global__ void __launch_bounds__(kRmsNormWarpThreads) rmsnorm_warp_kernel(const __grid_constant__ RmsNormParams p) {
  constexpr int kRowsPerBlock = kRmsNormWarpThreads / kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= p.rows) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarpSize;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  T* res = kFused ? static_cast<T*>(p.residual) + r * p.residual_stride : nullptr;
  float ss = 0.f;
  for (int64_t c = lane; c < p.hidden; c += kWarpSize) {
    float x = to_float(in[c]);
    if constexpr (kFused) {
      const T stored = from_float<T>(x + to_float(res[c]));
      res[c] = stored;
      x = to_float(stored);
    }
    ss += x * x;
  }
  const float inv_rms = rsqrt_rn(warp_reduce_sum(ss) / static_cast<float>(p.hidden) + p.eps);
  const T* src = kFused ? res : in;
  for (int64_t c = lane; c < p.hidden; c += kWarpSize)
    out[c] = from_float<T>(to_float(src[c]) * inv_rms * norm_weight(w, c, kGemma));
}

}  // namespace flashlab::kernels
