// Body of launch_attn_flash2_hdim<kHeadDim>, included by one src/attention_flash2_d<D>.cu per
// head dim.
#pragma once

#include "kernels/attention/03_flash2.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab::detail {

template <int kHeadDim>
void launch_attn_flash2_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  // Softcap or ALiBi take the generic score path (one m16 tile per warp), as does dropout (its
  // draws need the registers); plain scores, masks included, the lighter one with two tiles per
  // warp.
  BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr || p.dropout_p > 0.f, kScoreMod, [&] {
    using Tr = kernels::Flash2Traits<kHeadDim, kScoreMod>;
    HALF_DTYPE_SWITCH(dtype, T, [&] {
      // <.., true, true> with dropout; <.., kScoreMod, false> without (never <.., false, true>).
      const auto kernel = p.dropout_p > 0.f ? kernels::attn_flash2_kernel<T, kHeadDim, kScoreMod, kScoreMod>
                                            : kernels::attn_flash2_kernel<T, kHeadDim, kScoreMod, false>;
      FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
      const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_q, Tr::kBlockM)), p.nheads, p.batch);
      FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
    });
  });
}

// Rung 3 over a paged KV cache (the paged prefill's portable rung, src/paged_prefill.cu): p.kv_indptr
// set, q and o varlen, no dropout.
template <int kHeadDim>
void launch_attn_flash2_paged_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
    using Tr = kernels::Flash2Traits<kHeadDim, kScoreMod>;
    HALF_DTYPE_SWITCH(dtype, T, [&] {
      const auto kernel = kernels::attn_flash2_kernel<T, kHeadDim, kScoreMod, false, true>;
      FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
      const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_q, Tr::kBlockM)), p.nheads, p.batch);
      FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
    });
  });
}

}  // namespace flashlab::detail
