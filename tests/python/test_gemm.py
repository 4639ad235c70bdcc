"""flashlab.gemm from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors), the
default rung per dtype, out= rules.
GPU part: every rung that takes the dtype against torch.matmul in float64, outputs poisoned with
NaN first; tolerance 2x the error of the naive same-dtype rung (rung 1; rung 1 itself against
torch's fp32 matmul, TF32 off, rounded once) plus one unit roundoff of max|ref| plus 4 fp32 unit
roundoffs of max(|alpha| |a| @ |b| + |beta out| + |bias|), as tests/gpu/test_gemm.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
from test_bindings import HAVE_CUDA, _HOST_BASE, fake, gpu, raises, torch
from numerics import check_close

U32 = 2.0 ** -24
RUNGS = {"float32": [1, 2, 3, 4, 5, 6], "float16": [1, 7, 8, 9], "bfloat16": [1, 7, 8, 9]}


# ---------------------------------------------------------------------------------------------
# CPU-runnable

def test_exported():
    assert flashlab.GEMM_RUNGS == 9
    assert "gemm" in flashlab.__all__ and "GEMM_RUNGS" in flashlab.__all__


def test_numpy_inputs_hit_the_cpp_device_check():
    a, b = np.ones((4, 8), np.float32), np.ones((8, 2), np.float32)
    with raises("gemm: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.gemm(a, b)
    with raises("gemm: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.gemm(a, b, out=np.empty((4, 2), np.float32), rung=1)
    with raises("gemm: argument 'b': expected a CUDA tensor, got cpu tensor"):
        flashlab.gemm(fake([4, 8]), b, out=fake([4, 2], offset_bytes=4096))


def _abc(m, n, k, dtype="float32", **kw):
    """Fake (m, k), (k, n), (m, n) tensors at distinct host offsets; kw per tensor ('a_strides', ...)."""
    return (fake([m, k], dtype, strides=kw.get("a_strides"), offset_bytes=kw.get("a_off", 0)),
            fake([k, n], dtype, strides=kw.get("b_strides"), offset_bytes=kw.get("b_off", 16384)),
            fake([m, n], dtype, strides=kw.get("c_strides"), offset_bytes=kw.get("c_off", 32768)))


@pytest.mark.parametrize("rung", [0, -1, 10, 2**40])
def test_bad_rung(rung):
    a, b, c = _abc(16, 32, 64)
    with raises(f"gemm: argument 'rung': expected 1..9, got {rung}"):
        flashlab.gemm(a, b, out=c, rung=rung)


def test_bad_inputs_name_the_argument():
    a, b, c = _abc(16, 32, 64, "bfloat16")
    with raises("gemm: argument 'b': expected shape (64, N) (rows = a's cols), got [63, 32]"):
        flashlab.gemm(a, fake([63, 32], "bfloat16", offset_bytes=16384), out=c)
    with raises("gemm: argument 'c': expected shape (16, 32), got [16, 31]"):
        flashlab.gemm(a, b, out=fake([16, 31], "bfloat16", offset_bytes=32768))
    with raises("gemm: argument 'b': expected dtype bf16 (same as 'a'), got fp32"):
        flashlab.gemm(a, fake([64, 32], offset_bytes=16384), out=c)
    ai, bi, ci = _abc(16, 32, 64, "int8")
    with raises("gemm: argument 'a': expected dtype fp32 or fp16 or bf16, got int8"):
        flashlab.gemm(ai, bi, out=ci)
    with raises("gemm: argument 'a': expected 2 dims, got 3 dims, shape [2, 16, 64]"):
        flashlab.gemm(fake([2, 16, 64], "bfloat16"), b, out=c)
    with raises("gemm: argument 'a': expected dtype fp32 for rung 3, got bf16"):
        flashlab.gemm(a, b, out=c, rung=3)
    with raises("gemm: argument 'a': expected dtype fp16 or bf16 for rung 8, got fp32"):
        flashlab.gemm(*_abc(16, 32, 64), rung=8)
    with raises("gemm: argument 'bias': expected shape [32], got [31]"):
        flashlab.gemm(a, b, out=c, bias=fake([31], "bfloat16", offset_bytes=49152))
    with raises("gemm: argument 'bias': expected dtype bf16 (same as 'c'), got fp32"):
        flashlab.gemm(a, b, out=c, bias=fake([32], offset_bytes=49152))
    with raises("gemm: argument 'c': expected row-major (strides (>= N, 1)), got strides [1, 16]"):
        flashlab.gemm(a, b, out=fake([16, 32], "bfloat16", strides=[1, 16], offset_bytes=32768))
    with raises("gemm: argument 'c': expected memory disjoint from 'a' or identical to it, got a partial overlap"):
        flashlab.gemm(a, b, out=fake([16, 32], "bfloat16", offset_bytes=64), rung=1)


def test_layouts():
    # NT (b a transposed view) is refused on rungs 2-8, both column-major everywhere.
    a, b, c = _abc(16, 32, 64, b_strides=[1, 64])
    with raises("gemm: argument 'a': expected row-major a and b (layout NN) for rung 4 "
                "(rungs 1 and 9 take NT, TN), got column-major b"):
        flashlab.gemm(a, b, out=c, rung=4)
    a, b, c = _abc(16, 32, 64, "bfloat16", a_strides=[1, 16], b_strides=[1, 64])
    with raises("gemm: argument 'a': expected layout NN, NT or TN (a and b not both column-major), "
                "got a and b both column-major"):
        flashlab.gemm(a, b, out=c)


def test_default_rung_reports_what_no_rung_takes():
    # No rung takes a and b both column-major: the default (gemm_best_rung) falls back to the
    # dtype's top rung, and its validation says why. Which rung a valid call gets is checked in
    # tests/cpu/test_gemm_validation.cpp (BestRungTakesTheArguments) and on the GPU below.
    for dtype in ("float32", "bfloat16"):
        a, b, c = _abc(16, 32, 64, dtype, a_strides=[1, 16], b_strides=[1, 64])
        with raises("gemm: argument 'a': expected layout NN, NT or TN (a and b not both column-major), "
                    "got a and b both column-major"):
            flashlab.gemm(a, b, out=c)


def test_out_rules():
    a, b, c = _abc(16, 32, 64)
    with raises("gemm: argument 'out': expected a tensor to read when beta != 0 "
                "(out = alpha * a @ b + beta * out), got None with beta 0.5"):
        flashlab.gemm(a, b, beta=0.5)
    with pytest.raises(TypeError, match="pass out= explicitly"):
        flashlab.gemm(a, b)  # fake tensors belong to no framework that could allocate out
    # out is allocated (M, N) like a: numpy a gets a numpy out, then the device check.
    with raises("gemm: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.gemm(np.ones((4, 8), np.float32), np.ones((8, 2), np.float32), alpha=2.0)
    with raises("gemm: argument 'b': expected 2 dims, got 1 dims, shape [8]"):
        flashlab.gemm(fake([4, 8]), fake([8], offset_bytes=16384), out=fake([4, 8], offset_bytes=32768))


# ---------------------------------------------------------------------------------------------
# GPU: numerics of every rung against torch in float64

def _sm90() -> bool:
    return HAVE_CUDA and torch.cuda.get_device_capability()[0] >= 9


def _is_row_major(t) -> bool:
    """As the C++ validation reads a 2-D view: unit stride in dim 1 and rows that do not overlap
    (a dim of size 1 has no stride to honour); otherwise it is (or is refused as) column-major."""
    r, c = t.shape
    return (c == 1 or t.stride(1) == 1) and (r == 1 or t.stride(0) >= c)


def _ld(t) -> int:
    """The leading dim the C++ validation reads (one row or one column: its length)."""
    r, c = t.shape
    if _is_row_major(t):
        return c if r == 1 else t.stride(0)
    return r if c == 1 else t.stride(1)


def _takes(rung: int, dtype: str, a, b, out) -> bool:
    """Whether the rung takes these torch tensors: its dtype, NN on rungs 2-8, and on rung 9 an
    sm_90 device with 16-byte aligned pointers and leading dims."""
    if rung not in RUNGS[dtype]:
        return False
    if not (_is_row_major(a) and _is_row_major(b)) and 2 <= rung <= 8:
        return False
    if rung == 9:
        es = a.element_size()
        return _sm90() and all(t.data_ptr() % 16 == 0 and _ld(t) * es % 16 == 0 for t in (a, b, out))
    return True


def _gen(seed: int):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _rand(shape, dtype, seed):
    return (2 * torch.rand(shape, device="cuda", generator=_gen(seed)) - 1).to(getattr(torch, dtype))


def _ref_and_scale(a, b, alpha, beta, c_in, bias):
    """float64 reference and the floor's scale: max of |alpha| |a| @ |b| + |beta c_in| + |bias|."""
    a64, b64 = a.double(), b.double()
    ref = alpha * (a64 @ b64)
    scale = abs(alpha) * (a64.abs() @ b64.abs())
    if beta != 0:
        ref += beta * c_in.double()
        scale += abs(beta) * c_in.double().abs()
    if bias is not None:
        ref += bias.double()
        scale += bias.double().abs()
    return ref.cpu().numpy(), float(scale.max())


