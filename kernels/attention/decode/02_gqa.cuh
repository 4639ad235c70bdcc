// Decode rung 2 — GQA-aware: a thread block per (request, KV head, chunk of up to kG of its query
// heads), so each K and V row is read once for the group (rung 1 read it once per query head).
//
// Changes from rung 1:
//   - The block's query heads (kG of the group, 1 .. 8) share every key: a warp loads the key's
//     row once and computes kG dot products from it, keeping kG online-softmax states (max, sum
//     and its lanes' output share per head). GQA 32 / 8 (group 4): a quarter of rung 1's K/V bytes.
//   - Each lane loads a contiguous slice of d / 32 elements (8 bytes at d 128 in 16-bit types,
//     16 at d 256) instead of strided 2-byte elements: a warp reads the row in one or two
//     instructions.
// Like rung 1: warps round-robin over the request's keys, the page looked up per key, fp32 with
// exp2, the warps' states merged in shared memory, out and the natural-log lse.
// Limits: one key per warp in flight (no prefetch of the next pages), kG shuffle reductions per
// key, and a long request still runs on one block per (KV head, chunk): split-KV's change.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/decode/01_naive.cuh"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

// kE consecutive elements at p (aligned to their total size, when it is 4, 8 or a multiple of 16
// bytes) as floats, by the widest loads that size allows.
template <typename T, int kE>
__device__ __forceinline__ void load_slice(const T* p, float (&out)[kE]) {
  constexpr int kBytes = kE * static_cast<int>(sizeof(T));
  constexpr int kChunk = kBytes % 16 == 0 ? 16 : kBytes == 8 ? 8 : kBytes == 4 ? 4 : static_cast<int>(sizeof(T));
  constexpr int kPer = kChunk / static_cast<int>(sizeof(T));  // elements per load
#pragma unroll
  for (int c = 0; c < kE / kPer; ++c) {
    alignas(kChunk) T v[kPer];
    if constexpr (kChunk == 16) *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p + c * kPer);
    else if constexpr (kChunk == 8) *reinterpret_cast<uint2*>(v) = *reinterpret_cast<const uint2*>(p + c * kPer);
    else if constexpr (kChunk == 4) *reinterpret_cast<uint32_t*>(v) = *reinterpret_cast<const uint32_t*>(p + c * kPer);
    else v[0] = p[c * kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) out[c * kPer + e] = to_float(v[e]);
  }
}

// Grid (nheads_kv x ceil(group / kG), batch), 128 threads; group = nheads / nheads_kv.
template <typename T, int kHeadDim, int kG>
__global__ void __launch_bounds__(128) paged_decode_gqa_kernel(const __grid_constant__ PagedDecodeParams p) {
  constexpr int kWarps = 4, kE = kHeadDim / 32;  // contiguous head-dim elements per lane
  constexpr float kLog2e = 1.4426950408889634f;
  static_assert(kHeadDim % 32 == 0 && kE <= 8 && kG >= 1 && kG <= 8, "head dims 32 .. 256; 1 .. 8 heads a block");
  __shared__ float s_m[kWarps][kG], s_l[kWarps][kG], s_acc[kWarps][kG][kHeadDim];
  const int group = p.nheads / p.nheads_kv, chunks = (group + kG - 1) / kG;
  const int hk = blockIdx.x / chunks, chunk = blockIdx.x % chunks, b = blockIdx.y, lane = threadIdx.x % 32;
  const int h0 = hk * group + chunk * kG, ng = min(kG, group - chunk * kG);  // query heads h0 .. h0 + ng - 1
  // The warp index from lane 0: a warp-uniform key loop for the compiler (as rung 1).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const int first = p.kv_indptr[b], pages = p.kv_indptr[b + 1] - first;
  const int len = pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0;

  float qs[kG][kE], acc[kG][kE], m[kG], l[kG];
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + (h0 + (g < ng ? g : 0)) * p.q_head_stride + lane * kE;
#pragma unroll
    for (int e = 0; e < kE; ++e) qs[g][e] = to_float(q[e]) * scale_log2, acc[g][e] = 0.f;
    m[g] = -INFINITY, l[g] = 0.f;
  }
  for (int j = warp; j < len; j += kWarps) {
    const int64_t page = p.kv_indices[first + j / p.page_size], slot = j % p.page_size;
    const T* kp = static_cast<const T*>(p.k_cache) + page * p.page_stride + slot * p.slot_stride + hk * p.head_stride + lane * kE;
    const T* vp = static_cast<const T*>(p.v_cache) + page * p.v_page_stride + slot * p.v_slot_stride + hk * p.v_head_stride + lane * kE;
    float kf[kE], vf[kE];
    load_slice<T, kE>(kp, kf);
    load_slice<T, kE>(vp, vf);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < kE; ++e) dot += qs[g][e] * kf[e];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const float m_new = fmaxf(m[g], dot);
      const float keep = exp2f(m[g] - m_new), w = exp2f(dot - m_new);
      l[g] = l[g] * keep + w;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[g][e] = acc[g][e] * keep + w * vf[e];
      m[g] = m_new;
    }
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) s_m[warp][g] = m[g], s_l[warp][g] = l[g];
#pragma unroll
    for (int e = 0; e < kE; ++e) s_acc[warp][g][lane * kE + e] = acc[g][e];
  }
  __syncthreads();

  // Per head: M = max m_w, L = sum l_w 2^(m_w - M), O = sum acc_w 2^(m_w - M) / L (as rung 1).
  for (int x = threadIdx.x; x < ng * kHeadDim; x += blockDim.x) {
    const int g = x / kHeadDim, c = x % kHeadDim;
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, s_m[w][g]);
    const float off = big == -INFINITY ? 0.f : big;
    float wsum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = exp2f(s_m[w][g] - off);
      wsum += s_l[w][g] * wt, o += s_acc[w][g][c] * wt;
    }
    T* out = static_cast<T*>(p.out) + b * p.out_batch_stride + (h0 + g) * p.out_head_stride;
    out[c] = from_float<T>(wsum > 0.f ? o / wsum : 0.f);
    if (c == 0 && p.lse != nullptr)
      p.lse[static_cast<int64_t>(b) * p.nheads + h0 + g] = wsum > 0.f ? (off + log2f(wsum)) * 0.6931471805599453f : -INFINITY;
  }
}

}  // namespace flashlab::kernels
