// Rung 3 — RMSNorm, one block per row, 16-byte vectors.
//
// Changes from rung 2: a whole block takes a row and every access is a 16-byte vector
// (8 x bf16 / 4 x fp32 per thread per instruction); the block's partial sums are combined with
// block_all_reduce_sum (shuffles, then one word per warp in shared memory). Weight vectors are
// loaded alongside. Still two walks over the row: the second re-reads it from L1/L2.
// Precondition (the host falls back to rung 2 otherwise): hidden a multiple of Vec<T>::kN and
// every row of input/out/residual and the weight starting on a 16-byte boundary.
// Limits: the second walk; with short rows, one block per row has little to do per launch.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/norm/params.h"

namespace flashlab::kernels {

// y = x * inv_rms * w (w or 1 + w), one vector, rounded once.
template <typename T, bool kGemma>
__device__ __forceinline__ Vec<T> scale_vec(const Vec<T>& x, const Vec<T>& w, float inv_rms) {
  Vec<T> y;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) {
    const float wj = kGemma ? 1.f + to_float(w.v[j]) : to_float(w.v[j]);
    y.v[j] = from_float<T>(to_float(x.v[j]) * inv_rms * wj);
  }
  return y;
}

template <typename T>
__device__ __forceinline__ float sum_squares_vec(const Vec<T>& x) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) s += to_float(x.v[j]) * to_float(x.v[j]);
  return s;
}

template <typename T, bool kFused, bool kGemma>
__global__ void rmsnorm_block_vec16_kernel(const __grid_constant__ RmsNormParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.hidden / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  T* res = kFused ? static_cast<T*>(p.residual) + r * p.residual_stride : nullptr;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    V x = load_vec(in + i * V::kN);
    if constexpr (kFused) {
      x = add_vec(x, load_vec(res + i * V::kN));
      store_vec(res + i * V::kN, x);
    }
    ss += sum_squares_vec(x);
  }
  const float inv_rms = rsqrt_rn(block_all_reduce_sum(ss) / static_cast<float>(p.hidden) + p.eps);
  const T* src = kFused ? res : in;
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x)
    store_vec(out + i * V::kN, scale_vec<T, kGemma>(load_vec(src + i * V::kN), load_vec(w + i * V::kN), inv_rms));
}

}  // namespace flashlab::kernels
