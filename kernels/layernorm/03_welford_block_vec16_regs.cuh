// Rung 3 — LayerNorm, one block per row, 16-byte vectors, the row held in registers: one read
// of the input (top rung).
//
// Changes from rung 2:
//   1. A block takes a row and every access is a 16-byte vector (8 x bf16 / 4 x fp32). Thread t
//      loads vectors t, t + blockDim, ... (kLayerNormVecsPerThread of them), all loads issued
//      before the first use, and keeps them in registers (rmsnorm's rung 4 layout).
//   2. Each thread forms the WelfordState of its own values from its registers: local sum ->
//      local mean, then the local sum of squared deviations. Exact two-pass over registers, one
//      division per thread instead of rung 2's division per value.
//   3. block_welford_combine merges the per-thread states (Chan's formula, shuffles, one state
//      per warp in shared memory) and hands mean and m2 to every thread.
//   4. The weight and bias vectors are loaded after the combine (three arrays of vectors held
//      across the barrier would cost occupancy, as rmsnorm's fused rung measured), and the
//      output is written from the registers: the input crosses the memory system once.
// Block size per row: whole warps so that threads x kLayerNormVecsPerThread x Vec<T>::kN covers
// the row (hidden 4096: 128 threads for bf16, 256 for fp32).
// Rows longer than kLayerNormVecsPerThread x kLayerNormRegsMaxThreads vectors take
// layernorm_welford_block_vec16_kernel below: the same block and vectors, a streaming Welford
// update per value, and a second read for the write. Rows that are not whole vectors or not
// 16-byte aligned (input, out, weight, bias) take rung 2 (the host decides).
// Limits: the launch and one block-wide combine per row, which matter for few or short rows.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/welford.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/layernorm/params.h"

namespace flashlab::kernels {

inline constexpr int kLayerNormVecsPerThread = 4;
// 128 registers per thread at 512 threads; rmsnorm's rung 4 spilled at 1024 (64 registers).
// Covers hidden <= 16384 (bf16) / 8192 (fp32).
inline constexpr int kLayerNormRegsMaxThreads = 512;

// y = (x - mean) * rstd * w (+ b), one vector, rounded once.
template <typename T, bool kBias>
__device__ __forceinline__ Vec<T> layernorm_scale_vec(const Vec<T>& x, const Vec<T>& w, const Vec<T>& b, float mean,
                                                      float rstd) {
  Vec<T> y;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) {
    const float v = (to_float(x.v[j]) - mean) * rstd * to_float(w.v[j]);
    y.v[j] = from_float<T>(kBias ? v + to_float(b.v[j]) : v);
  }
  return y;
}

template <typename T, bool kBias>
__device__ __forceinline__ void layernorm_store_vecs(T* out, const T* w, const T* b, int64_t i, const Vec<T>& x,
                                                     float mean, float rstd) {
  using V = Vec<T>;
  const V wv = load_vec(w + i * V::kN);
  const V bv = kBias ? load_vec(b + i * V::kN) : V{};
  store_vec(out + i * V::kN, layernorm_scale_vec<T, kBias>(x, wv, bv, mean, rstd));
}

// The fallback for rows too long for registers: streaming Welford, then a second read.
template <typename T, bool kBias>
__global__ void layernorm_welford_block_vec16_kernel(const __grid_constant__ LayerNormParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.hidden / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  WelfordState st{};
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    const V x = load_vec(in + i * V::kN);
#pragma unroll
    for (int j = 0; j < V::kN; ++j) st = welford_update(st, to_float(x.v[j]));
  }
  st = block_welford_combine(st);
  const float mean = st.mean, rstd = rsqrt_rn(welford_variance(st) + p.eps);
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x)
    layernorm_store_vecs<T, kBias>(out, w, b, i, load_vec(in + i * V::kN), mean, rstd);
}

template <typename T, bool kBias, int kVpt = kLayerNormVecsPerThread>
__global__ void __launch_bounds__(kLayerNormRegsMaxThreads) layernorm_welford_block_vec16_regs_kernel(
    const __grid_constant__ LayerNormParams p) {
  using V = Vec<T>;
  static_assert(kVpt >= 1 && kVpt <= 8, "vectors per thread held in registers");
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.hidden / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  V x[kVpt];  // (kVpt, Vec<T>::kN): this thread's vectors of the row
  int nmine = 0;
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) {
      x[k] = load_vec(in + i * V::kN);
      ++nmine;
    }
  }
  // This thread's state, two passes over its registers.
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (k < nmine)
#pragma unroll
      for (int j = 0; j < V::kN; ++j) s += to_float(x[k].v[j]);
  WelfordState st{};
  if (nmine > 0) {
    st.count = static_cast<float>(nmine * V::kN);
    st.mean = s / st.count;
#pragma unroll
    for (int k = 0; k < kVpt; ++k)
      if (k < nmine)
#pragma unroll
        for (int j = 0; j < V::kN; ++j) {
          const float d = to_float(x[k].v[j]) - st.mean;
          st.m2 += d * d;
        }
  }
  st = block_welford_combine(st);
  const float mean = st.mean, rstd = rsqrt_rn(welford_variance(st) + p.eps);
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) layernorm_store_vecs<T, kBias>(out, w, b, i, x[k], mean, rstd);
  }
}

}  // namespace flashlab::kernels
