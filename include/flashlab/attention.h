// Attention forward (exact softmax attention). Ladder: kernels/attention/, doc:
// docs/ladder/attention.md.
//
// Rungs (rung 0 is torch SDPA / cuDNN, measured in the benchmarks only):
//   1 naive: S = Q K^T materialised in global memory, softmax, O = P V      (O(N^2) memory)
//   2 FlashAttention-1: tiled, online softmax, CUDA cores, FA1 loop order
//     (outer loop over K/V blocks, inner over Q blocks; O, m, l kept in global memory)
//   3 FlashAttention-2: a CTA per (Q block, head, batch), Q in registers, K/V streamed by
//     cp.async, mma.sync m16n8k16 + ldmatrix, P in registers, exp2 softmax
//   4 Hopper (FlashAttention-3 class): TMA, wgmma, a producer warpgroup and two consumer
//     warpgroups with pingpong and softmax/GEMM overlap (sm_90; head dims 64 .. 256; also FP8
//     e4m3 inputs at head dim 128) (top)
// All rungs take every feature below (rung 4: head dims from 64, sm_90 only); they differ only in
// how fast.
//
// The maths, per batch b, query head h (its KV head h / (nheads / nheads_kv)), query row i,
// key column j, with sq / sk the sequence lengths of batch b:
//   s_ij = scale * q_i . k_j                          (scale: softmax_scale, default 1/sqrt(d))
//   s_ij = softcap * tanh(s_ij / softcap)             (softcap > 0 only)
//   s_ij = s_ij - slope_h * |i + sk - sq - j|         (ALiBi slopes given only)
//   s_ij = -inf where key j is masked for row i: with the diagonal aligned bottom-right
//          (d = i + sk - sq), key j is kept iff  j >= d - window_left  (window_left >= 0)
//          and  j <= d + window_right  (window_right >= 0); -1 means unbounded; causal is
//          window_right = 0 (flash-attn >= 2.1 semantics).
//   lse_i = log(sum_j exp(s_ij)),  o_i = sum_j exp(s_ij - lse_i) v_j
// computed with fp32 accumulation and rounded once to the output dtype. A row whose keys are
// all masked (or sk = 0) gives o_i = 0 and lse_i = -inf, never NaN.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

inline constexpr int kAttnFwdRungs = 4;
// rung = kAttnFwdRungAuto: rung 4 on a device of compute capability 9.x for head dims 64 ..
// 256, rung 3 otherwise.
inline constexpr int kAttnFwdRungAuto = -1;

// Head dims rungs 1-3 take (rung 4: all but 32).
inline constexpr int kAttnHeadDims[] = {32, 64, 96, 128, 192, 256};

