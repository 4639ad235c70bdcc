// TVM-FFI exports of the gated-activation family (include/flashlab/activation.h).
#include <cstdint>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/activation.h"

namespace flashlab::bindings {

namespace {

using ActFn = void (*)(const TensorView&, const TensorView&, cudaStream_t, int);

// out = act(input[..., :d]) * input[..., d:] on the caller's current stream of input's device.
void act_and_mul(const char* op, ActFn fn, tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), O = to_flashlab(out, op, "out");
    fn(I, O, current_stream(I), to_rung(op, rung, kActivationRungs));
  });
}

}  // namespace

void silu_and_mul(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  act_and_mul("silu_and_mul", flashlab::silu_and_mul, input, out, rung);
}

void gelu_and_mul(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  act_and_mul("gelu_and_mul", flashlab::gelu_and_mul, input, out, rung);
}

void gelu_tanh_and_mul(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  act_and_mul("gelu_tanh_and_mul", flashlab::gelu_tanh_and_mul, input, out, rung);
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul, flashlab::bindings::silu_and_mul);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_and_mul, flashlab::bindings::gelu_and_mul);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gelu_tanh_and_mul, flashlab::bindings::gelu_tanh_and_mul);
