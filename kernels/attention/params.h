// Parameters of the attention forward rungs (include/flashlab/attention.h has the maths). Host
// and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

struct AttnFwdParams {
  // q: (batch, seqlen_q, nheads, d) or packed (total_q, nheads, d); k, v: with nheads_kv; o: like
  // q. Element strides; the head dim is contiguous. For packed (varlen) tensors the batch
  // stride is unused: batch b starts at row cu_seqlens[b].
  const void* q;
  const void* k;
  const void* v;
  void* o;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  // Optional fp32 log-sum-exp out: element (b, h, i) at lse[b * lse_batch_stride + h *
  // lse_head_stride + i]; varlen: (nheads, total_q), batch stride 0 and i the packed row.
  float* lse;
  int64_t lse_batch_stride, lse_head_stride;
  // Varlen: int32 (batch + 1,) row offsets, or nullptr for fixed lengths seqlen_q / seqlen_k.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int64_t total_q, total_k;  // rows of q / k as stored: packed rows (varlen), seqlen otherwise
  int batch, nheads, nheads_kv, headdim;
  int seqlen_q, seqlen_k;  // fixed lengths, or the max over batches (varlen)
  float scale;             // softmax scale (already resolved)
  float softcap;           // > 0: s = softcap * tanh(s / softcap); 0: none
  // Mask, relative to the bottom-right aligned diagonal of each batch: key j is visible to row
  // i iff j >= i + sk - sq - window_left (window_left >= 0) and j <= i + sk - sq + window_right
  // (window_right >= 0); -1: unbounded. Causal is window_right = 0 (set by the host).
  int window_left, window_right;
  // Optional fp32 ALiBi slopes: slope of (b, h) at alibi_slopes[b * alibi_batch_stride + h]
  // (stride 0 for (nheads,) slopes). Adds -slope * |i + sk - sq - j| to s_ij.
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  // FP8 (e4m3 q, k, v; rung 4 only): fp32 descale factors, the values being x_e4m3 * descale.
  // Those of (b, kv head hk) at descale[b * descale_batch_stride + hk * descale_head_stride]
  // (both strides 0: one factor per tensor); nullptr: 1. The 16-bit rungs ignore them.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t descale_batch_stride, descale_head_stride;
  // Dropout (0: none): keep (b, h, i, j) iff dropout_draw(seed, offset, b, h, nheads, i, j) >=
  // dropout_threshold, a kept p_ij weighed by dropout_scale = 1 / (1 - dropout_p).
  float dropout_p, dropout_scale;
  uint32_t dropout_threshold, dropout_offset;
  uint64_t dropout_seed;
  // Varlen lse: element (h, packed row r) at lse[h * lse_head_stride + r * lse_row_stride]
  // (attention_fwd: (nheads, total_q), row stride 1; the paged prefill: (total_q, nheads), nheads;
  // read by the paged kernels only, attn_lse_offset).
  int64_t lse_row_stride = 1;
  // Paged K/V (batch_prefill_paged, include/flashlab/serving.h; varlen q): kv_indptr non-null
  // makes k and v page pools, batch b's keys the pages kv_indices[kv_indptr[b] ..), the last
  // holding kv_last_page_len[b] keys; key j in page kv_indices[kv_indptr[b] + j / page_size],
  // slot j % page_size. The k / v batch strides are then the page strides, the row strides the
  // slot strides, total_k the pool's pages; cu_seqlens_k is unused.
  const int* kv_indptr = nullptr;
  const int* kv_indices = nullptr;
  const int* kv_last_page_len = nullptr;
  int page_size = 0;
  uint32_t page_size_magic = 0, page_size_shift = 0;  // page_size as an IntDivisor (kernels/common/divide.cuh), set on the host
};

// The backward (include/flashlab/attention.h, attention_bwd) reads everything above (lse is the
// forward's, read here) plus the output's gradient, and writes dq, dk, dv.
// The tiled backward rungs (2, 3) read D and lse log2(e) for whole query blocks (64 or 128 rows):
// dsum_rows rounds seqlen_q up to a multiple of this.
inline constexpr int kAttnBwdRowPad = 128;

// Backward rung 3's reach in head dims and score modifiers, asked by the validation, the automatic
// choice, the dispatch, the benchmark and the tests: head dims 64 and 128
// (kernels/attention/backward/03_hopper.cuh) and 256 without softcap (03_hopper_split.cuh, where
// softcap's gradient factor would need S where dS is formed).
constexpr bool attn_bwd_rung3_head_dim(int64_t headdim) { return headdim == 64 || headdim == 128 || headdim == 256; }
constexpr bool attn_bwd_rung3_takes(int64_t headdim, bool softcap) {
  return attn_bwd_rung3_head_dim(headdim) && !(headdim == 256 && softcap);
}

struct AttnBwdParams : AttnFwdParams {
  // dout: like o; dq: like q; dk, dv: like k (each its own strides, head dim contiguous).
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  // fp32 workspace: D_i = sum_c dout_ic o_ic of every row, (batch, nheads, dsum_rows) (varlen:
  // for the max seqlen_q, rows past a batch's length unused by rung 1; rung 2 writes them).
  float* dsum;
  // Rows per (batch, head) of dsum and lse_log2: seqlen_q (rung 1), seqlen_q rounded up to the
  // query block (rung 2: a block's rows are copied whole, past the end included).
  int dsum_rows;
  // fp32 workspace of rung 2, laid out as dsum: lse log2(e) per row, +inf for rows that see no
  // key and for rows past the end (P = 2^(s - inf) = 0 there).
  float* lse_log2;
  // fp32 workspace of the tiled rungs: dq accumulated over key blocks. Rung 3: (batch x seqlen_q,
  // nheads, d) dense for fixed lengths, (total_q, nheads, d) for varlen; row r =
  // attn_dq_accum_row(b, i). Rung 2 (dq_accum_tiled): (batch, nheads, dsum_rows, d), each query
  // block's kBlockM x d floats in the order its warps add them (02_flash2.cuh, Flash2BwdTraits::
  // dq_tile_offset: a warp's reduction 512 contiguous bytes).
  float* dq_accum;
  bool dq_accum_tiled;
};

// Rung 4's (kernels/attention/04_hopper.cuh) key-block width by default for 16-bit inputs, and the
// paged prefill's at every length: 128 keys up to head dim 128, 96 up to 192, 80 above (FP8: 128).
// Host-visible: src/attention_hopper_dispatch.h tells from it which kernels round alike.
constexpr int attn_hopper_default_key_block(int headdim) { return headdim <= 128 ? 128 : headdim <= 192 ? 96 : 80; }

// Rung 4's split tail (kSplitTail; src/attention_hopper_dispatch.h): at most this many parts a tile.
constexpr int kAttnSplitTailMax = 4;

}  // namespace flashlab
