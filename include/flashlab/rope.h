// Rotary position embedding (RoPE) family. Ladder: kernels/rope/, doc: docs/ladder/rope.md.
// FlashInfer's apply_rope_pos_ids / apply_llama31_rope_pos_ids / apply_rope_with_cos_sin_cache.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 one thread per rotated pair, 2 one block per token with cos/sin shared by its heads and
// 16-byte vectors (top)
inline constexpr int kRopeRungs = 2;

// How the angles are made (apply_rope_pos_ids). Pair i (0 <= i < rotary_dim / 2) of a token at
// position p turns by p * inv_freq_i, computed in fp32 (the fp32 product of float(p) and
// inv_freq_i rounded once to fp32); cos/sin in fp32 at full range accuracy (sincosf).
//   plain:   inv_freq_i = 1 / (rope_scale * rope_theta^(2i / rotary_dim))
//   llama31: base_i = rope_theta^(-2i / rotary_dim), s = clamp((old_context_len * base_i / 2pi
//            - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1),
//            inv_freq_i = (1 - s) * base_i / llama31_factor + s * base_i  (rope_scale must be 1)
struct RopeOptions {
  int rotary_dim = 0;             // even, 2..head_dim; 0 means head_dim
  bool interleave = false;        // false: NeoX pairs (i, i + rotary_dim/2); true: GPT-J (2i, 2i+1)
  float rope_theta = 1e4f;        // finite, > 0
  float rope_scale = 1.f;         // finite, > 0 (positions are divided by it)
  bool llama31 = false;           // Llama 3.1 frequency bands (below)
  float low_freq_factor = 1.f;    // > 0
  float high_freq_factor = 4.f;   // > low_freq_factor
  float llama31_factor = 8.f;     // > 0: divides the low frequencies
  int old_context_len = 8192;     // > 0
};

// Rotates the first rotary_dim dims of every head of q and k, token t by pos_ids[t].
//   q: CUDA, [nnz, num_q_heads, head_dim], fp32/fp16/bf16, unit stride in the last dim, any
//      token and head strides.  k: [nnz, num_k_heads, head_dim], same dtype and device.
//   q_out, k_out: like q and k (own strides, not overlapping themselves or another argument);
//      q_out may be q itself and k_out k itself (in place: dims past rotary_dim are untouched;
//      out of place they are copied).
//   pos_ids: [nnz] int32 or int64, contiguous; values are read on the device and not checked
//      (positions up to 2^24 are exact in the fp32 angle).
// Rung 2 needs 16-byte vectors of whole pairs (head_dim and strides multiples of
// 16 / sizeof(dtype), rotary_dim of twice that for NeoX, aligned pointers, rotary_dim <= 1024);
// other inputs take rung 1's path (same result).
void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_out, const TensorView& k_out,
                        const TensorView& pos_ids, const RopeOptions& opt, cudaStream_t stream = nullptr,
                        int rung = kRopeRungs);

// The same rotation with cos/sin read from a table: cos_sin_cache [max_pos, rotary_dim] fp32,
// contiguous, row p = (cos of pairs 0..rotary_dim/2-1, sin of the same) for position p
// (vLLM's and FlashInfer's layout); rotary_dim = its second dim (even, <= head_dim). pos_ids
// values must lie in [0, max_pos) (read on the device, not checked). Other arguments as above.
void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_out,
                                   const TensorView& k_out, const TensorView& pos_ids,
                                   const TensorView& cos_sin_cache, bool interleave, cudaStream_t stream = nullptr,
                                   int rung = kRopeRungs);

// [nnz, num_heads * head_size] (vLLM's flattened layout) as a [nnz, num_heads, head_size] view
// of the same memory; checks that t is 2-D with a last dim a positive multiple of head_size.
TensorView split_heads(const TensorView& t, int64_t head_size, const char* op, const char* name);

}  // namespace flashlab
