#include "src/core/tensor_map.h"

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

}  // namespace flashlab::detail
