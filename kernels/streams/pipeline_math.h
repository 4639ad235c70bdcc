// The function the streams pipeline computes, shared by the kernel, the host-side fp32 "naive"
// version the tests compare with, and (through the constants) the float64 reference:
//
//   f(x) = (1/kPipelineTerms) * sum_{j=1..kPipelineTerms} p(x * j / kPipelineTerms),
//   p(t) = sum_{k=0..kPipelinePolyDegree} (-t)^k / (k + 2)   (Horner's rule).
//
// For |x| <= 1 every p argument is in [-1, 1], so f stays bounded. About 2 * 65 * 32 = 4160
// fp32 flops per element.
#pragma once

#include "kernels/common/hd.h"

namespace flashlab {

inline constexpr int kPipelinePolyDegree = 64;
inline constexpr int kPipelineTerms = 32;

namespace kernels {

FLASHLAB_HD inline float pipeline_poly(float t) {
  float y = 0.f;
#pragma unroll
  for (int k = kPipelinePolyDegree; k >= 0; --k) y = y * -t + 1.f / static_cast<float>(k + 2);
  return y;
}

FLASHLAB_HD inline float pipeline_f(float x) {
  float acc = 0.f;
#pragma unroll 1
  for (int j = 1; j <= kPipelineTerms; ++j) acc += pipeline_poly(x * (static_cast<float>(j) / kPipelineTerms));
  return acc / kPipelineTerms;
}

}  // namespace kernels
}  // namespace flashlab
