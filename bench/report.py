"""Turn results files into the README table, roofline plots and per-op ladder tables.

    python bench/report.py [bench/results/*.json] [--readme README.md] [--plots docs/plots]
    python bench/report.py --ladder vector_add bench/results/<file>.json
    python bench/report.py --stdout bench/results/*.json      # print the table, touch nothing

Of the files given (default: every bench/results/*.json) the newest per device, by "date", is
reported; pass one file to report an older run. The README gets one section per device between
the markers below (nothing is written when they are missing) and docs/plots gets
roofline_<gpu>.png per device. Every ratio compares rows of one file: one run, one machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (bench/common.py)
from common import fmt_ms, fmt_num  # noqa: E402

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


class ReportError(Exception):
    pass


# ---------------------------------------------------------------- selecting and grouping

def _date_key(doc: dict):
    try:
        return datetime.fromisoformat(str(doc.get("date", "")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("-inf")


def newest_per_device(docs: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """[(path, doc)] -> the newest doc of each device, sorted by device name.

    On equal dates the file given later wins (a glob lists names in order, and names embed the date).
    """
    best: dict[str, tuple[str, dict]] = {}
    for path, doc in docs:
        dev = doc.get("device") or "unknown device"
        if dev not in best or _date_key(doc) >= _date_key(best[dev][1]):
            best[dev] = (path, doc)
    return [best[d] for d in sorted(best)]


def group_cases(rows: list[dict]) -> dict[tuple, list[dict]]:
    """case key -> rows, keys in order of first appearance; in a case flashlab rungs come first
    (by rung), then peers fastest first."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("ms"):
            groups.setdefault(common.case_key(r), []).append(r)
    for key, rs in groups.items():
        ours = sorted((r for r in rs if not common.is_peer(r)),
                      key=lambda r: (r.get("rung") is None, r.get("rung") or 0))
        peers = sorted((r for r in rs if common.is_peer(r)), key=lambda r: r["ms"])
        groups[key] = ours + peers
    return groups


def best_peer(rows: list[dict]) -> dict | None:
    peers = [r for r in rows if common.is_peer(r) and r.get("ms")]
    return min(peers, key=lambda r: r["ms"]) if peers else None


def speedup(baseline: dict | None, row: dict) -> float | None:
    """How many times faster row is than baseline (>1: row is faster)."""
    if baseline is None or not baseline.get("ms") or not row.get("ms"):
        return None
    return baseline["ms"] / row["ms"]


def impl_label(row: dict) -> str:
    if common.is_peer(row):
        return str(row.get("impl"))
    parts = [common.FLASHLAB]
    if row.get("rung") is not None:
        parts.append(f"r{row['rung']}")
    if row.get("rung_name"):
        parts.append(str(row["rung_name"]))
    return " ".join(parts)


def _peaks(doc: dict) -> tuple[float | None, float | None]:
    p = doc.get("peaks") or {}
    return p.get("copy_TBps") or None, p.get("gemm_bf16_TFLOPs") or None


# Compute-bound ops -> the peer whose rate is their baseline (rung 0, same case): their ladder
# tables show TFLOP/s and % of that peer instead of bandwidth, and no share of the copy peak.
COMPUTE_BASELINE = {"gemm": "cublas", "attn_fwd": "torch-sdpa-cudnn", "attn_bwd": "torch-sdpa-cudnn"}


def _pct_copy(row: dict, peak) -> str:
    """Share of the device copy bandwidth; none for ops whose bytes cross the host link, nor for
    compute-bound ops."""
    if row.get("op") in common.HOST_LINK_OPS or row.get("op") in COMPUTE_BASELINE:
        return "–"
    return _pct(common.row_TBps(row), peak)


def _pct(value, peak) -> str:
    return f"{100 * value / peak:.1f}%" if value and peak else "–"


