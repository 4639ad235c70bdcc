"""flashlab.layernorm from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors).
GPU part: every rung against a float64 torch reference, with and without bias, inputs with a
large common offset, outputs poisoned with NaN first; tolerance 2x the naive same-dtype error
plus one unit roundoff of max|ref|.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch
from numerics import check_close


def test_numpy_input_hits_the_cpp_device_check():
    with raises("layernorm: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.layernorm(np.zeros((4, 64), np.float32), np.ones(64, np.float32), np.zeros(64, np.float32))


def test_bad_inputs_name_the_argument():
    x, out = fake([4, 64], "bfloat16"), fake([4, 64], "bfloat16", offset_bytes=4096)
    with raises("layernorm: argument 'weight': expected shape [64], got [63]"):
        flashlab.layernorm(x, fake([63], "bfloat16", offset_bytes=1024), out=out)
    with raises("layernorm: argument 'bias': expected shape [64], got [32]"):
        flashlab.layernorm(x, fake([64], "bfloat16", offset_bytes=1024), fake([32], "bfloat16", offset_bytes=2048),
                           out=out)
    with raises("layernorm: argument 'bias': expected dtype bf16 (same as 'input'), got fp32"):
        flashlab.layernorm(x, fake([64], "bfloat16", offset_bytes=1024), fake([64], offset_bytes=2048), out=out)
    with raises("layernorm: argument 'eps': expected a finite value >= 0, got -1"):
        flashlab.layernorm(x, fake([64], "bfloat16", offset_bytes=1024), eps=-1.0, out=out)
    with raises("layernorm: argument 'rung': expected 1..3, got 4"):
        flashlab.layernorm(x, fake([64], "bfloat16", offset_bytes=1024), out=out, rung=4)
    with raises("layernorm: argument 'out': expected shape [4, 64] (same as 'input'), got [4, 32]"):
        flashlab.layernorm(x, fake([64], "bfloat16", offset_bytes=1024), out=fake([4, 32], "bfloat16", offset_bytes=4096))


def test_exported():
    assert flashlab.LAYERNORM_RUNGS == 3
    assert "layernorm" in flashlab.__all__ and "LAYERNORM_RUNGS" in flashlab.__all__


def _ref(x64, w64, b64, eps):
    mean = x64.mean(axis=-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps) * w64
    return y + b64 if b64 is not None else y


def _naive(x, w, b, eps):
    """The same computation done naively in fp32 from the stored inputs (two-pass mean and
    variance with sequential fp32 sums, as tests/gpu/test_layernorm.cpp does), rounded once."""
    x32 = x.float().cpu().numpy().reshape(-1, x.shape[-1])
    w32 = w.float().cpu().numpy()
    n = np.float32(x32.shape[-1])
    mean = np.add.accumulate(x32, axis=-1, dtype=np.float32)[:, -1] / n
    d = x32 - mean[:, None]
    var = np.add.accumulate(d * d, axis=-1, dtype=np.float32)[:, -1] / n
    rstd = (np.float32(1) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    y = d * rstd[:, None] * w32
    if b is not None:
        y = y + b.float().cpu().numpy()
    return torch.from_numpy(y.reshape(x.shape)).to(x.dtype).double().numpy()


SHAPES = [(1, 1), (7, 111), (16, 4096), (3, 4097), (2, 8192), (4, 3, 512), (2, 40000)]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.LAYERNORM_RUNGS + 1))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm(dtype, rung, shape, bias):
    dt = getattr(torch, dtype)
    x = torch.randn(shape, device="cuda").to(dt)
    w = (torch.rand(shape[-1], device="cuda") + 0.5).to(dt)
    b = (torch.rand(shape[-1], device="cuda") - 0.5).to(dt) if bias else None
    out = torch.full_like(x, float("nan"))
    assert flashlab.layernorm(x, w, b, 1e-5, out=out, rung=rung) is out
    ref = _ref(x.double().cpu().numpy(), w.double().cpu().numpy(), b.double().cpu().numpy() if bias else None, 1e-5)
    naive = _naive(x, w, b, 1e-5)
    check_close(out, ref, naive, dtype, f"layernorm {dtype} {shape} rung {rung} bias={bias}")
    allocated = flashlab.layernorm(x, w, b, 1e-5, rung=rung)
    assert allocated.shape == x.shape and allocated.dtype == x.dtype
    check_close(allocated, ref, naive, dtype, "out allocated")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.LAYERNORM_RUNGS + 1))
@pytest.mark.parametrize("hidden", [1024, 4096, 8192])
def test_layernorm_large_offset(dtype, rung, hidden):
    """Mean 1000, std 1: E[x^2] - E[x]^2 in fp32 would lose the variance entirely."""
    dt = getattr(torch, dtype)
    x = (torch.randn(16, hidden, device="cuda", dtype=torch.float64) + 1000.0).to(dt)
    w = (torch.rand(hidden, device="cuda") + 0.5).to(dt)
    b = (torch.rand(hidden, device="cuda") - 0.5).to(dt)
    out = flashlab.layernorm(x, w, b, 1e-5, rung=rung)
    ref = _ref(x.double().cpu().numpy(), w.double().cpu().numpy(), b.double().cpu().numpy(), 1e-5)
    check_close(out, ref, _naive(x, w, b, 1e-5), dtype, f"offset {dtype} {hidden} rung {rung}")


@gpu
def test_layernorm_matches_torch_and_strided_rows_on_a_stream():
    x_full = torch.randn(64, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    x = x_full[:, :4096]  # row stride 4160
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16)
    b = torch.rand(4096, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = flashlab.layernorm(x, w, b, 1e-5)
    s.synchronize()
    ref = _ref(x.double().cpu().numpy(), w.double().cpu().numpy(), b.double().cpu().numpy(), 1e-5)
    check_close(out, ref, _naive(x, w, b, 1e-5), "bfloat16", "strided rows on a side stream")
    torch_out = torch.nn.functional.layer_norm(x, (4096,), w, b, 1e-5)
    assert (out.float() - torch_out.float()).abs().max().item() <= 2 * 2.0 ** -8 * torch_out.float().abs().max().item()
