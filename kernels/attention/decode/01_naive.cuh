// Decode rung 1 — the textbook batch decode over a paged KV cache (include/flashlab/serving.h,
// batch_decode_paged): one thread block per (request, query head), one query token each.
//   - Its 4 warps take the request's keys round-robin (key j to warp j % 4), each key's page
//     looked up in the page table; the lanes split the head dim (element l + 32 e to lane l: a
//     warp reads 32 consecutive elements at a time), the score is a warp-shuffle sum.
//   - Each warp keeps an online softmax (running max m, sum l, its lanes' share of the output
//     accumulator), in fp32 with exp2 on log2(e)-scaled scores; the 4 partial states are merged
//     through shared memory at the end (as merge_states does), out rounded once, lse natural log.
//   - GQA: query head h reads KV head h / (nheads / nheads_kv) — every query head of a group
//     streams the same KV again (rung 2's change).
// A request without keys writes out = 0 and lse = -inf.
// Limits: memory-bound and latency-bound at once: one key per warp in flight, scalar 2-byte
// loads, the group's KV read once per query head, one block per (request, head) however long
// the request (a long request runs on one SM: split-KV's change).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

struct PagedDecodeParams {
  const void* q;  // (batch, nheads, headdim), rows q_batch_stride / heads q_head_stride apart
  int64_t q_batch_stride, q_head_stride;
  const void *k_cache, *v_cache;
  int64_t page_stride, slot_stride, head_stride;  // elements, k_cache (NHD / HND differ only here)
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int *kv_indices, *kv_indptr, *kv_last_page_len;
  void* out;  // (batch, nheads, headdim)
  int64_t out_batch_stride, out_head_stride;
  float* lse;  // (batch, nheads) contiguous, or nullptr
  float scale;
  int batch, nheads, nheads_kv, page_size;
};

// Grid (nheads, batch), 128 threads.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(128) paged_decode_naive_kernel(const __grid_constant__ PagedDecodeParams p) {
  constexpr int kWarps = 4, kE = kHeadDim / 32;  // head-dim elements per lane
  constexpr float kLog2e = 1.4426950408889634f;
  static_assert(kHeadDim % 32 == 0 && kE <= 8, "head dims 32 .. 256, multiples of 32");
  __shared__ float s_m[kWarps], s_l[kWarps], s_acc[kWarps][kHeadDim];
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x % 32;
  // The warp index as a broadcast from lane 0: the compiler then knows the key loop below is
  // uniform across the warp (its shuffles need no divergence path, which spilled 16 bytes).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const int hk = h / (p.nheads / p.nheads_kv);
  const int first = p.kv_indptr[b], pages = p.kv_indptr[b + 1] - first;
  const int len = pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0;

  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  float qs[kE], acc[kE];
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int e = 0; e < kE; ++e) qs[e] = to_float(q[lane + 32 * e]) * scale_log2, acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;  // log2 units
  for (int j = warp; j < len; j += kWarps) {
    const int64_t page = p.kv_indices[first + j / p.page_size], slot = j % p.page_size;
    const T* k = static_cast<const T*>(p.k_cache) + page * p.page_stride + slot * p.slot_stride + hk * p.head_stride;
    const T* v = static_cast<const T*>(p.v_cache) + page * p.v_page_stride + slot * p.v_slot_stride + hk * p.v_head_stride;
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kE; ++e) dot += qs[e] * to_float(k[lane + 32 * e]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float m_new = fmaxf(m, dot);
    const float keep = exp2f(m - m_new), w = exp2f(dot - m_new);  // m = -inf first: keep = 0
    l = l * keep + w;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[e] = acc[e] * keep + w * to_float(v[lane + 32 * e]);
    m = m_new;
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int e = 0; e < kE; ++e) s_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();

  // Merge the warps' states: M = max m_w, L = sum l_w 2^(m_w - M), O = sum acc_w 2^(m_w - M) / L.
  float big = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, s_m[w]);
  const float off = big == -INFINITY ? 0.f : big;  // no key anywhere: every weight 0, not NaN
  float wsum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) wsum += s_l[w] * exp2f(s_m[w] - off);
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  T* out = static_cast<T*>(p.out) + b * p.out_batch_stride + h * p.out_head_stride;
#pragma unroll
  for (int c0 = 0; c0 < kHeadDim; c0 += 128) {
    const int c = c0 + static_cast<int>(threadIdx.x);
    if (c >= kHeadDim) break;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][c] * exp2f(s_m[w] - off);
    out[c] = from_float<T>(o * inv);
  }
  if (threadIdx.x == 0 && p.lse != nullptr)
    p.lse[static_cast<int64_t>(b) * p.nheads + h] = wsum > 0.f ? (off + log2f(wsum)) * 0.6931471805599453f : -INFINITY;
}

}  // namespace flashlab::kernels
