// Rung 1 — RMSNorm, one thread per row.
//
// out[r, c] = x[r, c] * rsqrt(mean_c(x[r, c]^2) + eps) * w[c], in fp32, rounded once.
// Steps: thread r walks row r twice: once for the sum of squares, once to scale and store.
// The textbook version, and what it costs: consecutive threads of a warp read addresses one
// row apart (hidden * sizeof(T) bytes), so every load instruction touches 32 different
// cache lines and the DRAM bursts are mostly wasted; the second walk hits L2 at best.
// There are only `rows` threads in all (16384 for the benchmark shape: 1/8 of the machine).
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/norm/params.h"

namespace flashlab::kernels {

inline constexpr int kRmsNormNaiveThreads = 128;

template <typename T>
__device__ __forceinline__ float norm_weight(const T* w, int64_t c, bool gemma) {
  return gemma ? 1.f + to_float(w[c]) : to_float(w[c]);
}

template <typename T, bool kGemma>
__global__ void __launch_bounds__(kRmsNormNaiveThreads) rmsnorm_naive_kernel(const __grid_constant__ RmsNormParams p) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  const T* x = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  float ss = 0.f;
  for (int64_t c = 0; c < p.hidden; ++c) ss += to_float(x[c]) * to_float(x[c]);
  const float inv_rms = rsqrt_rn(ss / static_cast<float>(p.hidden) + p.eps);
  for (int64_t c = 0; c < p.hidden; ++c) out[c] = from_float<T>(to_float(x[c]) * inv_rms * norm_weight(w, c, kGemma));
}

}  // namespace flashlab::kernels
