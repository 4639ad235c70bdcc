"""Dynamic FP8 (e4m3) / INT8 quantization and dequantization (C++: include/flashlab/quant.h).

``input`` is [..., cols] (viewed as [rows, cols]; rows may be strided, the last dim must be
contiguous), fp32, fp16 or bf16. ``scheme="per_token"`` gives one fp32 scale per row (scales
[rows]), ``"per_tensor"`` one for the whole tensor (scales [1]); scale = max(absmax, 1e-12) / qmax
(448 e4m3, 127 int8) and ``q = round(x / scale)`` with an fp32 division: e4m3 saturates to
+-448 (round to nearest even), int8 is clamped to [-127, 127] (round half to even).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

QUANT_RUNGS = 2  # 1 block/row scalar two walks, 2 block/row vec16 in registers (top)


def _rows(x: Any) -> Any:
    """x as [rows, cols]: 2-D tensors as they are, others reshaped (a view when contiguous)."""
    return x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1])


def _empty(like: Any, shape: tuple[int, ...], dtype: str) -> Any:
    # numpy has no float8 of its own (ml_dtypes' one cannot cross DLPack), so numpy inputs get a
    # byte placeholder, which the C++ checks reject by name (a CPU input is rejected before 'out'
    # is looked at). Other frameworks without the dtype likewise.
    if dtype.startswith("float8") and isinstance(like, np.ndarray):
        return _alloc.empty(like, shape, "uint8")
    try:
        return _alloc.empty(like, shape, dtype)
    except (TypeError, AttributeError):
        return _alloc.empty(like, shape, "uint8")


def _quantize(input: Any, q_dtype: str, scheme: str, out: Any, scales: Any, rung: int | None) -> tuple[Any, Any]:  # noqa: A002
    shape = tuple(input.shape)
    if out is None:
        out = _empty(input, shape, q_dtype)
    if scales is None:
        rows = math.prod(shape[:-1]) if shape else 1
        scales = _alloc.empty(input, (rows if scheme == "per_token" else 1,), "float32")
    _ffi.quantize(_rows(input), _rows(out), scales, scheme, QUANT_RUNGS if rung is None else rung)
    return out, scales


def quantize_fp8(input: Any, scheme: str = "per_token", out: Any = None, scales: Any = None,  # noqa: A002
                 rung: int | None = None) -> tuple[Any, Any]:
    """Quantize to float8 e4m3 (torch.float8_e4m3fn). Returns ``(q, scales)``.

    ``out`` defaults to a new e4m3 tensor shaped like ``input``; ``scales`` to a new fp32 tensor of
    shape [rows] (per token, rows = the product of the leading dims) or [1] (per tensor).
    """
    return _quantize(input, "float8_e4m3fn", scheme, out, scales, rung)


def quantize_int8(input: Any, scheme: str = "per_token", out: Any = None, scales: Any = None,  # noqa: A002
                  rung: int | None = None) -> tuple[Any, Any]:
    """Quantize to int8 in [-127, 127]. Returns ``(q, scales)``; otherwise as :func:`quantize_fp8`."""
    return _quantize(input, "int8", scheme, out, scales, rung)


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)  # numpy dtypes
    return name if isinstance(name, str) else str(dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32


def dequantize(q: Any, scales: Any, dtype: Any = "float32", out: Any = None) -> Any:
    """``out = q * scales`` (scales [rows] per token or [1] per tensor), computed in fp32 and
    rounded once to ``dtype`` (float32, float16 or bfloat16; a name or a torch dtype). Returns ``out``."""
    if out is None:
        out = _alloc.empty(q, tuple(q.shape), _dtype_name(dtype))
    _ffi.dequantize(_rows(q), scales, _rows(out))
    return out
