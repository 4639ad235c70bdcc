// Rung 4 (Hopper: TMA, wgmma, warp specialization) for head dim 128.
#include "src/attention_hopper_hdim.cuh"

template void flashlab::detail::launch_attn_hopper_hdim<128>(const flashlab::AttnFwdParams&, flashlab::DType, cudaStream_t);
