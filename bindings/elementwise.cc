// TVM-FFI exports of the elementwise family (include/flashlab/elementwise.h).
#include <cstdint>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/elementwise.h"

namespace flashlab::bindings {

// out = a + b on the caller's current stream of a's device; rung 1..kVectorAddRungs.
void vector_add(tvm::ffi::TensorView a, tvm::ffi::TensorView b, tvm::ffi::TensorView out, int64_t rung) {
  constexpr const char* op = "vector_add";
  call([&] {
    const TensorView A = to_flashlab(a, op, "a"), B = to_flashlab(b, op, "b"), O = to_flashlab(out, op, "out");
    flashlab::vector_add(A, B, O, current_stream(A), to_rung(op, rung, kVectorAddRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(vector_add, flashlab::bindings::vector_add);
