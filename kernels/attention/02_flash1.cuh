// Rung 2 — FlashAttention-1: tiles and the online softmax, on CUDA cores, in FA1's loop order.
//
// Changes from rung 1: S is never stored. Keys and values are cut into blocks of kBlock keys;
// for each key block the running statistics of every row are updated with the online softmax:
//   m' = max(m, max_j s_ij),  l' = l e^(m - m') + sum_j e^(s_ij - m'),
//   O' = O e^(m - m') + sum_j e^(s_ij - m') v_j
// so that after the last block O / l is the softmax-weighted sum and m + log(l) the lse.
// Loop order (the FA1 paper's): one thread block per (batch, head); the OUTER loop walks key/
// value blocks (loaded once into shared memory), the INNER loop walks query blocks, and each
// (key block, query block) step reads the query block's O, m, l from global memory, updates them
// and writes them back. Steps of one inner iteration (kBlock rows x kBlock keys, 128 threads):
//   1. load the query block into shared memory (16-bit, as stored);
//   2. S = logits(Q K^T) into shared memory (fp32 dot products, attn_logit);
//   3. per row (a warp per row): m', the rescale factor e^(m - m'), P = e^(S - m') in place, l';
//   4. O = O e^(m - m') + P V, read-modify-write of the fp32 accumulator rows in global memory.
// Pairs whose key block is fully masked for the whole query block (causal, window) are skipped.
// A final kernel divides O by l, rounds to the output dtype and writes the lse.
// Memory: O (fp32), m and l live in a workspace of batch x nheads x sq x (d + 2) x 4 bytes:
// O(N), not O(N^2). Traffic: O is read and written once per key block (O(N^2 d / kBlock)),
// which is what FA2's loop order removes; and there is only batch x nheads thread blocks.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

inline constexpr int kFlash1Threads = 128;

// Rows (and keys) per block: 32 up to head dim 128, 16 above (three 16-bit tiles of kBlock x d
// in shared memory stay under 48 KB).
template <int kHeadDim>
inline constexpr int kFlash1Block = kHeadDim <= 128 ? 32 : 16;

// Workspace: O (batch, nheads, max_sq, d) fp32, then m and l (batch, nheads, max_sq) fp32 each.
struct Flash1Workspace {
  float* o;
  float* m;
  float* l;
};

__host__ __device__ inline Flash1Workspace flash1_workspace(void* base, const AttnFwdParams& p) {
  float* o = static_cast<float*>(base);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.nheads * p.seqlen_q;
  return {o, o + rows * p.headdim, o + rows * p.headdim + rows};
}

// O = 0, m = -inf, l = 0 for every row. Grid-stride.
__global__ void attn_flash1_init_kernel(const __grid_constant__ AttnFwdParams p, void* workspace) {
  const Flash1Workspace w = flash1_workspace(workspace, p);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.nheads * p.seqlen_q;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < rows * p.headdim;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    w.o[e] = 0.f;
    if (e < rows) w.m[e] = -INFINITY, w.l[e] = 0.f;
  }
}

