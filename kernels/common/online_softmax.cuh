// Online softmax state: the (max, sum) pair that lets a row's softmax statistics be built from
// pieces in any grouping, then merged.
//
// For a set of values X: m = max X, s = sum_{x in X} exp(x - m). Two sets merge as
//   m = max(m1, m2),  s = s1 * exp(m1 - m) + s2 * exp(m2 - m)
// (the smaller max's sum is rescaled to the larger one), and adding one value x is the merge
// with ({x}: m = x, s = 1). Every exp argument is <= 0, so nothing overflows whatever the
// magnitude of the inputs. The empty set is (m = -inf, s = 0).
// -inf entries: exp(-inf - m) = 0, but (-inf) - (-inf) is NaN, so exp_below() returns 0 for a
// -inf first argument; a set of only -inf values stays (m = -inf, s = 0). s == 0 therefore marks
// a fully masked row (any other row has s >= 1: its max contributes exp(0)). NaN inputs make s
// NaN (fmaxf skips NaN in m, but exp(NaN - m) is NaN); +inf makes m = +inf and s NaN: both
// propagate to the row's outputs, as in torch.
// The host/device part below (struct, merge, softmax_from_state) is unit-tested on the CPU;
// the warp/block merges (device only) on the GPU.
#pragma once

#include <cmath>

#include "kernels/common/hd.h"

namespace flashlab::kernels {

struct OnlineSoftmaxState {
  float m;  // max of the values seen; -inf when none, or all -inf
  float s;  // sum of exp(x - m) over the values seen; 0 when none, or all -inf
};

FLASHLAB_HD inline OnlineSoftmaxState online_softmax_empty() { return {-INFINITY, 0.f}; }

// exp(a - b) for a <= b; 0 when a = -inf (also when b = -inf too, the masked case).
// kFast: the hardware approximation (__expf: ex2.approx, a few ulp of fp32), used where the
// output is 16-bit and its rounding (2^-9 / 2^-12) dwarfs that error. With the accurate expf
// the bf16 kernels were bound by exponent arithmetic, not memory (58% of copy at 16384 x 4096).
template <bool kFast = false>
FLASHLAB_HD inline float exp_below(float a, float b) {
  if (a == -INFINITY) return 0.f;
#ifdef __CUDA_ARCH__
  if constexpr (kFast) return __expf(a - b);
#endif
  return expf(a - b);
}

FLASHLAB_HD inline OnlineSoftmaxState online_softmax_merge(OnlineSoftmaxState a, OnlineSoftmaxState b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * exp_below(a.m, m) + b.s * exp_below(b.m, m)};
}

// Adds kN values with a single rescale of the running sum (max of the batch first).
template <int kN, bool kFast = false>
FLASHLAB_HD inline void online_softmax_add(OnlineSoftmaxState& st, const float (&x)[kN]) {
  float m = st.m;
  for (int j = 0; j < kN; ++j) m = fmaxf(m, x[j]);
  float s = st.s * exp_below(st.m, m);
  for (int j = 0; j < kN; ++j) s += exp_below<kFast>(x[j], m);
  st = {m, s};
}

// One output element from its row's final state; log_s = log(st.s) (computed once per row).
// Fully masked rows (st.s == 0): softmax 0, log_softmax -inf (DESIGN.md: never NaN).
// kFast: __expf and a fast division (__fdividef) for 16-bit outputs, as in exp_below.
template <bool kLog, bool kFast = false>
FLASHLAB_HD inline float softmax_from_state(float x, OnlineSoftmaxState st, float log_s) {
  if constexpr (kLog) return st.s == 0.f ? -INFINITY : (x - st.m) - log_s;
  if (st.s == 0.f) return 0.f;
#ifdef __CUDA_ARCH__
  if constexpr (kFast) return __fdividef(exp_below<true>(x, st.m), st.s);
#endif
  return exp_below(x, st.m) / st.s;
}

// 16-bit outputs take the fast exponent and division (see exp_below).
template <typename T>
inline constexpr bool kSoftmaxFastMath = sizeof(T) == 2;

}  // namespace flashlab::kernels

#ifdef __CUDACC__

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"

namespace flashlab::kernels {

// --- The base-2 fast path (16-bit outputs of the cluster softmax) ---------------------------
// exp(x - m) = 2^(x log2(e) - m log2(e)): one FFMA and one MUFU.EX2 per value. The .ftz form of
// ex2.approx is the bare MUFU instruction; the default (non-ftz) form that __expf compiles to
// wraps it in a range test and two multiplies to produce subnormal results, and exp_below's
// -inf test adds a compare and a select: about 10 instructions per value instead of 3. Here
// -inf needs no test: x = -inf gives 2^-inf = 0 as long as the offset is finite, and the
// offset is only infinite for a set of only -inf values (then 0 is used instead) or a +inf
// value (then s is NaN, as it must be). Results below 2^-126 flush to 0: far below the 16-bit
// outputs' resolution of an exponent's relative error.
inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^t for t <= 0 on the FMA pipe (FFMA/FADD and integer ops) instead of MUFU, for a share of
// the exponents of a sum where MUFU.EX2 (16 per SM per cycle, 8 times fewer than FFMA) is the
// bottleneck (tried in the cluster softmax's fold: no gain there). t = n + f with n = round(t) (adding 1.5 * 2^23 leaves n in the low mantissa bits),
// 2^f on [-0.5, 0.5] by a degree-3 polynomial (relative error 7.5e-5 = 2^-13.7; coefficients
// fitted for this file by reweighted least squares), n added to the result's exponent field.
// t < -126 gives 0 (2^-inf = 0 for masked values, as ex2.approx.ftz); a NaN t gives a
// meaningless finite value: callers make NaN reach the sum through the MUFU share.
__device__ __forceinline__ float exp2_poly3_nonpos(float t) {
  const float j = t + 12582912.f;  // 1.5 * 2^23: j's low mantissa bits hold round(t)
  const float f = t - (j - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.0551716685f, f, 0.242611155f), f, 0.693260968f), f, 0.999928057f);
  const float r = __int_as_float(__float_as_int(p) + (__float_as_int(j) << 23));
  return t < -126.f ? 0.f : r;
}

