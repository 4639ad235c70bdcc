// Rung 2 — RoPE, one block per token: cos/sin once per (token, frequency), 16-byte vectors (top).
//
// Changes from rung 1: block t handles every head of token t (q heads, then k heads).
// 1. Threads i < rd/2 compute (cos, sin) of pair i once (or read them from the cache row) into
//    shared memory: (rd/2,) float2. The fp64 inv_freq and the sincos are paid once per
//    (token, frequency) and reused by all num_q_heads + num_k_heads heads.
// 2. The heads are cut into 16-byte units, numbered head-major so consecutive threads touch
//    consecutive vectors of a head:
//      NeoX: unit u < rd/(2 kN) is the vector pair (dims [u kN, u kN + kN), the same + rd/2):
//            both halves of kN pairs, loaded, rotated and stored by one thread;
//      GPT-J: unit u < rd/kN is one vector holding kN/2 whole pairs;
//      then, out of place, the (head_dim - rd)/kN tail vectors, copied as they are.
//    The block strides over (heads x units); loads are plain 128-bit, stores streaming.
// Preconditions (else the host takes rung 1, same result): head_dim a multiple of kN, rd a
// multiple of 2 kN (NeoX) or kN (GPT-J), every token and head stride a multiple of kN, every
// pointer 16-byte aligned, rd <= kRopeVecMaxRotaryDim.
// Limits: a memory-bound op (3 flops per rotated element); what is left is the sincos of the
// first step, which the block's loads wait behind (one warp-level pass, plus Payne-Hanek
// reduction for angles past ~1e5 rad), and the tail of blocks when nnz is small.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/rope/01_scalar.cuh"
#include "kernels/rope/params.h"

namespace flashlab::kernels {

inline constexpr int kRopeVecThreads = 128;
inline constexpr int kRopeVecMaxRotaryDim = 1024;  // (512,) float2 = 4 KB of shared memory
static_assert(kRopeVecMaxRotaryDim / 2 % kRopeVecThreads == 0, "the cos/sin pass is whole block strides");

// x0 cos - x1 sin and x1 cos + x0 sin for one lane pair, rounded once.
template <typename T>
__device__ __forceinline__ void rotate(T& x0, T& x1, float2 cs) {
  const float a = to_float(x0), b = to_float(x1);
  x0 = from_float<T>(a * cs.x - b * cs.y);
  x1 = from_float<T>(b * cs.x + a * cs.y);
}

template <typename T, typename IdType, bool kInterleave>
__global__ void __launch_bounds__(kRopeVecThreads) rope_vec16_kernel(const __grid_constant__ RopeParams p) {
  using V = Vec<T>;
  constexpr int kN = V::kN;
  static_assert(kN % 2 == 0, "a vector holds whole GPT-J pairs");
  __shared__ float2 cs[kRopeVecMaxRotaryDim / 2];  // (rd/2,) (cos, sin) of each pair
  const int64_t t = blockIdx.x;
  const int half = p.rotary_dim / 2;
  const IdType pos = static_cast<const IdType*>(p.pos_ids)[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float c, s;
    rope_cos_sin(p, pos, i, c, s);
    cs[i] = make_float2(c, s);
  }
  __syncthreads();

  const int rot_units = kInterleave ? p.rotary_dim / kN : half / kN;
  const int units = rot_units + (p.copy_tail ? (p.head_dim - p.rotary_dim) / kN : 0);  // per head
  const int total = (p.num_q_heads + p.num_k_heads) * units;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int h = idx / units, u = idx - h * units;
    const T* x;
    T* y;
    rope_head_rows(p, t, h, x, y);
    if (u >= rot_units) {  // tail vector
      const int d = p.rotary_dim + (u - rot_units) * kN;
      store_vec(y + d, load_vec(x + d));
    } else if constexpr (kInterleave) {
      V v = load_vec(x + u * kN);  // (kN,) = kN/2 pairs starting at pair u kN/2
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) rotate(v.v[2 * j], v.v[2 * j + 1], cs[u * (kN / 2) + j]);
      store_vec(y + u * kN, v);
    } else {
      V lo = load_vec(x + u * kN), hi = load_vec(x + half + u * kN);  // (kN,) each: pairs u kN .. u kN + kN - 1
#pragma unroll
      for (int j = 0; j < kN; ++j) rotate(lo.v[j], hi.v[j], cs[u * kN + j]);
      store_vec(y + u * kN, lo);
      store_vec(y + half + u * kN, hi);
    }
  }
}

}  // namespace flashlab::kernels
