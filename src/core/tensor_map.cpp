#include "src/core/tensor_map.h"

#include <string>

#include <cuda_runtime_api.h>

#include "flashlab/error.h"

namespace flashlab::detail {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    // The ABI of cuTensorMapEncodeTiled as introduced in CUDA 12.0.
    FLASHLAB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
    FLASHLAB_CHECK(status == cudaDriverEntryPointSuccess && p != nullptr,
                   "cuTensorMapEncodeTiled not found in the CUDA driver (TMA needs driver >= 12.0)");
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

CUtensorMapDataType map_dtype(DType dt) {
  switch (dt) {
    case DType::kF32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::kF16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::kBF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kI8:
    case DType::kU8: return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // bytes: the copy engine does not look inside
    default: throw Error(concat("tensor map: unsupported dtype ", dtype_name(dt)));
  }
}

}  // namespace

CUtensorMap make_tensor_map_2d(const void* base, DType dtype, int64_t inner, int64_t outer, int64_t row_stride_bytes,
                               int box_inner, int box_outer, bool swizzle_128b) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, map_dtype(dtype), 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FLASHLAB_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a ", outer,
                 " x ", inner, " view with row stride ", row_stride_bytes, " bytes and box ", box_outer, " x ", box_inner);
  return map;
}

namespace {

// A rank-D (4 or 5) view swizzled over swizzle_bytes (128, 64 or 32); the message lists the view.
CUtensorMap tensor_map_swizzled(const void* base, DType dtype, int rank, const int64_t* dims, const int64_t* strides_bytes,
                                const int* box, int swizzle_bytes = 128) {
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_32B;
  CUtensorMap map{};
  cuuint64_t d[5], st[4];
  cuuint32_t bx[5];
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) d[i] = static_cast<cuuint64_t>(dims[i]), bx[i] = static_cast<cuuint32_t>(box[i]);
  for (int i = 0; i + 1 < rank; ++i) st[i] = static_cast<cuuint64_t>(strides_bytes[i]);
  const CUresult r = encode_tiled()(&map, map_dtype(dtype), static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, st, bx,
                                    elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string view;
    for (int i = 0; i < rank; ++i) view += (i ? " x " : "dims ") + std::to_string(dims[i]);
    for (int i = 0; i + 1 < rank; ++i) view += (i ? ", " : ", byte strides ") + std::to_string(strides_bytes[i]);
    for (int i = 0; i < rank; ++i) view += (i ? " x " : ", box ") + std::to_string(box[i]);
    FLASHLAB_CHECK(false, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a ", rank, "-D view of ", view);
  }
  return map;
}

}  // namespace

CUtensorMap make_tensor_map_4d(const void* base, DType dtype, const int64_t (&dims)[4], const int64_t (&strides_bytes)[3],
                               const int (&box)[4]) {
  return tensor_map_swizzled(base, dtype, 4, dims, strides_bytes, box);
}

CUtensorMap make_tensor_map_5d(const void* base, DType dtype, const int64_t (&dims)[5], const int64_t (&strides_bytes)[4],
                               const int (&box)[5], int swizzle_bytes) {
  return tensor_map_swizzled(base, dtype, 5, dims, strides_bytes, box, swizzle_bytes);
}

}  // namespace flashlab::detail
