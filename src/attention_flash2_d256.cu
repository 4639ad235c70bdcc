// Rung 3 (FlashAttention-2) for head dim 256.
#include "src/attention_flash2_hdim.cuh"

template void flashlab::detail::launch_attn_flash2_hdim<256>(const flashlab::AttnFwdParams&, flashlab::DType, cudaStream_t);
