// TVM-FFI exports of the RMSNorm family (include/flashlab/norm.h).
#include <cstdint>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/norm.h"

namespace flashlab::bindings {

// out = rmsnorm(input) * weight (gemma: * (1 + weight)) on the caller's current stream.
void rmsnorm(tvm::ffi::TensorView input, tvm::ffi::TensorView weight, tvm::ffi::TensorView out, double eps,
             bool gemma, int64_t rung) {
  constexpr const char* op = "rmsnorm";
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), W = to_flashlab(weight, op, "weight"),
                     O = to_flashlab(out, op, "out");
    flashlab::rmsnorm(I, W, O, eps, gemma, current_stream(I), to_rung(op, rung, kRmsNormRungs));
  });
}

// residual += input; input = rmsnorm(residual) * weight, both in place.
void fused_add_rmsnorm(tvm::ffi::TensorView input, tvm::ffi::TensorView residual, tvm::ffi::TensorView weight,
                       double eps, bool gemma, int64_t rung) {
  constexpr const char* op = "fused_add_rmsnorm";
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), R = to_flashlab(residual, op, "residual"),
                     W = to_flashlab(weight, op, "weight");
    flashlab::fused_add_rmsnorm(I, R, W, eps, gemma, current_stream(I), to_rung(op, rung, kRmsNormRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, flashlab::bindings::rmsnorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm, flashlab::bindings::fused_add_rmsnorm);
