// Pieces every attention forward rung shares: where a batch's rows are (fixed length or
// varlen), the score of a (row, key) pair (scale, softcap, ALiBi, mask), and the range of keys
// a block of rows can see (so that fully masked blocks are skipped, not computed).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/params.h"
#include "kernels/common/hd.h"
#include "kernels/common/philox.cuh"

namespace flashlab::kernels {

// Batch b's sequences: its rows of q start at packed row q_row0 (varlen) or at b's batch
// stride (fixed); sq / sk its lengths (0 possible for varlen).
struct AttnBatch {
  int64_t q_row0, k_row0;  // first packed row (varlen), 0 otherwise
  int sq, sk;
};

// kPaged: the keys from the page table (p.kv_indptr, varlen q), k_row0 unused.
template <bool kPaged = false>
__device__ __forceinline__ AttnBatch attn_batch(const AttnFwdParams& p, int b) {
  if (p.cu_seqlens_q != nullptr) {
    if constexpr (kPaged) {
      const int q0 = p.cu_seqlens_q[b], pages = p.kv_indptr[b + 1] - p.kv_indptr[b];
      return {q0, 0, p.cu_seqlens_q[b + 1] - q0, pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0};
    }
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    return {q0, k0, p.cu_seqlens_q[b + 1] - q0, p.cu_seqlens_k[b + 1] - k0};
  }
  return {0, 0, p.seqlen_q, p.seqlen_k};
}

// Element offset of (batch b, row i, head h) in a tensor with these strides: packed rows
// (row0 + i) for varlen, b * batch_stride + i * row_stride otherwise.
__device__ __forceinline__ int64_t attn_offset(const AttnFwdParams& p, int b, int64_t row0, int64_t i, int h,
                                               int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  const int64_t batch_part = p.cu_seqlens_q != nullptr ? row0 * row_stride : b * batch_stride;
  return batch_part + i * row_stride + h * head_stride;
}

// Element of the lse of (batch b, head h, row i): (batch, nheads, sq) or, varlen, (nheads, total_q)
// (or (total_q, nheads): lse_row_stride).
// kRowStride: varlen rows lse_row_stride apart (the paged prefill's kernels), else 1 (the
// multiply cost the dropout kernel of rung 3 a spill).
template <bool kRowStride = false>
__device__ __forceinline__ int64_t attn_lse_offset(const AttnFwdParams& p, int b, int h, const AttnBatch& s, int64_t i) {
  if constexpr (kRowStride)
    if (p.cu_seqlens_q != nullptr) return h * p.lse_head_stride + (s.q_row0 + i) * p.lse_row_stride;
  return p.cu_seqlens_q != nullptr ? h * p.lse_head_stride + s.q_row0 + i : b * p.lse_batch_stride + h * p.lse_head_stride + i;
}

// Everything that turns q.k into the logit s_ij for one (batch, head): see attention.h.
struct AttnScoreMod {
  float scale;    // softmax scale
  float softcap;  // > 0: softcap * tanh(s / softcap)
  float slope;    // ALiBi slope of this (batch, head), 0 when none
  int diag;       // sk - sq: row i's diagonal key is i + diag
  int window_left, window_right;  // -1: unbounded
};

__device__ __forceinline__ AttnScoreMod attn_score_mod(const AttnFwdParams& p, int b, int h, const AttnBatch& s) {
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
  return {p.scale, p.softcap, slope, s.sk - s.sq, p.window_left, p.window_right};
}

// Key j visible to row i (bottom-right aligned diagonal, sliding window; causal is right = 0).
FLASHLAB_HD inline bool attn_visible(int i, int j, int diag, int window_left, int window_right) {
  const int d = i + diag;
  return (window_left < 0 || j >= d - window_left) && (window_right < 0 || j <= d + window_right);
}

// The dropout weight z of (batch b, head h, row i, key j): 1 / (1 - p) if kept, 0 if dropped, 1
// without dropout. i and j are the batch's own row and key (varlen: not the packed rows).
__device__ __forceinline__ float attn_dropout_weight(const AttnFwdParams& p, int b, int h, int i, int j) {
  if (p.dropout_p == 0.f) return 1.f;
  const uint32_t draw = dropout_draw(p.dropout_seed, p.dropout_offset, b, h, p.nheads, i, j);
  return draw >= p.dropout_threshold ? p.dropout_scale : 0.f;
}

// The dropout weights of keys j and j + 1 (j even: one Philox call serves both, as four
// adjacent keys share a counter) for (batch b, head h, row i): z0, z1 as attn_dropout_weight's.
// For the tiled rungs, whose threads hold pairs of adjacent scores.
__device__ __forceinline__ void attn_dropout_weight2(const AttnFwdParams& p, int b, int h, int i, int j, float& z0,
                                                     float& z1) {
  const Philox4 r = dropout_draws4(p.dropout_seed, p.dropout_offset, b, h, p.nheads, i, j);
  const bool upper = (j & 2) != 0;  // keys 4 (j / 4) + {2, 3}: words 2, 3 (selects, not a run-time index)
  z0 = (upper ? r.x[2] : r.x[0]) >= p.dropout_threshold ? p.dropout_scale : 0.f;
  z1 = (upper ? r.x[3] : r.x[1]) >= p.dropout_threshold ? p.dropout_scale : 0.f;
}

// The logit of raw dot product `dot` for row i, key j (natural-log units), -inf when masked.
__device__ __forceinline__ float attn_logit(float dot, int i, int j, const AttnScoreMod& m) {
  if (!attn_visible(i, j, m.diag, m.window_left, m.window_right)) return -INFINITY;
  float s = dot * m.scale;
  if (m.softcap > 0.f) s = m.softcap * tanhf(s / m.softcap);
  if (m.slope != 0.f) s -= m.slope * fabsf(static_cast<float>(i + m.diag - j));
  return s;
}

// The tensor-core rungs' logit in log2 units with softcap and/or ALiBi, from the raw dot product
// (scale_log2 = scale log2(e), slope_log2 = slope log2(e)); the mask is applied separately.
__device__ __forceinline__ float attn_logit_log2(float dot, int i, int j, const AttnScoreMod& m, float scale_log2,
                                                 float slope_log2) {
  constexpr float kLog2e = 1.4426950408889634f;
  float x = m.softcap > 0.f ? m.softcap * kLog2e * tanhf(dot * (m.scale / m.softcap)) : dot * scale_log2;
  if (m.slope != 0.f) x -= slope_log2 * fabsf(static_cast<float>(i + m.diag - j));
  return x;
}

// Keys [lo, hi) that any row of [row_lo, row_hi) can see, clipped to [0, sk); empty (lo >= hi)
// when none. Blocks of keys outside it are fully masked for the whole row block.
struct AttnKeyRange {
  int lo, hi;
};
FLASHLAB_HD inline AttnKeyRange attn_key_range(int row_lo, int row_hi, int sk, int diag, int window_left,
                                               int window_right) {
  int lo = 0, hi = sk;
  if (window_left >= 0) lo = row_lo + diag - window_left > 0 ? row_lo + diag - window_left : 0;
  if (window_right >= 0) {
    const int last = row_hi - 1 + diag + window_right;  // last key of the last row
    hi = last + 1 < sk ? last + 1 : sk;
  }
  return {lo, hi};
}

// Rows [lo, hi) of [0, sq) that can see any key of [key_lo, key_hi) (the backward walks the rows
// of a key block): key j is visible to row i iff i >= j - diag - window_right (window_right >= 0)
// and i <= j - diag + window_left (window_left >= 0). Empty (lo >= hi) when none.
struct AttnRowRange {
  int lo, hi;
};
FLASHLAB_HD inline AttnRowRange attn_row_range(int key_lo, int key_hi, int sq, int diag, int window_left,
                                               int window_right) {
  int lo = 0, hi = sq;
  if (window_right >= 0) lo = key_lo - diag - window_right > 0 ? key_lo - diag - window_right : 0;
  if (window_left >= 0) {
    const int last = key_hi - 1 - diag + window_left;  // last row that sees the last key
    hi = last + 1 < sq ? last + 1 : sq;
  }
  return {lo, hi};
}

}  // namespace flashlab::kernels
