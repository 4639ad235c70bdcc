// TVM-FFI exports of the serving ops (include/flashlab/serving.h): attention-state merges, the
// paged KV cache's append and batch decode.
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

// New tokens into a paged KV cache; layout 0: NHD, 1: HND (checked by the library).
void append_paged_kv_cache(tvm::ffi::TensorView append_k, tvm::ffi::TensorView append_v, tvm::ffi::TensorView batch_indices,
                           tvm::ffi::TensorView positions, tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                           tvm::ffi::TensorView kv_indices, tvm::ffi::TensorView kv_indptr,
                           tvm::ffi::TensorView kv_last_page_len, int64_t layout) {
  constexpr const char* op = "append_paged_kv_cache";
  call([&] {
    const TensorView Ak = to_flashlab(append_k, op, "append_k"), Av = to_flashlab(append_v, op, "append_v"),
                     Bi = to_flashlab(batch_indices, op, "batch_indices"), Pos = to_flashlab(positions, op, "positions"),
                     Kc = to_flashlab(k_cache, op, "k_cache"), Vc = to_flashlab(v_cache, op, "v_cache"),
                     Ind = to_flashlab(kv_indices, op, "kv_indices"), Ptr = to_flashlab(kv_indptr, op, "kv_indptr"),
                     Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len");
    const auto kv_layout = layout >= 0 && layout <= 1 ? static_cast<KvLayout>(layout) : static_cast<KvLayout>(-1);
    flashlab::append_paged_kv_cache(Ak, Av, Bi, Pos, Kc, Vc, Ind, Ptr, Last, kv_layout, current_stream(Kc));
  });
}

// out (and lse, when given) = batch decode of q over a paged KV cache; layout 0: NHD, 1: HND.
void batch_decode_paged(tvm::ffi::TensorView q, tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                        tvm::ffi::TensorView kv_indices, tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_last_page_len,
                        tvm::ffi::TensorView out, OptTensor lse, int64_t layout, double softmax_scale, int64_t rung) {
  constexpr const char* op = "batch_decode_paged";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), Kc = to_flashlab(k_cache, op, "k_cache"),
                     Vc = to_flashlab(v_cache, op, "v_cache"), Ind = to_flashlab(kv_indices, op, "kv_indices"),
                     Ptr = to_flashlab(kv_indptr, op, "kv_indptr"), Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len"),
                     O = to_flashlab(out, op, "out"), L = to_flashlab_opt(lse, op, "lse");
    const auto kv_layout = layout >= 0 && layout <= 1 ? static_cast<KvLayout>(layout) : static_cast<KvLayout>(-1);
    flashlab::batch_decode_paged(Q, Kc, Vc, Ind, Ptr, Last, O, lse.has_value() ? &L : nullptr, kv_layout,
                                 static_cast<float>(softmax_scale), current_stream(Q), to_rung(op, rung, kPagedDecodeRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_state, flashlab::bindings::merge_state);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states, flashlab::bindings::merge_states);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(append_paged_kv_cache, flashlab::bindings::append_paged_kv_cache);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_paged, flashlab::bindings::batch_decode_paged);
