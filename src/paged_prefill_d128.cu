// The paged prefill's kernels (rungs 3 and 4 of the forward over a paged KV cache) for head dim 128.
#include "src/attention_flash2_hdim.cuh"
#include "src/attention_hopper_hdim.cuh"

template void flashlab::detail::launch_attn_flash2_paged_hdim<128>(const flashlab::AttnFwdParams&, flashlab::DType, cudaStream_t);
template void flashlab::detail::launch_attn_hopper_paged_hdim<128>(const flashlab::AttnFwdParams&, flashlab::DType, cudaStream_t);
