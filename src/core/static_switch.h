// Turn runtime choices into template parameters. Nest at most three deep.
//   DTYPE_SWITCH(t.dtype, T, [&] { launch<T>(...); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"

// fp32 / fp16 / bf16 storage types; other dtypes throw (validation rejects them earlier).
#define DTYPE_SWITCH(DTYPE, T, ...)                                                         \
  [&] {                                                                                     \
    switch (DTYPE) {                                                                        \
      case ::flashlab::DType::kF32: { using T = float; return __VA_ARGS__(); }              \
      case ::flashlab::DType::kF16: { using T = __half; return __VA_ARGS__(); }             \
      case ::flashlab::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }     \
      default:                                                                              \
        throw ::flashlab::Error(::flashlab::detail::concat("DTYPE_SWITCH: unsupported dtype ", \
                                                           ::flashlab::dtype_name(DTYPE))); \
    }                                                                                       \
  }()

// fp16 / bf16 only (the tensor-core GEMM rungs); other dtypes throw.
#define HALF_DTYPE_SWITCH(DTYPE, T, ...)                                                    \
  [&] {                                                                                     \
    switch (DTYPE) {                                                                        \
      case ::flashlab::DType::kF16: { using T = __half; return __VA_ARGS__(); }             \
      case ::flashlab::DType::kBF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }     \
      default:                                                                              \
        throw ::flashlab::Error(::flashlab::detail::concat("HALF_DTYPE_SWITCH: unsupported dtype ", \
                                                           ::flashlab::dtype_name(DTYPE))); \
    }                                                                                       \
  }()

#define BOOL_SWITCH(COND, NAME, ...)              \
  [&] {                                           \
    if (COND) { constexpr bool NAME = true; return __VA_ARGS__(); }  \
    else { constexpr bool NAME = false; return __VA_ARGS__(); }      \
  }()

namespace flashlab::detail {

// A type as a value, for generic lambdas that launch one kernel instantiation per type:
//   const auto launch = [&](auto tag) { using X = typename decltype(tag)::type; ... };
//   fp8 ? launch(TypeTag<__nv_fp8_e4m3>{}) : launch(TypeTag<T>{});
template <typename X>
struct TypeTag {
  using type = X;
};

}  // namespace flashlab::detail
