// TVM-FFI exports of the reduce family (include/flashlab/reduce.h).
#include <cstdint>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/reduce.h"

namespace flashlab::bindings {

// out[0] = sum of x (fp32 accumulation) on the caller's current stream; rung 1..kSumRungs.
void sum(tvm::ffi::TensorView x, tvm::ffi::TensorView out, int64_t rung) {
  constexpr const char* op = "sum";
  call([&] {
    const TensorView X = to_flashlab(x, op, "x"), O = to_flashlab(out, op, "out");
    flashlab::sum(X, O, current_stream(X), to_rung(op, rung, kSumRungs));
  });
}

// out[r] = sum_c x[r, c] on the caller's current stream.
void row_sum(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
  constexpr const char* op = "row_sum";
  call([&] {
    const TensorView X = to_flashlab(x, op, "x"), O = to_flashlab(out, op, "out");
    flashlab::row_sum(X, O, current_stream(X));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(sum, flashlab::bindings::sum);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_sum, flashlab::bindings::row_sum);
