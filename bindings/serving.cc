// TVM-FFI exports of the serving ops (include/flashlab/serving.h): attention-state merges.
#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/serving.h"

namespace flashlab::bindings {

// (v_out, s_out) = the merge of (v_a, s_a) and (v_b, s_b), on the caller's current stream of v_a's device.
void merge_state(tvm::ffi::TensorView v_a, tvm::ffi::TensorView s_a, tvm::ffi::TensorView v_b, tvm::ffi::TensorView s_b,
                 tvm::ffi::TensorView v_out, tvm::ffi::TensorView s_out) {
  constexpr const char* op = "merge_state";
  call([&] {
    const TensorView Va = to_flashlab(v_a, op, "v_a"), Sa = to_flashlab(s_a, op, "s_a"), Vb = to_flashlab(v_b, op, "v_b"),
                     Sb = to_flashlab(s_b, op, "s_b"), Vo = to_flashlab(v_out, op, "v_out"),
                     So = to_flashlab(s_out, op, "s_out");
    flashlab::merge_state(Va, Sa, Vb, Sb, Vo, So, current_stream(Va));
  });
}

// (v_out, s_out) = the merge of the states along v's / s's dim 1.
void merge_states(tvm::ffi::TensorView v, tvm::ffi::TensorView s, tvm::ffi::TensorView v_out, tvm::ffi::TensorView s_out) {
  constexpr const char* op = "merge_states";
  call([&] {
    const TensorView V = to_flashlab(v, op, "v"), S = to_flashlab(s, op, "s"), Vo = to_flashlab(v_out, op, "v_out"),
                     So = to_flashlab(s_out, op, "s_out");
    flashlab::merge_states(V, S, Vo, So, current_stream(V));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_state, flashlab::bindings::merge_state);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states, flashlab::bindings::merge_states);
