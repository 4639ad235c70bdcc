// Rung 4's persistent variant (kernels/attention/04_hopper_persistent.cuh; prepared, measured by
// bench/experiments/attention_hopper_ablation.cu --persistent, not in the library yet): the
// arguments of rung 4, its two counters in the stream's zero-filled counters workspace (the kernel
// leaves them zero), min(tiles, SMs) CTAs.
#pragma once

#include <algorithm>
#include <climits>

#include "kernels/attention/04_hopper_persistent.cuh"
#include "src/attention_hopper_hdim.cuh"
#include "src/core/launch.h"

namespace flashlab::detail {

template <typename T, int kHeadDim, bool kScoreMod, int kBlockN = 0>
void launch_attn_hopper_persistent(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  using Tr = kernels::HopperAttnPersistentTraits<kHeadDim, kScoreMod, kBlockN>;
  const kernels::HopperAttnArgs args = attn_hopper_args<T, kHeadDim, kScoreMod, kBlockN>(p, dtype, stream);
  const int64_t tiles = static_cast<int64_t>(args.m_blocks) * p.nheads * p.batch;
  FLASHLAB_CHECK(tiles <= INT_MAX, "attention_fwd: arguments 'q', 'max_seqlen_q': expected at most 2^31 - 1 query blocks "
                 "of 128 rows x heads x batches for rung 4, got ", tiles);
  if (tiles == 0) return;
  auto* counters = static_cast<int*>(workspace(stream, 2 * sizeof(int), Workspace::kCounters));
  const auto kernel = kernels::attn_hopper_persistent_kernel<T, kHeadDim, kScoreMod, kBlockN>;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles, sm_count()));
  FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, args, counters, static_cast<int>(tiles));
}

}  // namespace flashlab::detail
