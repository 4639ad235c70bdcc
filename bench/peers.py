"""Time the peer libraries on the shapes the C++ harness measured, and merge them into one file.

    python bench/peers.py --in build/gpu/bench.json [--out FILE | --out-dir DIR] [--quick]

For every distinct (op, dtype, shape) of the harness rows that has a peer here, the peers run in
this one process with the same byte/flop accounting as the harness, and their rows are appended
with the same op, dtype and shape, so every ratio is read from one file of one run:
    copy        torch (dst.copy_(src))
    vector_add  torch (torch.add out=), torch-compile (a + b), triton (our own kernel below)
    reduce_sum  torch (torch.sum, fp32 accumulate), torch-compile
    row_sum     torch (x.sum(dim=1), fp32 accumulate), torch-compile
    rmsnorm     torch (torch.nn.functional.rms_norm), torch-compile (the Llama formula in fp32)
    fused_add_rmsnorm  torch (r = x + r; rms_norm(r)), torch-compile (the same, one graph)
    layernorm   torch (torch.nn.functional.layer_norm, with bias), torch-compile (the formula in fp32, cast once)
    softmax     torch (torch.softmax(x, -1)), torch-compile (the same)
    log_softmax torch (torch.log_softmax(x, -1)), torch-compile (the same)
    silu_and_mul       torch (F.silu(x[..., :d]) * x[..., d:]), torch-compile (the same, one graph)
    gelu_and_mul       torch (F.gelu(x[..., :d], approximate="none") * x[..., d:]), torch-compile
    gelu_tanh_and_mul  torch (F.gelu(x[..., :d], approximate="tanh") * x[..., d:]), torch-compile
    rope        torch (NeoX rotation of q and k, fp32 cos/sin from pos_ids, cast once), torch-compile
    attn_fwd / attn_bwd  torch SDPA (flash, cuDNN, efficient backends), (batch, heads, seq, d) layout
    paged_decode  torch SDPA (flash, cuDNN) on contiguous K/V, one query token, enable_gqa (none for "zipf")
    quantize_fp8 / quantize_int8 / quantize_fp8_per_tensor  torch (s = absmax(x) / qmax per row or
                whole; q = (x.float() / s).clamp(-qmax, qmax) -> float8_e4m3fn, or round() -> int8),
                torch-compile (the same, one graph)
Timing: warm-up, L2 flushed (a 256 MiB write) before each repetition outside the timed region,
CUDA events around the call alone, median of >= 20 repetitions (about 0.5 s per case).
A peer that fails is skipped and named in "peers_note"; the run goes on.

The helpers above main() are pure (no torch) so the tests run on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
FLUSH_BYTES = 256 << 20  # > 5x the 50 MB L2 of an H100/H200

# op -> peers this file can time for it
PEERS = {
    "copy": ("torch",),
    "vector_add": ("torch", "torch-compile", "triton"),
    "reduce_sum": ("torch", "torch-compile"),
    "row_sum": ("torch", "torch-compile"),
    "rmsnorm": ("torch", "torch-compile"),
    "fused_add_rmsnorm": ("torch", "torch-compile"),
    "layernorm": ("torch", "torch-compile"),
    "softmax": ("torch", "torch-compile"),
    "log_softmax": ("torch", "torch-compile"),
    "silu_and_mul": ("torch", "torch-compile"),
    "gelu_and_mul": ("torch", "torch-compile"),
    "gelu_tanh_and_mul": ("torch", "torch-compile"),
    "rope": ("torch", "torch-compile"),
    "quantize_fp8": ("torch", "torch-compile"),
    "quantize_int8": ("torch", "torch-compile"),
    "quantize_fp8_per_tensor": ("torch", "torch-compile"),
    "attn_fwd": ("torch-sdpa-flash", "torch-sdpa-cudnn", "torch-sdpa-efficient"),
    "attn_bwd": ("torch-sdpa-flash", "torch-sdpa-cudnn", "torch-sdpa-efficient"),
    "paged_decode": ("torch-sdpa-flash", "torch-sdpa-cudnn"),
}
# Rows whose shapes the peers follow: our rungs, and the harness's own copy baseline.
SOURCE_IMPLS = ("flashlab", "cudaMemcpy")


# ---------------------------------------------------------------- pure helpers

def peer_cases(doc: dict) -> list[dict]:
    """Distinct (op, dtype, shape) of the harness rows that have peers here, in file order.

    Each case carries the bytes/flops of its first source row (the harness's accounting wins
    over the formulas in common.py, so TB/s of a peer and of a rung divide the same bytes).
    """
    cases, seen = [], set()
    for row in doc.get("rows", []):
        if row.get("impl") not in SOURCE_IMPLS or row.get("op") not in PEERS:
            continue
        if row.get("dtype") == "e4m3":  # FP8 attention: no peer here runs it (SDPA has no FP8)
            continue
        key = common.case_key(row)
        if key in seen:
            continue
        seen.add(key)
        case = {"op": row["op"], "dtype": row.get("dtype"), "shape": dict(row.get("shape") or {})}
        case["bytes"] = common.row_bytes(row)
        case["flops"] = common.row_flops(row) or 0
        if row["op"] == "copy":
            case["copy_bytes"] = copy_buffer_bytes(row)
            if case["bytes"] is None:
                case["bytes"] = 2 * case["copy_bytes"]  # read + write
        cases.append(case)
    return cases


def copy_buffer_bytes(row: dict) -> int:
    """Size of one copy buffer: shape n counts elements of dtype (bytes when dtype is absent)."""
    n = (row.get("shape") or {}).get("n")
    if n is None:
        if row.get("bytes"):
            return row["bytes"] // 2
        raise ValueError("copy row has neither shape.n nor bytes")
    return n * (common.elem_bytes(row.get("dtype")) or 1)


def make_peer_row(case: dict, impl: str, ms: float, reps: int) -> dict:
    row = {"op": case["op"], "impl": impl, "dtype": case["dtype"], "shape": dict(case["shape"]),
           "ms": ms, "bytes": case["bytes"], "flops": case["flops"], "reps": reps}
    row["TBps"] = case["bytes"] / ms / 1e9 if case["bytes"] and ms > 0 else 0.0
    row["TFLOPs"] = case["flops"] / ms / 1e9 if case["flops"] and ms > 0 else 0.0
    return row


def merge_peer_rows(doc: dict, peer_rows: list[dict], notes: list[str],
                    versions: dict | None = None) -> dict:
    """A copy of doc with peer_rows appended; every harness field is kept.

    A peer row replaces an older row of the same (op, dtype, shape, impl), so running peers.py
    twice on one file leaves one row per peer.
    """
    out = copy.deepcopy(doc)
    new = {(common.case_key(r), r["impl"]) for r in peer_rows}
    out["rows"] = [r for r in out.get("rows", [])
                   if (common.case_key(r), r.get("impl")) not in new] + list(peer_rows)
    out.update(versions or {})
    if notes:
        out["peers_note"] = list(out.get("peers_note") or []) + list(notes)
    return out


def default_out_path(doc: dict, out_dir=RESULTS_DIR) -> Path:
    return Path(out_dir) / common.results_filename(doc)


# ---------------------------------------------------------------- torch side (GPU machine)

try:  # the Triton peer is ours and tiny; absent triton just means no such peer
    import triton
    import triton.language as tl

    @triton.jit
    def _vector_add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # One program per BLOCK elements; int64 offsets so n may exceed 2^31.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask)
        b = tl.load(b_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a + b, mask=mask)
except Exception:  # noqa: BLE001  (ImportError, or a triton that fails to initialise)
    triton = None


def _torch_dtype(torch, dtype):
    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
             "fp64": torch.float64}
    if dtype not in table:
        raise ValueError(f"no torch dtype for {dtype!r}")
    return table[dtype]


def _random(torch, shape, dtype):
    # Never zeros: a zero input can hide a wrong kernel and changes nothing for bandwidth, but
    # random data keeps compression and sparsity tricks out of the picture.
    return torch.randn(shape, device="cuda", dtype=_torch_dtype(torch, dtype))


class Timer:
    """Median of CUDA-event timings with an L2 flush before each repetition."""

    def __init__(self, torch, budget_s: float, min_reps: int, max_reps: int, warmup: int):
        self.torch = torch
        self.budget_s, self.min_reps, self.max_reps, self.warmup = budget_s, min_reps, max_reps, warmup
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def flush(self):
        self.flush_buf.zero_()
        # Keep the GPU busy long enough that the CPU cost of launching fn (dynamo guards,
        # Triton's launcher) is paid before the start event runs, not inside the timing:
        # measured on an H100, 60 us was not always enough for a torch.compile call.
        if hasattr(self.torch.cuda, "_sleep"):
            self.torch.cuda._sleep(1_000_000)  # cycles, ~0.5 ms

    def _timed(self, fn, reps):
        ev = self.torch.cuda.Event
        starts = [ev(enable_timing=True) for _ in range(reps)]
        ends = [ev(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush()  # outside the events: the GPU runs it while the CPU queues fn
            s.record()
            fn()
            e.record()
        self.torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def __call__(self, fn) -> tuple[float, int]:
        for _ in range(self.warmup):
            fn()
        self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._timed(fn, 3)
        per_rep_s = (time.perf_counter() - t0) / 3  # includes the flush and launch overhead
        reps = int(self.budget_s / max(per_rep_s, 1e-6))
        reps = max(self.min_reps, min(self.max_reps, reps))
        return statistics.median(self._timed(fn, reps)), reps


def _compiled(torch, fn, *args):
    # A fresh dynamo cache per case: otherwise many shapes hit the recompile limit and dynamo
    # silently falls back to eager, which would then be timed as "torch-compile".
    torch._dynamo.reset()
    return functools.partial(torch.compile(fn, dynamic=False, fullgraph=True), *args)


def _peer_builders(torch, case):
    """impl -> build(), which returns the zero-argument callable to time.

    Inputs are allocated here, once per case; building (compiling) happens inside the
    per-peer try of run_peers so one peer's failure leaves the others running.
    """
    op, dtype, s = case["op"], case["dtype"], case["shape"]
    if op == "copy":
        src = torch.randint(0, 256, (case["copy_bytes"],), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return {"torch": lambda: functools.partial(dst.copy_, src)}
    if op in ("attn_fwd", "attn_bwd"):  # torch SDPA in its native (batch, heads, seq, d) layout, one backend each
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        if s["nheads_q"] != s["nheads_kv"] or s["seqlen_q"] != s["seqlen_k"]:
            return {}  # is_causal is top-left aligned in SDPA: same as ours only when sq == sk
        q, k, v = (_random(torch, (s["batch"], s["nheads_q"], s["seqlen_q"], s["headdim"]), dtype) for _ in range(3))
        causal = bool(s["causal"])
        dropout_p = s.get("dropout_pct", 0) / 100  # the dropout rows (bench/cases_attention.cu)

        def backend(b):
            if op == "attn_bwd":  # the backward alone: the forward once (its graph kept), then grads
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                with sdpa_kernel(b):
                    out = sdpa(qg, kg, vg, is_causal=causal, dropout_p=dropout_p)
                dout = _random(torch, tuple(out.shape), dtype)
                return functools.partial(torch.autograd.grad, out, (qg, kg, vg), dout, retain_graph=True)

            def run():
                with sdpa_kernel(b):
                    return sdpa(q, k, v, is_causal=causal, dropout_p=dropout_p)
            return run

        return {"torch-sdpa-flash": lambda: backend(SDPBackend.FLASH_ATTENTION),
                "torch-sdpa-cudnn": lambda: backend(SDPBackend.CUDNN_ATTENTION),
                "torch-sdpa-efficient": lambda: backend(SDPBackend.EFFICIENT_ATTENTION)}
    if op == "paged_decode":  # one query token per request over contiguous K/V (no paging), GQA by enable_gqa
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        if s.get("zipf") or dtype == "e4m3":  # ragged lengths, or an FP8 cache: no SDPA equivalent
            return {}
        b, hq, hk, d, n = s["batch"], s["nheads_q"], s["nheads_kv"], s["headdim"], s["kv_len"]
        q = _random(torch, (b, hq, 1, d), dtype)
        k, v = (_random(torch, (b, hk, n, d), dtype) for _ in range(2))

        def decode(backend):
            def run():
                with sdpa_kernel(backend):
                    return sdpa(q, k, v, enable_gqa=hq != hk)
            return run

        # (no efficient backend: it lacks enable_gqa for dense inputs)
        return {"torch-sdpa-flash": lambda: decode(SDPBackend.FLASH_ATTENTION),
                "torch-sdpa-cudnn": lambda: decode(SDPBackend.CUDNN_ATTENTION)}
    if op == "vector_add":
        n = s["n"]
        a, b = _random(torch, n, dtype), _random(torch, n, dtype)
        out = torch.empty_like(a)
        builders = {
            "torch": lambda: functools.partial(torch.add, a, b, out=out),
            "torch-compile": lambda: _compiled(torch, lambda x, y: x + y, a, b),
        }
        if triton is not None:
            block = 4096
            grid = (triton.cdiv(n, block),)
            builders["triton"] = lambda: functools.partial(
                _vector_add_kernel[grid], a, b, out, n, BLOCK=block, num_warps=8)
        return builders
    if op == "reduce_sum":
        x = _random(torch, s["n"], dtype)
        return {
            "torch": lambda: functools.partial(torch.sum, x, dtype=torch.float32),
            "torch-compile": lambda: _compiled(torch, lambda t: torch.sum(t, dtype=torch.float32), x),
        }
    if op == "row_sum":
        x = _random(torch, (s["rows"], s["cols"]), dtype)
        return {
            "torch": lambda: functools.partial(x.sum, dim=1, dtype=torch.float32),
            "torch-compile": lambda: _compiled(torch, lambda t: t.sum(dim=1, dtype=torch.float32), x),
        }
    if op in ("rmsnorm", "fused_add_rmsnorm"):
        rows, hidden = s["rows"], s["cols"]
        x, r = _random(torch, (rows, hidden), dtype), _random(torch, (rows, hidden), dtype)
        w = _random(torch, hidden, dtype)
        eps = 1e-6

        def rms(t, weight):  # the Llama/FlashInfer formula: fp32 statistics, one rounding
            tf = t.float()
            return (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(t.dtype)

        if op == "rmsnorm":
            return {
                "torch": lambda: functools.partial(torch.nn.functional.rms_norm, x, (hidden,), w, eps),
                "torch-compile": lambda: _compiled(torch, rms, x, w),
            }

        def fused_eager(t, res, weight):
            res = t + res
            return torch.nn.functional.rms_norm(res, (hidden,), weight, eps), res

        def fused(t, res, weight):
            res = t + res
            return rms(res, weight), res

        return {
            "torch": lambda: functools.partial(fused_eager, x, r, w),
            "torch-compile": lambda: _compiled(torch, fused, x, r, w),
        }
    if op == "layernorm":
        rows, hidden = s["rows"], s["cols"]
        x = _random(torch, (rows, hidden), dtype)
        w, b = _random(torch, hidden, dtype), _random(torch, hidden, dtype)
        eps = 1e-5

        def ln(t, weight, bias):  # fp32 statistics (biased variance), one rounding
            tf = t.float()
            mean = tf.mean(-1, keepdim=True)
            var = (tf - mean).pow(2).mean(-1, keepdim=True)
            return ((tf - mean) * torch.rsqrt(var + eps) * weight.float() + bias.float()).to(t.dtype)

        return {
            "torch": lambda: functools.partial(torch.nn.functional.layer_norm, x, (hidden,), w, b, eps),
            "torch-compile": lambda: _compiled(torch, ln, x, w, b),
        }
    if op in ("softmax", "log_softmax"):
        x = _random(torch, (s["rows"], s["cols"]), dtype)
        fn = torch.softmax if op == "softmax" else torch.log_softmax
        return {
            "torch": lambda: functools.partial(fn, x, -1),
            "torch-compile": lambda: _compiled(torch, lambda t: fn(t, -1), x),
        }
    if op == "rope":  # shape keys nnz, nheads_q, nheads_kv, headdim; NeoX, rotary_dim = headdim
        nnz, hq, hk, d = s["nnz"], s["nheads_q"], s["nheads_kv"], s["headdim"]
        q, k = _random(torch, (nnz, hq, d), dtype), _random(torch, (nnz, hk, d), dtype)
        pos = torch.arange(nnz, device="cuda", dtype=torch.int32) % max(nnz // 16, 1)
        inv_freq = 1.0 / (1e4 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))

        def rope(tq, tk, p):
            ang = p.float()[:, None] * inv_freq[None, :]  # (nnz, d/2)
            cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

            def rot(x):
                x0, x1 = x[..., : d // 2].float(), x[..., d // 2:].float()
                return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).to(x.dtype)

            return rot(tq), rot(tk)

        return {
            "torch": lambda: functools.partial(rope, q, k, pos),
            "torch-compile": lambda: _compiled(torch, rope, q, k, pos),
        }
    if op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        d = s["cols"]  # the output width; the input is [rows, 2d]
        x = _random(torch, (s["rows"], 2 * d), dtype)
        nnf = torch.nn.functional
        act = {"silu_and_mul": nnf.silu,
               "gelu_and_mul": functools.partial(nnf.gelu, approximate="none"),
               "gelu_tanh_and_mul": functools.partial(nnf.gelu, approximate="tanh")}[op]

        def act_and_mul(t):
            return act(t[..., :d]) * t[..., d:]

        return {
            "torch": lambda: functools.partial(act_and_mul, x),
            "torch-compile": lambda: _compiled(torch, act_and_mul, x),
        }
    if op in ("quantize_fp8", "quantize_int8", "quantize_fp8_per_tensor"):
        x = _random(torch, (s["rows"], s["cols"]), dtype)
        per_tensor = op == "quantize_fp8_per_tensor"

        def quant(t):  # dynamic quantization: fp32 scales, one division per element
            a = t.abs().amax() if per_tensor else t.abs().amax(-1, keepdim=True)
            if op == "quantize_int8":
                sc = a.float() / 127
                return torch.round(t.float() / sc).clamp(-127, 127).to(torch.int8), sc
            sc = a.float() / 448
            return (t.float() / sc).clamp(-448, 448).to(torch.float8_e4m3fn), sc

        return {
            "torch": lambda: functools.partial(quant, x),
            "torch-compile": lambda: _compiled(torch, quant, x),
        }
    return {}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def run_peers(cases: list[dict], quick: bool = False, log=print) -> tuple[list[dict], list[str]]:
    import torch

    timer = Timer(torch, budget_s=0.1 if quick else 0.5, min_reps=10 if quick else 20,
                  max_reps=2000, warmup=3 if quick else 10)
    rows, notes = [], []
    for case in cases:
        label = f"{case['op']} {case['dtype']} {common.fmt_shape(case['shape'])}"
        try:
            builders = _peer_builders(torch, case)
        except Exception as e:  # noqa: BLE001  (e.g. out of memory: skip this case, keep going)
            notes.append(f"{label}: inputs: {_first_line(e)}")
            log(f"  {label}: SKIPPED ({notes[-1]})")
            builders = {}
        for impl, build in builders.items():
            try:
                ms, reps = timer(build())
                rows.append(make_peer_row(case, impl, ms, reps))
                log(f"  {label:40s} {impl:14s} {ms:9.4f} ms {rows[-1]['TBps']:7.3f} TB/s ({reps} reps)")
            except Exception as e:  # noqa: BLE001  (a failing peer is reported, not fatal)
                notes.append(f"{label} {impl}: {_first_line(e)}")
                log(f"  {label} {impl}: FAILED ({notes[-1]})")
        del builders
        torch.cuda.empty_cache()
    return rows, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in", dest="inp", required=True, help="harness JSON (build/gpu/bench.json)")
    p.add_argument("--out", help="merged results file (default OUT_DIR/<gpu>_<date>_<sha>.json)")
    p.add_argument("--out-dir", default=str(RESULTS_DIR),
                   help="folder for the default-named file (default bench/results)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (0.1 s per case)")
    args = p.parse_args(argv)

    doc = common.load_results(args.inp)
    try:
        import torch
    except ImportError:
        print("peers.py: torch is not installed; peers need torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"peers.py: torch {torch.__version__} sees no CUDA device; peers need a GPU",
              file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    if doc.get("device") and doc["device"] != name:
        print(f"peers.py: warning: harness ran on {doc['device']!r}, peers run on {name!r}",
              file=sys.stderr)

    cases = peer_cases(doc)
    print(f"peers.py: {len(cases)} cases on {name} (torch {torch.__version__})")
    rows, notes = run_peers(cases, quick=args.quick)
    versions = {"torch": torch.__version__}
    if triton is not None:
        versions["triton"] = triton.__version__
    merged = merge_peer_rows(doc, rows, notes, versions)
    out = Path(args.out) if args.out else default_out_path(doc, args.out_dir)
    common.write_results(out, merged)
    print(f"peers.py: {len(rows)} peer rows, {len(notes)} failures -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
