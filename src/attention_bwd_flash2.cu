// The tiled backward rungs' launchers: the preprocess (D, lse log2(e), dq_accum zeroed) and the
// dq conversion they share, and rung 2's main kernel (FlashAttention-2 style) over key blocks.
#include "kernels/attention/backward/02_flash2.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab::detail {

void launch_attn_bwd_preprocess(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  if (p.seqlen_q == 0) return;
  const dim3 padded_rows_grid(static_cast<unsigned>(p.dsum_rows / 4), p.nheads, p.batch);
  HALF_DTYPE_SWITCH(dtype, T, [&] { FLASHLAB_LAUNCH(kernels::attn_bwd_dsum_kernel<T>, padded_rows_grid, 128, 0, stream, p); });
}

void launch_attn_bwd_dq_convert(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  if (p.seqlen_q == 0) return;
  const dim3 rows_grid(static_cast<unsigned>(ceil_div(p.seqlen_q, 4)), p.nheads, p.batch);
  HALF_DTYPE_SWITCH(dtype, T, [&] { FLASHLAB_LAUNCH(kernels::attn_bwd_dq_convert_kernel<T>, rows_grid, 128, 0, stream, p); });
}

void launch_attn_bwd_flash2(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  if (p.seqlen_k == 0) return;
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    HEADDIM_SWITCH(p.headdim, kD, [&] {
      // Dropout takes the generic element-wise path and 64-key blocks: <.., true, true> with
      // Flash2BwdTraits<d, true>; never <.., false, true>.
      BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr || p.dropout_p > 0.f, kScoreMod, [&] {
        const auto launch = [&](auto kernel, auto traits) {
          using Tr = typename decltype(traits)::type;
          FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
          // All of the unified L1 as shared memory (up to 217 KB a block at head dim 256).
          FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   cudaSharedmemCarveoutMaxShared));
          const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_k, Tr::kBlockN)), p.nheads_kv, p.batch);
          FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
        };
        if constexpr (kScoreMod) {
          if (p.dropout_p > 0.f)
            return launch(kernels::attn_bwd_flash2_kernel<T, kD, true, true>, TypeTag<kernels::Flash2BwdTraits<kD, true>>{});
        }
        launch(kernels::attn_bwd_flash2_kernel<T, kD, kScoreMod, false>, TypeTag<kernels::Flash2BwdTraits<kD>>{});
      });
    });
  });
}

}  // namespace flashlab::detail
