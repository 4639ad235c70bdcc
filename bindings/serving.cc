// TVM-FFI exports of the serving ops (include/flashlab/serving.h): attention-state merges, the
// paged KV cache's append, batch decode and batch prefill.
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/serving.h"

namespace flashlab::bindings {

// The layout code (0: NHD, 1: HND); anything else maps to an invalid KvLayout the library rejects.
KvLayout to_layout(int64_t layout) {
  return layout >= 0 && layout <= 1 ? static_cast<KvLayout>(layout) : static_cast<KvLayout>(-1);
}

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
    flashlab::append_paged_kv_cache(Ak, Av, Bi, Pos, Kc, Vc, Ind, Ptr, Last, to_layout(layout), current_stream(Kc));
  });
}

// out (and lse, when given) = batch decode of q over a paged KV cache; layout 0: NHD, 1: HND.
void batch_decode_paged(tvm::ffi::TensorView q, tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                        tvm::ffi::TensorView kv_indices, tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_last_page_len,
                        tvm::ffi::TensorView out, OptTensor lse, int64_t layout, double softmax_scale, int64_t rung,
                        double k_scale, double v_scale) {
  constexpr const char* op = "batch_decode_paged";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), Kc = to_flashlab(k_cache, op, "k_cache"),
                     Vc = to_flashlab(v_cache, op, "v_cache"), Ind = to_flashlab(kv_indices, op, "kv_indices"),
                     Ptr = to_flashlab(kv_indptr, op, "kv_indptr"), Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len"),
                     O = to_flashlab(out, op, "out"), L = to_flashlab_opt(lse, op, "lse");
    flashlab::batch_decode_paged(Q, Kc, Vc, Ind, Ptr, Last, O, lse.has_value() ? &L : nullptr, to_layout(layout),
                                 static_cast<float>(softmax_scale), current_stream(Q), to_rung(op, rung, kPagedDecodeRungs),
                                 static_cast<float>(k_scale), static_cast<float>(v_scale));
  });
}

// The prefill's options from the binding's scalars.
PagedPrefillOptions prefill_options(const char* op, bool causal, int64_t window_left, double softcap, double softmax_scale) {
  FLASHLAB_CHECK(window_left >= -1 && window_left <= 0x7fffffff, op,
                 ": argument 'window_left': expected -1 (unbounded) or a count below 2^31, got ", window_left);
  PagedPrefillOptions opt;
  opt.causal = causal, opt.window_left = static_cast<int>(window_left), opt.softcap = static_cast<float>(softcap);
  opt.softmax_scale = static_cast<float>(softmax_scale);
  return opt;
}

// out (and lse, when given: (total_q, nheads)) = the batch prefill of q (packed by qo_indptr) over
// a paged KV cache; max_qo_len -1: read from qo_indptr.
void batch_prefill_paged(tvm::ffi::TensorView q, tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView k_cache,
                         tvm::ffi::TensorView v_cache, tvm::ffi::TensorView kv_indices, tvm::ffi::TensorView kv_indptr,
                         tvm::ffi::TensorView kv_last_page_len, tvm::ffi::TensorView out, OptTensor lse, int64_t layout,
                         bool causal, int64_t window_left, double softcap, double softmax_scale, int64_t max_qo_len,
                         int64_t rung) {
  constexpr const char* op = "batch_prefill_paged";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), QP = to_flashlab(qo_indptr, op, "qo_indptr"),
                     Kc = to_flashlab(k_cache, op, "k_cache"), Vc = to_flashlab(v_cache, op, "v_cache"),
                     Ind = to_flashlab(kv_indices, op, "kv_indices"), Ptr = to_flashlab(kv_indptr, op, "kv_indptr"),
                     Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len"), O = to_flashlab(out, op, "out"),
                     L = to_flashlab_opt(lse, op, "lse");
    flashlab::batch_prefill_paged(Q, QP, Kc, Vc, Ind, Ptr, Last, O, lse.has_value() ? &L : nullptr, to_layout(layout),
                                  prefill_options(op, causal, window_left, softcap, softmax_scale), max_qo_len,
                                  current_stream(Q), to_rung(op, rung, kPagedPrefillRungs));
  });
}