struct AttnFwdOptions {
  // <= 0 or NaN: 1 / sqrt(headdim). Otherwise a finite value > 0.
  float softmax_scale = 0.f;
  bool causal = false;
  // Sliding window in keys left / right of the (bottom-right aligned) diagonal; -1: unbounded.
  // With causal = true, window_right is taken as 0 (as flash-attn does; it must still be >= -1).
  int64_t window_left = -1, window_right = -1;
  // > 0: softcapping (s = softcap * tanh(s / softcap)); 0: none. Finite, >= 0.
  float softcap = 0.f;
  // Optional fp32 ALiBi slopes, (nheads,) or (batch, nheads), contiguous.
  const TensorView* alibi_slopes = nullptr;
  // Variable-length batches: both given or neither. int32, (batch + 1,), contiguous,
  // cu_seqlens[0] = 0, non-decreasing; q/k/v/out are then packed (total, nheads, headdim) and
  // batch b's rows are [cu_seqlens[b], cu_seqlens[b + 1]). max_seqlen_q / max_seqlen_k must be
  // >= every batch's length (they size the grid; the kernels read the true lengths). The values
  // are checked on the host (a copy and a wait on the stream) unless the stream is capturing a
  // CUDA graph, when they are taken as given.
  const TensorView* cu_seqlens_q = nullptr;
  const TensorView* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  // Optional output: fp32 log-sum-exp of each row's scores, (batch, nheads, seqlen_q)
  // (contiguous), or (nheads, total_q) for varlen. -inf for fully masked rows.
  const TensorView* softmax_lse = nullptr;
  // Optional output, for tests (flash-attn's return_attn_probs): the normalised probabilities
  // exp(s_ij - lse_i), dtype of q, (batch, nheads, seqlen_q, seqlen_k) contiguous, or
  // (batch, nheads, max_seqlen_q, max_seqlen_k) for varlen (entries past a batch's lengths are
  // written 0). Computed by a separate pass from the lse (needs softmax_lse too).
  const TensorView* attn_probs = nullptr;
  // FP8 (q, k, v e4m3; out bf16): optional fp32 descale factors, the inputs' values being
  // x_e4m3 * descale (FlashAttention-3's q_descale, k_descale, v_descale). Each one element (per
  // tensor) or (batch, nheads_kv) contiguous (per sequence and kv head; all three alike); absent:
  // 1. Only with e4m3 inputs.
  const TensorView* q_descale = nullptr;
  const TensorView* k_descale = nullptr;
  const TensorView* v_descale = nullptr;
  // Dropout on the probabilities (training): p_ij is kept with probability 1 - dropout_p and then
  // weighs v_j by 1 / (1 - dropout_p), else dropped. The mask is a function of (dropout_seed,
  // dropout_offset, batch, head, row, key) alone (Philox4x32-10, kernels/common/philox.cuh), so
  // the backward given the same three regenerates it; a caller advances the offset (or the seed)
  // between calls that must not share a mask. dropout_p finite, in [0, 1); > 0 runs on rungs 1
  // and 3 (kAttnFwdRungAuto takes rung 3), not with e4m3 inputs. softmax_lse is that
  // before dropout; attn_probs writes a dropped entry as -p_ij (flash-attn's convention).
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;
  uint32_t dropout_offset = 0;
};

// q: (batch, seqlen_q, nheads, headdim), k, v: (batch, seqlen_k, nheads_kv, headdim), out: like
// q; or, varlen, q/out: (total_q, nheads, headdim), k/v: (total_k, nheads_kv, headdim).
// fp16 or bf16 (all four the same), or FP8: q, k, v e4m3 and out bf16 (rung 4 on sm_90, head dim
// 128; no attn_probs; over more than 2048 keys V is transposed into a workspace of batch x
// nheads_kv x 128 x seqlen_k rounded up to 128 bytes first); on one CUDA device; any
// batch/row/head strides with a unit stride in the head dim; 16-byte aligned pointers and strides (multiples of 16 bytes).
// headdim one of kAttnHeadDims; nheads a multiple of nheads_kv (GQA/MQA); seqlen_q,
// seqlen_k >= 1 (fixed length); out must not overlap q, k, v or itself; softmax_lse and
// attn_probs must not overlap the inputs, out or each other, nor the inputs cu_seqlens and
// alibi_slopes any output. Optional tensors are aligned to their element size.
// Rung 4 also needs a compute capability 9.x device, a head dim of 64 .. 256 and positive strides
// on every dim of size > 1 (TMA); the automatic choice takes rung 3 where these do not hold.
// Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid arguments.
void attention_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   cudaStream_t stream = nullptr, int rung = kAttnFwdRungAuto, const AttnFwdOptions& options = {});

// Bytes of device workspace a rung needs for these shapes (rung 1: the fp32 S/P matrix; rung 2:
// the fp32 output accumulator and the running max and sum of every row; rungs 3 and 4: none;
// kAttnFwdRungAuto: none). Not counted: rung 4's per-stream scratch, FP8's transposed V over more
// than 2048 keys (batch x kv heads x headdim x seqlen_k rounded up to 128, bytes) and the parts of
// a split last wave of tiles (FP8 without a mask or causal, head dim 64 without a mask: at most
// SMs x 192 x (headdim + 1) x 4 bytes).
// attention_fwd allocates it itself (stream-ordered, on `stream`); exposed for the memory
// comparison of the ladder. For varlen, seqlen_q / seqlen_k are the totals (rung 1: the sum
// over batches of seqlen_q x seqlen_k is at most total_q x max_seqlen_k).
int64_t attention_fwd_workspace_bytes(int rung, int64_t batch, int64_t nheads, int64_t seqlen_q, int64_t seqlen_k,
                                      int64_t headdim);

