// Parameters of the RoPE family (apply_rope_pos_ids, apply_rope_with_cos_sin_cache), and the
// inverse frequencies every rung and the tests share. Host and device both include this.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/common/hd.h"

namespace flashlab {

// How the inverse frequency of pair i (0 <= i < rotary_dim / 2) is made:
//   base_i = theta^(-2i / rotary_dim)
//   plain:    inv_freq_i = base_i / rope_scale                          (FlashInfer's rope_scale)
//   llama31:  s = clamp((old_context_len * base_i / 2pi - low) / (high - low), 0, 1)
//             inv_freq_i = (1 - s) * base_i / factor + s * base_i
// (Llama 3.1: wavelengths 2pi / base_i longer than old_context_len / low are divided by factor,
// shorter than old_context_len / high are kept, and the band between is interpolated.)
struct RopeFreq {
  double rope_theta;       // > 0
  double rope_scale;       // > 0 (1 with llama31)
  bool llama31;
  double llama31_factor;   // > 0
  double low_freq_factor;  // > 0
  double high_freq_factor; // > low_freq_factor
  double old_context_len;  // > 0
};

// inv_freq_i in float64; the kernels round it once to fp32. Computing it in fp64 makes it the
// correctly rounded fp32 value (up to ties), so host tests can form the exact fp32 angle the
// kernels form: at position 1M an ulp of inv_freq moves the angle by ~0.06 rad.
FLASHLAB_HD inline double rope_inv_freq_f64(const RopeFreq& f, int i, int rotary_dim) {
  const double base = pow(f.rope_theta, -2.0 * i / rotary_dim);
  if (!f.llama31) return base / f.rope_scale;
  const double kTwoPi = 6.283185307179586;
  double s = (f.old_context_len * base / kTwoPi - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  s = s < 0.0 ? 0.0 : (s > 1.0 ? 1.0 : s);
  return (1.0 - s) * base / f.llama31_factor + s * base;
}

FLASHLAB_HD inline float rope_inv_freq(const RopeFreq& f, int i, int rotary_dim) {
  return static_cast<float>(rope_inv_freq_f64(f, i, rotary_dim));
}

// Rotates dims [0, rotary_dim) of every head of q and k by angle pos * inv_freq_i per pair i:
//   NeoX (interleave = false): pair i is dims (i, i + rotary_dim / 2)
//   GPT-J (interleave = true): pair i is dims (2i, 2i + 1)
//   (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin), in fp32, each output rounded once to T.
// Dims [rotary_dim, head_dim) are copied (out of place) or left alone (in place).
struct RopeParams {
  const void* q;             // (nnz, num_q_heads, head_dim), dtype T, strides (q_stride_n, q_stride_h, 1)
  const void* k;             // (nnz, num_k_heads, head_dim), dtype T, strides (k_stride_n, k_stride_h, 1)
  void* q_out;               // like q, own strides; may be q itself (in place)
  void* k_out;               // like k, own strides; may be k itself (in place)
  const void* pos_ids;       // (nnz,), IdType (int32 or int64), contiguous
  const float* cos_sin_cache;  // (max_pos, rotary_dim) fp32 contiguous: cos in [0, rd/2), sin in
                               // [rd/2, rd); null: cos/sin computed from freq
  int64_t nnz;               // tokens, >= 1
  int num_q_heads, num_k_heads;  // >= 1 each
  int head_dim;              // >= rotary_dim
  int rotary_dim;            // even, >= 2
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h;  // elements
  int64_t q_out_stride_n, q_out_stride_h, k_out_stride_n, k_out_stride_h;
  bool copy_tail;            // out of place: copy dims [rotary_dim, head_dim)
  RopeFreq freq;             // unused with a cache
};

}  // namespace flashlab
