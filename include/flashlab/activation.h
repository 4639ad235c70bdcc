// Gated activations of an MLP block (FlashInfer semantics). Ladder: kernels/activation/,
// doc: docs/ladder/activation.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

inline constexpr int kActivationRungs = 2;  // 1 scalar grid-stride, 2 vec16 tiles + scalar edges (top)

// out[..., i] = act(input[..., i]) * input[..., d + i] for i < d, where input's last dim is 2d:
// the first half is the gate, the second half the up projection. Computed in fp32 and rounded
// once to the output dtype.
//   input: CUDA, shape [..., 2d] (>= 1 element, last dim even), dtype fp32, fp16 or bf16, unit
//          stride in the last dim; its leading dims must flatten to rows with one row stride
//          >= 2d (e.g. a column slice x[:, :2d] of a wider matrix).
//   out:   same device and dtype, contiguous, shape [..., d]; must not overlap input.
// Both rungs take any element-aligned pointers, any d and any row stride; rung 2 runs the
// 16-byte vector path on every row whose gate, up and out rows share one offset modulo 16 bytes
// and scalar accesses elsewhere.
// Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid arguments.
void silu_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream = nullptr,
                  int rung = kActivationRungs);  // act(x) = x / (1 + exp(-x))
void gelu_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream = nullptr,
                  int rung = kActivationRungs);  // act(x) = x/2 (1 + erf(x / sqrt 2)), exact GELU
void gelu_tanh_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream = nullptr,
                       int rung = kActivationRungs);  // act(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

}  // namespace flashlab
