"""Probe: is there GPU time in a flash_attn_func call beyond its kernel? Each call event-timed as
bench/experiments/attention_vs_sdpa.py times it (L2 flushed, ~0.5 ms GPU sleep, CUDA events around
the call; median of 30) against the kernels' own durations from torch.profiler (median of 10), for
flashlab and SDPA's cuDNN backend, at the short shapes where our ratios to cuDNN are lowest.
Answered on an H100 (2026-11-27, c02233d; bench/results/experiments/attention_fwd_call_overhead_c02233d_h100.txt):
no, both calls are their kernel plus ~3 us, so the gaps there are the kernels'.

Usage (GPU machine; flashlab's Python package importable, FLASHLAB_LIB_DIR set):
    python3 bench/experiments/attention_call_overhead.py
"""
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa
from torch.profiler import ProfilerActivity, profile

from flashlab import flash_attn_func

FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
SLEEP_CYCLES = 1_000_000  # ~0.5 ms: the CPU queues the call meanwhile (as attention_vs_sdpa.py)


def event_us(fn, reps: int = 30) -> float:
    """Median microseconds between CUDA events around one call, after an L2 flush and a pause."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        FLUSH.zero_()
        torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def kernel_us(fn, reps: int = 10) -> dict:
    """Each kernel the call launches (name: launches, median microseconds), from torch.profiler; the
    flush and the pause are left out."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            FLUSH.zero_()
            torch.cuda._sleep(SLEEP_CYCLES)
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        name = e.name.lower()
        if e.device_type.name != "CUDA" or any(x in name for x in ("sleep", "spin", "elementwise", "fill")):
            continue
        kernels.setdefault(e.name[:60], []).append(e.device_time)
    return {name: (len(t), round(statistics.median(t), 1)) for name, t in kernels.items()}


def main():
    for d, s, causal in [(64, 512, False), (64, 512, True), (64, 1024, False), (128, 512, False), (256, 512, False),
                         (128, 4096, False)]:
        b, h = 16384 // s, 2048 // d  # 16k tokens, model dim 2048
        q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        def ours():
            return flash_attn_func(q, k, v, causal=causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(qt, kt, vt, is_causal=causal)

        for name, fn in (("flashlab", ours), ("cudnn", cudnn)):
            print(f"d {d} s {s} causal {int(causal)} {name}: event {event_us(fn):.1f} us; kernels {kernel_us(fn)}", flush=True)


if __name__ == "__main__":
    main()
