// Rung 5 — many elements per thread, 16-byte loads, fixed grid, then one small pass.
//
// Changes from rung 4: the grid is fixed to a few blocks per SM (at most kSumMaxBlocks) and
// strides over the array; each thread sums kSumUnroll 16-byte vectors per trip with all loads
// issued before the adds, so 64 bytes per thread are in flight, and one accumulator per
// vector so the adds form kSumUnroll independent chains. Each thread ends with one fp32
// partial, the block combines them with block_reduce_sum (shuffles + 8 words of shared
// memory), and a second launch of one block sums the <= kSumMaxBlocks block partials.
// Head/tail: elements before the first 16-byte boundary and after the last whole vector are
// read with scalar loads (the same split as vector add rung 3), so any pointer and length work.
// The summation order depends only on n, the pointer's offset mod 16 and the grid: fixed.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/reduce/01_atomic.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

inline constexpr int kSumUnroll = 4;
inline constexpr int kSumMaxBlocks = 1024;  // partials fit one block of the final pass

// Sum of one vector's elements as a pairwise tree: log2(kN) dependent adds instead of kN.
template <typename T>
__device__ __forceinline__ float vec_sum(const Vec<T>& v) {
  float s[Vec<T>::kN];
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) s[j] = to_float(v.v[j]);
#pragma unroll
  for (int w = Vec<T>::kN / 2; w > 0; w /= 2)
#pragma unroll
    for (int j = 0; j < w; ++j) s[j] += s[j + w];
  return s[0];
}

// This thread's share of sum(x[0:n)): thread `rank` of `nthreads` cooperating threads.
// One accumulator per unrolled vector keeps the kSumUnroll add chains independent, so the
// adds of bf16 data (8 elements per vector) do not serialise behind one register.
template <typename T>
__device__ __forceinline__ float thread_partial_sum(const T* x, int64_t n, int64_t rank, int64_t nthreads) {
  using V = Vec<T>;
  constexpr int kU = kSumUnroll;
  const int64_t head = vec_head(x, n);
  const int64_t nvec = (n - head) / V::kN;
  const int64_t body_end = head + nvec * V::kN;
  float edge = 0.f;
  // Head and tail: fewer than 2 * V::kN elements, one per thread.
  if (rank < head) edge += to_float(x[rank]);
  if (rank < n - body_end) edge += to_float(x[body_end + rank]);
  const V* body = reinterpret_cast<const V*>(x + head);
  float acc[kU] = {};
  // Full trips (all kU vectors in range) with no bounds checks, then the remainder.
  int64_t base = rank;
  for (; base + (kU - 1) * nthreads < nvec; base += kU * nthreads) {
    V v[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) v[k] = load_vec(reinterpret_cast<const T*>(body + base + k * nthreads));
#pragma unroll
    for (int k = 0; k < kU; ++k) acc[k] += vec_sum(v[k]);
  }
  for (; base < nvec; base += nthreads) acc[0] += vec_sum(load_vec(reinterpret_cast<const T*>(body + base)));
  float total = edge;
#pragma unroll
  for (int k = 0; k < kU; ++k) total += acc[k];
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kSumThreads) sum_vec_multi_kernel(const __grid_constant__ SumPassParams p) {
  const int64_t rank = static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  const float block_sum =
      block_reduce_sum<kSumThreads>(thread_partial_sum(static_cast<const T*>(p.in), p.n, rank,
                                                       static_cast<int64_t>(gridDim.x) * kSumThreads));
  if (threadIdx.x == 0) p.out[blockIdx.x] = block_sum;
}

}  // namespace flashlab::kernels
