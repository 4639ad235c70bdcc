// Parameters of the gated-activation family (silu/gelu/gelu_tanh _and_mul). Host and device
// both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// Which activation multiplies the up half; the host turns it into a functor type
// (kernels/activation/01_scalar.cuh), so each kernel is compiled once per activation.
enum class Activation { kSilu, kGelu, kGeluTanh };

struct ActMulParams {
  const void* in;         // (rows, in_row_stride), dtype T, unit column stride; row r is
                          // gate = in[r, 0:d] then up = in[r, d:2d]
  void* out;              // (rows, d), dtype T, contiguous; disjoint from in
  int64_t rows;           // >= 1: product of the input's leading dims
  int64_t d;              // output width (half the input's last dim), >= 1
  int64_t in_row_stride;  // elements between input rows, >= 2 * d
};

}  // namespace flashlab
