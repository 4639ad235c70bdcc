"""flashlab.quantize_fp8 / quantize_int8 / dequantize from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors).
GPU part: every rung and both schemes against a torch reference: scales within 1 ulp of fp32 of
the float64 max(absmax, 1e-12) / qmax; codes equal to torch's rounding of the kernel's own fp32
quotient x / scale (so no boundary case needs slack); dequantize(quantize(x)) within half a step.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch


def test_numpy_input_hits_the_cpp_device_check():
    with raises("quantize: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.quantize_fp8(np.zeros((4, 64), np.float32))
    with raises("quantize: argument 'input': expected a CUDA tensor, got cpu tensor"):
        flashlab.quantize_int8(np.zeros((4, 64), np.float32), scheme="per_tensor")


def test_bad_inputs_name_the_argument():
    x = fake([4, 64], "bfloat16")
    with raises("quantize: argument 'out': expected dtype e4m3 or int8, got bf16"):
        flashlab.quantize_fp8(x, out=fake([4, 64], "bfloat16", offset_bytes=1024), scales=fake([4], offset_bytes=2048))
    with raises("quantize: argument 'scales': expected shape [4], got [1]"):
        flashlab.quantize_int8(x, out=fake([4, 64], "int8", offset_bytes=1024), scales=fake([1], offset_bytes=2048))
    with raises("quantize: argument 'scales': expected shape [1], got [4]"):
        flashlab.quantize_fp8(x, scheme="per_tensor", out=fake([4, 64], "float8_e4m3fn", offset_bytes=1024),
                              scales=fake([4], offset_bytes=2048))
    with raises("quantize: argument 'scheme': expected per_token or per_tensor, got per_row"):
        flashlab.quantize_fp8(x, scheme="per_row", out=fake([4, 64], "float8_e4m3fn", offset_bytes=1024),
                              scales=fake([4], offset_bytes=2048))
    with raises("quantize: argument 'rung': expected 1..2, got 3"):
        flashlab.quantize_fp8(x, out=fake([4, 64], "float8_e4m3fn", offset_bytes=1024),
                              scales=fake([4], offset_bytes=2048), rung=3)
    with raises("dequantize: argument 'scales': expected shape [4] (per token) or [1] (per tensor), got [3]"):
        flashlab.dequantize(fake([4, 64], "int8"), fake([3], offset_bytes=1024),
                            out=fake([4, 64], "float16", offset_bytes=2048))
    with raises("dequantize: argument 'out': expected dtype fp32 or fp16 or bf16, got int8"):
        flashlab.dequantize(fake([4, 64], "float8_e4m3fn"), fake([4], offset_bytes=1024),
                            out=fake([4, 64], "int8", offset_bytes=2048))


def test_e4m3_dlpack_dtype_is_mapped():
    # A float8_e4m3fn tensor crosses the bindings as e4m3: the call gets as far as the C++
    # check on 'scales' (the dtype of 'out' was accepted).
    with raises("quantize: argument 'scales': expected dtype fp32, got fp16"):
        flashlab.quantize_fp8(fake([2, 16]), out=fake([2, 16], "float8_e4m3fn", offset_bytes=1024),
                              scales=fake([2], "float16", offset_bytes=2048))


# ------------------------------------------------------------------------------------ GPU part

_QMAX = {"fp8": 448.0, "int8": 127.0}


def _ref_codes(x, scales, fmt, per_tensor):
    """torch's rounding of the kernel's own fp32 quotient (same fp32 scale, IEEE division)."""
    s = scales.view(1, 1) if per_tensor else scales.view(-1, 1)
    v = x.float().reshape(-1, x.shape[-1]) / s
    if fmt == "fp8":
        return v.clamp(-448, 448).to(torch.float8_e4m3fn).float()  # RNE; clamp = satfinite
    return torch.round(v.clamp(-127, 127)).float()  # torch.round: half to even


def _step(v, fmt):
    if fmt == "int8":
        return torch.ones_like(v)
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(e - 3)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("scheme", ["per_token", "per_tensor"])
@pytest.mark.parametrize("rung", range(1, flashlab.QUANT_RUNGS + 1))
@pytest.mark.parametrize("shape", [(1, 1), (7, 111), (99, 4096), (3, 4097), (2, 8192), (16384, 8), (4, 3, 512)])
def test_quantize(dtype, fmt, scheme, rung, shape):
    dt = getattr(torch, dtype)
    x = (torch.randn(shape, device="cuda") * 3).to(dt)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] > 2:
        rows[1].zero_()  # an all-zero row: a positive scale, zero codes
        rows[2] *= 1000  # beyond e4m3's range before scaling
    qfn = flashlab.quantize_fp8 if fmt == "fp8" else flashlab.quantize_int8
    q, s = qfn(x, scheme=scheme, rung=rung)
    assert q.dtype == (torch.float8_e4m3fn if fmt == "fp8" else torch.int8) and q.shape == x.shape
    per_tensor = scheme == "per_tensor"
    x64 = x.double().reshape(-1, shape[-1])
    amax = x64.abs().amax() .reshape(1) if per_tensor else x64.abs().amax(-1)
    ref_s = amax.clamp_min(float(np.float32(1e-12))) / _QMAX[fmt]
    assert torch.isfinite(s).all() and (s > 0).all()
    ulp = (torch.nextafter(ref_s.float(), torch.tensor(float("inf"), device="cuda")) - ref_s.float()).double()
    assert ((s.double() - ref_s).abs() <= ulp).all(), f"scales off by more than 1 ulp ({dtype} {fmt} {scheme})"
    codes = q.float().reshape(-1, shape[-1])
    ref = _ref_codes(x, s, fmt, per_tensor)
    assert torch.equal(codes, ref), f"{(codes != ref).sum().item()} codes differ ({dtype} {fmt} {scheme} rung {rung})"
    back = flashlab.dequantize(q, s, dtype=torch.float32).reshape(-1, shape[-1]).double()
    sc = (s.view(1, 1) if per_tensor else s.view(-1, 1)).double()
    v = x.float().reshape(-1, shape[-1]) / (s.view(1, 1) if per_tensor else s.view(-1, 1))
    bound = 0.5 * _step(v, fmt).double() * sc * (1 + 1e-6) + x64.abs() * 2.0 ** -23
    assert ((back - x64).abs() <= bound).all(), "round trip beyond half a step"


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dequantize_dtypes_and_strided_input(dtype):
    x_full = torch.randn(64, 4096 + 64, device="cuda", dtype=torch.bfloat16)
    x = x_full[:, :4096]  # row stride 4160
    q, s = flashlab.quantize_fp8(x)
    out = flashlab.dequantize(q, s, dtype=getattr(torch, dtype))
    assert out.dtype == getattr(torch, dtype)
    ref = (q.double() * s.double().view(-1, 1)).to(out.dtype)
    torch.testing.assert_close(out, ref, rtol=2 ** -7, atol=0)
