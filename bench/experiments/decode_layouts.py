"""Decode (top rung) bandwidth by KV layout, page size and page order (batch 64, 16k keys, 32/8
heads, d 128, bf16): does paging granularity or the pages' placement cost bandwidth? CUDA-event
timing of graph replays, median of 50."""
import statistics

import torch

import flashlab

b, n, hq, hk, d = 64, 16384, 32, 8, 128
q = torch.randn(b, hq, d, dtype=torch.bfloat16, device="cuda")
for layout, ps, shuffled in [("NHD", 16, False), ("NHD", 16, True), ("HND", 16, True), ("NHD", 256, True),
                             ("HND", 1024, False)]:
    if True:
        pages = b * n // ps
        shape = (pages, ps, hk, d) if layout == "NHD" else (pages, hk, ps, d)
        kc = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        vc = torch.randn_like(kc)
        indptr = torch.arange(0, pages + 1, n // ps, dtype=torch.int32, device="cuda")
        indices = (torch.randperm(pages, device="cuda") if shuffled else torch.arange(pages, device="cuda")).to(torch.int32)
        last = torch.full((b,), ps, dtype=torch.int32, device="cuda")
        ws = torch.empty(flashlab.batch_decode_workspace_bytes(b, hq, hk, d), dtype=torch.uint8, device="cuda")
        w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
        w.plan(indptr, indices, last, hq, hk, d, ps)
        out = torch.empty_like(q)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            w.run(q, (kc, vc), out=out)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                w.run(q, (kc, vc), out=out)
        torch.cuda.current_stream().wait_stream(s)
        times = []
        for _ in range(50):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); g.replay(); e1.record(); e1.synchronize()
            times.append(e0.elapsed_time(e1))
        ms = statistics.median(times)
        print(f"{layout} page {ps:5d} {'shuffled' if shuffled else 'in order'}: {ms:.4f} ms {2 * kc.numel() * 2 / ms / 1e9:.3f} TB/s")
        del kc, vc
