// Rung 4's launcher (Hopper): one translation unit per head dim
// (src/attention_hopper_d<D>.cu instantiate launch_attn_hopper_hdim<D>). Head dim 32 is not
// taken (validated before).
#include "src/attention_launch.h"

namespace flashlab::detail {

void launch_attn_hopper(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  switch (p.headdim) {
    case 64: return launch_attn_hopper_hdim<64>(p, dtype, stream);
    case 96: return launch_attn_hopper_hdim<96>(p, dtype, stream);
    case 128: return launch_attn_hopper_hdim<128>(p, dtype, stream);
    case 192: return launch_attn_hopper_hdim<192>(p, dtype, stream);
    case 256: return launch_attn_hopper_hdim<256>(p, dtype, stream);
    default: throw Error(concat("launch_attn_hopper: unsupported head dim ", p.headdim));
  }
}

}  // namespace flashlab::detail
