// The kernel stage of the streams pipeline: y = p(x), a degree-kPolyDegree polynomial by
// Horner's rule. The degree sets the arithmetic per element so that, on one H100, the kernel
// of a chunk takes time of the same order as its copies: that is the regime where overlapping
// copy in, compute and copy out pays most (the serial time is the sum of the three, the
// pipelined time approaches the largest).
#pragma once

#include <cstdint>

#include "kernels/streams/params.h"

namespace flashlab::kernels {

inline constexpr int kPipelineThreads = 256;
inline constexpr int kPolyDegree = kPipelinePolyDegree;

__host__ __device__ inline float pipeline_poly(float x) {
  // Coefficients 1/(k+2), alternating sign: bounded for |x| <= 1.
  float y = 0.f;
#pragma unroll
  for (int k = kPolyDegree; k >= 0; --k) y = y * x + ((k & 1) ? -1.f : 1.f) / static_cast<float>(k + 2);
  return y;
}

__global__ void __launch_bounds__(kPipelineThreads)
    pipeline_poly_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = pipeline_poly(in[i]);
}

}  // namespace flashlab::kernels
