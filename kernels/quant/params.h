// Parameters of the quantize family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// Dynamic quantization of x (rows, cols) to an 8-bit format F (e4m3 or int8), qmax = 448 / 127:
//   per token:  scale[r] = max(absmax(x[r, :]), kQuantTinyAbsmax) / qmax
//   per tensor: scale[0] = max(absmax(x), kQuantTinyAbsmax) / qmax   (absmax_scale_kernel first)
//   q[r, c] = round_F(x[r, c] / scale)   (an IEEE fp32 division, round to nearest even, then
//             saturate to [-qmax, qmax]; the reference divides the same fp32 values the same way)
struct QuantParams {
  const void* input;      // (rows, cols), dtype T, row stride input_stride, unit column stride
  void* q;                // (rows, cols), e4m3 or int8 (one byte each), row stride q_stride
  float* scales;          // (rows,) per token: written; (1,) per tensor: read (absmax_scale_kernel wrote it)
  int64_t rows, cols;     // >= 1 each
  int64_t input_stride;   // elements between rows of input, >= cols
  int64_t q_stride;       // elements (bytes) between rows of q, >= cols
};

// The per-tensor absmax: a one-pass grid reduction (the ticket scheme of kernels/reduce/06).
struct AbsmaxScaleParams {
  const void* input;      // (rows, cols), dtype T, row stride input_stride, unit column stride
  int64_t rows, cols, input_stride;
  float* scale;           // (1,) fp32 out: max(absmax, kQuantTinyAbsmax) / qmax
  float* partials;        // (gridDim.x,) scratch: one absmax per block
  unsigned int* counter;  // (1,) blocks done; zero on entry and on exit
};

// x[r, c] = q[r, c] * scale (scale[r] per token, scale[0] per tensor), rounded once to T.
struct DequantParams {
  const void* q;          // (rows, cols), e4m3 or int8, row stride q_stride, unit column stride
  const float* scales;    // (rows,) or (1,)
  void* out;              // (rows, cols), dtype T, row stride out_stride
  int64_t rows, cols, q_stride, out_stride;
  bool per_tensor;        // scales has one element
};

}  // namespace flashlab

namespace flashlab {

inline constexpr float kE4M3Max = 448.f;  // largest finite __nv_fp8_e4m3
inline constexpr float kInt8Max = 127.f;  // symmetric int8: -128 is never produced
// Floor of the absmax before the division by qmax, so that an all-zero row (or tensor) gets a
// positive, finite scale (1e-12 / 448 is a normal fp32) and quantizes to zeros, never NaN.
inline constexpr float kQuantTinyAbsmax = 1e-12f;

}  // namespace flashlab
