"""Experiment: torch SDPA (cuDNN and flash backends) on the contiguous decode of
bench/experiments/decode_read_ceiling.cu's shape (batch 64, 32 query / 8 KV heads, 16k keys,
d 128, bf16), timed as that program times (L2 flushed, CUDA events, median of 10): K + V GB/s."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

q = torch.randn(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(64, 8, 16384, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    with sdpa_kernel(backend):
        def call():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        call()
        torch.cuda.synchronize()
        times = []
        for i in range(12):
            flush.fill_(i)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times = sorted(times[2:])
        ms = times[len(times) // 2]
        print(f"sdpa {backend.name:16s} {ms:.4f} ms  {2 * k.numel() * 2 / ms / 1e6:.1f} GB/s")