def _torch_naive(a, b, alpha, beta, c_in, bias):
    """The same computation in fp32 (torch matmul, TF32 off), epilogue in fp32, rounded once."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        v = alpha * (a.float() @ b.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    if beta != 0:
        v = v + beta * c_in.float()
    if bias is not None:
        v = v + bias.float()
    return v.to(a.dtype)


def _check_rungs(a, b, dtype, what, alpha=1.0, beta=0.0, bias=None, rungs=None):
    """Every rung that takes (a, b) in dtype: out poisoned with NaN (beta != 0: out holds c_in),
    held against rung 1 (rung 1 against torch's fp32 result). Returns the rungs run."""
    m, n = a.shape[0], b.shape[1]
    c_in = _rand((m, n), dtype, 99) if beta != 0 else None
    ref, scale = _ref_and_scale(a, b, alpha, beta, c_in, bias)
    extra = 4 * U32 * scale
    naive = _torch_naive(a, b, alpha, beta, c_in, bias).double().cpu().numpy()
    baseline, ran = None, []
    for rung in rungs or RUNGS[dtype]:
        out = c_in.clone() if beta != 0 else torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
        if not _takes(rung, dtype, a, b, out):
            continue
        assert flashlab.gemm(a, b, out, alpha=alpha, beta=beta, bias=bias, rung=rung) is out
        check_close(out, ref, naive if rung == 1 else baseline, dtype, f"{what} rung {rung}", extra)
        if rung == 1:
            baseline = out.double().cpu().numpy()
        ran.append(rung)
    return ran


SHAPES = [(1, 1, 1), (17, 129, 127), (129, 127, 1000), (64, 256, 4096), (256, 512, 128), (1000, 8, 24)]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mnk", SHAPES)
def test_gemm(dtype, mnk):
    m, n, k = mnk
    a, b = _rand((m, k), dtype, m + k), _rand((k, n), dtype, k + n + 1)
    ran = _check_rungs(a, b, dtype, f"gemm {dtype} {m}x{n}x{k}")
    assert ran[0] == 1
    fresh = flashlab.gemm(a, b, rung=1)  # out allocated
    assert tuple(fresh.shape) == (m, n) and fresh.dtype == a.dtype and fresh.device == a.device
    assert not torch.isnan(fresh).any()


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemm_default_rung(dtype):
    # K = 256 (rung 9 on sm_90 for 16-bit), K = 100 (rows of 200 bytes: rung 9's 16-byte rule
    # fails, the default falls back to rung 8) and an NT view (rung 1 for fp32): every default
    # call runs and is right.
    for k, b_t in ((256, False), (100, False), (256, True)):
        a = _rand((128, k), dtype, 1)
        b = _rand((64, k), dtype, 2).t() if b_t else _rand((k, 64), dtype, 2)
        out = flashlab.gemm(a, b)
        ref, scale = _ref_and_scale(a, b, 1.0, 0.0, None, None)
        check_close(out, ref, flashlab.gemm(a, b, rung=1).double().cpu().numpy(), dtype,
                    f"default rung {dtype} K {k} {'NT' if b_t else 'NN'}", 4 * U32 * scale)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gemm_epilogue(dtype):
    a, b = _rand((129, 300), dtype, 3), _rand((300, 136), dtype, 4)
    bias = _rand((136,), dtype, 5)
    _check_rungs(a, b, dtype, f"gemm {dtype} alpha 2 + bias", alpha=2.0, bias=bias)
    _check_rungs(a, b, dtype, f"gemm {dtype} alpha 0.5 beta -1.5", alpha=0.5, beta=-1.5)
    _check_rungs(a, b, dtype, f"gemm {dtype} alpha -1 beta 1 + bias", alpha=-1.0, beta=1.0, bias=bias)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_gemm_transposed_views(dtype, layout):
    m, n, k = 256, 136, 520
    if layout == "NT":  # a @ w.t() for an (N, K) weight
        a, b = _rand((m, k), dtype, 6), _rand((n, k), dtype, 7).t()
    else:  # x.t() @ b for a (K, M) x
        a, b = _rand((k, m), dtype, 8).t(), _rand((k, n), dtype, 9)
    ran = _check_rungs(a, b, dtype, f"gemm {dtype} {layout}")
    assert 1 in ran and all(r in (1, 9) for r in ran)
    if dtype == "bfloat16" and _sm90():
        assert 9 in ran


@gpu
def test_gemm_views_with_padded_rows():
    # Column slices: leading dims > cols; rung 9 takes 16-byte multiples.
    base_a = _rand((300, 1032), "bfloat16", 10)
    base_b = _rand((1000, 520), "bfloat16", 11)
    a, b = base_a[:, :1000], base_b[:, :512]
    out_base = torch.full((300, 520), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_base[:, :512]
    rungs = [r for r in RUNGS["bfloat16"] if _takes(r, "bfloat16", a, b, out)]
    ref, scale = _ref_and_scale(a, b, 1.0, 0.0, None, None)
    naive = flashlab.gemm(a, b, rung=1).double().cpu().numpy()
    for rung in rungs:
        out_base.fill_(float("nan"))
        flashlab.gemm(a, b, out, rung=rung)
        check_close(out, ref, naive, "bfloat16", f"padded rows rung {rung}", 4 * U32 * scale)
        assert torch.isnan(out_base[:, 512:]).all(), f"rung {rung} wrote into out's padding"


@gpu
def test_gemm_runs_on_torchs_current_stream():
    a = torch.ones(256, 512, device="cuda")
    b = torch.ones(512, 128, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        a.fill_(2.0)
        out = flashlab.gemm(a, b, rung=1)
    s.synchronize()
    assert torch.equal(out, torch.full_like(out, 1024.0))


@gpu
def test_gemm_gpu_errors_carry_the_cpp_message():
    a = torch.randn(16, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    with raises("gemm: argument 'a': expected dtype fp32 for rung 3, got fp16"):
        flashlab.gemm(a, b, rung=3)
    with raises("gemm: argument 'b': expected shape (64, N) (rows = a's cols), got [63, 32]"):
        flashlab.gemm(a, b[:63], rung=1)
    with raises("gemm: argument 'a': expected row-major a and b (layout NN) for rung 8 "
                "(rungs 1 and 9 take NT, TN), got column-major b"):
        flashlab.gemm(a, torch.randn(32, 64, device="cuda", dtype=torch.float16).t(), rung=8)
    with raises("gemm: argument 'out': expected a tensor to read when beta != 0 "
                "(out = alpha * a @ b + beta * out), got None with beta 1.0"):
        flashlab.gemm(a, b, beta=1.0)
    with raises("gemm: argument 'c': expected dtype fp16 (same as 'a'), got fp32"):
        flashlab.gemm(a, b, torch.empty(16, 32, device="cuda"), rung=1)
