// TVM-FFI exports of the LayerNorm family (include/flashlab/layernorm.h).
#include <cstdint>

#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include "bindings/convert.h"
#include "flashlab/layernorm.h"

namespace flashlab::bindings {

// out = layernorm(input) * weight + bias on the caller's current stream; bias None: no bias.
void layernorm(tvm::ffi::TensorView input, tvm::ffi::TensorView weight, tvm::ffi::Optional<tvm::ffi::TensorView> bias,
               tvm::ffi::TensorView out, double eps, int64_t rung) {
  constexpr const char* op = "layernorm";
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), W = to_flashlab(weight, op, "weight"),
                     O = to_flashlab(out, op, "out");
    const TensorView B = bias.has_value() ? to_flashlab(bias.value(), op, "bias") : TensorView{};
    flashlab::layernorm(I, W, B, O, eps, current_stream(I), to_rung(op, rung, kLayerNormRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm, flashlab::bindings::layernorm);
