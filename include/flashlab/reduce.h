// Reductions. Ladder: kernels/reduce/, doc: docs/ladder/reduce.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 atomic, 2 smem interleaved, 3 smem sequential, 4 warp shuffle, 5 vec16 multi, 6 one pass (top)
inline constexpr int kSumRungs = 6;

// out[0] = sum of every element of x, accumulated in fp32.
//   x: CUDA, contiguous, >= 1 element, fp32 or bf16.  out: same device, fp32, shape [1].
// Deterministic for a given x shape, pointer offset mod 16 and device, except rung 1 (atomics).
// Rungs 2-6 use a workspace the library allocates once per (device, stream) and keeps.
void sum(const TensorView& x, const TensorView& out, cudaStream_t stream = nullptr,
         int rung = kSumRungs);

// out[r] = sum_c x[r, c], accumulated in fp32.
//   x: CUDA, shape [rows, cols] (both >= 1), unit column stride, row stride >= cols,
//      fp32 or bf16.  out: same device, fp32, contiguous, shape [rows].
void row_sum(const TensorView& x, const TensorView& out, cudaStream_t stream = nullptr);

}  // namespace flashlab
