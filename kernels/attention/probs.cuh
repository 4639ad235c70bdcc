// The attention probabilities P = exp(s - lse) for tests (flash-attn's return_attn_probs), from
// the lse a rung wrote: a separate pass that recomputes each score (rung 1's attn_naive_logit), so
// that the rungs themselves never store an N x N matrix.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/01_naive.cuh"
#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

// probs: (batch, nheads, max_sq, max_sk) in T, every entry written (0 past a batch's lengths,
// where masked, and on fully masked rows); with dropout a dropped entry as -p (flash-attn's
// convention: the sign shows the mask, the magnitude the probability before dropout). Grid (ceil(max_sk / 32) * ceil(max_sq / 8), nheads,
// batch), block (32, 8).
template <typename T>
__global__ void attn_probs_kernel(const __grid_constant__ AttnFwdParams p, T* probs) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int blocks_j = (p.seqlen_k + 31) / 32;
  const int j = (blockIdx.x % blocks_j) * 32 + threadIdx.x, i = (blockIdx.x / blocks_j) * 8 + threadIdx.y;
  if (i >= p.seqlen_q || j >= p.seqlen_k) return;
  const AttnBatch sb = attn_batch(p, b);
  float value = 0.f;
  if (i < sb.sq && j < sb.sk) {
    const int64_t at = attn_lse_offset(p, b, h, sb, i);
    const float lse = p.lse[at];
    const float s = attn_naive_logit<T>(p, b, h, sb, i, j);
    value = lse == -INFINITY || s == -INFINITY ? 0.f : expf(s - lse);
    if (attn_dropout_weight(p, b, h, i, j) == 0.f) value = -value;
  }
  probs[((static_cast<int64_t>(b) * p.nheads + h) * p.seqlen_q + i) * p.seqlen_k + j] = from_float<T>(value);
}

}  // namespace flashlab::kernels
