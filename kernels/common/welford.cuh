// Welford / Chan running mean and variance: a state per group of values, an update per value,
// and a combine of two states, so a mean and variance come out of one pass over the data.
//
//   state {count n, mean m, m2 = sum (x - m)^2}; variance = m2 / n (biased, torch's LayerNorm).
//   update(x):      n += 1; d = x - m; m += d / n; m2 += d * (x - m)
//   combine(a, b):  n = na + nb; d = mb - ma; m = ma + d * nb / n; m2 = m2a + m2b + d^2 * na * nb / n
// Unlike sum(x^2)/n - mean^2, neither step subtracts two large nearly equal numbers, so rows
// with a large common offset (mean 1000, std 1) keep their variance. combine works for any two
// counts (1 and 10^6 alike) and an empty state (n = 0) is its identity.
// count is a float: exact up to 2^24 values per state, far beyond a row of any LLM.
//
// welford_update / welford_combine are FLASHLAB_HD (the CPU tests run them); the warp and block
// combines below them need nvcc.
#pragma once

#include "kernels/common/hd.h"

namespace flashlab::kernels {

// An aggregate (no constructors, so it can live in __shared__); WelfordState{} is the empty state.
struct WelfordState {
  float count;  // values seen
  float mean;   // their mean
  float m2;     // sum of squared deviations from `mean`
};

FLASHLAB_HD inline WelfordState welford_update(WelfordState s, float x) {
  s.count += 1.f;
  const float d = x - s.mean;
  s.mean += d / s.count;
  s.m2 += d * (x - s.mean);
  return s;
}

// Both empty -> empty; one empty -> the other, exactly (wb is 0 or 1).
FLASHLAB_HD inline WelfordState welford_combine(const WelfordState& a, const WelfordState& b) {
  const float n = a.count + b.count;
  if (n == 0.f) return a;
  const float wb = b.count / n;
  const float d = b.mean - a.mean;
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.count * wb};
}

// Biased variance (m2 / n); 0 for an empty state.
FLASHLAB_HD inline float welford_variance(const WelfordState& s) { return s.count > 0.f ? s.m2 / s.count : 0.f; }

}  // namespace flashlab::kernels

#ifdef __CUDACC__
#include "kernels/common/reduce.cuh"

namespace flashlab::kernels {

__device__ __forceinline__ WelfordState shfl_xor_state(const WelfordState& s, int offset) {
  return {__shfl_xor_sync(kFullMask, s.count, offset), __shfl_xor_sync(kFullMask, s.mean, offset),
          __shfl_xor_sync(kFullMask, s.m2, offset)};
}

// The warp's combined state, returned to every lane. The butterfly gives each lane the same
// states in a different order, and combine is not bitwise symmetric (roundings, FMA
// contraction), so lane 0's result is broadcast: every lane normalises with the same numbers.
__device__ __forceinline__ WelfordState warp_welford_combine(WelfordState s) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) s = welford_combine(s, shfl_xor_state(s, offset));
  return {__shfl_sync(kFullMask, s.count, 0), __shfl_sync(kFullMask, s.mean, 0), __shfl_sync(kFullMask, s.m2, 0)};
}

// The block's combined state, returned to every thread; blockDim.x a multiple of 32 (<= 1024),
// known only at run time. Every thread of the block must call it. Two barriers; shared memory
// holds one state per warp.
__device__ __forceinline__ WelfordState block_welford_combine(WelfordState s) {
  __shared__ WelfordState warp_states[kWarpSize];  // (up to 32 warps,)
  __shared__ WelfordState total;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  s = warp_welford_combine(s);
  if (lane == 0) warp_states[warp] = s;
  __syncthreads();
  if (warp == 0) {
    WelfordState t = lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_states[lane] : WelfordState{};
    t = warp_welford_combine(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

}  // namespace flashlab::kernels
#endif  // __CUDACC__
