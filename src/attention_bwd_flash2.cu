// The tiled backward rungs' launchers: the preprocess (D, lse log2(e), dq_accum zeroed) and the
// dq conversion they share, and rung 2's main kernel (FlashAttention-2 style) over key blocks.
#include <type_traits>

#include "kernels/attention/backward/02_flash2.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab::detail {

namespace {

// f(std::integral_constant<int, kLanes>) with kLanes = kernels::attn_bwd_row_lanes(headdim).
template <typename F>
void row_lanes_switch(int headdim, F&& f) {
  switch (kernels::attn_bwd_row_lanes(headdim)) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: return f(std::integral_constant<int, 32>{});
  }
}

}  // namespace

void launch_attn_bwd_preprocess(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  if (p.seqlen_q == 0) return;
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    row_lanes_switch(p.headdim, [&](auto lanes) {
      constexpr int kLanes = decltype(lanes)::value, kRows = 4 * (32 / kLanes);  // rows per 128-thread block
      const dim3 grid(static_cast<unsigned>(p.dsum_rows / kRows), p.nheads, p.batch);  // dsum_rows: a multiple of 128
      FLASHLAB_LAUNCH((kernels::attn_bwd_dsum_rows_kernel<T, kLanes>), grid, 128, 0, stream, p);
    });
  });
}

void launch_attn_bwd_dq_convert(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  if (p.seqlen_q == 0) return;
  if (p.dq_accum_tiled) {  // rung 2's tiles, in the layout of the main kernel that added them
    return HALF_DTYPE_SWITCH(dtype, T, [&] {
      HEADDIM_SWITCH(p.headdim, kD, [&] {
        BOOL_SWITCH(p.dropout_p > 0.f, kDropout, [&] {  // the main kernel's kDropout (launch_attn_bwd_flash2)
          using Tr = kernels::Flash2BwdTraits<kD, kDropout>;
          const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_q, Tr::kBlockM)), p.nheads, p.batch);
          FLASHLAB_LAUNCH((kernels::attn_bwd_dq_convert_tiles_kernel<T, kD, kDropout>), grid, Tr::kThreads, 0, stream, p);
        });
      });
    });
  }
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    row_lanes_switch(p.headdim, [&](auto lanes) {
      constexpr int kLanes = decltype(lanes)::value, kRows = 4 * (32 / kLanes);
      const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_q, kRows)), p.nheads, p.batch);
      FLASHLAB_LAUNCH((kernels::attn_bwd_dq_convert_rows_kernel<T, kLanes>), grid, 128, 0, stream, p);
    });
  });
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
