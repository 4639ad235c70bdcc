// Rung 3 (FlashAttention-2) for head dim 64.
#include "src/attention_flash2_hdim.cuh"

template void flashlab::detail::launch_attn_flash2_hdim<64>(const flashlab::AttnFwdParams&, flashlab::DType, cudaStream_t);
