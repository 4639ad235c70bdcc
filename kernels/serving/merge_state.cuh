// The merge of attention states (include/flashlab/serving.h): one warp per (query, head), its
// lanes over the head dim in 16-byte vectors, the states' log-sum-exps read by every lane (a few
// floats, from L1). Memory-bound: each v element read once, each output written once.
//   S = m + log(sum_i e^{s_i - m}),  m = max_i s_i;   V = sum_i v_i e^{s_i - S}
// in fp32, one rounding of V to the output dtype. All s = -inf (no visible key anywhere): S = -inf,
// V = 0 (the offset m is then taken as 0 so that no -inf - -inf = NaN arises).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"

namespace flashlab::kernels {

struct MergeStateParams {
  // merge_state: states 0 and 1 in v[0], v[1] / s[0], s[1], (seq, nheads, headdim) / (seq, nheads).
  // merge_states: v[1] = nullptr, the states of v[0] / s[0], (seq, num_states, nheads, headdim) /
  // (seq, num_states, nheads). Query t, state i, head h: v at t * v_query_stride + i *
  // v_state_stride + h * headdim (v_state_stride unused for a pair), s likewise.
  const void* v[2];
  const float* s[2];
  int64_t v_query_stride, v_state_stride;  // elements
  int64_t s_query_stride, s_state_stride;
  void* v_out;
  float* s_out;
  int64_t seq;
  int nheads, headdim, num_states;  // num_states: 2 for merge_state (v[0], v[1]); else states of v[0]
};

// Grid: ceil(seq * nheads / 4) blocks of 128 threads (4 warps, a (query, head) each).
template <typename T>
__global__ void merge_state_kernel(const __grid_constant__ MergeStateParams p) {
  using V = Vec<T>;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= p.seq * p.nheads) return;
  const int64_t t = item / p.nheads;
  const int h = static_cast<int>(item % p.nheads);
  const bool pair = p.v[1] != nullptr;  // merge_state: two tensors; merge_states: states of one
  const auto s_of = [&](int i) {
    return pair ? p.s[i][t * p.s_query_stride + h] : p.s[0][t * p.s_query_stride + i * p.s_state_stride + h];
  };
  const auto v_of = [&](int i) {
    const T* base = static_cast<const T*>(pair ? p.v[i] : p.v[0]);
    return base + t * p.v_query_stride + (pair ? 0 : i * p.v_state_stride) + static_cast<int64_t>(h) * p.headdim;
  };
  float m = -INFINITY;
  for (int i = 0; i < p.num_states; ++i) m = fmaxf(m, s_of(i));
  const float off = m == -INFINITY ? 0.f : m;
  float sum = 0.f;
  for (int i = 0; i < p.num_states; ++i) sum += expf(s_of(i) - off);
  const float S = m == -INFINITY ? -INFINITY : off + logf(sum);
  T* out = static_cast<T*>(p.v_out) + (t * p.nheads + h) * p.headdim;
  for (int c = lane * V::kN; c < p.headdim; c += 32 * V::kN) {
    float acc[V::kN];
#pragma unroll
    for (int e = 0; e < V::kN; ++e) acc[e] = 0.f;
    if (m != -INFINITY) {
      for (int i = 0; i < p.num_states; ++i) {
        const float w = expf(s_of(i) - S);  // 0 for a -inf state
        if (w == 0.f) continue;
        const V x = load_vec(v_of(i) + c);
#pragma unroll
        for (int e = 0; e < V::kN; ++e) acc[e] += w * to_float(x.v[e]);
      }
    }
    V y;
#pragma unroll
    for (int e = 0; e < V::kN; ++e) y.v[e] = from_float<T>(acc[e]);
    store_vec_wb(out + c, y);
  }
  // Last, once every lane has read the s it needs: s_out may be s_a itself (in place).
  __syncwarp();
  if (lane == 0) p.s_out[t * p.nheads + h] = S;
}

}  // namespace flashlab::kernels
