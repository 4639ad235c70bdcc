// Serving attention (issue 8): what a decode or prefill over split KV needs around its kernels.
// So far the merge of attention states (FlashInfer's cascade merge_state / merge_states). Kernels:
// kernels/serving/, doc: docs/ladder/attention.md (Serving).
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// An attention state is the output v of attention over one segment of the keys and its
// log-sum-exp s (natural log, as attention_fwd's softmax_lse; -inf for a segment with no visible
// key, whose v is then ignored). Two states of the same queries over disjoint key segments merge
// into the state over their union:
//   S = log(e^{s_a} + e^{s_b}),   V = v_a e^{s_a - S} + v_b e^{s_b - S}
// (computed in fp32 with the larger s as the offset; S = -inf and V = 0 when both are -inf).
//   v_a, v_b, v_out: CUDA, (seq, nheads, headdim) contiguous, one dtype: fp32, fp16 or bf16;
//                    headdim >= 1 and a multiple of 16 bytes' worth of elements (8 for fp16/bf16,
//                    4 for fp32), 16-byte aligned.
//   s_a, s_b, s_out: fp32, (seq, nheads) contiguous, on the same device.
// An output may be identical to an input of its kind (in place: v_out = v_a, s_out = s_a) but
// must not otherwise overlap any argument. Enqueued on `stream`; throws flashlab::Error (nothing
// launched) on invalid arguments. seq = 0 or nheads = 0: nothing to do.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, cudaStream_t stream = nullptr);

// The merge of num_states states of the same queries over disjoint key segments:
//   S = log sum_i e^{s_i},   V = sum_i v_i e^{s_i - S}.
//   v: (seq, num_states, nheads, headdim) contiguous (as merge_state's v), num_states >= 1;
//   s: fp32 (seq, num_states, nheads) contiguous; v_out: (seq, nheads, headdim) like v;
//   s_out: fp32 (seq, nheads). Outputs must not overlap the inputs. Otherwise as merge_state.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  cudaStream_t stream = nullptr);

}  // namespace flashlab
