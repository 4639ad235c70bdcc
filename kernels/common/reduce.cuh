// Warp and block sum reductions in fp32.
//
// warp_reduce_sum: butterfly over __shfl_xor_sync; after log2(32) = 5 steps every lane holds
// the warp's sum, with no shared memory and no __syncthreads. The summation order is fixed,
// so the result is deterministic.
// block_reduce_sum: each warp reduces, lane 0 of each warp writes one value to shared memory,
// then warp 0 reduces those kThreads/32 values. One __syncthreads in the middle.
#pragma once

namespace flashlab::kernels {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Sum over the block; the result is valid in thread 0. Every thread of the block must call it.
// Safe to call more than once per kernel (a trailing barrier protects the scratch array).
template <int kThreads>
__device__ __forceinline__ float block_reduce_sum(float v) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ float warp_sums[kWarps];  // (kWarps,)
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_reduce_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  float total = 0.f;
  if (warp == 0) {
    total = lane < kWarps ? warp_sums[lane] : 0.f;
    total = warp_reduce_sum(total);
  }
  __syncthreads();
  return total;
}

// Sum over the block, returned to every thread; blockDim.x a multiple of 32 (<= 1024), known
// only at run time. Every thread of the block must call it. Two barriers.
__device__ __forceinline__ float block_all_reduce_sum(float v) {
  __shared__ float warp_sums[kWarpSize];  // (up to 32 warps,)
  __shared__ float total;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_reduce_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_sums[lane] : 0.f;
    t = warp_reduce_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// Max over the warp, in every lane (fmaxf: a NaN operand is ignored). Exact and order-free.
__device__ __forceinline__ float warp_reduce_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Max over the block, returned to every thread; as block_all_reduce_sum (run-time blockDim.x,
// whole warps, every thread calls it, two barriers).
__device__ __forceinline__ float block_all_reduce_max(float v) {
  __shared__ float warp_maxes[kWarpSize];  // (up to 32 warps,)
  __shared__ float result;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_reduce_max(v);
  if (lane == 0) warp_maxes[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float m = lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_maxes[lane] : __int_as_float(0xff800000);  // -inf
    m = warp_reduce_max(m);
    if (lane == 0) result = m;
  }
  __syncthreads();
  return result;
}

}  // namespace flashlab::kernels
