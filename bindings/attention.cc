// TVM-FFI export of the attention forward ladder (include/flashlab/attention.h).
#include <cstdint>
#include <limits>

#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include "bindings/convert.h"
#include "flashlab/attention.h"

namespace flashlab::bindings {

namespace {

// A float option from Python (double) as the C++ API's float. A finite value beyond float's
// range becomes +-inf, which the API rejects by name, rather than a rounded valid one.
float to_float(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (v > kMax) return std::numeric_limits<float>::infinity();
  if (v < -kMax) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);
}

// The dropout options from Python: dropout_p as a float (the C++ API checks its range), the seed's
// 64 bits as given (Python passes a uint64 seed as the int64 of the same bits), the offset checked
// to fit the API's uint32 (a wrapped value would silently repeat another call's mask).
void set_dropout_options(AttnFwdOptions& o, const char* op, double dropout_p, int64_t dropout_seed,
                         int64_t dropout_offset) {
  if (dropout_offset < 0 || dropout_offset > int64_t{std::numeric_limits<uint32_t>::max()})
    throw Error(detail::concat(op, ": argument 'dropout_offset': expected 0 .. 2^32 - 1, got ", dropout_offset));
  o.dropout_p = to_float(dropout_p);
  o.dropout_seed = static_cast<uint64_t>(dropout_seed);
  o.dropout_offset = static_cast<uint32_t>(dropout_offset);
}

// The options attention_fwd and attention_bwd share, from their Python arguments (optional
// tensors already converted: nullptr when None).
void set_shared_options(AttnFwdOptions& o, const tvm::ffi::Optional<double>& softmax_scale, bool causal,
                        int64_t window_left, int64_t window_right, double softcap, const TensorView* alibi_slopes,
                        const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k, int64_t max_seqlen_q,
                        int64_t max_seqlen_k, const TensorView* softmax_lse) {
  o.softmax_scale = softmax_scale.has_value() ? to_float(softmax_scale.value()) : 0.f;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = to_float(softcap);
  o.alibi_slopes = alibi_slopes;
  o.cu_seqlens_q = cu_seqlens_q;
  o.cu_seqlens_k = cu_seqlens_k;
  o.max_seqlen_q = max_seqlen_q;
  o.max_seqlen_k = max_seqlen_k;
  o.softmax_lse = softmax_lse;
}

}  // namespace

// out = softmax(scale * q k^T (+ softcap, ALiBi, mask)) v on the caller's current stream of q's
// device. softmax_lse / attn_probs: optional outputs; alibi_slopes: optional input; cu_seqlens_q
// and cu_seqlens_k (both or neither) switch to the packed variable-length layout, with
// max_seqlen_q / max_seqlen_k (ignored otherwise); softmax_scale None: 1 / sqrt(headdim);
// q_descale / k_descale / v_descale: FP8 descale factors (optional); dropout_p, dropout_seed (the
// uint64 seed's bits as an int64) and dropout_offset (0 .. 2^32 - 1): dropout, off at dropout_p = 0.
void attention_fwd(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView out,
                   OptTensor softmax_lse, OptTensor attn_probs, OptTensor alibi_slopes, OptTensor cu_seqlens_q,
                   OptTensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                   tvm::ffi::Optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                   double softcap, OptTensor q_descale, OptTensor k_descale, OptTensor v_descale, int64_t rung,
                   double dropout_p, int64_t dropout_seed, int64_t dropout_offset) {
  constexpr const char* op = "attention_fwd";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), K = to_flashlab(k, op, "k"), V = to_flashlab(v, op, "v"),
                     O = to_flashlab(out, op, "out");
    const TensorView Lse = to_flashlab_opt(softmax_lse, op, "softmax_lse"),
                     Probs = to_flashlab_opt(attn_probs, op, "attn_probs"),
                     Alibi = to_flashlab_opt(alibi_slopes, op, "alibi_slopes"),
                     CuQ = to_flashlab_opt(cu_seqlens_q, op, "cu_seqlens_q"),
                     CuK = to_flashlab_opt(cu_seqlens_k, op, "cu_seqlens_k"),
                     Dq = to_flashlab_opt(q_descale, op, "q_descale"), Dk = to_flashlab_opt(k_descale, op, "k_descale"),
                     Dv = to_flashlab_opt(v_descale, op, "v_descale");
    AttnFwdOptions o;
    set_shared_options(o, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes.has_value() ? &Alibi : nullptr,
                       cu_seqlens_q.has_value() ? &CuQ : nullptr, cu_seqlens_k.has_value() ? &CuK : nullptr,
                       max_seqlen_q, max_seqlen_k, softmax_lse.has_value() ? &Lse : nullptr);
    o.attn_probs = attn_probs.has_value() ? &Probs : nullptr;
    o.q_descale = q_descale.has_value() ? &Dq : nullptr;
    o.k_descale = k_descale.has_value() ? &Dk : nullptr;
    o.v_descale = v_descale.has_value() ? &Dv : nullptr;
    set_dropout_options(o, op, dropout_p, dropout_seed, dropout_offset);
    flashlab::attention_fwd(Q, K, V, O, current_stream(Q), to_rung(op, rung, kAttnFwdRungs), o);
  });
}

// dq, dk, dv = gradients of sum(dout * out) (include/flashlab/attention.h, attention_bwd), written
// on the caller's current stream of q's device; softmax_lse: the forward's (required); the
// other options as attention_fwd's (the dropout ones the forward's, which regenerate its mask).
void attention_bwd(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView out,
                   tvm::ffi::TensorView dout, tvm::ffi::TensorView dq, tvm::ffi::TensorView dk, tvm::ffi::TensorView dv,
                   OptTensor softmax_lse, OptTensor alibi_slopes, OptTensor cu_seqlens_q, OptTensor cu_seqlens_k,
                   int64_t max_seqlen_q, int64_t max_seqlen_k, tvm::ffi::Optional<double> softmax_scale, bool causal,
                   int64_t window_left, int64_t window_right, double softcap, bool deterministic, int64_t rung,
                   double dropout_p, int64_t dropout_seed, int64_t dropout_offset) {
  constexpr const char* op = "attention_bwd";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), K = to_flashlab(k, op, "k"), V = to_flashlab(v, op, "v"),
                     O = to_flashlab(out, op, "out"), dO = to_flashlab(dout, op, "dout"), dQ = to_flashlab(dq, op, "dq"),
                     dK = to_flashlab(dk, op, "dk"), dV = to_flashlab(dv, op, "dv");
    const TensorView Lse = to_flashlab_opt(softmax_lse, op, "softmax_lse"),
                     Alibi = to_flashlab_opt(alibi_slopes, op, "alibi_slopes"),
                     CuQ = to_flashlab_opt(cu_seqlens_q, op, "cu_seqlens_q"),
                     CuK = to_flashlab_opt(cu_seqlens_k, op, "cu_seqlens_k");
    AttnBwdOptions o;
    set_shared_options(o, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes.has_value() ? &Alibi : nullptr,
                       cu_seqlens_q.has_value() ? &CuQ : nullptr, cu_seqlens_k.has_value() ? &CuK : nullptr,
                       max_seqlen_q, max_seqlen_k, softmax_lse.has_value() ? &Lse : nullptr);
    o.deterministic = deterministic;
    set_dropout_options(o, op, dropout_p, dropout_seed, dropout_offset);
    flashlab::attention_bwd(Q, K, V, O, dO, dQ, dK, dV, current_stream(Q), to_rung(op, rung, kAttnBwdRungs), o);
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_fwd, flashlab::bindings::attention_fwd);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_bwd, flashlab::bindings::attention_bwd);