// A prefill plan as the 11 integers Python keeps: batch, total_q, max_qo_len, page_size, kv_pages,
// pages_used, device, and the addresses of qo_indptr, kv_indices, kv_indptr, kv_last_page_len.
tvm::ffi::Shape prefill_plan_to_shape(const PrefillPlanInfo& p) {
  return tvm::ffi::Shape({p.batch, p.total_q, p.max_qo_len, p.page_size, p.kv_pages, p.pages_used,
                          static_cast<int64_t>(p.device), static_cast<int64_t>(p.qo_indptr),
                          static_cast<int64_t>(p.kv_indices), static_cast<int64_t>(p.kv_indptr),
                          static_cast<int64_t>(p.kv_last_page_len)});
}
PrefillPlanInfo shape_to_prefill_plan(const tvm::ffi::Shape& s, const char* op) {
  if (s.size() != 11)
    throw Error(detail::concat(op, ": argument 'plan': expected the 11 integers batch_prefill_paged_plan returned, got ", s.size()));
  PrefillPlanInfo p;
  p.batch = s[0], p.total_q = s[1], p.max_qo_len = s[2], p.page_size = s[3], p.kv_pages = s[4], p.pages_used = s[5];
  p.device = static_cast<int>(s[6]);
  p.qo_indptr = static_cast<uint64_t>(s[7]), p.kv_indices = static_cast<uint64_t>(s[8]);
  p.kv_indptr = static_cast<uint64_t>(s[9]), p.kv_last_page_len = static_cast<uint64_t>(s[10]);
  return p;
}

// The plan of a batch prefill: the index tensors' values read (on the caller's current stream) and checked once.
tvm::ffi::Shape batch_prefill_paged_plan(tvm::ffi::TensorView qo_indptr, tvm::ffi::TensorView kv_indices,
                                         tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_last_page_len,
                                         int64_t page_size) {
  constexpr const char* op = "batch_prefill_paged_plan";
  PrefillPlanInfo info;
  call([&] {
    const TensorView QP = to_flashlab(qo_indptr, op, "qo_indptr"), Ind = to_flashlab(kv_indices, op, "kv_indices"),
                     Ptr = to_flashlab(kv_indptr, op, "kv_indptr"), Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len");
    info = flashlab::batch_prefill_paged_plan(QP, Ind, Ptr, Last, page_size, current_stream(QP));
  });
  return prefill_plan_to_shape(info);
}

// out (and lse, when given) = the batch prefill under a plan (no device reads); layout 0: NHD, 1: HND.
void batch_prefill_paged_run(tvm::ffi::Shape plan, tvm::ffi::TensorView q, tvm::ffi::TensorView qo_indptr,
                             tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache, tvm::ffi::TensorView kv_indices,
                             tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_last_page_len, tvm::ffi::TensorView out,
                             OptTensor lse, int64_t layout, bool causal, int64_t window_left, double softcap,
                             double softmax_scale, int64_t rung) {
  constexpr const char* op = "batch_prefill_paged_run";
  call([&] {
    const PrefillPlanInfo info = shape_to_prefill_plan(plan, op);
    const TensorView Q = to_flashlab(q, op, "q"), QP = to_flashlab(qo_indptr, op, "qo_indptr"),
                     Kc = to_flashlab(k_cache, op, "k_cache"), Vc = to_flashlab(v_cache, op, "v_cache"),
                     Ind = to_flashlab(kv_indices, op, "kv_indices"), Ptr = to_flashlab(kv_indptr, op, "kv_indptr"),
                     Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len"), O = to_flashlab(out, op, "out"),
                     L = to_flashlab_opt(lse, op, "lse");
    flashlab::batch_prefill_paged_run(info, Q, QP, Kc, Vc, Ind, Ptr, Last, O, lse.has_value() ? &L : nullptr,
                                      to_layout(layout), prefill_options(op, causal, window_left, softcap, softmax_scale),
                                      current_stream(Q), to_rung(op, rung, kPagedPrefillRungs));
  });
}

