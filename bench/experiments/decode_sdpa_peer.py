"""Experiment: torch SDPA (cuDNN and flash backends) on the contiguous decode of
bench/experiments/decode_read_ceiling.cu's shape (batch 64, 32 query / 8 KV heads, d 128, bf16;
4k and 16k keys; SWEEP=1: decode_sweep.cu's shapes), timed as that program and decode_fixed_cost.cu time (L2 flushed by a 256 MiB
write, CUDA events, median of 30), eager and as the replay of a CUDA graph: K + V GB/s.
Also ncu-friendly: NCU=1 runs each call once after a warm-up."""
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        flush.fill_(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


# SWEEP=1: decode_sweep.cu's shapes (batch, keys), cuDNN only; else batch 64 at 4k and 16k.
sweep = os.environ.get("SWEEP") == "1"
shapes = ([(64, 1024), (64, 2048), (64, 4096), (64, 8192), (64, 16384), (33, 4096), (66, 4096), (16, 16384),
           (8, 16384), (32, 8192), (128, 2048), (256, 1024), (512, 512)] if sweep else [(64, 4096), (64, 16384)])
for bsz, n in shapes:
    q = torch.randn(bsz, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(bsz, 8, n, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    gb = 2 * k.numel() * 2 / 1e9
    for backend in (SDPBackend.CUDNN_ATTENTION,) if sweep else (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            def call():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            if os.environ.get("NCU") == "1":
                call()
                torch.cuda.synchronize()
                call()
                torch.cuda.synchronize()
                continue
            eager = timed(call)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                call()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
            graph = timed(g.replay)
            print(f"batch {bsz:2d} keys {n:5d} sdpa {backend.name:16s} eager {eager:.4f} ms {gb / eager * 1e3:7.1f} GB/s"
                  f"  graph {graph:.4f} ms {gb / graph * 1e3:7.1f} GB/s")
