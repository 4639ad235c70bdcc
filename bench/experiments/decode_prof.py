# One decode step (batch 64, 16k keys, 32/8 heads, d128, page 16, NHD) through the plan/run wrapper, for ncu.
# FP8=1: an e4m3 cache (scales 1).
import os

import torch, flashlab
b, n, hq, hk, d, ps = 64, 16384, 32, 8, 128, 16
pages = b * n // ps
kc = torch.randn(pages, ps, hk, d, dtype=torch.bfloat16, device="cuda")
vc = torch.randn_like(kc)
if os.environ.get("FP8") == "1":
    kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
q = torch.randn(b, hq, d, dtype=torch.bfloat16, device="cuda")
indptr = torch.arange(0, pages + 1, n // ps, dtype=torch.int32, device="cuda")
indices = torch.arange(pages, dtype=torch.int32, device="cuda")
last = torch.full((b,), ps, dtype=torch.int32, device="cuda")
ws = torch.empty(flashlab.batch_decode_workspace_bytes(b, hq, hk, d), dtype=torch.uint8, device="cuda")
w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws)
w.plan(indptr, indices, last, hq, hk, d, ps)
for _ in range(3):
    out = w.run(q, (kc, vc))
torch.cuda.synchronize()