// A plan as the 11 integers Python keeps: batch, nheads, nheads_kv, headdim, page_size, device,
// capacity, chunks, chunk_pages, split, id.
tvm::ffi::Shape plan_to_shape(const DecodePlanInfo& p) {
  return tvm::ffi::Shape({p.batch, p.nheads, p.nheads_kv, p.headdim, p.page_size, static_cast<int64_t>(p.device), p.capacity,
                          p.chunks, p.chunk_pages, static_cast<int64_t>(p.split), p.id});
}
DecodePlanInfo shape_to_plan(const tvm::ffi::Shape& s, const char* op) {
  if (s.size() != 11)
    throw Error(detail::concat(op, ": argument 'plan': expected the 11 integers batch_decode_plan returned, got ", s.size()));
  DecodePlanInfo p;
  p.batch = s[0], p.nheads = s[1], p.nheads_kv = s[2], p.headdim = s[3], p.page_size = s[4];
  p.device = static_cast<int>(s[5]), p.capacity = s[6], p.chunks = s[7], p.chunk_pages = s[8], p.split = s[9] != 0;
  p.id = s[10];
  return p;
}

// Bytes of a decode plan's workspace for this shape on CUDA device `device`.
int64_t batch_decode_workspace_bytes(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t headdim, int64_t device) {
  int64_t bytes = 0;
  call([&] {
    const int dev = device >= 0 && device <= 1 << 20 ? static_cast<int>(device) : -1;
    bytes = flashlab::batch_decode_workspace_bytes(batch, nheads, nheads_kv, headdim, dev);
  });
  return bytes;
}

// The plan of a decode (rung 3) from host page counts, copied into `workspace` on the caller's
// current stream of its device.
tvm::ffi::Shape batch_decode_plan(tvm::ffi::TensorView kv_indptr_host, int64_t page_size, int64_t nheads, int64_t nheads_kv,
                                  int64_t headdim, tvm::ffi::TensorView workspace, bool kv_fp8) {
  constexpr const char* op = "batch_decode_plan";
  DecodePlanInfo info;
  call([&] {
    const TensorView Ptr = to_flashlab(kv_indptr_host, op, "kv_indptr_host"), W = to_flashlab(workspace, op, "workspace");
    info = flashlab::batch_decode_plan(Ptr, page_size, nheads, nheads_kv, headdim, W, current_stream(W),
                                       kv_fp8 ? DType::kE4M3 : DType::kBF16);
  });
  return plan_to_shape(info);
}

// out (and lse, when given) = decode rung 3 under a plan; layout 0: NHD, 1: HND.
void batch_decode_run(tvm::ffi::Shape plan, tvm::ffi::TensorView workspace, tvm::ffi::TensorView q,
                      tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache, tvm::ffi::TensorView kv_indices,
                      tvm::ffi::TensorView kv_indptr, tvm::ffi::TensorView kv_last_page_len, tvm::ffi::TensorView out,
                      OptTensor lse, int64_t layout, double softmax_scale, double k_scale, double v_scale) {
  constexpr const char* op = "batch_decode_run";
  call([&] {
    const DecodePlanInfo info = shape_to_plan(plan, op);
    const TensorView W = to_flashlab(workspace, op, "workspace"), Q = to_flashlab(q, op, "q"),
                     Kc = to_flashlab(k_cache, op, "k_cache"), Vc = to_flashlab(v_cache, op, "v_cache"),
                     Ind = to_flashlab(kv_indices, op, "kv_indices"), Ptr = to_flashlab(kv_indptr, op, "kv_indptr"),
                     Last = to_flashlab(kv_last_page_len, op, "kv_last_page_len"), O = to_flashlab(out, op, "out"),
                     L = to_flashlab_opt(lse, op, "lse");
    flashlab::batch_decode_run(info, W, Q, Kc, Vc, Ind, Ptr, Last, O, lse.has_value() ? &L : nullptr, to_layout(layout),
                               static_cast<float>(softmax_scale), current_stream(Q), static_cast<float>(k_scale),
                               static_cast<float>(v_scale));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_state, flashlab::bindings::merge_state);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(merge_states, flashlab::bindings::merge_states);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(append_paged_kv_cache, flashlab::bindings::append_paged_kv_cache);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_paged, flashlab::bindings::batch_decode_paged);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_workspace_bytes, flashlab::bindings::batch_decode_workspace_bytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_plan, flashlab::bindings::batch_decode_plan);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode_run, flashlab::bindings::batch_decode_run);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_prefill_paged, flashlab::bindings::batch_prefill_paged);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_prefill_paged_plan, flashlab::bindings::batch_prefill_paged_plan);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_prefill_paged_run, flashlab::bindings::batch_prefill_paged_run);
