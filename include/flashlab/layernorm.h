// LayerNorm family. Ladder: kernels/layernorm/, doc: docs/ladder/layernorm.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 warp per row, two-pass statistics (three reads), 2 warp per row, Welford (two reads),
// 3 block per row, 16-byte vectors, row in registers, Welford combine (one read; top)
inline constexpr int kLayerNormRungs = 3;

// out = (input - mean) * rsqrt(var + eps) * weight + bias over the last dim, with var the
// biased variance (torch.nn.functional.layer_norm); statistics in fp32, rounded once.
//   input: CUDA, shape [rows, hidden] (both >= 1), fp32/fp16/bf16, unit stride in the last
//          dim, row stride >= hidden.  weight: [hidden], same dtype and device, contiguous.
//   bias: like weight, or an empty TensorView{} (null data, no dims) for no bias.
//   out: like input (its own row stride); may be input itself (in place).  eps: finite, >= 0.
// Rung 3 needs hidden a multiple of 16 bytes / sizeof(dtype) and 16-byte aligned rows, weight
// and bias; other inputs take rung 2's path (same result).
void layernorm(const TensorView& input, const TensorView& weight, const TensorView& bias, const TensorView& out,
               double eps, cudaStream_t stream = nullptr, int rung = kLayerNormRungs);

}  // namespace flashlab
