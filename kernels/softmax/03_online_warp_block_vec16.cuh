// Rung 3 — softmax in one read: online state over 16-byte vectors, a warp or a block per row,
// the row held in registers.
//
// Changes from rung 2: every access is a 16-byte vector (8 x bf16/fp16, 4 x fp32); each
// thread folds its vectors into an OnlineSoftmaxState (one rescale per vector, not per value);
// the states are merged across the warp (warp_merge, 5 shuffles) or the block
// (block_all_merge); the vectors stay in registers across the merge and are scaled from there,
// so the input crosses the memory system once. Two shapes of work, by row length:
//   softmax_online_warp_kernel:  cols <= kSoftmaxWarpMaxCols: one warp per row, 8 rows per
//                                block, no shared memory, no barrier; each lane holds up to
//                                kSoftmaxWarpMaxCols / 32 values (32: 8 fp32 or 4 bf16 vectors);
//   softmax_online_block_kernel: longer rows: one block per row; with kInRegs each thread holds
//                                kSoftmaxBlockVpt vectors (block size follows the row, up to
//                                kSoftmaxBlockMaxThreads: bf16 rows <= 16384, fp32 <= 8192);
//                                longer rows fold vectors as they stream by, then read the row
//                                a second time to write it (!kInRegs).
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
  OnlineSoftmaxState st = online_softmax_empty();
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (k * kWarpSize + lane < nvec) online_softmax_add_vec(st, x[k]);
  st = warp_merge(st);
  const float log_s = logf(st.s);
#pragma unroll
  for (int k = 0; k < kVpt; ++k)
    if (k * kWarpSize + lane < nvec) store_vec(out + (k * kWarpSize + lane) * V::kN, softmax_vec<T, kLog>(x[k], st, log_s));
}

// One block per row. kInRegs: blockDim.x * kSoftmaxBlockVpt vectors cover the row.
template <typename T, bool kLog, bool kInRegs>
__global__ void __launch_bounds__(kSoftmaxBlockMaxThreads) softmax_online_block_kernel(const __grid_constant__ SoftmaxParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.cols / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  OnlineSoftmaxState st = online_softmax_empty();
  if constexpr (kInRegs) {
    V x[kSoftmaxBlockVpt];  // (kSoftmaxBlockVpt,) vectors of the row, all loads issued first
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k) {
      const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < nvec) x[k] = load_vec(in + i * V::kN);
    }
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k)
      if (k * static_cast<int64_t>(blockDim.x) + threadIdx.x < nvec) online_softmax_add_vec(st, x[k]);
    st = block_all_merge(st);
    const float log_s = logf(st.s);
#pragma unroll
    for (int k = 0; k < kSoftmaxBlockVpt; ++k) {
      const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < nvec) store_vec(out + i * V::kN, softmax_vec<T, kLog>(x[k], st, log_s));
    }
  } else {
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) online_softmax_add_vec(st, load_vec(in + i * V::kN));
    st = block_all_merge(st);
    const float log_s = logf(st.s);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x)
      store_vec(out + i * V::kN, softmax_vec<T, kLog>(load_vec(in + i * V::kN), st, log_s));
  }
}

}  // namespace flashlab::kernels
