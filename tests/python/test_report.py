"""bench/report.py and the pure helpers of bench/peers.py on a synthetic results file (CPU only)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"flashlab_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _load("report")
peers = _load("peers")
common = _load("common")

N = 1 << 28
COPY_N = 1 << 30


def _row(op, impl, ms, dtype="bf16", shape=None, rung=None, rung_name=None, **extra):
    r = {"op": op, "impl": impl, "dtype": dtype, "shape": shape or {"n": N}, "ms": ms}
    if rung is not None:
        r["rung"], r["rung_name"] = rung, rung_name
    r.update(extra)
    return r


def _doc(device="NVIDIA H100 80GB HBM3", date="2026-11-22T23:01:02Z", commit="0123456789abcdef"):
    vb = 3 * N * 2
    rows = [
        # as the harness writes them: copy counts fp32 elements and bytes read + written
        _row("copy", "cudaMemcpy", 0.72, dtype="fp32", shape={"n": COPY_N // 4}, bytes=2 * COPY_N,
             TBps=2 * COPY_N / 0.72 / 1e9, TFLOPs=0, flops=0),
        _row("gemm", "cublas", 1.47, shape={"m": 8192, "n": 8192, "k": 8192}, bytes=3 * 8192 ** 2 * 2,
             flops=2 * 8192 ** 3),
        _row("vector_add", "flashlab", 0.80, rung=1, rung_name="grid_stride", bytes=vb, flops=N),
        _row("vector_add", "flashlab", 0.55, rung=3, rung_name="vec16_tail", bytes=vb, flops=N,
             TBps=vb / 0.55 / 1e9, TFLOPs=N / 0.55 / 1e9),
        _row("vector_add", "flashlab", 0.60, rung=2, rung_name="vec16"),  # no bytes/flops: derived
        _row("vector_add", "torch", 0.66, bytes=vb, flops=N),
        _row("vector_add", "torch-compile", 0.605, bytes=vb, flops=N),
        _row("reduce_sum", "flashlab", 0.20, dtype="fp32", rung=6, rung_name="one_pass"),
        _row("row_sum", "flashlab", 0.10, dtype="fp32", shape={"rows": 4096, "cols": 8192}, rung=1,
             rung_name="row_sum"),
        _row("row_sum", "torch", 0.12, dtype="fp32", shape={"rows": 4096, "cols": 8192}),
        _row("streams_pipeline", "flashlab", 5.0, dtype="fp32",
             shape={"n": 1 << 26, "streams": 4, "chunks": 16}, rung=2, rung_name="overlapped",
             bytes=2 * 4 << 26, TBps=0.05),
    ]
    return {"device": device, "date": date, "commit": commit, "cuda": "13.0", "driver": "580.159.04",
            "peaks": {"copy_TBps": 3.0, "gemm_bf16_TFLOPs": 750.0}, "rows": rows}


def _table_rows(md):
    """Data rows of a markdown table as lists of cells."""
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]


def _find(rows, *cells):
    hits = [r for r in rows if all(c in r for c in cells)]
    assert len(hits) == 1, (cells, rows)
    return hits[0]


# ---------------------------------------------------------------- report: tables

def test_results_table_ratios_and_order():
    md = report.results_table(_doc())
    header = md.splitlines()[0]
    assert "x vs best peer" in header and "% copy peak" in header
    rows = _table_rows(md)
    col = {name: i for i, name in enumerate(c.strip() for c in header.strip("|").split("|"))}

    top = _find(rows, "flashlab r3 vec16_tail")
    assert top[col["x vs best peer"]] == f"{0.605 / 0.55:.2f}x"  # best peer is torch-compile
    assert top[col["% copy peak"]] == f"{100 * (3 * N * 2 / 0.55 / 1e9) / 3.0:.1f}%"
    assert top[col["shape"]] == "n=256Mi"
    # rung 2 had no bytes: the op's count (3 n elem) gives the same TB/s accounting
    r2 = _find(rows, "flashlab r2 vec16")
    assert r2[col["TB/s"]] == common.fmt_num(3 * N * 2 / 0.60 / 1e9)
    assert r2[col["TFLOP/s"]] == common.fmt_num(N / 0.60 / 1e9)
    assert _find(rows, "torch-compile")[col["x vs best peer"]] == "1.00x"
    assert _find(rows, "row_sum", "flashlab r1 row_sum")[col["x vs best peer"]] == "1.20x"
    # no peer: no ratio
    assert _find(rows, "streams_pipeline")[col["x vs best peer"]] == "–"
    assert _find(rows, "reduce_sum")[col["x vs best peer"]] == "–"

    # rungs in order, then peers fastest first
    impls = [r[col["impl"]] for r in rows if r[col["op"]] == "vector_add"]
    assert impls == ["flashlab r1 grid_stride", "flashlab r2 vec16", "flashlab r3 vec16_tail",
                     "torch-compile", "torch"]


def test_header_line_states_the_run():
    line = report.header_line(dict(_doc(), torch="2.11.0"))
    for part in ("NVIDIA H100 80GB HBM3", "2026-11-22T23:01:02Z", "`0123456`", "copy 3.00 TB/s",
                 "bf16 GEMM 750 TFLOP/s", "torch 2.11.0"):
        assert part in line


def test_ladder_table():
    md = report.ladder_table(_doc(), "vector_add")
    header = md.splitlines()[0]
    assert "x vs rung 1" in header and "x vs torch" in header and "shape" not in header
    rows = _table_rows(md)
    col = {name: i for i, name in enumerate(c.strip() for c in header.strip("|").split("|"))}
    assert [r[col["rung"]] for r in rows] == ["1", "2", "3", "–", "–"]
    top = _find(rows, "vec16_tail")
    assert top[col["x vs rung 1"]] == f"{0.80 / 0.55:.2f}x"
    assert top[col["x vs torch"]] == f"{0.66 / 0.55:.2f}x"  # eager torch, not the best peer
    assert _find(rows, "grid_stride")[col["x vs rung 1"]] == "1.00x"
    assert _find(rows, "torch (peer)")[col["x vs torch"]] == "1.00x"

    with pytest.raises(report.ReportError):
        report.ladder_table(_doc(), "softmax")


def _gemm_doc():
    def g(impl, ms, m, layout="NN", rung=None, name=None):
        shape = {"m": m, "n": 4096, "k": 4096, "layout": layout}
        return _row("gemm", impl, ms, shape=shape, rung=rung, rung_name=name,
                    bytes=(2 * m * 4096 + 4096 ** 2) * 2, flops=2 * m * 4096 ** 2)
    doc = _doc()
    doc["rows"] += [g("cublas", 0.20, 4096), g("flashlab", 0.25, 4096, rung=9, name="hopper_ws"),
                    g("flashlab", 0.50, 4096, rung=8, name="mma_sync"),
                    g("cublas", 0.22, 4096, "NT"), g("flashlab", 0.20, 4096, "NT", rung=9, name="hopper_ws")]
    return doc


def test_ladder_table_gemm_reads_as_share_of_cublas():
    md = report.ladder_table(_gemm_doc(), "gemm")
    header = md.splitlines()[0]
    col = {name: i for i, name in enumerate(c.strip() for c in header.strip("|").split("|"))}
    assert "TFLOP/s" in col and "% of cublas" in col and "TB/s" not in col and "x vs torch" not in col
    rows = _table_rows(md)
    nn = [r for r in rows if "layout=NN" in r[col["shape"]]]
    assert [r[col["rung"]] for r in nn] == ["8", "9", "0"]  # rungs in order, then cuBLAS as rung 0
    top = _find(nn, "9")
    assert top[col["% of cublas"]] == "80.0%"
    # share of the run's measured bf16 peak (750 TFLOP/s in _doc): 16-bit rows only
    assert top[col["% of bf16 peak"]] == f"{100 * (2 * 4096 ** 3 / 0.25 / 1e9) / 750.0:.1f}%"
    assert top[col["TFLOP/s"]] == common.fmt_num(2 * 4096 ** 3 / 0.25 / 1e9)
    assert _find(nn, "cublas (peer)")[col["% of cublas"]] == "100.0%"
    nt = [r for r in rows if "layout=NT" in r[col["shape"]]]
    assert _find(nt, "hopper_ws")[col["% of cublas"]] == f"{100 * 0.22 / 0.20:.1f}%"
    # the results table: no share of the copy peak for GEMM; x vs best peer is x vs cuBLAS
    md = report.results_table(_gemm_doc())
    header = md.splitlines()[0]
    col = {name: i for i, name in enumerate(c.strip() for c in header.strip("|").split("|"))}
    r9 = [r for r in _table_rows(md) if r[col["impl"]] == "flashlab r9 hopper_ws"]
    assert [r[col["% copy peak"]] for r in r9] == ["–", "–"]
    assert sorted(r[col["x vs best peer"]] for r in r9) == ["0.80x", "1.10x"]
    assert "layout=NN" in r9[0][col["shape"]] or "layout=NN" in r9[1][col["shape"]]


def test_ladder_cli_prints_table(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_doc()))
    assert report.main(["--ladder", "row_sum", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| rung |" in out and "row_sum" in out and "1.20x" in out


# ---------------------------------------------------------------- report: README and plot

README = """# flashlab

