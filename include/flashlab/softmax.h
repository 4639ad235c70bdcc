// Softmax family. Ladder: kernels/softmax/, doc: docs/ladder/softmax.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 block per row, three passes; 2 block per row, online max+sum then a write pass; 3 online
// state over 16-byte vectors, warp per row (cols <= 1024) or block per row, row in registers;
// 4 the best by row shape: rung 3's kernels, or a row split over a thread-block cluster for few
// or very long rows (top)
inline constexpr int kSoftmaxRungs = 4;

// out[r, :] = softmax(input[r, :]) over the last dim, in fp32, rounded once:
//   out[r, c] = exp(x[r, c] - max_c x[r, c]) / sum_c exp(x[r, c] - max_c x[r, c]).
//   input: CUDA, shape [rows, cols] (both >= 1), fp32/fp16/bf16, unit stride in the last dim,
//          row stride >= cols.  out: like input (its own row stride); may be input itself (in
//          place, then with the same row stride).
// A row of only -inf (fully masked) gives 0s, not NaN (torch gives NaN); -inf entries of other
// rows give 0. NaN or +inf in a row make that row NaN.
// Rungs 3-4 need cols a multiple of 16 bytes / sizeof(dtype) and 16-byte aligned rows; other
// inputs take rung 2's path (same result).
void softmax(const TensorView& input, const TensorView& out, cudaStream_t stream = nullptr,
             int rung = kSoftmaxRungs);

// out[r, c] = x[r, c] - max_c x[r, c] - log(sum_c exp(x[r, c] - max_c x[r, c])); same
// requirements and rungs as softmax. A row of only -inf gives -inf (not NaN); -inf entries of
// other rows give -inf.
void log_softmax(const TensorView& input, const TensorView& out, cudaStream_t stream = nullptr,
                 int rung = kSoftmaxRungs);

}  // namespace flashlab
