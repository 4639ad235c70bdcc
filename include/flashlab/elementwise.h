// Elementwise ops. Ladder: kernels/elementwise/, doc: docs/ladder/elementwise.md.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

inline constexpr int kVectorAddRungs = 3;  // 1 grid-stride, 2 vec16, 3 vec16 + head/tail (top)

// out = a + b elementwise, computed in fp32 and rounded once.
//   a, b, out: one CUDA device, same shape (>= 1 element), contiguous, dtype fp32 or bf16
//   (all the same). out may be a or b (in place), but must not partially overlap them.
//   rung 2 additionally needs 16-byte aligned pointers and numel a multiple of 16/sizeof(dtype).
// Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid arguments.
void vector_add(const TensorView& a, const TensorView& b, const TensorView& out,
                cudaStream_t stream = nullptr, int rung = kVectorAddRungs);

}  // namespace flashlab
