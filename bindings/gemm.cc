// TVM-FFI export of the GEMM ladder (include/flashlab/gemm.h).
#include <cstdint>

#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include "bindings/convert.h"
#include "flashlab/gemm.h"

namespace flashlab::bindings {

// c = alpha * a @ b + beta * c + bias on the caller's current stream of a's device; bias None:
// no bias; rung None: the highest rung that takes these arguments (gemm_best_rung).
void gemm(tvm::ffi::TensorView a, tvm::ffi::TensorView b, tvm::ffi::TensorView c,
          tvm::ffi::Optional<tvm::ffi::TensorView> bias, double alpha, double beta, tvm::ffi::Optional<int64_t> rung) {
  constexpr const char* op = "gemm";
  call([&] {
    const TensorView A = to_flashlab(a, op, "a"), B = to_flashlab(b, op, "b"), C = to_flashlab(c, op, "c");
    const TensorView Bias = bias.has_value() ? to_flashlab(bias.value(), op, "bias") : TensorView{};
    GemmEpilogue epilogue;
    epilogue.alpha = static_cast<float>(alpha);
    epilogue.beta = static_cast<float>(beta);
    epilogue.bias = bias.has_value() ? &Bias : nullptr;
    const int r = rung.has_value() ? to_rung(op, rung.value(), kGemmRungs) : gemm_best_rung(A, B, C, epilogue);
    flashlab::gemm(A, B, C, current_stream(A), r, epilogue);
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemm, flashlab::bindings::gemm);
