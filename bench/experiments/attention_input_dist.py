"""Probe: do the kernels' times depend on the inputs' values? bench/experiments/attention_hopper_ablation.cu
fills q, k, v uniformly in [-1, 1) (bench/harness.cu fill_random; logits of standard deviation ~0.33 at
head dim 64), bench/experiments/attention_vs_sdpa.py with standard normals (logits of deviation 1),
and the library's d 64 kernel at 512 keys measured 382-385 TFLOP/s in the first and 351.9 in the
second. Here flash_attn_func and SDPA's cuDNN backend run on both kinds of inputs (and normals
scaled by 4: wider logits) of the same shapes, all timed round-robin in one process as
attention_vs_sdpa.py times them (L2 flush, ~0.5 ms GPU sleep, CUDA events; median of ROUNDS).

--paths: instead, on normal inputs, the call paths: flash_attn_func (the custom op; since 9830929 it
writes softmax_lse only where autograd will read it, so not here), flashlab.attention_fwd into a given
out without softmax_lse and with it, attention_fwd with rung=4, and cuDNN.

Usage (GPU machine; flashlab's Python package importable, FLASHLAB_LIB_DIR set):
    python3 bench/experiments/attention_input_dist.py [--paths]
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_vs_sdpa import time_round_robin  # noqa: E402

from flashlab import attention_fwd, flash_attn_func  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "30"))


# (seqlen, head dim, causal): the short shapes where the ratios to cuDNN are lowest, and d 128 at 4k.
SHAPES = ((512, 64, False), (512, 64, True), (1024, 64, False), (512, 128, False), (4096, 128, False), (512, 256, False))


def inputs(kind: str, s: int, d: int, gen):
    """q, k, v (batch, seqlen, heads, d) of the benchmark's 16k tokens and model dim 2048, and
    SDPA's (batch, heads, seqlen, d) copies of them."""
    shape = (16384 // s, s, 2048 // d, d)
    if kind == "uniform":
        q, k, v = ((torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16) for _ in range(3))
    else:
        scale = 4.0 if kind == "normal x4" else 1.0
        q, k, v = ((torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.bfloat16) for _ in range(3))
    return (q, k, v), tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))


def cudnn(qkv_t, causal: bool):
    """SDPA's cuDNN backend on these (batch, heads, seqlen, d) tensors, as a closure."""
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(*qkv_t, is_causal=causal)
    return run


def flops(s: int, d: int, causal: bool) -> float:
    return 4.0 * (16384 // s) * (2048 // d) * s * s * d * (0.5 if causal else 1.0)


def main():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2026)
    kinds = ("uniform", "normal", "normal x4")
    for s, d, causal in SHAPES:
        fns = {}
        for kind in kinds:
            (q, k, v), qkv_t = inputs(kind, s, d, gen)
            fns[f"flashlab {kind}"] = lambda q=q, k=k, v=v: flash_attn_func(q, k, v, causal=causal)
            fns[f"cudnn {kind}"] = cudnn(qkv_t, causal)
        ms = time_round_robin(fns, ROUNDS)
        f = flops(s, d, causal)
        line = [f"d {d:3d} seqlen {s:5d} causal {int(causal)}"]
        for kind in kinds:
            ours, theirs = ms[f"flashlab {kind}"], ms[f"cudnn {kind}"]
            line.append(f"{kind}: flashlab {f / ours / 1e9:6.1f} cudnn {f / theirs / 1e9:6.1f} ratio {theirs / ours:.3f}")
        print("  ".join(line), flush=True)


def paths():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2027)
    for s, d, causal in SHAPES:
        (q, k, v), qkv_t = inputs("normal", s, d, gen)
        out = torch.empty_like(q)
        lse = torch.empty((q.shape[0], q.shape[2], s), dtype=torch.float32, device="cuda")
        fns = {"flash_attn_func": lambda: flash_attn_func(q, k, v, causal=causal),
               "attention_fwd": lambda: attention_fwd(q, k, v, out, causal=causal),
               "attention_fwd+lse": lambda: attention_fwd(q, k, v, out, softmax_lse=lse, causal=causal),
               "attention_fwd rung 4": lambda: attention_fwd(q, k, v, out, causal=causal, rung=4),
               "cudnn": cudnn(qkv_t, causal)}
        ms = time_round_robin(fns, ROUNDS)
        f = flops(s, d, causal)
        print(f"d {d:3d} seqlen {s:5d} causal {int(causal)}  " +
              "  ".join(f"{name} {f / t / 1e9:6.1f}" for name, t in ms.items()), flush=True)


if __name__ == "__main__":
    paths() if "--paths" in sys.argv[1:] else main()
