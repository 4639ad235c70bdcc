// Backward rung 1 — naive: P and dS materialised in global memory (the GPU reference rung).
//
// With L = sum(dout * out) and, per (batch, head), P = softmax(S) of the forward (recomputed from
// the saved lse: p_ij = exp(s_ij - lse_i)) and Z its dropout weights (all 1 without dropout;
// regenerated from the forward's seed and offset):
//   dV = (P Z)^T dO,   dP = (dO V^T) Z,   D_i = sum_j p_ij dp_ij = dO_i . O_i,
//   dS = P * (dP - D)  (softmax backward),   dQ = (dS * g) K,   dK = (dS * g)^T Q,
// g_ij = d s_ij / d (q_i . k_j): the scale, times 1 - tanh^2(scale q.k / softcap) with softcap
// (ALiBi and the mask add constants: nothing to differentiate). GQA: a KV head's dK and dV sum
// over the query heads of its group. Four kernels, every value fp32, each output rounded once:
//   1. D_i = dO_i . O_i, one thread per row (O as the forward stored it, as FlashAttention does);
//   2. one thread per (batch, head, row i, key j): the logit again (attn_naive_dot, attn_logit),
//      p_ij, dp_ij = dO_i . V_j, ds_ij g_ij -> two fp32 matrices (batch, nheads, max_sq, max_sk)
//      in a workspace;
//   3. dQ: one thread per (batch, head, row, column of the head dim), a sum over keys;
//   4. dK, dV: one thread per (batch, KV head, key, column), a sum over the group's heads and
//      the rows.
// No atomics anywhere, so the result is deterministic. Memory: two fp32 matrices of
// batch x nheads x sq x sk (what FlashAttention's backward never stores: the next rung
// recomputes P block by block from Q, K and the lse); every dot product reads its rows from
// global memory / L2.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/01_naive.cuh"
#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

// Step 1. One thread per (batch, head, row): grid (ceil(max_sq / 128), nheads, batch).
template <typename T>
__global__ void attn_bwd_naive_dsum_kernel(const __grid_constant__ AttnBwdParams p) {
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq) return;
  const T* o = static_cast<const T*>(p.o) + attn_offset(p, b, sb.q_row0, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  const T* dout = static_cast<const T*>(p.dout) +
                  attn_offset(p, b, sb.q_row0, i, h, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  float acc = 0.f;
  for (int c = 0; c < p.headdim; ++c) acc += to_float(dout[c]) * to_float(o[c]);
  p.dsum[(static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + i] = acc;
}

// Step 2. One thread per (batch, head, row, key): grid (ceil(max_sk / 32) * ceil(max_sq / 8),
// nheads, batch), block (32, 8). prob (p z) and dsg: (batch, nheads, max_sq, max_sk) fp32.
template <typename T>
__global__ void attn_bwd_naive_ds_kernel(const __grid_constant__ AttnBwdParams p, float* prob, float* dsg) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int blocks_j = (p.seqlen_k + 31) / 32;
  const int j = (blockIdx.x % blocks_j) * 32 + threadIdx.x, i = (blockIdx.x / blocks_j) * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq || j >= sb.sk) return;
  const AttnScoreMod mod = attn_score_mod(p, b, h, sb);
  const float dot = attn_naive_dot<T>(p, b, h, sb, i, j);
  const float s = attn_logit(dot, i, j, mod);
  const float lse = p.lse[attn_lse_offset(p, b, h, sb, i)];
  // Masked keys and rows that see no key (lse = -inf) have p = 0: no gradient through them.
  const float pij = s == -INFINITY || lse == -INFINITY ? 0.f : expf(s - lse);
  const int hk = h / (p.nheads / p.nheads_kv);
  const T* dout = static_cast<const T*>(p.dout) +
                  attn_offset(p, b, sb.q_row0, i, h, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  const T* v = static_cast<const T*>(p.v) + attn_offset(p, b, sb.k_row0, j, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  float dp = 0.f;
  for (int c = 0; c < p.headdim; ++c) dp += to_float(dout[c]) * to_float(v[c]);
  const float z = attn_dropout_weight(p, b, h, i, j);
  dp *= z;
  const float ds = pij * (dp - p.dsum[(static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + i]);
  float g = mod.scale;
  if (mod.softcap > 0.f) {
    const float t = tanhf(dot * mod.scale / mod.softcap);
    g *= 1.f - t * t;
  }
  const int64_t at = attn_naive_s_row(prob, p, b, h, i) - prob + j;
  prob[at] = pij * z;  // what dV takes
  dsg[at] = ds * g;
}

// Step 3. dQ = (dS g) K: one thread per (batch, head, row, column): grid (ceil(d / 32) *
// ceil(max_sq / 8), nheads, batch), block (32, 8).
template <typename T>
__global__ void attn_bwd_naive_dq_kernel(const __grid_constant__ AttnBwdParams p, const float* dsg) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int blocks_c = (p.headdim + 31) / 32;
  const int c = (blockIdx.x % blocks_c) * 32 + threadIdx.x, i = (blockIdx.x / blocks_c) * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq || c >= p.headdim) return;
  const int hk = h / (p.nheads / p.nheads_kv);
  const float* row = attn_naive_s_row(const_cast<float*>(dsg), p, b, h, i);
  const T* k = static_cast<const T*>(p.k) + attn_offset(p, b, sb.k_row0, 0, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  float acc = 0.f;
  for (int j = 0; j < sb.sk; ++j) acc += row[j] * to_float(k[j * p.k_row_stride + c]);
  T* dq = static_cast<T*>(p.dq) + attn_offset(p, b, sb.q_row0, i, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  dq[c] = from_float<T>(acc);
}

// Step 4. dK = (dS g)^T Q and dV = (P Z)^T dO, summed over the query heads of KV head hk: one thread
// per (batch, KV head, key, column): grid (ceil(d / 32) * ceil(max_sk / 8), nheads_kv, batch),
// block (32, 8).
template <typename T>
__global__ void attn_bwd_naive_dkdv_kernel(const __grid_constant__ AttnBwdParams p, const float* prob, const float* dsg) {
  const int b = blockIdx.z, hk = blockIdx.y;
  const int blocks_c = (p.headdim + 31) / 32;
  const int c = (blockIdx.x % blocks_c) * 32 + threadIdx.x, j = (blockIdx.x / blocks_c) * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (j >= sb.sk || c >= p.headdim) return;
  const int group = p.nheads / p.nheads_kv;
  float acc_k = 0.f, acc_v = 0.f;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const T* q = static_cast<const T*>(p.q) + attn_offset(p, b, sb.q_row0, 0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const T* dout = static_cast<const T*>(p.dout) +
                    attn_offset(p, b, sb.q_row0, 0, h, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
    const int64_t col = attn_naive_s_row(const_cast<float*>(prob), p, b, h, 0) - prob + j;  // (i = 0, j)
    for (int i = 0; i < sb.sq; ++i) {
      const int64_t at = col + static_cast<int64_t>(i) * p.seqlen_k;
      acc_k += dsg[at] * to_float(q[i * p.q_row_stride + c]);
      acc_v += prob[at] * to_float(dout[i * p.dout_row_stride + c]);
    }
  }
  T* dk = static_cast<T*>(p.dk) + attn_offset(p, b, sb.k_row0, j, hk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  T* dv = static_cast<T*>(p.dv) + attn_offset(p, b, sb.k_row0, j, hk, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  dk[c] = from_float<T>(acc_k);
  dv[c] = from_float<T>(acc_v);
}

}  // namespace flashlab::kernels
