// The attention forward's argument checks (src/attention.cu), shared with the backward
// (src/attention_bwd.cu), which takes the same inputs and options.
#pragma once

#include <functional>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/attention.h"
#include "flashlab/validate.h"
#include "kernels/attention/params.h"

namespace flashlab::detail {

// Every check of attention_fwd() on q, k, v, out and the options, messages naming `op`; throws
// flashlab::Error on the first that fails (nothing launched), else the kernel parameters
// (window and scale resolved). Reads cu_seqlens from the device (waiting on `stream`) unless
// the stream is capturing; more_host_checks (a caller's own, e.g. the backward's on its
// gradients) runs just before that read, after every host-side check here.
AttnFwdParams attention_validated_params(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& out, int rung, const AttnFwdOptions& opt, cudaStream_t stream,
                                         const std::function<void()>& more_host_checks = {});

// cu_seqlens values v (batch + 1, on the host): v[0] = 0, non-decreasing; returns the longest length.
int64_t cu_seqlens_longest(const check::Arg& cu, const std::vector<int>& v, int64_t batch);

// cu_seqlens values (read from the device, waiting for `stream`): cu[0] = 0, non-decreasing,
// cu[batch] = `total` (the packed rows of `ref`), every length <= max_len (named max_name);
// returns the longest length.
int64_t check_cu_seqlens_values(const check::Arg& cu, const check::Arg& ref, int64_t batch, int64_t total, int64_t max_len,
                                const char* max_name, cudaStream_t stream);

// TMA (forward rung 4, backward rung 3) walks a tensor with positive strides only: no broadcast
// (0) or reversed dims.
bool tma_strides(const TensorView& t);

// No two elements of the output a at one address.
void attention_no_self_overlap(const check::Arg& a);

}  // namespace flashlab::detail
