// Rung 3's launcher (FlashAttention-2): one translation unit per head dim
// (src/attention_flash2_d<D>.cu instantiate launch_attn_flash2_hdim<D>).
#include "src/attention_launch.h"

namespace flashlab::detail {

void launch_attn_flash2(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  HEADDIM_SWITCH(p.headdim, kD, [&] { launch_attn_flash2_hdim<kD>(p, dtype, stream); });
}

}  // namespace flashlab::detail
