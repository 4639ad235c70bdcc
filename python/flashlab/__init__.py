"""flashlab: LLM GPU kernels built as ladders of rungs, over TVM-FFI.

Functions take any DLPack tensor (torch, numpy, CuPy, JAX, ...), run on the caller's current
CUDA stream (torch's current stream for torch tensors) and validate in C++: an invalid argument
raises ValueError whose message names the op, the argument, what was expected and what was given.
"""

from __future__ import annotations

from typing import Any

from . import _alloc, _loader

__all__ = ["SUM_RUNGS", "VECTOR_ADD_RUNGS", "library_path", "row_sum", "sum", "vector_add"]

VECTOR_ADD_RUNGS = 3  # 1 grid-stride, 2 vec16, 3 vec16 + head/tail (top)
SUM_RUNGS = 6  # 1 atomic, 2 smem interleaved, 3 smem sequential, 4 warp shuffle, 5 vec16 multi, 6 one pass (top)

_ffi, _path = _loader.load()


def library_path() -> str:
    """Path of the loaded flashlab_ffi module."""
    return str(_path)


def vector_add(a: Any, b: Any, out: Any = None, rung: int | None = None) -> Any:
    """``out = a + b`` elementwise (fp32 or bf16, computed in fp32). Returns ``out``.

    ``out`` defaults to a new tensor like ``a``; ``rung`` to the top rung.
    """
    if out is None:
        out = _alloc.empty(a, tuple(a.shape))
    _ffi.vector_add(a, b, out, VECTOR_ADD_RUNGS if rung is None else rung)
    return out


def sum(x: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A001 (the op's name)
    """``out[0]`` = sum of every element of ``x``, accumulated in fp32. Returns ``out``.

    ``out`` defaults to a new fp32 tensor of shape [1] on ``x``'s device; ``rung`` to the top rung.
    """
    if out is None:
        out = _alloc.empty(x, (1,), "float32")
    _ffi.sum(x, out, SUM_RUNGS if rung is None else rung)
    return out


def row_sum(x: Any, out: Any = None) -> Any:
    """``out[r] = sum_c x[r, c]``, accumulated in fp32, for a 2-D ``x``. Returns ``out``.

    ``out`` defaults to a new fp32 tensor of shape [rows] on ``x``'s device.
    """
    if out is None:
        out = _alloc.empty(x, tuple(x.shape[:1]), "float32")
    _ffi.row_sum(x, out)
    return out
