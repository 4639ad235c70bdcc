// Internal: the attention forward host's launchers, one file per rung (rung 3 one per head dim)
// so that they compile in parallel; src/attention.cu validates and dispatches. Arguments are
// already validated.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/attention.h"
#include "flashlab/error.h"
#include "flashlab/tensor.h"
#include "kernels/attention/params.h"

// Head dims 32, 64, 96, 128, 192, 256 (kAttnHeadDims) as a compile-time kHeadDim.
#define HEADDIM_SWITCH(D, NAME, ...)                                                                     \
  [&] {                                                                                                  \
    switch (D) {                                                                                         \
      case 32: { constexpr int NAME = 32; return __VA_ARGS__(); }                                       \
      case 64: { constexpr int NAME = 64; return __VA_ARGS__(); }                                       \
      case 96: { constexpr int NAME = 96; return __VA_ARGS__(); }                                       \
      case 128: { constexpr int NAME = 128; return __VA_ARGS__(); }                                     \
      case 192: { constexpr int NAME = 192; return __VA_ARGS__(); }                                     \
      case 256: { constexpr int NAME = 256; return __VA_ARGS__(); }                                     \
      default: throw ::flashlab::Error(::flashlab::detail::concat("HEADDIM_SWITCH: unsupported head dim ", D)); \
    }                                                                                                    \
  }()

namespace flashlab::detail {

// Rung 2 (src/attention_flash1.cu): init, the FA1 kernel, finish; `workspace` of
// attention_fwd_workspace_bytes(2, ...) bytes.
void launch_attn_flash1(const AttnFwdParams& p, DType dtype, void* workspace, cudaStream_t stream);

// Rung 3 (src/attention_flash2.cu dispatches to src/attention_flash2_d<D>.cu).
void launch_attn_flash2(const AttnFwdParams& p, DType dtype, cudaStream_t stream);
template <int kHeadDim>
void launch_attn_flash2_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream);

// Rung 4 (src/attention_hopper.cu dispatches to src/attention_hopper_d<D>.cu): head dims 64 ..
// 256, sm_90a.
void launch_attn_hopper(const AttnFwdParams& p, DType dtype, cudaStream_t stream);
template <int kHeadDim>
void launch_attn_hopper_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream);

// The paged prefill's rungs (src/paged_prefill_d<D>.cu instantiate them for head dims 64, 128,
// 256): rung 3 and rung 4 with K and V gathered through the page table (p.kv_indptr set, q and o
// varlen, fp16 / bf16; rung 4 on sm_90a).
template <int kHeadDim>
void launch_attn_flash2_paged_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream);
template <int kHeadDim>
void launch_attn_hopper_paged_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream);

// The tiled backward rungs (2, 3): p.dsum, p.lse_log2 and p.dq_accum point into their workspace
// (attention_bwd_workspace_bytes). The preprocess (D, lse log2(e), dq_accum zeroed) runs first,
// then one rung's main kernel, then the dq conversion (src/attention_bwd_flash2.cu); p.dq_accum_tiled
// (rung 2's accumulator layout) set by the caller before all three.
void launch_attn_bwd_preprocess(const AttnBwdParams& p, DType dtype, cudaStream_t stream);
void launch_attn_bwd_dq_convert(const AttnBwdParams& p, DType dtype, cudaStream_t stream);
// Rung 2's main kernel.
void launch_attn_bwd_flash2(const AttnBwdParams& p, DType dtype, cudaStream_t stream);
// Rung 3's (src/attention_bwd_hopper.cu): head dims 64 and 128, no dropout, sm_90a.
void launch_attn_bwd_hopper(const AttnBwdParams& p, DType dtype, cudaStream_t stream);
// attention_bwd at rung 2 or 3 (validation, workspace, preprocess, dq conversion: the
// library's) with `main` launched in place of that rung's main kernel: how
// bench/experiments/attention_bwd_hopper_ablation.cu times other variants of rung 3.
using AttnBwdMainLaunch = void (*)(const AttnBwdParams& p, DType dtype, cudaStream_t stream);
void attention_bwd_with_main(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             cudaStream_t stream, int rung, const AttnBwdOptions& options, AttnBwdMainLaunch main);

}  // namespace flashlab::detail
