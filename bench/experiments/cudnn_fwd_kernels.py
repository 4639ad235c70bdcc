"""Experiment: which kernel torch SDPA's cuDNN backend runs for the forward at the benchmark's short
shapes (bf16, 16k tokens, model dim 2048), one call each after a warm-up; meant to run under Nsight
Compute (its launch statistics, SASS) to read the peer's tile shape and structure.

Usage (GPU machine): ncu --kernel-name regex:cudnn ... python3 bench/experiments/cudnn_fwd_kernels.py
[d,seqlen,causal ...] (default: 64,512,0 64,512,1 64,1024,1 128,512,0)
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

shapes = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [(64, 512, 0), (64, 512, 1), (64, 1024, 1), (128, 512, 0)]
for d, s, causal in shapes:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(2):
            sdpa(q, k, v, is_causal=bool(causal))
    torch.cuda.synchronize()
    print(f"d {d} s {s} causal {causal} done", flush=True)
