"""Experiment: which kernels each attention backward launches, and how long each one takes.

Why: flashlab's backward is three kernels (the preprocess: D = rowsum(dO * O), lse log2(e), dq_accum
zeroed; the main kernel; the dq conversion) and its gap to cuDNN is largest at short sequences,
where the fixed cost of the first and last is the largest share. Whether cuDNN pays the same fixed
costs, or wins inside its main kernel, decides what to work on; the totals of
attention_vs_sdpa.py cannot say which.

How: the shapes of attention_vs_sdpa.py (bf16, 16k tokens, model dim 2048); for each
implementation (flashlab's automatic backward rung, SDPA's cuDNN and flash backwards),
torch.autograd.grad of the same dout is called REPS times under torch.profiler after warm-up,
each call after the same 256 MiB L2 flush; every GPU kernel the calls launch is listed with its
mean duration per call (CUPTI's kernel records), then the sum, and the span from the first
kernel's start to the last kernel's end per call (gaps between kernels included).

Usage (GPU machine; flashlab importable, FLASHLAB_LIB_DIR set):
    python3 bench/experiments/bwd_kernel_breakdown.py OUT.json [--seqlens 512,2048,16384] [--dims 128]
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_vs_sdpa import autograd_backward  # noqa: E402  (a sibling script: the same closures)

FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def backward_fns(b, s, h, d, causal):
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    dout = torch.randn_like(q)
    return autograd_backward(causal, q, k, v, qt, kt, vt, dout, dout.transpose(1, 2).contiguous())


def breakdown(fn, reps, trace_path):
    """Per-kernel mean duration (us per call) and the mean span per call, from CUPTI records.

    Each rep launches: the flush (a fill kernel), torch.cuda._sleep (a spin kernel), the call's
    kernels. Kernels are grouped from one spin kernel to the next and each group's last kernel
    (the next rep's flush) dropped, except in the last group."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            FLUSH.zero_()
            torch.cuda._sleep(1000000)
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    os.remove(trace_path)
    kernels = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") == "kernel")
    groups = []
    for k in kernels:
        if "spin" in k[2].lower() or "sleep" in k[2].lower():
            groups.append([])
        elif groups:
            groups[-1].append(k)
    calls = [g[:-1] for g in groups[:-1]] + groups[-1:]
    calls = [c for c in calls if c]
    per = collections.defaultdict(list)
    spans = []
    for call in calls:
        spans.append(call[-1][1] - call[0][0])
        seen = collections.Counter()
        for start, end, name in call:
            seen[name] += 1
            per[(name, seen[name])].append(end - start)
    rows = [{"kernel": name, "nth": nth, "us": sum(t) / len(t), "calls": len(t)}
            for (name, nth), t in per.items()]
    first = {}
    for i, (_, _, name) in enumerate(calls[0] if calls else []):
        first.setdefault(name, i)
    rows.sort(key=lambda r: (first.get(r["kernel"], 1 << 30), r["nth"]))
    return rows, (sum(spans) / len(spans) if spans else 0.0), len(calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seqlens", default="512,2048,16384")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    doc = {"device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": os.environ.get("FLASHLAB_COMMIT", "unknown"), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "experiment": "bwd_kernel_breakdown", "cases": []}
    for d in (int(x) for x in args.dims.split(",")):
        for causal in (False, True):
            for s in (int(x) for x in args.seqlens.split(",")):
                b, h = 16384 // s, 2048 // d
                fns = backward_fns(b, s, h, d, causal)
                for impl, fn in fns.items():
                    rows, span, ncalls = breakdown(fn, args.reps, args.out + ".trace.json")
                    total = sum(r["us"] for r in rows)
                    print(f"d {d} seqlen {s} causal {int(causal)} {impl}: {ncalls} calls, kernels {total:.1f} us, "
                          f"span {span:.1f} us")
                    for r in rows:
                        print(f"    {r['us']:9.1f} us  x{r['calls']:<3d} {r['kernel'][:150]}")
                    doc["cases"].append({"headdim": d, "seqlen": s, "batch": b, "nheads": h, "causal": int(causal),
                                         "impl": impl, "calls": ncalls, "kernels_us": total, "span_us": span,
                                         "kernels": rows})
                del fns
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
