// Rung 2's launcher (FlashAttention-1 loop order): see kernels/attention/02_flash1.cuh.
#include <algorithm>

#include "kernels/attention/02_flash1.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab::detail {

void launch_attn_flash1(const AttnFwdParams& p, DType dtype, void* workspace, cudaStream_t stream) {
  const int64_t elems = static_cast<int64_t>(p.batch) * p.nheads * p.seqlen_q * p.headdim;
  FLASHLAB_LAUNCH(kernels::attn_flash1_init_kernel, static_cast<unsigned>(std::min<int64_t>(ceil_div(elems, 256), 4096)), 256, 0,
                  stream, p, workspace);
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    HEADDIM_SWITCH(p.headdim, kD, [&] {
      FLASHLAB_LAUNCH((kernels::attn_flash1_kernel<T, kD>), dim3(p.nheads, p.batch), kernels::kFlash1Threads, 0, stream, p,
                      workspace);
    });
    FLASHLAB_LAUNCH(kernels::attn_flash1_finish_kernel<T>, dim3(static_cast<unsigned>(ceil_div(p.seqlen_q, 8)), p.nheads, p.batch),
                    dim3(32, 8), 0, stream, p, workspace);
  });
}

}  // namespace flashlab::detail
