// Row-wise sum: out[r] = sum_c x[r, c].
//
// Built from the top sum rung's pieces: the threads of a row take their shares with
// thread_partial_sum (16-byte loads, head/tail for rows that do not start on a 16-byte
// boundary, e.g. an odd row stride), then reduce. Rows are independent, so there is no second
// pass. Two shapes of work:
//   row_sum_warp_kernel:  one warp per row, for short rows (a block per row would leave most
//                         of its threads idle and pay a barrier for a few hundred bytes);
//   row_sum_block_kernel: one block per row, for long rows;
//   row_sum_split_kernel: several blocks per row, for few long rows (64 x 128256: one block
//                         per row would leave half the SMs idle). Each block sums one chunk
//                         of a row; the last block of a row (a ticket per row, as in sum rung
//                         6) adds the row's chunk sums in order. One launch, deterministic.
// The kernels loop over their work items (grid-stride) with a grid of one resident wave.
#pragma once

#include "kernels/common/reduce.cuh"
#include "kernels/reduce/05_vec_multi.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

inline constexpr int kRowSumWarpMaxCols = 1024;  // longest row a single warp takes
inline constexpr int kRowSumMinChunk = 4096;     // shortest piece of a row a split block takes

template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) row_sum_warp_kernel(const __grid_constant__ RowSumParams p) {
  constexpr int kWarps = kThreads / kWarpSize;
  const T* in = static_cast<const T*>(p.in);
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize; r < p.rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float s = warp_reduce_sum(thread_partial_sum(in + r * p.row_stride, p.cols, lane, kWarpSize));
    if (lane == 0) p.out[r] = s;
  }
}

template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) row_sum_block_kernel(const __grid_constant__ RowSumParams p) {
  const T* in = static_cast<const T*>(p.in);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float s = block_reduce_sum<kThreads>(thread_partial_sum(in + r * p.row_stride, p.cols,
                                                                  threadIdx.x, kThreads));
    if (threadIdx.x == 0) p.out[r] = s;
  }
}

// Work item i = (row i / splits, chunk i % splits); chunk c covers [c * chunk, (c+1) * chunk).
// Rung 6's ticket scheme, per row: the block that finishes a row's last chunk adds the row's
// partials in chunk order (deterministic), writes out[r] and resets the row's counter to zero.
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) row_sum_split_kernel(const __grid_constant__ RowSumParams p,
                                                                 const __grid_constant__ RowSumSplit split) {
  __shared__ bool is_last;
  const T* in = static_cast<const T*>(p.in);
  for (int64_t i = blockIdx.x; i < p.rows * split.splits; i += gridDim.x) {
    const int64_t r = i / split.splits, c0 = (i % split.splits) * split.chunk;
    const int64_t len = c0 + split.chunk <= p.cols ? split.chunk : p.cols - c0;
    const float s = block_reduce_sum<kThreads>(
        len > 0 ? thread_partial_sum(in + r * p.row_stride + c0, len, threadIdx.x, kThreads) : 0.f);
    if (threadIdx.x == 0) {
      split.partials[i] = s;
      __threadfence();  // partial visible before the ticket is taken
      is_last = atomicAdd(split.counters + r, 1u) == split.splits - 1;
    }
    __syncthreads();
    if (is_last) {
      __threadfence();  // see the other blocks' partials of this row
      float acc = 0.f;
      for (int64_t c = threadIdx.x; c < split.splits; c += kThreads) acc += __ldcg(split.partials + r * split.splits + c);
      const float total = block_reduce_sum<kThreads>(acc);
      if (threadIdx.x == 0) {
        p.out[r] = total;
        split.counters[r] = 0u;
      }
    }
    __syncthreads();  // is_last is rewritten by the next item
  }
}

}  // namespace flashlab::kernels
