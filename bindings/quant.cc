// TVM-FFI exports of the quantize family (include/flashlab/quant.h).
#include <cstdint>
#include <string>

#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include "bindings/convert.h"
#include "flashlab/quant.h"

namespace flashlab::bindings {

// "per_token" / "per_tensor" -> QuantScheme; anything else is the C++ API's kind of error.
QuantScheme to_scheme(const std::string& s) {
  if (s == "per_token") return QuantScheme::kPerToken;
  if (s == "per_tensor") return QuantScheme::kPerTensor;
  throw Error(detail::concat("quantize: argument 'scheme': expected per_token or per_tensor, got ", s));
}

// out = round(input / scale), scales written; out's dtype (e4m3 or int8) chooses the format.
void quantize(tvm::ffi::TensorView input, tvm::ffi::TensorView out, tvm::ffi::TensorView scales,
              tvm::ffi::String scheme, int64_t rung) {
  constexpr const char* op = "quantize";
  call([&] {
    const QuantScheme sch = to_scheme(std::string(scheme));
    const TensorView I = to_flashlab(input, op, "input"), O = to_flashlab(out, op, "out"),
                     S = to_flashlab(scales, op, "scales");
    flashlab::quantize(I, O, S, sch, current_stream(I), to_rung(op, rung, kQuantRungs));
  });
}

// out = q * scales (per token [rows] or per tensor [1]).
void dequantize(tvm::ffi::TensorView q, tvm::ffi::TensorView scales, tvm::ffi::TensorView out) {
  constexpr const char* op = "dequantize";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), S = to_flashlab(scales, op, "scales"),
                     O = to_flashlab(out, op, "out");
    flashlab::dequantize(Q, S, O, current_stream(Q));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(quantize, flashlab::bindings::quantize);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequantize, flashlab::bindings::dequantize);
