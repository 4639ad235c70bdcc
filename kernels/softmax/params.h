// Parameters of the softmax family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// Per row r of a (rows, cols) tensor, in fp32, rounded once to T:
//   softmax:     out[r, c] = exp(x[r, c] - m) / s
//   log_softmax: out[r, c] = x[r, c] - m - log(s)
// where m = max_c x[r, c] and s = sum_c exp(x[r, c] - m). A row of all -inf (fully masked)
// gives 0 (softmax) / -inf (log_softmax), never NaN.
struct SoftmaxParams {
  const void* input;     // (rows, cols), dtype T, row stride input_stride, unit column stride
  void* out;             // (rows, cols), dtype T, row stride out_stride; may be input itself
  int64_t rows, cols;    // >= 1 each
  int64_t input_stride, out_stride;  // elements between rows
};

}  // namespace flashlab
