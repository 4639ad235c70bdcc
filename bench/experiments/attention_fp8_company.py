"""Experiment: flash_attn_func's FP8 forward at 8k / 16k keys (16k tokens, 16 heads, d 128) timed as
attention_vs_sdpa.py times it (L2 flush, GPU sleep, events, median of 30, round-robin), alone,
with SDPA's cuDNN, with our bf16 and cuDNN (as in that script's file), and alone again: how much the
company of the timed call moves its rate on a power-capped H100.

Usage (GPU machine; flashlab importable, FLASHLAB_LIB_DIR set; run from the repository root):
    python3 bench/experiments/attention_fp8_company.py
"""
import sys, torch
sys.path.insert(0, "bench/experiments")
import attention_vs_sdpa as avs
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from flashlab import flash_attn_func
for s in (8192, 16384):
    b, h, d = 16384 // s, 16, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    fp8 = lambda: flash_attn_func(q8, k8, v8)
    bf = lambda: flash_attn_func(q, k, v)
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(qt, kt, vt)
    flops = 4.0 * b * h * s * s * d
    for label, fns in (("fp8 alone", {"fp8": fp8}), ("fp8+cudnn", {"fp8": fp8, "cudnn": cud}),
                       ("fp8+bf16+cudnn", {"fp8": fp8, "bf16": bf, "cudnn": cud}), ("fp8 alone again", {"fp8": fp8})):
        ms = avs.time_round_robin(fns, 30)
        print(f"s {s} {label:16s} " + "  ".join(f"{n} {flops / t / 1e9:7.1f}" for n, t in ms.items()), flush=True)
