// Backward rung 3's launcher (Hopper): the main kernel over key blocks (the preprocess and the dq
// conversion are rung 2's, src/attention_bwd_flash2.cu); its variant's launch is
// src/attention_bwd_hopper_launch.cuh.
#include "src/attention_bwd_hopper_launch.cuh"
#include "src/attention_launch.h"
#include "src/core/static_switch.h"

namespace flashlab::detail {

void launch_attn_bwd_hopper(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  // No key rows (or no query rows) anywhere: nothing for a tensor map to describe; rung 2 writes
  // the zero dk, dv without them.
  if (p.seqlen_k == 0 || p.total_k == 0 || p.total_q == 0) return launch_attn_bwd_flash2(p, dtype, stream);
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
      // The tiles addressed as shared memory (STS / LDS): 3% faster than generic accesses at head
      // dim 64 on an H200; at 128 1% slower until the dQ stores lost their bank conflicts, 0.4-9%
      // faster since (H100, 2026-11-27; bench/experiments/attention_bwd_hopper_ablation.cu).
      // dQ's TMA reductions issued by the producer's warps (kDqByProducer) and dQ's product issued
      // before dK's (kDqFirst), together: at head dim 128 8-13% faster than neither, 4-9% than
      // either alone; at 64 2-3% and 1-3% (H100, 2026-11-27, df00425; before the dQ stores lost
      // their bank conflicts kDqByProducer was 1.4-1.8% slower at 128 and kDqFirst 0-5%).
      if (p.headdim == 64) return launch_attn_bwd_hopper_variant<T, 64, kScoreMod, 2, true, true, true>(p, dtype, stream);
      if (p.headdim == 128) return launch_attn_bwd_hopper_variant<T, 128, kScoreMod, 2, true, true, true>(p, dtype, stream);
      // (softcap at 256: the validation and the automatic choice send it to rung 2; the launcher refuses it)
      if (p.headdim == 256) return launch_attn_bwd_hopper_split<T, 256, kScoreMod>(p, dtype, stream);
      throw Error(concat("launch_attn_bwd_hopper: unsupported head dim ", p.headdim));
    });
  });
}

}  // namespace flashlab::detail