// --- Backward --------------------------------------------------------------------------------
// Gradients of L = sum(dout * out) with respect to q, k, v, for out = attention_fwd(q, k, v) with
// the same options. Recomputes the probabilities p_ij = exp(s_ij - lse_i) from the forward's
// softmax_lse instead of storing them; with D_i = dout_i . out_i,
//   dv_j = sum_i p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
//   dq_i = sum_j ds_ij g_ij k_j,  dk_j = sum_i ds_ij g_ij q_i,
// g_ij = d s_ij / d (q_i . k_j) (the scale; times 1 - tanh^2 with softcap). GQA/MQA: a KV head's
// dk and dv are summed over the query heads that share it. Masked entries and rows that see no
// key contribute nothing. Ladder (kernels/attention/backward/, doc: docs/ladder/attention.md):
//   1 naive: P and dS materialised in global memory, one thread per element of each product
//     (deterministic: no atomics)
//   2 FlashAttention-2 style: a thread block per (key block, KV head, batch), mma.sync, P and dS
//     recomputed per block in shared memory, dK and dV in registers, dQ by fp32 atomics
//   3 Hopper (FlashAttention-3 class): TMA, wgmma on the transposed problem (S^T = K Q^T, so P^T
//     and dS^T feed dV and dK from registers), a producer warpgroup and two consumer
//     warpgroups; sm_90 only, head dims 64, 128 and 256 (256: its own kernel, the consumers
//     splitting the head dim; no softcap), no dropout (top)
inline constexpr int kAttnBwdRungs = 3;
// The automatic choice: rung 3 where it applies (sm_90, head dim 64, 128 or 256 (without
// softcap), no dropout, strides TMA can walk), else rung 2; with options.deterministic rung 1 (the top rung that is
// deterministic: rungs 2 and 3 add dQ by atomics, in an order that varies from run to run).
// Dropout takes the forward's dropout_p, seed and offset, the same as given to it: the mask is
// regenerated (rungs 1 and 2).
inline constexpr int kAttnBwdRungAuto = -1;

// The forward's options, plus:
struct AttnBwdOptions : AttnFwdOptions {
  // Bit-identical gradients from run to run (flash-attn's `deterministic`): rung 1 always; rungs
  // 2 and 3 never (rejected with deterministic = true); the automatic choice takes rung 1 then.
  bool deterministic = false;
};

// q, k, v, out and the options as given to (and returned by) attention_fwd: the same shapes,
// layouts, dtypes (fp16 / bf16; not FP8) and restrictions. options.softmax_lse is required here
// and read (the forward's lse); options.attn_probs and the FP8 descale factors must be absent.
// dout: like out (the gradient of the output); dq: like q; dk, dv: like k (written, not
// accumulated; any strides with a contiguous head dim, 16-byte aligned). The outputs must not
// overlap each other, themselves or any input. Enqueued on `stream`; throws flashlab::Error
// (nothing launched) on invalid arguments.
void attention_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   cudaStream_t stream = nullptr, int rung = kAttnBwdRungAuto, const AttnBwdOptions& options = {});

// Bytes of device workspace the backward rung needs (rung 1: the fp32 P and dS matrices,
// batch x nheads x seqlen_q x seqlen_k each, and D, batch x nheads x seqlen_q; rungs 2, 3: the fp32
// dq accumulator, D and lse log2(e) for batch x nheads x (seqlen_q rounded up to a multiple of
// 128) rows, headdim + 2 floats a row in all; kAttnBwdRungAuto: rung 2's; for
// varlen the max lengths, with batch x max_seqlen_q >= total_q). attention_bwd allocates it
// itself (stream-ordered, on `stream`).
int64_t attention_bwd_workspace_bytes(int rung, int64_t batch, int64_t nheads, int64_t seqlen_q, int64_t seqlen_k,
                                      int64_t headdim);

}  // namespace flashlab
