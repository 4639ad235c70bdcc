// Rung 1 — RoPE, one thread per rotated pair, each computing its own cos/sin.
//
// For token t at position p = pos_ids[t] and every head of q and k, pair i of the first
// rotary_dim dims (NeoX: dims (i, i + rd/2); GPT-J: dims (2i, 2i + 1)) is rotated by
// angle = float(p) * inv_freq_i:  (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin), fp32, one
// rounding per output. Out of place, dims [rd, head_dim) are copied.
// Steps: the work is a flat list of units, (token, head of q then k, unit), where unit < rd/2
// is a pair and the rest (out of place only) are tail elements copied one by one; each thread
// strides over the list by the whole grid and splits its index with 64-bit divisions.
// cos/sin: sincosf, the full-range CUDA function (<= 2 ulp for every finite angle; angles past
// ~1e5 rad take its slow Payne-Hanek reduction). __sincosf would be wrong here: its error grows
// with |angle| and the angle reaches 1e6 rad at position 1M. inv_freq is computed in fp64 and
// rounded once (kernels/rope/params.h); with a cache, cos/sin are read from it instead.
// What limits it next: every pair recomputes inv_freq (an fp64 pow) and sincos — the same
// values for every head of the token, 40x over for Llama-3-8B's 32 + 8 heads — and moves 2-4
// bytes per memory instruction, with the two elements of a NeoX pair rd/2 apart.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/rope/params.h"

namespace flashlab::kernels {

inline constexpr int kRopeScalarThreads = 128;

// cos/sin of pair i at position pos: from the cache row, or computed.
template <typename IdType>
__device__ __forceinline__ void rope_cos_sin(const RopeParams& p, IdType pos, int i, float& c, float& s) {
  if (p.cos_sin_cache != nullptr) {
    const float* row = p.cos_sin_cache + static_cast<int64_t>(pos) * p.rotary_dim;  // (rotary_dim,)
    c = row[i];
    s = row[p.rotary_dim / 2 + i];
  } else {
    sincosf(static_cast<float>(pos) * rope_inv_freq(p.freq, i, p.rotary_dim), &s, &c);
  }
}

// Element offsets of pair i within a head.
template <bool kInterleave>
__device__ __forceinline__ void rope_pair_dims(int i, int rotary_dim, int& d0, int& d1) {
  d0 = kInterleave ? 2 * i : i;
  d1 = kInterleave ? 2 * i + 1 : i + rotary_dim / 2;
}

// Head h of token t (q heads first, then k heads): its input x and output y rows, (head_dim,).
template <typename T>
__device__ __forceinline__ void rope_head_rows(const RopeParams& p, int64_t t, int64_t h, const T*& x, T*& y) {
  const bool is_q = h < p.num_q_heads;
  const int64_t hh = is_q ? h : h - p.num_q_heads;
  x = static_cast<const T*>(is_q ? p.q : p.k) + t * (is_q ? p.q_stride_n : p.k_stride_n) +
      hh * (is_q ? p.q_stride_h : p.k_stride_h);
  y = static_cast<T*>(is_q ? p.q_out : p.k_out) + t * (is_q ? p.q_out_stride_n : p.k_out_stride_n) +
      hh * (is_q ? p.q_out_stride_h : p.k_out_stride_h);
}

template <typename T, typename IdType, bool kInterleave>
__global__ void __launch_bounds__(kRopeScalarThreads) rope_scalar_kernel(const __grid_constant__ RopeParams p) {
  const int half = p.rotary_dim / 2;
  const int64_t units = half + (p.copy_tail ? p.head_dim - p.rotary_dim : 0);  // per head
  const int64_t heads = p.num_q_heads + p.num_k_heads;
  const int64_t total = p.nnz * heads * units;
  const IdType* pos_ids = static_cast<const IdType*>(p.pos_ids);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t u = idx % units;
    const int64_t th = idx / units;
    const int64_t h = th % heads, t = th / heads;
    const T* x;
    T* y;
    rope_head_rows(p, t, h, x, y);
    if (u >= half) {  // tail element, copied
      const int64_t d = p.rotary_dim + (u - half);
      y[d] = x[d];
      continue;
    }
    const int i = static_cast<int>(u);
    float c, s;
    rope_cos_sin(p, pos_ids[t], i, c, s);
    int d0, d1;
    rope_pair_dims<kInterleave>(i, p.rotary_dim, d0, d1);
    const float x0 = to_float(x[d0]), x1 = to_float(x[d1]);
    y[d0] = from_float<T>(x0 * c - x1 * s);
    y[d1] = from_float<T>(x1 * c + x0 * s);
  }
}

}  // namespace flashlab::kernels
