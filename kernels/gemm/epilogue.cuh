// The epilogue every GEMM rung shares: out = alpha * acc + beta * c_in + bias[n], in fp32,
// rounded once to the output dtype.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/gemm/params.h"

namespace flashlab::kernels {

template <typename T>
__device__ __forceinline__ float gemm_epilogue_value(const GemmParams& p, float acc, int m, int n) {
  float v = p.alpha * acc;
  if (p.beta != 0.f) v += p.beta * to_float(static_cast<const T*>(p.c)[m * p.ldc + n]);
  if (p.bias) v += to_float(static_cast<const T*>(p.bias)[n]);
  return v;
}

template <typename T>
__device__ __forceinline__ void gemm_store(const GemmParams& p, float acc, int m, int n) {
  static_cast<T*>(p.c)[m * p.ldc + n] = from_float<T>(gemm_epilogue_value<T>(p, acc, m, n));
}

}  // namespace flashlab::kernels
