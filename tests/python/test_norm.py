"""flashlab.rmsnorm / gemma_rmsnorm / fused_add_rmsnorm / gemma_fused_add_rmsnorm from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors).
GPU part: every rung against a float64 torch reference, outputs poisoned with NaN first,
tolerance 2x the naive same-dtype error plus one unit roundoff of max|ref|.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch
from numerics import check_close


def test_numpy_input_hits_the_cpp_device_check():
    with raises("rmsnorm: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.rmsnorm(np.zeros((4, 64), np.float32), np.ones(64, np.float32))


def test_bad_inputs_name_the_argument():
    with raises("rmsnorm: argument 'weight': expected shape [64], got [63]"):
        flashlab.rmsnorm(fake([4, 64], "bfloat16"), fake([63], "bfloat16", offset_bytes=1024),
                         out=fake([4, 64], "bfloat16", offset_bytes=2048))
    with raises("rmsnorm: argument 'eps': expected a finite value >= 0, got -1"):
        flashlab.rmsnorm(fake([4, 64]), fake([64], offset_bytes=2048), eps=-1.0, out=fake([4, 64], offset_bytes=4096))
    with raises("fused_add_rmsnorm: argument 'residual': expected dtype fp16 (same as 'input'), got bf16"):
        flashlab.fused_add_rmsnorm(fake([2, 8], "float16"), fake([2, 8], "bfloat16", offset_bytes=1024),
                                   fake([8], "float16", offset_bytes=2048))
    with raises("rmsnorm: argument 'rung': expected 1..4, got 9"):  # the Gemma variant is rmsnorm's flag
        flashlab.gemma_rmsnorm(fake([2, 8]), fake([8], offset_bytes=1024), out=fake([2, 8], offset_bytes=2048), rung=9)


def _ref(x64, w64, eps, gemma):
    inv = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return x64 * inv * ((1.0 + w64) if gemma else w64)


def _naive(x, w, eps, gemma):
    """The same computation done naively in fp32 from the stored inputs (sequential sum of
    squares, as tests/gpu/test_norm.cpp does), rounded once to the output dtype."""
    x32 = x.float().cpu().numpy().reshape(-1, x.shape[-1])
    w32 = w.float().cpu().numpy()
    ss = np.add.accumulate(x32 * x32, axis=-1, dtype=np.float32)[:, -1]
    inv = (np.float32(1) / np.sqrt(ss / np.float32(x32.shape[-1]) + np.float32(eps))).astype(np.float32)
    y = x32 * inv[:, None] * ((np.float32(1) + w32) if gemma else w32)
    return torch.from_numpy(y.reshape(x.shape)).to(x.dtype).double().numpy()


SHAPES = [(1, 1), (7, 111), (16, 4096), (3, 4097), (2, 8192), (4, 3, 512)]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.RMSNORM_RUNGS + 1))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gemma", [False, True])
def test_rmsnorm(dtype, rung, shape, gemma):
    dt = getattr(torch, dtype)
    x = torch.randn(shape, device="cuda").to(dt)
    w = (torch.rand(shape[-1], device="cuda") + 0.5).to(dt)
    out = torch.full_like(x, float("nan"))
    fn = flashlab.gemma_rmsnorm if gemma else flashlab.rmsnorm
    assert fn(x, w, 1e-6, out=out, rung=rung) is out
    ref = _ref(x.double().cpu().numpy(), w.double().cpu().numpy(), 1e-6, gemma)
    check_close(out, ref, _naive(x, w, 1e-6, gemma), dtype, f"rmsnorm {dtype} {shape} rung {rung} gemma={gemma}")
    allocated = fn(x, w, 1e-6, rung=rung)
    assert allocated.shape == x.shape and allocated.dtype == x.dtype
    check_close(allocated, ref, _naive(x, w, 1e-6, gemma), dtype, "out allocated")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(2, flashlab.RMSNORM_RUNGS + 1))
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm(dtype, rung, gemma):
    dt = getattr(torch, dtype)
    x = torch.randn(33, 4096, device="cuda").to(dt)
    r = torch.randn(33, 4096, device="cuda").to(dt)
    w = (torch.rand(4096, device="cuda") - 0.5).to(dt)
    stored = (x.double() + r.double()).to(dt)  # the residual as stored: rounded once
    x_in, r_in = x.clone(), r.clone()
    fn = flashlab.gemma_fused_add_rmsnorm if gemma else flashlab.fused_add_rmsnorm
    fn(x_in, r_in, w, 1e-6, rung=rung)
    sum64 = (x.double() + r.double()).cpu().numpy()
    check_close(r_in, sum64, (x.float() + r.float()).to(dt).double().cpu().numpy(), dtype, "residual")
    ref = _ref(stored.double().cpu().numpy(), w.double().cpu().numpy(), 1e-6, gemma)
    check_close(x_in, ref, _naive(stored, w, 1e-6, gemma), dtype, f"fused {dtype} rung {rung} gemma={gemma}")


@gpu
def test_rmsnorm_strided_rows_and_stream():
    x_full = torch.randn(64, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    x = x_full[:, :4096]  # row stride 4160
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = flashlab.rmsnorm(x, w, 1e-5)
    s.synchronize()
    ref = _ref(x.double().cpu().numpy(), w.double().cpu().numpy(), 1e-5, False)
    check_close(out, ref, _naive(x, w, 1e-5, False), "bfloat16", "strided rows on a side stream")