// Grid (nheads, batch), kFlash1Threads threads.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kFlash1Threads) attn_flash1_kernel(const __grid_constant__ AttnFwdParams p, void* workspace) {
  constexpr int kB = kFlash1Block<kHeadDim>;
  constexpr int kWarps = kFlash1Threads / 32;
  __shared__ T ks[kB][kHeadDim], vs[kB][kHeadDim], qs[kB][kHeadDim];  // (kB, d) each
  __shared__ float s[kB][kB + 1];                                      // (rows, keys), +1: no bank conflicts by column
  __shared__ float rescale[kB];                                        // e^(m - m') per row of the block
  const int h = blockIdx.x, b = blockIdx.y;
  const int hk = h / (p.nheads / p.nheads_kv);
  const AttnBatch sb = attn_batch(p, b);
  const AttnScoreMod mod = attn_score_mod(p, b, h, sb);
  const Flash1Workspace w = flash1_workspace(workspace, p);
  const int64_t row_base = (static_cast<int64_t>(b) * p.nheads + h) * p.seqlen_q;  // this (b, h)'s first row in the workspace
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int k0 = 0; k0 < sb.sk; k0 += kB) {  // outer: key/value blocks
    __syncthreads();                        // the previous block's readers are done with ks / vs
    for (int e = threadIdx.x; e < kB * kHeadDim; e += kFlash1Threads) {
      const int r = e / kHeadDim, c = e % kHeadDim;
      const bool in = k0 + r < sb.sk;
      const int64_t ko = attn_offset(p, b, sb.k_row0, k0 + r, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
      const int64_t vo = attn_offset(p, b, sb.k_row0, k0 + r, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
      ks[r][c] = in ? static_cast<const T*>(p.k)[ko + c] : from_float<T>(0.f);
      vs[r][c] = in ? static_cast<const T*>(p.v)[vo + c] : from_float<T>(0.f);
    }
    for (int i0 = 0; i0 < sb.sq; i0 += kB) {  // inner: query blocks
      const int rows = sb.sq - i0 < kB ? sb.sq - i0 : kB;
      const AttnKeyRange kr = attn_key_range(i0, i0 + rows, sb.sk, mod.diag, mod.window_left, mod.window_right);
      if (kr.hi <= k0 || kr.lo >= k0 + kB) continue;  // the whole pair is masked
      __syncthreads();  // ks / vs loaded; the previous pair's readers of qs / s are done
      for (int e = threadIdx.x; e < kB * kHeadDim; e += kFlash1Threads) {  // 1. Q block
        const int r = e / kHeadDim, c = e % kHeadDim;
        const int64_t qo = attn_offset(p, b, sb.q_row0, i0 + r, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
        qs[r][c] = r < rows ? static_cast<const T*>(p.q)[qo + c] : from_float<T>(0.f);
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kB * kB; e += kFlash1Threads) {  // 2. S = logits(Q K^T)
        const int r = e / kB, j = e % kB;
        float dot = 0.f;
#pragma unroll 8
        for (int c = 0; c < kHeadDim; ++c) dot += to_float(qs[r][c]) * to_float(ks[j][c]);
        s[r][j] = r < rows && k0 + j < sb.sk ? attn_logit(dot, i0 + r, k0 + j, mod) : -INFINITY;
      }
      __syncthreads();
      for (int r = warp; r < rows; r += kWarps) {  // 3. online softmax, a warp per row
        float mb = -INFINITY;
        for (int j = lane; j < kB; j += 32) mb = fmaxf(mb, s[r][j]);
        for (int o = 16; o > 0; o >>= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        const float m_old = w.m[row_base + i0 + r];
        const float m_new = fmaxf(m_old, mb);
        float sum = 0.f;
        for (int j = lane; j < kB; j += 32) {
          const float e = m_new == -INFINITY ? 0.f : expf(s[r][j] - m_new);  // all masked so far: P = 0
          s[r][j] = e;
          sum += e;
        }
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float scale = m_old == -INFINITY ? 0.f : expf(m_old - m_new);  // nothing to rescale yet: 0 (O, l are 0)
        if (lane == 0) {
          rescale[r] = scale;
          w.m[row_base + i0 + r] = m_new;
          w.l[row_base + i0 + r] = w.l[row_base + i0 + r] * scale + sum;
        }
      }
      __syncthreads();
      for (int e = threadIdx.x; e < rows * kHeadDim; e += kFlash1Threads) {  // 4. O = O e^(m - m') + P V
        const int r = e / kHeadDim, c = e % kHeadDim;
        float acc = 0.f;
        for (int j = 0; j < kB; ++j) acc += s[r][j] * to_float(vs[j][c]);
        float* o = w.o + (row_base + i0 + r) * kHeadDim + c;
        *o = *o * rescale[r] + acc;
      }
    }
  }
}

// o = O / l rounded to T (0 for a row that saw no key), lse = m + log(l) (-inf then).
// Grid (ceil(max_sq / 8), nheads, batch), block (32, 8): a warp per row.
template <typename T>
__global__ void attn_flash1_finish_kernel(const __grid_constant__ AttnFwdParams p, const void* workspace) {
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * 8 + threadIdx.y;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq) return;
  const Flash1Workspace w = flash1_workspace(const_cast<void*>(workspace), p);
  const int64_t row = (static_cast<int64_t>(b) * p.nheads + h) * p.seqlen_q + i;
  const float l = w.l[row];
  const float inv = l > 0.f ? 1.f / l : 0.f;
  T* o = static_cast<T*>(p.o) + attn_offset(p, b, sb.q_row0, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  for (int c = threadIdx.x; c < p.headdim; c += 32) o[c] = from_float<T>(w.o[row * p.headdim + c] * inv);
  if (threadIdx.x == 0 && p.lse != nullptr) {
    const int64_t at = attn_lse_offset(p, b, h, sb, i);
    p.lse[at] = l > 0.f ? w.m[row] + logf(l) : -INFINITY;
  }
}

}  // namespace flashlab::kernels