def _pct_peak16(row: dict, peak) -> str:
    """Share of the run's measured bf16 GEMM rate (peaks.gemm_bf16_TFLOPs) for 16-bit rows of a
    compute-bound op; none for other dtypes (fp32 FMA and FP8 have other ceilings)."""
    return _pct(common.row_TFLOPs(row), peak) if row.get("dtype") in ("bf16", "fp16") else "–"


def _x(v) -> str:
    return f"{v:.2f}x" if v is not None else "–"


def _md_table(header: list[str], rows: list[list[str]], right_from: int) -> str:
    align = ["---" if i < right_from else "--:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- tables

def header_line(doc: dict) -> str:
    copy_peak, gemm_peak = _peaks(doc)
    sw = [f"CUDA {doc['cuda']}" if doc.get("cuda") else None,
          f"driver {doc['driver']}" if doc.get("driver") else None,
          f"torch {doc['torch']}" if doc.get("torch") else None]
    sw_text = ", ".join(s for s in sw if s)
    return (f"**{doc.get('device', 'unknown device')}** · {doc.get('date', 'no date')} · "
            f"commit `{common.short_sha(doc.get('commit'))}`" + (f" · {sw_text}" if sw_text else "")
            + f" · measured peaks: copy {fmt_num(copy_peak)} TB/s, "
              f"bf16 GEMM {fmt_num(gemm_peak)} TFLOP/s")


def results_table(doc: dict) -> str:
    """Markdown: every (op, dtype, shape, impl+rung) of one results file."""
    copy_peak, _ = _peaks(doc)
    out = []
    for rows in group_cases(doc.get("rows", [])).values():
        ref = best_peer(rows)
        for r in rows:
            out.append([str(r.get("op")), str(r.get("dtype") or "–"), common.fmt_shape(r.get("shape")),
                        impl_label(r), fmt_ms(r["ms"]), fmt_num(common.row_TBps(r)),
                        _pct_copy(r, copy_peak), fmt_num(common.row_TFLOPs(r)),
                        _x(speedup(ref, r))])
    return _md_table(["op", "dtype", "shape", "impl", "ms", "TB/s", "% copy peak", "TFLOP/s",
                      "x vs best peer"], out, right_from=4)


def ladder_table(doc: dict, op: str) -> str:
    """Markdown for docs/ladder/<op>.md: the flashlab rungs of op, each case followed by its
    peers, with speed-ups against rung 1 and against eager torch (compute-bound ops: TFLOP/s, %
    of their baseline peer, e.g. cuBLAS, and, for 16-bit rows, % of the run's measured bf16 GEMM
    peak, instead of TB/s, % copy peak and x vs torch)."""
    copy_peak, gemm_peak = _peaks(doc)
    baseline_impl = COMPUTE_BASELINE.get(op)
    groups = {k: rs for k, rs in group_cases(doc.get("rows", [])).items()
              if k[0] == op and any(not common.is_peer(r) for r in rs)}
    if not groups:
        raise ReportError(f"no flashlab rows for op {op!r} in this file")
    many_shapes = len({k[2] for k in groups}) > 1
    # shapes in order of first appearance, then dtype, so a dtype's rows sit together
    shape_order = {s: i for i, s in enumerate(dict.fromkeys(k[2] for k in groups))}
    keys = sorted(groups, key=lambda k: (shape_order[k[2]], str(k[1])))
    out = []
    for key in keys:
        rows = groups[key]
        rung1 = next((r for r in rows if not common.is_peer(r) and r.get("rung") == 1), None)
        torch_row = next((r for r in rows if r.get("impl") == "torch"), None)
        base_row = next((r for r in rows if r.get("impl") == baseline_impl), None)
        for r in rows:
            peer = common.is_peer(r)
            cells = [("0" if r.get("impl") == baseline_impl else "–") if peer else str(r.get("rung", "–")),
                     f"{r.get('impl')} (peer)" if peer else str(r.get("rung_name", "")),
                     str(r.get("dtype") or "–")]
            if many_shapes:
                cells.append(common.fmt_shape(r.get("shape")))
            if baseline_impl:
                of_base = speedup(base_row, r)
                cells += [fmt_ms(r["ms"]), fmt_num(common.row_TFLOPs(r)),
                          f"{100 * of_base:.1f}%" if of_base is not None else "–", _pct_peak16(r, gemm_peak),
                          _x(speedup(rung1, r))]
                out.append(cells)
                continue
            cells += [fmt_ms(r["ms"]), fmt_num(common.row_TBps(r)),
                      _pct_copy(r, copy_peak),
                      # rows whose shape differs from rung 1's (streams: the stream and chunk
                      # counts are part of the shape) carry their own same-run ratio
                      _x(r["speedup_vs_serial"]) if "speedup_vs_serial" in r else _x(speedup(rung1, r)),
                      _x(speedup(torch_row, r))]
            out.append(cells)
    header = ["rung", "name", "dtype"] + (["shape"] if many_shapes else []) + \
             (["ms", "TFLOP/s", f"% of {baseline_impl}", "% of bf16 peak", "x vs rung 1"] if baseline_impl else
              ["ms", "TB/s", "% copy peak", "x vs rung 1", "x vs torch"])
    return _md_table(header, out, right_from=4 if many_shapes else 3)


# ---------------------------------------------------------------- README

def replace_between_markers(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """text with everything between begin and end replaced by block; the rest byte for byte."""
    b = text.find(begin)
    e = text.find(end, b + len(begin)) if b >= 0 else -1
    if b < 0 or e < 0:
        raise ReportError(f"markers {begin} ... {end} not found (in that order)")
    return text[:b + len(begin)] + "\n" + block.rstrip("\n") + "\n" + text[e:]


LADDER_MARKER = re.compile(r"<!-- ladder:([a-z0-9_]+):begin -->")


def write_ladder_docs(reports: list[tuple[str, dict]], docs_dir: Path) -> list[Path]:
    """Fills every `<!-- ladder:OP:begin -->` ... `<!-- ladder:OP:end -->` block of the pages in
    docs_dir with the ladder table of OP from each report. Returns the pages written."""
    written = []
    for page in sorted(Path(docs_dir).glob("*.md")):
        text = page.read_text()
        new = text
        for op in LADDER_MARKER.findall(text):
            parts = ["<!-- generated by bench/report.py --docs; edit the results, not this block -->"]
            for path, doc in reports:
                parts += ["", header_line(doc) + f" · `{os.path.basename(path)}`", "", ladder_table(doc, op)]
            new = replace_between_markers(new, "\n".join(parts), f"<!-- ladder:{op}:begin -->",
                                          f"<!-- ladder:{op}:end -->")
        if new != text:
            page.write_text(new)
            written.append(page)
    return written


def readme_block(reports: list[tuple[str, dict]], plots: dict[str, Path], readme: Path) -> str:
    parts = ["<!-- generated by bench/report.py; edit the results, not this block -->"]
    for path, doc in reports:
        parts += ["", header_line(doc) + f" · `{os.path.basename(path)}`", "", results_table(doc)]
        notes = doc.get("peers_note")
        if notes:
            notes = [notes] if isinstance(notes, str) else notes
            parts += ["", "Peers that failed: " + "; ".join(notes)]
        if path in plots:
            rel = os.path.relpath(plots[path], readme.resolve().parent)
            parts += ["", f"![roofline, {doc.get('device', '')}]({Path(rel).as_posix()})"]
    parts += ["", "x vs best peer: time of the fastest peer of the same op, dtype and shape "
                  "divided by this row's time (above 1: faster than every peer). "
                  "% copy peak: TB/s over the device-to-device copy bandwidth measured in the same run."]
    return "\n".join(parts)


# ---------------------------------------------------------------- plots


def gemm_ladder_points(doc: dict) -> dict[str, list[tuple[str, float]]]:
    """Per GEMM shape with a cuBLAS row (NN only): [(label, TFLOP/s)] of every rung, cuBLAS first."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for r in doc.get("rows", []):
        shape = r.get("shape") or {}
        if r.get("op") != "gemm" or shape.get("layout") != "NN" or not r.get("ms"):  # (the start-up peak row has no layout)
            continue
        flops = common.row_flops(r)
        if not flops:
            continue
        key = f"{r.get('dtype')} {shape.get('m')}x{shape.get('n')}x{shape.get('k')}"
        label = "cuBLAS" if common.is_peer(r) else f"r{r.get('rung')} {r.get('rung_name', '')}"
        groups.setdefault(key, []).append((label, flops / r["ms"] / 1e9))
    return {k: sorted(v, key=lambda p: (p[0] != "cuBLAS", p[0])) for k, v in groups.items()
            if any(lbl == "cuBLAS" for lbl, _ in v) and len(v) > 1}


def plot_gemm_ladder(doc: dict, out_dir) -> Path | None:
    """Bar chart of every GEMM rung's TFLOP/s per shape (NN), cuBLAS of the same run as the
    reference bar: docs/plots/gemm_ladder_<gpu>.png. None when the file has no GEMM rows."""
    groups = gemm_ladder_points(doc)
    if not groups:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 * len(groups) + 0.6), squeeze=False)
    for ax, (key, pts) in zip(axes[:, 0], groups.items()):
        labels = [p[0] for p in pts]
        vals = [p[1] for p in pts]
        ref = vals[0]
        colors = ["0.55" if lbl == "cuBLAS" else "tab:blue" for lbl in labels]
        ax.barh(range(len(vals)), vals, color=colors)
        ax.set_yticks(range(len(vals)), labels, fontsize=7)
        ax.invert_yaxis()
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.1f} ({100 * v / ref:.0f}%)", va="center", fontsize=7)
        ax.set_xlim(0, max(vals) * 1.25)
        ax.set_title(key, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("TFLOP/s (% of cuBLAS in the same run)")
    fig.suptitle(f"GEMM ladder, {doc.get('device')} · commit {doc.get('commit')}", fontsize=10)
    fig.tight_layout()
    out = Path(out_dir) / f"gemm_ladder_{common.gpu_slug(doc.get('device'))}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

# Ops whose bytes do not cross device memory (the streams pipeline moves host bytes over PCIe):
# the HBM roofline says nothing about them.
NOT_ON_ROOFLINE = {"streams_pipeline"}


def roofline_points(doc: dict) -> list[tuple[float, float, str, str]]:
    """(flop/byte, TFLOP/s, impl, op) for every row with known flops and bytes."""
    pts = []
    for r in doc.get("rows", []):
        if r.get("op") in NOT_ON_ROOFLINE:
            continue
        f, b, ms = common.row_flops(r), common.row_bytes(r), r.get("ms")
        if f and b and ms:
            pts.append((f / b, f / ms / 1e9, str(r.get("impl")), str(r.get("op"))))
    return pts


def plot_roofline(doc: dict, out_dir) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    copy_peak, gemm_peak = _peaks(doc)
    pts = roofline_points(doc)
    ridge = gemm_peak / copy_peak if copy_peak and gemm_peak else None
    ais = [p[0] for p in pts]
    xmin = min([0.05] + [a / 4 for a in ais])
    xmax = max([ridge * 8 if ridge else 1e3] + [a * 4 for a in ais])

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    if copy_peak:
        x1 = ridge if ridge else xmax
        ax.plot([xmin, x1], [xmin * copy_peak, x1 * copy_peak], color="0.2", lw=2)
        xl = (xmin * x1) ** 0.5
        ax.text(xl, xl * copy_peak * 1.5, f"copy {copy_peak:.2f} TB/s", ha="right", va="bottom",
                color="0.2", fontsize=9)
    if gemm_peak:
        x0 = ridge if ridge else xmin
        ax.plot([x0, xmax], [gemm_peak, gemm_peak], color="0.2", lw=2)
        ax.text(xmax / 1.2, gemm_peak * 1.12, f"bf16 GEMM {gemm_peak:.0f} TFLOP/s", ha="right",
                va="bottom", color="0.2", fontsize=9)

    impls = sorted({p[2] for p in pts}, key=lambda i: (i != common.FLASHLAB, i))
    ops = list(dict.fromkeys(p[3] for p in pts))
    cmap = plt.get_cmap("tab10")
    color = {i: cmap(k % 10) for k, i in enumerate(impls)}
    shapes = "osD^vPX*<>"
    marker = {o: shapes[k % len(shapes)] for k, o in enumerate(ops)}
    for ai, tf, impl, op in pts:
        ax.scatter(ai, tf, color=color[impl], marker=marker[op], s=36, alpha=0.8,
                   edgecolors="none", zorder=3)

    ys = [p[1] for p in pts] + [v for v in (gemm_peak, xmin * (copy_peak or 0)) if v]
    ax.set_xlim(xmin, xmax)
    if ys:
        ax.set_ylim(min(ys) / 4, max(ys) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{doc.get('device', '')}: roofline · {common.short_date(doc.get('date'))} · "
                 f"{common.short_sha(doc.get('commit'))}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    if pts:
        leg1 = ax.legend(handles=[Line2D([], [], ls="", marker="o", color=color[i], label=i)
                                  for i in impls], title="impl", loc="upper left", fontsize=8)
        ax.add_artist(leg1)
        ax.legend(handles=[Line2D([], [], ls="", marker=marker[o], color="0.4", label=o)
                           for o in ops], title="op", loc="lower right", fontsize=8)
    fig.tight_layout()
    out = Path(out_dir) / f"roofline_{common.gpu_slug(doc.get('device'))}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ---------------------------------------------------------------- CLI

def load_all(paths: list[str]) -> list[tuple[str, dict]]:
    if not paths:
        paths = sorted(str(p) for p in RESULTS_DIR.glob("*.json"))
        if not paths:
            raise ReportError(f"no results files given and none in {RESULTS_DIR}")
    return [(p, common.load_results(p)) for p in paths]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="results JSON files (default bench/results/*.json)")
    p.add_argument("--readme", default="README.md", help="file with the results markers")
    p.add_argument("--plots", default="docs/plots", help="folder for roofline_<gpu>.png")
    p.add_argument("--ladder", metavar="OP", help="print the ladder table of OP and exit")
    p.add_argument("--stdout", action="store_true", help="print the README block, write nothing")
    p.add_argument("--docs", metavar="DIR", help="also fill the ladder tables of DIR/*.md (docs/ladder)")
    args = p.parse_args(argv)

    try:
        reports = newest_per_device(load_all(args.files))
        if args.ladder:
            for path, doc in reports:
                table = ladder_table(doc, args.ladder)
                print(header_line(doc) + f" · `{os.path.basename(path)}`\n\n{table}\n")
            return 0
        readme = Path(args.readme)
        if args.stdout:
            print(readme_block(reports, {}, readme))
            return 0
        if not readme.is_file():
            raise ReportError(f"{readme}: no such file")
        text = readme.read_text()
        replace_between_markers(text, "")  # check the markers before writing anything
        plots = {path: plot_roofline(doc, args.plots) for path, doc in reports}
        gemm_plots = [plot_gemm_ladder(doc, args.plots) for _, doc in reports]
        readme.write_text(replace_between_markers(text, readme_block(reports, plots, readme)))
        pages = write_ladder_docs(reports, Path(args.docs)) if args.docs else []
    except (ReportError, ValueError, OSError) as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 1
    for path, doc in reports:
        print(f"report.py: {doc.get('device')}: {path}")
    n_plots = len(plots) + sum(p is not None for p in gemm_plots)
    print(f"report.py: wrote {readme}, {n_plots} plot(s) in {args.plots}, {len(pages)} ladder page(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
