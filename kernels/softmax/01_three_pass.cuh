// Rung 1 — softmax, one block per row, three passes over the row.
//
// out[r, c] = exp(x[r, c] - m) / s  (log_softmax: x[r, c] - m - log s), in fp32, rounded once,
// with m = max_c x[r, c] and s = sum_c exp(x[r, c] - m). Subtracting the max keeps every exp
// argument <= 0: without it, exp(89) already overflows fp32.
// Steps: block r walks row r three times, each thread taking columns tid, tid + blockDim, ...
//   1. m = block max of the row (block_all_reduce_max: warp shuffles, one value per warp in
//      shared memory);
//   2. s = block sum of exp(x - m);
//   3. write the outputs.
// The textbook version, and what it costs: three reads of the input (the second and third hit
// L1/L2 at best) for one write; scalar 2- or 4-byte accesses; a block per row whatever its
// length. Rows of only -inf give m = -inf, s = 0 and the masked output (0 / -inf), see
// kernels/common/online_softmax.cuh.
#pragma once

#include <cmath>

#include "kernels/common/dtype.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/softmax/params.h"

namespace flashlab::kernels {

inline constexpr int kSoftmaxRowThreads = 256;  // rungs 1-2: threads per row

template <typename T, bool kLog>
__global__ void __launch_bounds__(kSoftmaxRowThreads) softmax_three_pass_kernel(const __grid_constant__ SoftmaxParams p) {
  const int64_t r = blockIdx.x;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) m = fmaxf(m, to_float(in[c]));
  m = block_all_reduce_max(m);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) s += exp_below(to_float(in[c]), m);
  const OnlineSoftmaxState st{m, block_all_reduce_sum(s)};
  const float log_s = logf(st.s);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x)
    out[c] = from_float<T>(softmax_from_state<kLog>(to_float(in[c]), st, log_s));
}

}  // namespace flashlab::kernels
