// Rung 3 — softmax in one read, a warp or a block per row, the row held in registers.
//
// Changes from rung 2: every access is a 16-byte vector (8 x bf16/fp16, 4 x fp32) and the row
// stays in registers, so the input crosses the memory system once. With the whole row in hand
// no online rescaling is needed (softmax_in_registers): the max first (comparisons only, merged
// with warp/block max reductions), then exactly one exponent per value, kept in fp32 registers
// for the output, then the sum. Two shapes of work, by row length:
//   softmax_online_warp_kernel:  cols <= kSoftmaxWarpMaxCols: one warp per row, 8 rows per
//                                block, no shared memory, no barrier; each lane holds up to
//                                kSoftmaxWarpMaxCols / 32 values (32: 8 fp32 or 4 bf16 vectors);
//   softmax_online_block_kernel: longer rows: one block per row; with kInRegs each thread holds
//                                kSoftmaxBlockVpt vectors (block size follows the row, up to
//                                kSoftmaxBlockMaxThreads: bf16 rows <= 16384, fp32 <= 8192);
//                                longer rows fold vectors into an OnlineSoftmaxState as they
//                                stream by (merged with block_all_merge), then read the row a
//                                second time to write it (!kInRegs).
// Precondition (the host takes rung 2 otherwise): cols a multiple of Vec<T>::kN and every row
// of input and out starting on a 16-byte boundary.
// Limits: a row is one block's work, so few long rows (64 x 128256 vocabulary logits) leave
// most SMs idle and rows past the register budget are read twice.
#pragma once

#include <cmath>

#include "kernels/common/online_softmax.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/softmax/params.h"

namespace flashlab::kernels {

inline constexpr int kSoftmaxWarpMaxCols = 1024;      // longest row a single warp takes
inline constexpr int kSoftmaxWarpThreads = 256;       // 8 rows per block
inline constexpr int kSoftmaxBlockVpt = 4;            // vectors per thread held by the block kernel
inline constexpr int kSoftmaxBlockMaxThreads = 512;   // as rmsnorm rung 4: 1024 threads cap registers at 64

// A row held in registers needs no online rescaling: the max comes first (comparisons only),
// then each value takes exactly one exponent, kept in fp32 registers for the output. The
// online state (one exponent per value for the sum, another for the output, plus a rescale
// per vector) made the bf16 kernel exponent-bound at 75% of copy. Reduce is warp_reduce_* or
// block_all_reduce_*; `valid[k]` says whether vector k of this thread is inside the row.
template <typename T, bool kLog, int kVpt, typename MaxReduce, typename SumReduce>
__device__ __forceinline__ void softmax_in_registers(Vec<T> (&x)[kVpt], const bool (&valid)[kVpt], MaxReduce max_reduce,
                                                     SumReduce sum_reduce) {
  using V = Vec<T>;
  constexpr bool kFast = kSoftmaxFastMath<T>;
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (valid[k])
#pragma unroll
      for (int j = 0; j < V::kN; ++j) m = fmaxf(m, to_float(x[k].v[j]));
  m = max_reduce(m);
  float e[kVpt][V::kN];  // exp(x - m) of this thread's values
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
#pragma unroll
    for (int j = 0; j < V::kN; ++j) {
      e[k][j] = valid[k] ? exp_below<kFast>(to_float(x[k].v[j]), m) : 0.f;
      s += e[k][j];
    }
  s = sum_reduce(s);
  // Fully masked rows (s == 0): softmax 0, log_softmax -inf (never NaN).
  const float log_s = logf(s), inv_s = s == 0.f ? 0.f : 1.f / s;
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
#pragma unroll
    for (int j = 0; j < V::kN; ++j) {
      float y;
      if constexpr (kLog) y = s == 0.f ? -INFINITY : (to_float(x[k].v[j]) - m) - log_s;
      else if constexpr (kFast) y = e[k][j] * inv_s;
      else y = s == 0.f ? 0.f : e[k][j] / s;
      x[k].v[j] = from_float<T>(y);
    }
}

template <typename T, bool kLog>
__global__ void __launch_bounds__(kSoftmaxWarpThreads) softmax_online_warp_kernel(const __grid_constant__ SoftmaxParams p) {
  using V = Vec<T>;
  constexpr int kVpt = kSoftmaxWarpMaxCols / V::kN / kWarpSize;  // vectors per lane: 8 fp32, 4 bf16
  static_assert(kVpt * V::kN * kWarpSize == kSoftmaxWarpMaxCols, "a warp covers the longest row exactly");
  constexpr int kRowsPerBlock = kSoftmaxWarpThreads / kWarpSize;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (r >= p.rows) return;  // whole warps exit together
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nvec = p.cols / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  V x[kVpt];  // (kVpt,) vectors of the row: lane l holds vectors l, l + 32, ...
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (k * kWarpSize + lane < nvec) x[k] = load_vec(in + (k * kWarpSize + lane) * V::kN);
  bool valid[kVpt];
#pragma unroll
  for (int k = 0; k < kVpt; ++k) valid[k] = k * kWarpSize + lane < nvec;
  softmax_in_registers<T, kLog>(x, valid, [](float v) { return warp_reduce_max(v); },
                                [](float v) { return warp_reduce_sum(v); });
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (valid[k]) store_vec(out + (k * kWarpSize + lane) * V::kN, x[k]);
}

// One block per row. kInRegs: blockDim.x * kSoftmaxBlockVpt vectors cover the row.
template <typename T, bool kLog, bool kInRegs>
__global__ void __launch_bounds__(kSoftmaxBlockMaxThreads) softmax_online_block_kernel(const __grid_constant__ SoftmaxParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.cols / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  if constexpr (kInRegs) {
    V x[kSoftmaxBlockVpt];  // (kSoftmaxBlockVpt,) vectors of the row, all loads issued first
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k) {
      const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < nvec) x[k] = load_vec(in + i * V::kN);
    }
    bool valid[kSoftmaxBlockVpt];
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k) valid[k] = k * static_cast<int64_t>(blockDim.x) + threadIdx.x < nvec;
    softmax_in_registers<T, kLog>(x, valid, [](float v) { return block_all_reduce_max(v); },
                                  [](float v) { return block_all_reduce_sum(v); });
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k)
      if (valid[k]) store_vec(out + (k * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V::kN, x[k]);
  } else {
    OnlineSoftmaxState st = online_softmax_empty();
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) online_softmax_add_vec(st, load_vec(in + i * V::kN));
    st = block_all_merge(st);
    const float log_s = logf(st.s);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x)
      store_vec(out + i * V::kN, softmax_vec<T, kLog>(load_vec(in + i * V::kN), st, log_s));
  }
}

}  // namespace flashlab::kernels
