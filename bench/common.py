"""Pure helpers shared by bench/peers.py and bench/report.py (no torch, no matplotlib).

A results file is the harness JSON (DESIGN.md, "Benchmarks"):
  {"device", "date", "commit", "cuda", "driver", "peaks": {"copy_TBps", "gemm_bf16_TFLOPs"},
   "rows": [{"op", "impl", "rung", "rung_name", "dtype", "shape", "ms", "TBps", "TFLOPs",
             "bytes", "flops"}, ...]}
Rows may lack any key but "op", "impl" and "ms"; the helpers below derive what is missing with
the same accounting as the C++ harness, so a derived number is comparable with a measured one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FLASHLAB = "flashlab"

# Ops whose bytes cross PCIe/NVLink-C2C to the host: device copy bandwidth is not their ceiling.
HOST_LINK_OPS = ("streams_pipeline",)

DTYPE_BYTES = {
    "fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2,
    "e4m3": 1, "e5m2": 1, "int8": 1, "uint8": 1, "u8": 1, "int32": 4, "int64": 8,
}


def load_results(path) -> dict:
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: not a flashlab results file (expected an object with 'rows')")
    return doc


def write_results(path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    tmp.replace(path)  # a reader never sees half a file


# ---- file naming: bench/results/<gpu>_<date>_<sha>.json ----

def gpu_slug(device: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", (device or "").lower()).strip("-")
    return slug or "unknown-gpu"


def short_date(date: str | None) -> str:
    """'2026-11-22T23:01:02Z' -> '2026-11-22'."""
    m = re.match(r"\d{4}-\d{2}-\d{2}", date or "")
    return m.group(0) if m else "nodate"


def short_sha(commit: str | None) -> str:
    """First 7 hex digits; a '-dirty' tree keeps its mark so it never overwrites a clean run."""
    m = re.match(r"[0-9a-fA-F]+", commit or "")
    sha = m.group(0)[:7].lower() if m else "nosha"
    return sha + ("-dirty" if "dirty" in (commit or "") else "")


def results_filename(doc: dict) -> str:
    return f"{gpu_slug(doc.get('device'))}_{short_date(doc.get('date'))}_{short_sha(doc.get('commit'))}.json"


# ---- cases and accounting ----

def shape_key(shape: dict | None) -> tuple:
    return tuple(sorted((shape or {}).items()))


def case_key(row: dict) -> tuple:
    """(op, dtype, shape): the rows that share it are compared with each other."""
    return (row.get("op"), row.get("dtype"), shape_key(row.get("shape")))


def is_peer(row: dict) -> bool:
    return row.get("impl") != FLASHLAB


def elem_bytes(dtype: str | None) -> int | None:
    return DTYPE_BYTES.get(dtype or "")


def op_bytes(op: str, dtype: str | None, shape: dict) -> int | None:
    """Bytes an op must move at least (same counts as the harness); None when unknown."""
    e = elem_bytes(dtype)
    s = shape or {}
    try:
        if op == "vector_add" and e:
            return 3 * s["n"] * e
        if op == "reduce_sum" and e:
            return s["n"] * e + 4
        if op == "row_sum" and e:
            return s["rows"] * s["cols"] * e + s["rows"] * 4
        if op == "streams_pipeline":
            return 2 * s["n"] * 4  # fp32 in over H2D, fp32 out over D2H
    except KeyError:
        return None
    return None


def op_flops(op: str, shape: dict) -> int | None:
    """Useful FLOPs of an op (one add per element); None when the op has no count here."""
    s = shape or {}
    try:
        if op in ("vector_add", "reduce_sum"):
            return s["n"]
        if op == "row_sum":
            return s["rows"] * s["cols"]
        if op == "copy":
            return 0
    except KeyError:
        return None
    return None


def row_bytes(row: dict) -> int | None:
    b = row.get("bytes")
    return b if b else op_bytes(row.get("op"), row.get("dtype"), row.get("shape"))


def row_flops(row: dict) -> int | None:
    f = row.get("flops")
    return f if f else op_flops(row.get("op"), row.get("shape"))


def row_TBps(row: dict) -> float | None:
    if row.get("TBps"):
        return row["TBps"]
    b, ms = row_bytes(row), row.get("ms")
    return b / ms / 1e9 if b and ms else None


def row_TFLOPs(row: dict) -> float | None:
    if row.get("TFLOPs"):
        return row["TFLOPs"]
    f, ms = row_flops(row), row.get("ms")
    return f / ms / 1e9 if f and ms else None


# ---- formatting ----

def fmt_int(v) -> str:
    """Exact, but powers-of-two-ish sizes read short: 268435456 -> '256Mi', 1536 -> '1.5Ki'."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1024:
        return str(v)
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if v >= scale:
            q = v / scale
            if (v * 2) % scale == 0:  # exact in halves: no precision hidden
                return (f"{q:g}{unit}")
            break
    return str(v)


def fmt_shape(shape: dict | None) -> str:
    return " ".join(f"{k}={fmt_int(v)}" for k, v in (shape or {}).items())


def fmt_ms(v) -> str:
    """Four significant digits, zeros kept so a column of times lines up: 0.5500, 12.30."""
    if not v:
        return "–"
    return f"{v:.1f}" if v >= 1e4 else f"{v:#.4g}".rstrip(".")


def fmt_num(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if v == 0:
        return "0"
    if abs(v) >= 10 ** digits:
        return f"{v:.0f}"
    return f"{v:#.{digits}g}".rstrip(".")  # '#' keeps zeros: 3.00, not 3
