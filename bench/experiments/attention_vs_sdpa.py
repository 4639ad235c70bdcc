"""Experiment: flashlab's attention forward (flash_attn_func, the library's automatic rung) against
torch SDPA's cuDNN and flash backends, timed round-robin in one process.

Why: bench/flashlab_bench times our kernels and bench/peers.py times SDPA one after the other,
each in its own ~0.5 s window; on an H100 at its 700 W cap the SM clock moves between about 1.5
and 1.98 GHz with the load of the moment (nvidia-smi dmon, 2026-11-26), so a ratio of two such
windows carries the difference of their clocks: two runs of the same binary differed by up to
7% on one shape. Here every repetition of every implementation of a shape is timed in rotation
(a, b, c; b, c, a; ...), each after the same L2 flush and the same GPU-side pause, so all of them
see the same clocks, and the ratios are those of the kernels.

Shapes as bench/cases_attention.cu: bf16, 16k tokens, model dim 2048 (batch = 16384 / seqlen,
nheads = 2048 / headdim), head dim 128 at seqlen 512..16k, 64 and 256 at 512..2k, causal and not;
our layout (batch, seqlen, heads, d), SDPA's native (batch, heads, seqlen, d), each contiguous.
At head dim 128 also flashlab's FP8 forward (e4m3 q, k, v from the same normals, bf16 out; no
peer has it). Timing per repetition: 256 MiB write (L2 flush), ~0.5 ms GPU sleep (the Python
launch cost of the next call is paid under it; SLEEP_CYCLES, below), CUDA events around the call; median of ROUNDS
(default 30) rounds after 5 warm-up calls each. Every implementation's output is checked against
SDPA's cuDNN output of the same shape (bf16: max |diff| <= 2^-6 max |ref|; FP8: the e4m3 inputs'
own reference is not computed here, only finiteness) before timing.

--bwd: the backward instead (op "attn_bwd", 2.5x the forward's FLOPs as the harness counts):
the forward once with its graph kept, then torch.autograd.grad of the same dout timed (flashlab:
its automatic backward rung; SDPA: the backend's backward), the same shapes; the gradients
checked against cuDNN's with the same bound; no FP8. A shape where any call raises is reported in
"failures" and skipped. --bwd-rung N: flashlab's backward is attention_bwd(..., rung=N) called
directly (no autograd) on the forward's out and lse, e.g. rung 2 (FA2-style) against SDPA's flash
backward.

Usage (GPU machine; flashlab's Python package importable, FLASHLAB_LIB_DIR set):
    python3 bench/experiments/attention_vs_sdpa.py OUT.json [--quick] [--bwd [--bwd-rung N]] [--dims 128,256]
Writes the rows in the results-file format (bench/common.py), with "timing": "round-robin".
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashlab import attention_bwd, attention_fwd, flash_attn_func

FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
# SLEEP_CYCLES=0: no pause between repetitions (the GPU kept busier, clocks lower at the power cap;
# the Python launch of short calls may then show in their times).
SLEEP_CYCLES = int(os.environ.get("SLEEP_CYCLES", "1000000"))


def shapes(quick: bool):
    out = []
    for causal in (False, True):
        for s in ((1024, 4096) if quick else (512, 1024, 2048, 4096, 8192, 16384)):
            out.append((s, 128, causal))
        for d in (64, 256):
            for s in ((2048,) if quick else (512, 1024, 2048)):
                out.append((s, d, causal))
    return out


def time_round_robin(fns: dict, rounds: int) -> dict:
    names = list(fns)
    for name in names:
        for _ in range(5):
            fns[name]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        events = []
        for name in order:
            FLUSH.zero_()
            if SLEEP_CYCLES > 0:
                torch.cuda._sleep(SLEEP_CYCLES)  # ~0.5 ms by default: the CPU queues the call meanwhile
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            events.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in events:
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


def fwd_case(b, s, h, d, causal, q, k, v, qt, kt, vt, rounds):
    """The forward of one shape: rows and failures."""
    rows, failures = [], []

    def ours():
        return flash_attn_func(q, k, v, causal=causal)

    def backend(bk):
        def run():
            with sdpa_kernel(bk):
                return sdpa(qt, kt, vt, is_causal=causal)
        return run

    fns = {"flashlab": ours, "torch-sdpa-cudnn": backend(SDPBackend.CUDNN_ATTENTION),
           "torch-sdpa-flash": backend(SDPBackend.FLASH_ATTENTION)}
    if d == 128:
        q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        fns["flashlab-e4m3"] = lambda: flash_attn_func(q8, k8, v8, causal=causal)
    ref = fns["torch-sdpa-cudnn"]().transpose(1, 2).float()
    scale = ref.abs().max().item()
    for name, fn in list(fns.items()):
        out = fn().float()
        if name != "flashlab-e4m3" and name != "torch-sdpa-cudnn":
            out = out if name == "flashlab" else out.transpose(1, 2)
            err = (out - ref).abs().max().item() / scale
            ok = err <= 2.0 ** -6
        else:
            err, ok = 0.0, bool(torch.isfinite(out).all().item())
        if not ok:
            failures.append(f"d {d} seqlen {s} causal {int(causal)} {name}: max|diff|/max|ref| {err:.2e}")
            print("FAIL:", failures[-1])
            del fns[name]
    ms = time_round_robin(fns, rounds)
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    line = [f"d {d:3d} seqlen {s:5d} causal {int(causal)}"]
    for name, t in ms.items():
        dtype = "e4m3" if name == "flashlab-e4m3" else "bf16"
        rows.append({"op": "attn_fwd", "impl": name, "dtype": dtype, "timing": "round-robin",
                     "shape": {"batch": b, "seqlen_q": s, "seqlen_k": s, "nheads_q": h, "nheads_kv": h,
                               "headdim": d, "causal": int(causal)},
                     "ms": t, "flops": flops, "TFLOPs": flops / t / 1e9, "reps": rounds})
        line.append(f"{name} {flops / t / 1e9:6.1f}")
    line.append(f"flashlab/cudnn {ms['torch-sdpa-cudnn'] / ms['flashlab']:.3f}" if "flashlab" in ms else "")
    print("  ".join(line), flush=True)
    return rows, failures


def autograd_backward(causal, q, k, v, qt, kt, vt, dout, dout_t, with_flashlab=True):
    """Closures timing one backward each: the forward once with its graph kept, then
    torch.autograd.grad of dout (flashlab: its automatic backward rung, unless with_flashlab is
    False; SDPA: each backend's)."""
    def grads(fwd, inputs, g):
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        out = fwd(*leaves)
        return lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)

    def sdpa_fwd(bk):
        def run(a, b_, c):
            with sdpa_kernel(bk):
                return sdpa(a, b_, c, is_causal=causal)
        return run

    fns = {"flashlab": grads(lambda a, b_, c: flash_attn_func(a, b_, c, causal=causal), (q, k, v), dout)} \
        if with_flashlab else {}
    fns["torch-sdpa-cudnn"] = grads(sdpa_fwd(SDPBackend.CUDNN_ATTENTION), (qt, kt, vt), dout_t)
    fns["torch-sdpa-flash"] = grads(sdpa_fwd(SDPBackend.FLASH_ATTENTION), (qt, kt, vt), dout_t)
    return fns


