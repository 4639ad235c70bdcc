"""RMSNorm family, FlashInfer names and semantics (C++: include/flashlab/norm.h).

``input`` is [..., hidden] (viewed as [rows, hidden]; rows may be strided, the last dim must be
contiguous); ``weight`` is [hidden]; fp32, fp16 or bf16, all one dtype; computed in fp32.
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

RMSNORM_RUNGS = 4  # 1 thread/row, 2 warp/row, 3 block/row vec16, 4 block/row vec16 in registers (top)


def _rows(x: Any) -> Any:
    """x as [rows, hidden]: 2-D tensors as they are, others reshaped (a view when contiguous)."""
    return x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1])


def rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002
    """``out = input * rsqrt(mean(input**2, -1) + eps) * weight``. Returns ``out``."""
    return _rmsnorm(input, weight, eps, out, False, rung)


def gemma_rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002
    """Gemma's RMSNorm: ``input * rsqrt(mean(input**2, -1) + eps) * (1 + weight)``. Returns ``out``."""
    return _rmsnorm(input, weight, eps, out, True, rung)


def fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6, rung: int | None = None) -> None:  # noqa: A002
    """In place: ``residual += input``; ``input = rmsnorm(residual) * weight``."""
    _ffi.fused_add_rmsnorm(_rows(input), _rows(residual), weight, float(eps), False,
                           RMSNORM_RUNGS if rung is None else rung)


def gemma_fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6,  # noqa: A002
                            rung: int | None = None) -> None:
    """In place: ``residual += input``; ``input = rmsnorm(residual) * (1 + weight)``."""
    _ffi.fused_add_rmsnorm(_rows(input), _rows(residual), weight, float(eps), True,
                           RMSNORM_RUNGS if rung is None else rung)


def _rmsnorm(input: Any, weight: Any, eps: float, out: Any, gemma: bool, rung: int | None) -> Any:  # noqa: A002
    if out is None:
        out = _alloc.empty(input, tuple(input.shape))
    _ffi.rmsnorm(_rows(input), weight, _rows(out), float(eps), gemma, RMSNORM_RUNGS if rung is None else rung)
    return out
