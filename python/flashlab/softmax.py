"""Softmax family over the last dim (C++: include/flashlab/softmax.h).

``input`` is [..., cols] (viewed as [rows, cols]; rows may be strided, the last dim must be
contiguous); fp32, fp16 or bf16; computed in fp32 and rounded once; ``out`` has the same dtype
and may be ``input`` itself. A row of only -inf (fully masked) gives 0 (softmax) or -inf
(log_softmax), never NaN (torch gives NaN there).
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

SOFTMAX_RUNGS = 4  # 1 three-pass, 2 online two-pass, 3 online vec16 warp/block per row, 4 + rows split over a cluster (top)


def _rows(x: Any) -> Any:
    """x as [rows, cols]: 2-D tensors as they are, others reshaped (a view when contiguous)."""
    return x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1])


def softmax(input: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002 (torch's name)
    """``out = exp(input - max) / sum(exp(input - max))`` over the last dim. Returns ``out``."""
    return _softmax("softmax", input, out, rung)


def log_softmax(input: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002
    """``out = input - max - log(sum(exp(input - max)))`` over the last dim. Returns ``out``."""
    return _softmax("log_softmax", input, out, rung)


def _softmax(name: str, input: Any, out: Any, rung: int | None) -> Any:  # noqa: A002
    if out is None:
        out = _alloc.empty(input, tuple(input.shape))
    getattr(_ffi, name)(_rows(input), _rows(out), SOFTMAX_RUNGS if rung is None else rung)
    return out
