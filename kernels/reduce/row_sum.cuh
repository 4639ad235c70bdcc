// Row-wise sum: out[r] = sum_c x[r, c], one block per row.
//
// Built from the top sum rung's pieces: each thread of the block takes its share of the row
// with thread_partial_sum (16-byte loads, head/tail for rows that do not start on a 16-byte
// boundary, e.g. an odd row stride), then block_reduce_sum. Rows are independent, so there
// is no second pass. Blocks loop over rows (grid-stride) so the grid stays a few per SM.
#pragma once

#include "kernels/common/reduce.cuh"
#include "kernels/reduce/05_vec_multi.cuh"
#include "kernels/reduce/params.h"

namespace flashlab::kernels {

template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads) row_sum_kernel(const __grid_constant__ RowSumParams p) {
  const T* in = static_cast<const T*>(p.in);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float s = block_reduce_sum<kThreads>(thread_partial_sum(in + r * p.row_stride, p.cols,
                                                                  threadIdx.x, kThreads));
    if (threadIdx.x == 0) p.out[r] = s;
  }
}

}  // namespace flashlab::kernels
