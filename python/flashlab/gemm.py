"""GEMM: ``out = alpha * (a @ b) + beta * out + bias`` (C++: include/flashlab/gemm.h).

``a`` is (M, K) and ``b`` is (K, N), each row-major or a column-major view (a transpose such as
``w.t()`` of an (N, K) weight; not both); ``out`` is (M, N) with unit stride in its last dim. One
dtype for all: fp32 (rungs 1-6: fp32 FMA, no TF32) or fp16/bf16 (rungs 1, 7-9: fp32
accumulation, one rounding). The epilogue is computed in fp32 and rounded once.
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

# 1 naive, 2 coalesced, 3 smem tiles, 4 2D register blocking, 5 16-byte loads + transposed A tile,
# 6 warp tiling (fp32 top), 7 WMMA, 8 mma.sync + ldmatrix + cp.async, 9 TMA + wgmma (sm_90, top)
GEMM_RUNGS = 9


def _out_shape(a: Any, b: Any) -> tuple[int, ...]:
    # (M, N); for inputs that are not 2-D a's shape, which C++ rejects naming 'a' or 'b'.
    sa, sb = tuple(a.shape), tuple(b.shape)
    return (sa[0], sb[1]) if len(sa) == 2 and len(sb) == 2 else sa


def gemm(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
         rung: int | None = None) -> Any:
    """``out = alpha * (a @ b) + beta * out + bias[None, :]``. Returns ``out``.

    ``out`` defaults to a new (M, N) tensor like ``a`` (then ``beta`` must be 0: there is nothing
    to read); ``bias`` is an optional contiguous (N,) tensor of the same dtype; ``rung`` defaults
    to the top rung for the dtype (6 for fp32, 9 for fp16/bf16). Layouts NT and TN run on rungs 1
    and 9 only; rung 9 needs an sm_90 GPU and 16-byte aligned pointers and leading dims.
    """
    if out is None:
        if beta != 0:
            raise ValueError("gemm: argument 'out': expected a tensor to read when beta != 0 "
                             f"(out = alpha * a @ b + beta * out), got None with beta {beta}")
        out = _alloc.empty(a, _out_shape(a, b))
    _ffi.gemm(a, b, out, bias, float(alpha), float(beta), rung)
    return out
