// Quantize family: dynamic FP8 (e4m3) / INT8 quantization and dequantization.
// Ladder: kernels/quant/, doc: docs/ladder/quant.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// 1 one block per row, scalar loads, two walks; 2 the row in registers with 16-byte loads,
// packed 8-bit stores (top). Per tensor, each rung first runs one grid-wide absmax launch.
inline constexpr int kQuantRungs = 2;

enum class QuantScheme { kPerToken, kPerTensor };

// q = round(input / scale), scale = max(absmax, 1e-12) / qmax in fp32, where absmax is taken over
// each row (kPerToken, scales [rows]) or the whole tensor (kPerTensor, scales [1]).
//   input: CUDA, [rows, cols] (both >= 1), fp32/fp16/bf16, unit stride in the last dim, row
//          stride >= cols (rows < 2^31).
//   out: like input in shape (its own row stride), dtype e4m3 (qmax 448: round to nearest even,
//        saturating) or int8 (qmax 127: round half to even, clamped to [-127, 127]); the dtype
//        chooses the format.  scales: fp32, contiguous, [rows] or [1] as above; written.
// The division is an IEEE fp32 division of the stored input by the fp32 scale (not a multiply
// by 1 / scale). Rung 2 needs cols a multiple of 16 bytes / sizeof(dtype), 16-byte aligned input
// rows, out rows aligned to that many bytes, and cols <= 8192 (fp32) / 16384 (fp16, bf16); other
// inputs take rung 1 (same result, bit for bit).
void quantize(const TensorView& input, const TensorView& out, const TensorView& scales, QuantScheme scheme,
              cudaStream_t stream = nullptr, int rung = kQuantRungs);

// out = q * scale in fp32, rounded once to out's dtype.
//   q: CUDA, [rows, cols], e4m3 or int8, unit stride in the last dim.  scales: fp32, contiguous,
//   [rows] (per token) or [1] (per tensor).  out: like q in shape, fp32/fp16/bf16.
void dequantize(const TensorView& q, const TensorView& scales, const TensorView& out, cudaStream_t stream = nullptr);

}  // namespace flashlab
