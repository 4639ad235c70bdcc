// RMSNorm family. Ladder: kernels/norm/, doc: docs/ladder/rmsnorm.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 one thread per row, 2 one warp per row, 3 one block per row with 16-byte vectors,
// 4 the same with the row kept in registers (top)
inline constexpr int kRmsNormRungs = 4;

// out = input * rsqrt(mean(input^2 over the last dim) + eps) * weight, in fp32, rounded once;
// gemma = true uses (1 + weight) instead of weight.
//   input: CUDA, shape [rows, hidden] (both >= 1), fp32/fp16/bf16, unit stride in the last
//          dim, row stride >= hidden.  weight: [hidden], same dtype and device, contiguous.
//   out: like input (its own row stride); may be input itself (in place).  eps: finite, >= 0.
// Rungs 3-4 need hidden a multiple of 16 bytes / sizeof(dtype) and 16-byte aligned rows and
// weight; other inputs take rung 2's path (same result).
void rmsnorm(const TensorView& input, const TensorView& weight, const TensorView& out, double eps,
             bool gemma = false, cudaStream_t stream = nullptr, int rung = kRmsNormRungs);

// In place: residual = round(residual + input); input = rmsnorm(residual) as above (the sum
// of squares is taken over the stored, rounded residual). Same requirements; residual is
// like input and must not overlap it. Rungs 2-4 (rung 1 has no fused variant).
void fused_add_rmsnorm(const TensorView& input, const TensorView& residual, const TensorView& weight, double eps,
                       bool gemma = false, cudaStream_t stream = nullptr, int rung = kRmsNormRungs);

}  // namespace flashlab
