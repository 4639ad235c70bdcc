"""flashlab.softmax / log_softmax from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors).
GPU part: every rung against a float64 torch reference, outputs poisoned with NaN first,
tolerance 2x the naive same-dtype error plus one unit roundoff of max|ref| (finite values);
-inf outputs must match exactly, and fully masked rows give 0 / -inf, never NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch
from numerics import check_close


def test_numpy_input_hits_the_cpp_device_check():
    with raises("softmax: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.softmax(np.zeros((4, 64), np.float32))
    with raises("log_softmax: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.log_softmax(np.zeros((4, 64), np.float32))


def test_bad_inputs_name_the_argument():
    with raises("softmax: argument 'out': expected shape [4, 64] (same as 'input'), got [4, 32]"):
        flashlab.softmax(fake([4, 64], "bfloat16"), out=fake([4, 32], "bfloat16", offset_bytes=1024))
    with raises("log_softmax: argument 'out': expected dtype fp16 (same as 'input'), got fp32"):
        flashlab.log_softmax(fake([2, 8], "float16"), out=fake([2, 8], offset_bytes=1024))
    with raises("softmax: argument 'input': expected dtype fp32 or fp16 or bf16, got int32"):
        flashlab.softmax(fake([2, 8], "int32"), out=fake([2, 8], "int32", offset_bytes=1024))
    with raises("softmax: argument 'input': expected >= cols row stride (rows must not overlap), "
                "got row stride 4 for cols 8"):
        flashlab.softmax(fake([2, 8], strides=[4, 1]), out=fake([2, 8], offset_bytes=1024))
    with raises("softmax: argument 'out': expected the row stride of 'input' (16) when in place, got row stride 8"):
        flashlab.softmax(fake([2, 8], strides=[16, 1]), out=fake([2, 8]))
    with raises("softmax: argument 'rung': expected 1..4, got 5"):
        flashlab.softmax(fake([2, 8]), out=fake([2, 8], offset_bytes=1024), rung=5)
    with raises("log_softmax: argument 'rung': expected 1..4, got 0"):
        flashlab.log_softmax(fake([2, 8]), out=fake([2, 8], offset_bytes=1024), rung=0)


def _ref(x64, log):
    """float64 reference over the last dim; fully masked rows give 0 / -inf."""
    m = x64.max(axis=-1, keepdims=True)
    masked = np.isneginf(m)
    m = np.where(masked, 0.0, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.exp(x64 - m)
        s = e.sum(axis=-1, keepdims=True)
        y = (x64 - m) - np.log(s) if log else e / s
    return np.where(masked, -np.inf if log else 0.0, y)


def _naive(x, log):
    """The same computation in fp32 from the stored inputs (max, sequential sum of exp(x - max)
    as tests/gpu/test_softmax.cpp does), rounded once to the output dtype."""
    x32 = x.float().cpu().numpy().reshape(-1, x.shape[-1])
    m = x32.max(axis=-1, keepdims=True)
    masked = np.isneginf(m)
    m = np.where(masked, np.float32(0), m).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.exp(x32 - m, dtype=np.float32)
        s = np.add.accumulate(e, axis=-1, dtype=np.float32)[:, -1:]
        y = (x32 - m) - np.log(s) if log else e / s
    y = np.where(masked, np.float32(-np.inf if log else 0.0), y).astype(np.float32)
    return torch.from_numpy(y.reshape(x.shape)).to(x.dtype).double().numpy()


SHAPES = [(1, 1), (7, 111), (99, 500), (16, 1024), (3, 4097), (2, 8192), (4, 3, 512), (64, 128256)]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.SOFTMAX_RUNGS + 1))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax(dtype, rung, shape, log):
    dt = getattr(torch, dtype)
    x = (torch.randn(shape, device="cuda") * 4).to(dt)
    out = torch.full_like(x, float("nan"))
    fn = flashlab.log_softmax if log else flashlab.softmax
    assert fn(x, out=out, rung=rung) is out
    ref, naive = _ref(x.double().cpu().numpy(), log), _naive(x, log)
    check_close(out, ref, naive, dtype, f"{fn.__name__} {dtype} {shape} rung {rung}")
    allocated = fn(x, rung=rung)
    assert allocated.shape == x.shape and allocated.dtype == x.dtype
    check_close(allocated, ref, naive, dtype, "out allocated")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("cols", [111, 1024, 16384, 128256])
@pytest.mark.parametrize("log", [False, True])
def test_masked_large_in_place(dtype, cols, log):
    dt = getattr(torch, dtype)
    x = (torch.rand(6, cols, device="cuda") * 200 - 100).to(dt)  # exp(x) alone overflows fp32
    x[:, 1::3] = float("-inf")
    x[0] = float("-inf")  # a fully masked row
    ref, naive = _ref(x.double().cpu().numpy(), log), _naive(x, log)
    fn = flashlab.log_softmax if log else flashlab.softmax
    y = x.clone()
    assert fn(y, out=y) is y  # in place
    check_close(y, ref, naive, dtype, f"{fn.__name__} {dtype} masked |x|<=100 in place")
    assert (y[0] == (float("-inf") if log else 0.0)).all()


@gpu
def test_strided_rows_side_stream_and_torch():
    x_full = torch.randn(64, 4096 + 64, device="cuda", dtype=torch.bfloat16) * 3
    x = x_full[:, :4096]  # row stride 4160
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = flashlab.softmax(x)
        ly = flashlab.log_softmax(x)
    s.synchronize()
    for got, log in ((y, False), (ly, True)):
        check_close(got, _ref(x.double().cpu().numpy(), log), _naive(x, log), "bfloat16", "strided rows on a side stream")
    ref_torch = torch.softmax(x.float(), -1).to(torch.bfloat16)
    assert (y.float() - ref_torch.float()).abs().max().item() <= 2 ** -8
