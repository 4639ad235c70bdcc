// Rung 2 — softmax, one block per row, max and sum in one pass (online rescaling).
//
// Changes from rung 1: pass 1 keeps a running max m and a running sum s per thread; a value
// x above m rescales the sum to the new max before adding:
//   m' = max(m, x),  s' = s * exp(m - m') + exp(x - m')
// so max and sum come out of a single read. The threads' (m, s) states are then combined with
// the same rule (block_all_merge: warp shuffles, one state per warp in shared memory). Pass 2
// writes the outputs: two reads of the row instead of three. Costs one more exp per value
// than rung 1 only when the max grows (exp(0) = 1 otherwise, exactly).
// Limits: still scalar accesses, a block per row whatever its length, and a second read.
#pragma once

#include <cmath>

#include "kernels/common/dtype.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/softmax/01_three_pass.cuh"
#include "kernels/softmax/params.h"

namespace flashlab::kernels {

template <typename T, bool kLog>
__global__ void __launch_bounds__(kSoftmaxRowThreads) softmax_two_pass_kernel(const __grid_constant__ SoftmaxParams p) {
  const int64_t r = blockIdx.x;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  OnlineSoftmaxState st = online_softmax_empty();
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float x[1] = {to_float(in[c])};
    online_softmax_add(st, x);
  }
  st = block_all_merge(st);
  const float log_s = logf(st.s);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x)
    out[c] = from_float<T>(softmax_from_state<kLog>(to_float(in[c]), st, log_s));
}

}  // namespace flashlab::kernels
