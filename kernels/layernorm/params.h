// Parameters of the LayerNorm family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// out = (x - mean) * rsqrt(var + eps) * w + b, per row, computed in fp32 and rounded once;
// mean and the biased variance var are taken over the row (torch's LayerNorm).
struct LayerNormParams {
  const void* input;        // (rows, hidden), dtype T, row stride input_stride, unit column stride
  void* out;                // (rows, hidden), dtype T, row stride out_stride (may be input: in place)
  const void* weight;       // (hidden,), dtype T, contiguous
  const void* bias;         // (hidden,), dtype T, contiguous; nullptr when there is no bias
  int64_t rows, hidden;     // >= 1 each
  int64_t input_stride, out_stride;  // elements between rows
  float eps;                // >= 0
};

}  // namespace flashlab
