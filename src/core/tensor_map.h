// Host-side TMA descriptors: CUtensorMap for a 2-D row-major view, built with the driver's
// cuTensorMapEncodeTiled reached through cudaGetDriverEntryPoint (no link against libcuda).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "flashlab/tensor.h"

namespace flashlab::detail {

// `base` viewed as (outer, inner) elements of `dtype`, rows `row_stride_bytes` apart (a multiple
// of 16, base 16-byte aligned); boxes of (box_outer, box_inner) elements. swizzle_128b: the box
// lands in shared memory 128B-swizzled (box_inner * element size must be 128 bytes then).
// Throws flashlab::Error when the driver rejects the description.
CUtensorMap make_tensor_map_2d(const void* base, DType dtype, int64_t inner, int64_t outer, int64_t row_stride_bytes,
                               int box_inner, int box_outer, bool swizzle_128b);

// A 4-D view: dims[0] innermost and contiguous, strides_bytes[i] the byte stride of dims[i + 1]
// (multiples of 16, any order), boxes of box[0..3] elements, 128B-swizzled (box[0] x element
// size = 128 bytes). Used for (head dim, rows, heads, batch) views of attention tensors.
CUtensorMap make_tensor_map_4d(const void* base, DType dtype, const int64_t (&dims)[4], const int64_t (&strides_bytes)[3],
                               const int (&box)[4]);
// The same with 5 dims (the paged prefill's V: 64 columns, page rows, column boxes, heads, pages).
// swizzle_bytes: 128, or 64 / 32 for boxes of that many bytes per row (FP8 attention's V^T chunks).
CUtensorMap make_tensor_map_5d(const void* base, DType dtype, const int64_t (&dims)[5], const int64_t (&strides_bytes)[4],
                               const int (&box)[5], int swizzle_bytes = 128);

}  // namespace flashlab::detail