// max(a, b), NaN if either is NaN (fmaxf returns the other operand).
__device__ __forceinline__ float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// kN values into the state: max first, then one rescale and kN exponents in base 2. Same state
// (m, s) as online_softmax_add<kN, true>, to within the approximate exponent's error.
// kPolyShare (an experiment, off: measured 2% slower in the cluster softmax, see
// docs/ladder/softmax.md): every fourth exponent by exp2_poly3_nonpos on the FMA pipe instead
// of MUFU. Its NaN results are harmless: a NaN value makes m NaN (nan_max), so every exponent
// of the MUFU share is NaN, and a +inf value (m = +inf) sets s = NaN as exp(inf - inf) would.
template <int kN, bool kPolyShare = false>
__device__ __forceinline__ void online_softmax_add_exp2(OnlineSoftmaxState& st, const float (&x)[kN]) {
  float m = st.m;
#pragma unroll
  for (int j = 0; j < kN; ++j) m = kPolyShare ? nan_max(m, x[j]) : fmaxf(m, x[j]);
  const float offset = m == -INFINITY ? 0.f : m * kLog2e;  // all -inf so far: s stays 0
  float s = st.s * exp2_approx_ftz(fmaf(st.m, kLog2e, -offset)), s_poly = 0.f;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const float t = fmaf(x[j], kLog2e, -offset);
    if (kPolyShare && j % 4 == 3) s_poly += exp2_poly3_nonpos(t);
    else s += exp2_approx_ftz(t);
  }
  st = {m, kPolyShare && m == INFINITY ? NAN : s + s_poly};
}

// softmax(x) = 2^(x log2(e) - offset) with offset = m log2(e) + log2(s): the division by s
// folded into the exponent, one FFMA + one MUFU.EX2 per output. A fully masked row (s == 0,
// every x = -inf) takes offset 0, so its outputs are 2^-inf = 0.
__device__ __forceinline__ float softmax_exp2_offset(OnlineSoftmaxState st) {
  return st.s == 0.f ? 0.f : fmaf(st.m, kLog2e, log2f(st.s));
}

// One 16-byte vector into the state: a single rescale per vector.
template <typename T>
__device__ __forceinline__ void online_softmax_add_vec(OnlineSoftmaxState& st, const Vec<T>& v) {
  float x[Vec<T>::kN];
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) x[j] = to_float(v.v[j]);
  online_softmax_add<Vec<T>::kN, kSoftmaxFastMath<T>>(st, x);
}

// The same through the base-2 fast path (16-bit T only: see online_softmax_add_exp2).
template <typename T, bool kPolyShare = false>
__device__ __forceinline__ void online_softmax_add_vec_exp2(OnlineSoftmaxState& st, const Vec<T>& v) {
  static_assert(sizeof(T) == 2, "the approximate exponent is for 16-bit outputs");
  float x[Vec<T>::kN];
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) x[j] = to_float(v.v[j]);
  online_softmax_add_exp2<Vec<T>::kN, kPolyShare>(st, x);
}

// softmax_from_state on each element of a vector, rounded once.
template <typename T, bool kLog>
__device__ __forceinline__ Vec<T> softmax_vec(const Vec<T>& v, OnlineSoftmaxState st, float log_s) {
  Vec<T> y;
#pragma unroll
  for (int j = 0; j < Vec<T>::kN; ++j) y.v[j] = from_float<T>(softmax_from_state<kLog, kSoftmaxFastMath<T>>(to_float(v.v[j]), st, log_s));
  return y;
}

// Merge over the 32 lanes: the max by a butterfly (5 shuffles), then each lane rescales its sum
// to it with one exponent, then the sums by a butterfly (5 shuffles). Every lane gets the same
// state, bit for bit (max and addition are commutative, so both partners of each exchange
// compute the same value). Merging pairwise instead (5 rounds of online_softmax_merge) puts two
// exponents per round on the critical path: in the cluster softmax, whose rows wait on three
// of these merges in series, that was measurable.
__device__ __forceinline__ OnlineSoftmaxState warp_merge(OnlineSoftmaxState st) {
  float m = st.m;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  float s = st.s * exp_below(st.m, m);  // 0 for a masked lane (st.m = -inf), as in online_softmax_merge
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) s += __shfl_xor_sync(kFullMask, s, offset);
  return {m, s};
}

// Merge over the block, returned to every thread; blockDim.x a multiple of 32 (<= 1024).
// Every thread of the block must call it. Two barriers; safe to call more than once.
__device__ __forceinline__ OnlineSoftmaxState block_all_merge(OnlineSoftmaxState st) {
  __shared__ OnlineSoftmaxState warp_states[kWarpSize];  // (up to 32 warps,)
  __shared__ OnlineSoftmaxState total;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  st = warp_merge(st);
  if (lane == 0) warp_states[warp] = st;
  __syncthreads();
  if (warp == 0) {
    OnlineSoftmaxState t = lane < static_cast<int>(blockDim.x / kWarpSize) ? warp_states[lane] : online_softmax_empty();
    t = warp_merge(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

}  // namespace flashlab::kernels

#endif  // __CUDACC__
