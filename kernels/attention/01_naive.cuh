// Rung 1 — naive attention: the score matrix materialised in global memory.
//
// The textbook three steps, one kernel each, every value in fp32:
//   1. S = logits(Q K^T): one thread per (batch, head, row i, key j), a dot product over the
//      head dim read straight from global memory, then scale / softcap / ALiBi / mask
//      (attn_logit) -> S, (batch, nheads, max_sq, max_sk) fp32 in a workspace;
//   2. softmax over each row of S, in place (one thread per row: max, sum, then P = exp(s - max)
//      / sum) and lse = max + log(sum);
//   3. O = P V: one thread per (batch, head, row, column of the head dim), rounded once; with
//      dropout, P z (z = attn_dropout_weight: 0 or 1 / (1 - p), regenerated from the seed).
// Memory: the workspace is batch x nheads x sq x sk x 4 bytes: O(N^2) in the sequence length
// (8 GB for batch 1, 32 heads, 8k x 8k), which is what the next rungs remove. Reads: every
// score re-reads a row of Q and of K (d values each) from global memory / L2.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

// Row r of S in the workspace: (batch, head, max_sq, max_sk).
__device__ __forceinline__ float* attn_naive_s_row(float* s, const AttnFwdParams& p, int b, int h, int i) {
  return s + ((static_cast<int64_t>(b) * p.nheads + h) * p.seqlen_q + i) * p.seqlen_k;
}

// q_i . k_j of (batch b, head h) over the head dim, straight from global memory.
template <typename T>
__device__ __forceinline__ float attn_naive_dot(const AttnFwdParams& p, int b, int h, const AttnBatch& sb, int i, int j) {
  const int hk = h / (p.nheads / p.nheads_kv);
  const T* q = static_cast<const T*>(p.q) + attn_offset(p, b, sb.q_row0, i, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  const T* k = static_cast<const T*>(p.k) + attn_offset(p, b, sb.k_row0, j, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  float dot = 0.f;
  for (int c = 0; c < p.headdim; ++c) dot += to_float(q[c]) * to_float(k[c]);
  return dot;
}

// The logit s_ij of (batch b, head h): attn_naive_dot, then attn_logit. Also what the probs pass
// (probs.cuh) and the naive backward recompute.
template <typename T>
__device__ __forceinline__ float attn_naive_logit(const AttnFwdParams& p, int b, int h, const AttnBatch& sb, int i, int j) {
  return attn_logit(attn_naive_dot<T>(p, b, h, sb, i, j), i, j, attn_score_mod(p, b, h, sb));
}

// Step 1. Grid (ceil(max_sk / 32) * ceil(max_sq / 8), nheads, batch), block (32, 8).
template <typename T>
__global__ void attn_naive_scores_kernel(const __grid_constant__ AttnFwdParams p, float* s) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int blocks_j = (p.seqlen_k + 31) / 32;
  const int j = (blockIdx.x % blocks_j) * 32 + threadIdx.x, i = (blockIdx.x / blocks_j) * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq || j >= sb.sk) return;
  attn_naive_s_row(s, p, b, h, i)[j] = attn_naive_logit<T>(p, b, h, sb, i, j);
}

// Step 2. One thread per (batch, head, row): grid (ceil(max_sq / 128), nheads, batch). static:
// this header is included by the forward and the naive backward (one copy per translation unit
// of this non-template kernel, each launched only by its own).
static __global__ void attn_naive_softmax_kernel(const __grid_constant__ AttnFwdParams p, float* s) {
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq) return;
  float* row = attn_naive_s_row(s, p, b, h, i);
  float m = -INFINITY;
  for (int j = 0; j < sb.sk; ++j) m = fmaxf(m, row[j]);
  float sum = 0.f;
  if (m != -INFINITY)
    for (int j = 0; j < sb.sk; ++j) sum += expf(row[j] - m);
  // Fully masked row (or no keys): P = 0, lse = -inf.
  for (int j = 0; j < sb.sk; ++j) row[j] = sum > 0.f ? expf(row[j] - m) / sum : 0.f;
  if (p.lse != nullptr) {
    const int64_t at = attn_lse_offset(p, b, h, sb, i);
    p.lse[at] = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
}

// Step 3. One thread per (batch, head, row, column): grid (ceil(d / 32) * ceil(max_sq / 8),
// nheads, batch), block (32, 8).
template <typename T>
__global__ void attn_naive_pv_kernel(const __grid_constant__ AttnFwdParams p, const float* s) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int blocks_c = (p.headdim + 31) / 32;
  const int c = (blockIdx.x % blocks_c) * 32 + threadIdx.x, i = (blockIdx.x / blocks_c) * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq || c >= p.headdim) return;
  const int hk = h / (p.nheads / p.nheads_kv);
  const float* row = attn_naive_s_row(const_cast<float*>(s), p, b, h, i);
  const T* v = static_cast<const T*>(p.v) + attn_offset(p, b, sb.k_row0, 0, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  float acc = 0.f;
  for (int j = 0; j < sb.sk; ++j) acc += row[j] * attn_dropout_weight(p, b, h, i, j) * to_float(v[j * p.v_row_stride + c]);
  T* o = static_cast<T*>(p.o) + attn_offset(p, b, sb.q_row0, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  o[c] = from_float<T>(acc);
}

}  // namespace flashlab::kernels
