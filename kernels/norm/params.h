// Parameters of the RMSNorm family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// out = x * rsqrt(mean(x^2) + eps) * w, per row, computed in fp32 and rounded once, where
//   x = input                              (rmsnorm)
//   x = round(input + residual); residual = x; out = input   (fused_add_rmsnorm, in place)
//   w = weight, or 1 + weight for the Gemma variants.
struct RmsNormParams {
  const void* input;        // (rows, hidden), dtype T, row stride input_stride, unit column stride
  void* out;                // (rows, hidden), dtype T, row stride out_stride (fused: the input itself)
  void* residual;           // fused only: (rows, hidden), dtype T, row stride residual_stride
  const void* weight;       // (hidden,), dtype T, contiguous
  int64_t rows, hidden;     // >= 1 each
  int64_t input_stride, out_stride, residual_stride;  // elements between rows
  float eps;                // >= 0
};

}  // namespace flashlab
