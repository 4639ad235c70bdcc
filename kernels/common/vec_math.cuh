// Elementwise arithmetic on 16-byte vectors (Vec<T>), in fp32 with one rounding to T.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"

namespace flashlab::kernels {

// 1 / sqrt(v) with both steps correctly rounded (IEEE sqrt, then IEEE division), for the one
// normalisation factor per row of RMSNorm / LayerNorm: at one call per row its cost does not
// show, and it keeps fp32 outputs within the same-dtype naive computation's error, which the
// 2-ulp rsqrtf approximation did not for single-element rows.
__device__ __forceinline__ float rsqrt_rn(float v) { return 1.f / sqrtf(v); }

// round(x + y) elementwise.
template <typename T>
__device__ __forceinline__ Vec<T> add_vec(const Vec<T>& x, const Vec<T>& y) {
  Vec<T> r;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) r.v[j] = from_float<T>(to_float(x.v[j]) + to_float(y.v[j]));
  return r;
}

// bf16: the same fp32 adds, two lanes at a time (__nv_bfloat162 <-> float2 conversions).
template <>
__device__ __forceinline__ Vec<__nv_bfloat16> add_vec(const Vec<__nv_bfloat16>& x, const Vec<__nv_bfloat16>& y) {
  Vec<__nv_bfloat16> r;
  const auto* x2 = reinterpret_cast<const __nv_bfloat162*>(x.v);
  const auto* y2 = reinterpret_cast<const __nv_bfloat162*>(y.v);
  auto* r2 = reinterpret_cast<__nv_bfloat162*>(r.v);
#pragma unroll
  for (int j = 0; j < Vec<__nv_bfloat16>::kN / 2; ++j) {
    const float2 fx = __bfloat1622float2(x2[j]), fy = __bfloat1622float2(y2[j]);
    r2[j] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
  }
  return r;
}

}  // namespace flashlab::kernels