intro text, kept as is
<!-- results:begin -->
old table
<!-- results:end -->
tail text  \n"""


def test_readme_markers_replaced_and_png_written(tmp_path):
    old = _doc(date="2026-11-20T10:00:00Z", commit="aaaaaaa")
    new = _doc()
    other = _doc(device="NVIDIA H200", commit="bbbbbbb")
    for name, doc in (("old", old), ("new", new), ("h200", other)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    plots = tmp_path / "docs" / "plots"

    files = [str(tmp_path / f"{n}.json") for n in ("new", "old", "h200")]
    assert report.main(files + ["--readme", str(readme), "--plots", str(plots)]) == 0

    text = readme.read_text()
    head, rest = text.split(report.BEGIN)
    body, tail = rest.split(report.END)
    assert head == "# flashlab\n\nintro text, kept as is\n"
    assert tail == "\ntail text  \n"
    assert "old table" not in body
    assert "`0123456`" in body and "`aaaaaaa`" not in body  # the newest H100 file only
    assert "NVIDIA H200" in body and "`bbbbbbb`" in body
    assert "](docs/plots/roofline_nvidia-h100-80gb-hbm3.png)" in body

    for slug in ("nvidia-h100-80gb-hbm3", "nvidia-h200"):
        png = plots / f"roofline_{slug}.png"
        assert png.is_file() and png.stat().st_size > 1000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a second run replaces the block instead of nesting it
    assert report.main(files + ["--readme", str(readme), "--plots", str(plots)]) == 0
    assert readme.read_text() == text


def test_missing_markers_is_an_error_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "r.json").write_text(json.dumps(_doc()))
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n<!-- results:end -->\n<!-- results:begin -->\n")
    plots = tmp_path / "plots"
    rc = report.main([str(tmp_path / "r.json"), "--readme", str(readme), "--plots", str(plots)])
    assert rc == 1
    assert "markers" in capsys.readouterr().err
    assert readme.read_text() == "# no markers here\n<!-- results:end -->\n<!-- results:begin -->\n"
    assert not plots.exists()
    with pytest.raises(report.ReportError):
        report.replace_between_markers("nothing", "x")


def test_roofline_points_use_op_counts():
    pts = report.roofline_points(_doc())
    ops = {p[3] for p in pts}
    assert "copy" not in ops  # no flops: not on a FLOP/s plot
    gemm = [p for p in pts if p[3] == "gemm"][0]
    assert gemm[0] == pytest.approx(8192 / 3) and gemm[2] == "cublas"
    rs = [p for p in pts if p[3] == "reduce_sum"][0]
    assert rs[0] == pytest.approx(N / (N * 4 + 4))
    assert rs[1] == pytest.approx(N / 0.20 / 1e9)


def test_newest_per_device():
    a = ("a", _doc(date="2026-11-20T10:00:00Z"))
    b = ("b", _doc(date="2026-11-22T10:00:00Z"))
    c = ("c", _doc(device="NVIDIA H200"))
    assert [p for p, _ in report.newest_per_device([b, a, c])] == ["b", "c"]


# ---------------------------------------------------------------- peers.py pure helpers

def test_peers_importable_without_torch():
    # torch and triton made unimportable: the module and its pure helpers still load
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
            f"sys.path.insert(0, {str(BENCH)!r}); import peers, report; "
            "assert peers.triton is None; print(peers.common.results_filename({}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "unknown-gpu_nodate_nosha.json"


def test_peers_main_without_torch_fails_clearly(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_doc()))
    code = ("import sys; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {str(BENCH)!r}); import peers; "
            f"sys.exit(peers.main(['--in', {str(path)!r}, '--out', {str(tmp_path / 'o.json')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "torch is not installed" in out.stderr
    assert not (tmp_path / "o.json").exists()


def test_results_filename():
    doc = _doc()
    assert common.results_filename(doc) == "nvidia-h100-80gb-hbm3_2026-11-22_0123456.json"
    assert common.results_filename({"device": "NVIDIA H200", "date": "2026-01-02",
                                    "commit": "abcdef0123-dirty"}) == \
        "nvidia-h200_2026-01-02_abcdef0-dirty.json"
    assert common.results_filename({}) == "unknown-gpu_nodate_nosha.json"
    assert peers.default_out_path(doc).parent.name == "results"
    assert peers.default_out_path(doc, "/x/y") == Path("/x/y") / common.results_filename(doc)


def test_peer_cases_and_rows():
    cases = peers.peer_cases(_doc())
    keys = [(c["op"], c["dtype"], tuple(c["shape"].items())) for c in cases]
    # one case per (op, dtype, shape) with a torch peer; streams_pipeline has none
    assert keys == [("copy", "fp32", (("n", COPY_N // 4),)), ("vector_add", "bf16", (("n", N),)),
                    ("reduce_sum", "fp32", (("n", N),)),
                    ("row_sum", "fp32", (("rows", 4096), ("cols", 8192)))]
    copy_case, va, rs, _ = cases
    assert copy_case["copy_bytes"] == COPY_N and copy_case["bytes"] == 2 * COPY_N
    assert va["bytes"] == 3 * N * 2 and va["flops"] == N
    assert rs["bytes"] == N * 4 + 4  # derived the harness's way when the row has no bytes

    row = peers.make_peer_row(va, "torch", 0.5, reps=40)
    assert row["TBps"] == pytest.approx(3 * N * 2 / 0.5 / 1e9)
    assert row["TFLOPs"] == pytest.approx(N / 0.5 / 1e9)
    assert "rung" not in row and row["shape"] == {"n": N}


def test_merge_peer_rows_keeps_fields_and_replaces_old_peers():
    doc = dict(_doc(), sm_count=132)
    va = peers.peer_cases(doc)[1]
    new_torch = peers.make_peer_row(va, "torch", 0.64, reps=30)
    merged = peers.merge_peer_rows(doc, [new_torch], ["x torch-compile: boom"], {"torch": "2.11.0"})
    assert [r["ms"] for r in doc["rows"] if r["impl"] == "torch"][0] == 0.66  # input untouched
    for k in ("device", "date", "commit", "cuda", "driver", "peaks", "sm_count"):
        assert merged[k] == doc[k]
    assert merged["torch"] == "2.11.0" and merged["peers_note"] == ["x torch-compile: boom"]
    torch_rows = [r for r in merged["rows"] if r["op"] == "vector_add" and r["impl"] == "torch"]
    assert [r["ms"] for r in torch_rows] == [0.64]
    assert len(merged["rows"]) == len(doc["rows"])
    assert "peers_note" not in peers.merge_peer_rows(doc, [], [])


def test_fmt_int():
    assert common.fmt_int(1 << 28) == "256Mi"
    assert common.fmt_int(1536) == "1.5Ki"
    assert common.fmt_int(1000) == "1000"
    assert common.fmt_int(1_000_001) == "1000001"


def test_gemm_ladder_points_groups_nn_shapes_with_cublas_first():
    sq = {"m": 64, "n": 64, "k": 64, "layout": "NN"}
    flops = 2.0 * 64 ** 3
    doc = {"rows": [
        _row("gemm", "cublas", 0.5, shape={"m": 64, "n": 64, "k": 64}, flops=flops),  # start-up peak: no layout
        _row("gemm", "flashlab", 2.0, shape=sq, rung=9, rung_name="hopper_ws", flops=flops),
        _row("gemm", "cublas", 1.0, shape=sq, rung=0, flops=flops),
        _row("gemm", "flashlab", 4.0, shape=sq, rung=8, rung_name="mma_sync", flops=flops),
        _row("gemm", "flashlab", 1.0, shape=dict(sq, layout="NT"), rung=9, rung_name="hopper_ws", flops=flops),
        _row("gemm", "flashlab", 1.0, shape={"m": 8, "n": 8, "k": 8, "layout": "NN"}, rung=9, flops=1024.0),
    ]}
    groups = report.gemm_ladder_points(doc)
    assert list(groups) == ["bf16 64x64x64"]  # NT and the shape without a cuBLAS row are left out
    labels = [lbl for lbl, _ in groups["bf16 64x64x64"]]
    assert labels == ["cuBLAS", "r8 mma_sync", "r9 hopper_ws"]
    tf = dict(groups["bf16 64x64x64"])
    assert tf["cuBLAS"] == pytest.approx(flops / 1.0 / 1e9)
    assert tf["r9 hopper_ws"] == pytest.approx(flops / 2.0 / 1e9)