def bwd_case(b, s, h, d, causal, q, k, v, qt, kt, vt, rounds, bwd_rung=None):
    """The backward of one shape: rows and failures."""
    dout = torch.randn_like(q)
    dout_t = dout.transpose(1, 2).contiguous()

    def direct(rung):
        lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
        out = attention_fwd(q, k, v, softmax_lse=lse, causal=causal)
        return lambda: attention_bwd(q, k, v, out, dout, lse, causal=causal, rung=rung)

    fns = {"flashlab": direct(bwd_rung)} if bwd_rung is not None else {}
    fns.update(autograd_backward(causal, q, k, v, qt, kt, vt, dout, dout_t, with_flashlab=bwd_rung is None))
    failures = []
    ref = [g.transpose(1, 2).float() for g in fns["torch-sdpa-cudnn"]()]
    for name in ("flashlab", "torch-sdpa-flash"):
        got = [g.float() if name == "flashlab" else g.transpose(1, 2).float() for g in fns[name]()]
        err = max((a - r).abs().max().item() / r.abs().max().item() for a, r in zip(got, ref))
        if not err <= 2.0 ** -6:
            failures.append(f"bwd d {d} seqlen {s} causal {int(causal)} {name}: max|diff|/max|ref| {err:.2e}")
            print("FAIL:", failures[-1])
            del fns[name]
    ms = time_round_robin(fns, rounds)
    flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    rows, line = [], [f"bwd d {d:3d} seqlen {s:5d} causal {int(causal)}"]
    for name, t in ms.items():
        impl = f"{name}-rung{bwd_rung}" if name == "flashlab" and bwd_rung is not None else name
        rows.append({"op": "attn_bwd", "impl": impl, "dtype": "bf16", "timing": "round-robin",
                     "shape": {"batch": b, "seqlen_q": s, "seqlen_k": s, "nheads_q": h, "nheads_kv": h,
                               "headdim": d, "causal": int(causal)},
                     "ms": t, "flops": flops, "TFLOPs": flops / t / 1e9, "reps": rounds})
        line.append(f"{name} {flops / t / 1e9:6.1f}")
    if "flashlab" in ms:
        line.append(f"flashlab/cudnn {ms['torch-sdpa-cudnn'] / ms['flashlab']:.3f}")
        if "torch-sdpa-flash" in ms:
            line.append(f"flashlab/flash {ms['torch-sdpa-flash'] / ms['flashlab']:.3f}")
    print("  ".join(line), flush=True)
    return rows, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--dims", default="", help="comma-separated head dims to keep (default: all)")
    ap.add_argument("--bwd-rung", type=int, default=None, help="--bwd: flashlab's backward at this rung, called directly")
    args = ap.parse_args()
    keep = {int(x) for x in args.dims.split(",") if x}
    rounds = int(os.environ.get("ROUNDS", "30"))
    rows, failures = [], []
    for s, d, causal in shapes(args.quick):
        if keep and d not in keep:
            continue
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # SDPA's (b, h, s, d)
        try:
            if args.bwd:
                rows_c, fail_c = bwd_case(b, s, h, d, causal, q, k, v, qt, kt, vt, rounds, args.bwd_rung)
            else:
                rows_c, fail_c = fwd_case(b, s, h, d, causal, q, k, v, qt, kt, vt, rounds)
        except Exception as e:  # noqa: BLE001  (a backend refusing a shape: reported, the run goes on)
            rows_c, fail_c = [], [f"{'bwd' if args.bwd else 'fwd'} d {d} seqlen {s} causal {int(causal)}: "
                                  f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"]
            print("FAIL:", fail_c[0])
        rows += rows_c
        failures += fail_c
        del q, k, v, qt, kt, vt
        torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": os.environ.get("FLASHLAB_COMMIT", "unknown"), "torch": torch.__version__,
           "experiment": "attention_vs_sdpa (round-robin timing)", "rows": rows, "failures": failures}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out} ({len(rows)} rows, {len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
