// TVM-FFI exports of the RoPE family (include/flashlab/rope.h).
#include <cstdint>
#include <limits>

#include <tvm/ffi/function.h>

#include "bindings/convert.h"
#include "flashlab/rope.h"

namespace flashlab::bindings {

namespace {

// An int64 from Python as the C++ API's int; out-of-range values become one the API rejects
// with its own message (never wrap into a valid one).
int to_int(int64_t v) {
  if (v > std::numeric_limits<int>::max()) return std::numeric_limits<int>::max();
  if (v < std::numeric_limits<int>::min()) return std::numeric_limits<int>::min();
  return static_cast<int>(v);
}

}  // namespace

// q_out, k_out = rope(q, k) at pos_ids (q_out may be q, k_out k) on the caller's current stream.
void apply_rope_pos_ids(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_out,
                        tvm::ffi::TensorView k_out, tvm::ffi::TensorView pos_ids, int64_t rotary_dim, bool interleave,
                        double rope_theta, double rope_scale, bool llama31, double low_freq_factor,
                        double high_freq_factor, double llama31_factor, int64_t old_context_len, int64_t rung) {
  constexpr const char* op = "apply_rope_pos_ids";
  call([&] {
    const TensorView Q = to_flashlab(q, op, "q"), K = to_flashlab(k, op, "k"), QO = to_flashlab(q_out, op, "q_out"),
                     KO = to_flashlab(k_out, op, "k_out"), P = to_flashlab(pos_ids, op, "pos_ids");
    RopeOptions o;
    o.rotary_dim = to_int(rotary_dim);
    o.interleave = interleave;
    o.rope_theta = static_cast<float>(rope_theta);
    o.rope_scale = static_cast<float>(rope_scale);
    o.llama31 = llama31;
    o.low_freq_factor = static_cast<float>(low_freq_factor);
    o.high_freq_factor = static_cast<float>(high_freq_factor);
    o.llama31_factor = static_cast<float>(llama31_factor);
    o.old_context_len = to_int(old_context_len);
    flashlab::apply_rope_pos_ids(Q, K, QO, KO, P, o, current_stream(Q), to_rung(op, rung, kRopeRungs));
  });
}

// vLLM's layout: query [nnz, num_q_heads * head_size], key [nnz, num_k_heads * head_size].
void apply_rope_with_cos_sin_cache(tvm::ffi::TensorView positions, tvm::ffi::TensorView query,
                                   tvm::ffi::TensorView key, tvm::ffi::TensorView query_out,
                                   tvm::ffi::TensorView key_out, int64_t head_size, tvm::ffi::TensorView cos_sin_cache,
                                   bool interleave, int64_t rung) {
  constexpr const char* op = "apply_rope_with_cos_sin_cache";
  call([&] {
    const TensorView P = to_flashlab(positions, op, "positions"), C = to_flashlab(cos_sin_cache, op, "cos_sin_cache");
    const TensorView Q = split_heads(to_flashlab(query, op, "query"), head_size, op, "query"),
                     K = split_heads(to_flashlab(key, op, "key"), head_size, op, "key"),
                     QO = split_heads(to_flashlab(query_out, op, "query_out"), head_size, op, "query_out"),
                     KO = split_heads(to_flashlab(key_out, op, "key_out"), head_size, op, "key_out");
    flashlab::apply_rope_with_cos_sin_cache(Q, K, QO, KO, P, C, interleave, current_stream(Q),
                                            to_rung(op, rung, kRopeRungs));
  });
}

}  // namespace flashlab::bindings

TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope_pos_ids, flashlab::bindings::apply_rope_pos_ids);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope_with_cos_sin_cache, flashlab::bindings::apply_rope_with_cos_sin_cache);
