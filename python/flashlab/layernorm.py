"""LayerNorm, torch.nn.functional.layer_norm semantics over the last dim (C++: include/flashlab/layernorm.h).

``input`` is [..., hidden] (viewed as [rows, hidden]; rows may be strided, the last dim must be
contiguous); ``weight`` and ``bias`` are [hidden]; fp32, fp16 or bf16, all one dtype; mean and
biased variance in fp32, rounded once.
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported
from .norm import _rows

LAYERNORM_RUNGS = 3  # 1 warp/row two-pass, 2 warp/row Welford, 3 block/row vec16 in registers + Welford (top)


def layernorm(input: Any, weight: Any, bias: Any = None, eps: float = 1e-5, out: Any = None,  # noqa: A002
              rung: int | None = None) -> Any:
    """``out = (input - mean) * rsqrt(var + eps) * weight + bias`` per row (biased var). Returns ``out``.

    ``bias`` None means no bias; ``out`` defaults to a new tensor like ``input``; ``rung`` to the top rung.
    """
    if out is None:
        out = _alloc.empty(input, tuple(input.shape))
    _ffi.layernorm(_rows(input), weight, bias, _rows(out), float(eps), LAYERNORM_RUNGS if rung is None else rung)
    return out
