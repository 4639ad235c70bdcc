"""Profiling aid: torch SDPA's backward (flash or cuDNN backend) at one shape, twice, for Nsight
Compute to pick a launch from (its kernels against flashlab's in the ladder's "what limits it").

Usage (GPU machine): python3 bench/experiments/sdpa_bwd_once.py flash|cudnn HEADDIM SEQLEN CAUSAL(0|1)
bf16, 16k tokens, model dim 2048 (batch = 16384 / seqlen, heads = 2048 / headdim), SDPA's
(batch, heads, seqlen, d) layout.
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[sys.argv[1]]
d, s, causal = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(backend):
    out = sdpa(q, k, v, is_causal=causal)
g = torch.randn_like(out)
for _ in range(2):
    torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
torch.cuda.synchronize()
