// TVM-FFI exports of the softmax family (include/flashlab/softmax.h).
#include <cstdint>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/softmax.h"

namespace flashlab::bindings {

// out = softmax(input) over the last dim, on the caller's current stream.
void softmax(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  constexpr const char* op = "softmax";
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), O = to_flashlab(out, op, "out");
    flashlab::softmax(I, O, current_stream(I), to_rung(op, rung, kSoftmaxRungs));
  });
}

// out = log_softmax(input) over the last dim, on the caller's current stream.
void log_softmax(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t rung) {
  constexpr const char* op = "log_softmax";
  call([&] {
    const TensorView I = to_flashlab(input, op, "input"), O = to_flashlab(out, op, "out");
    flashlab::log_softmax(I, O, current_stream(I), to_rung(op, rung, kSoftmaxRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(softmax, flashlab::bindings::softmax);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(log_softmax, flashlab::bindings::log_softmax);
