"""flashlab: LLM GPU kernels built as ladders of rungs, over TVM-FFI.

Functions take any DLPack tensor (torch, numpy, CuPy, JAX, ...), run on the caller's current
CUDA stream (torch's current stream for torch tensors) and validate in C++: an invalid argument
raises ValueError whose message names the op, the argument, what was expected and what was given.
"""

from __future__ import annotations

from typing import Any

from . import _alloc, _loader

__all__ = ["ACTIVATION_RUNGS", "ATTN_BWD_RUNGS", "ATTN_FWD_RUNGS", "attention_bwd", "attention_fwd", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "ROPE_RUNGS", "apply_llama31_rope_pos_ids",
           "apply_llama31_rope_pos_ids_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
           "apply_rope_with_cos_sin_cache", "GEMM_RUNGS", "LAYERNORM_RUNGS", "QUANT_RUNGS", "RMSNORM_RUNGS", "SOFTMAX_RUNGS", "SUM_RUNGS", "VECTOR_ADD_RUNGS",
           "fused_add_rmsnorm", "gelu_and_mul", "gelu_tanh_and_mul", "gemm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm",
           "layernorm", "library_path", "log_softmax", "rmsnorm", "row_sum", "silu_and_mul", "softmax", "sum",
           "vector_add", "quantize_fp8", "quantize_int8", "dequantize"]

VECTOR_ADD_RUNGS = 3  # 1 grid-stride, 2 vec16, 3 vec16 + head/tail (top)
SUM_RUNGS = 6  # 1 atomic, 2 smem interleaved, 3 smem sequential, 4 warp shuffle, 5 vec16 multi, 6 one pass (top)
ACTIVATION_RUNGS = 2  # 1 scalar grid-stride, 2 vec16 tiles + scalar edges (top)

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


def _halved_last_dim(x: Any) -> tuple[int, ...]:
    # [..., 2d] -> [..., d]; a 0-dim input keeps its shape (C++ rejects it, naming 'input').
    shape = tuple(x.shape)
    return shape[:-1] + (shape[-1] // 2,) if shape else shape


def _act_and_mul(name: str, input: Any, out: Any, rung: int | None) -> Any:  # noqa: A002
    if out is None:
        out = _alloc.empty(input, _halved_last_dim(input))
    getattr(_ffi, name)(input, out, ACTIVATION_RUNGS if rung is None else rung)
    return out


def silu_and_mul(input: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002 (FlashInfer's name)
    """``out = silu(input[..., :d]) * input[..., d:]`` for ``input`` of shape [..., 2d]. Returns ``out``.

    silu(x) = x / (1 + exp(-x)); fp32, fp16 or bf16, computed in fp32 and rounded once. ``input``
    rows may be strided (unit stride in the last dim); ``out`` defaults to a new contiguous tensor
    like ``input`` with the last dim halved; ``rung`` to the top rung.
    """
    return _act_and_mul("silu_and_mul", input, out, rung)


def gelu_and_mul(input: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002
    """``out = gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) GELU. Returns ``out``.

    gelu(x) = x/2 * (1 + erf(x / sqrt(2))); otherwise as :func:`silu_and_mul`.
    """
    return _act_and_mul("gelu_and_mul", input, out, rung)


def gelu_tanh_and_mul(input: Any, out: Any = None, rung: int | None = None) -> Any:  # noqa: A002
    """``out = gelu_tanh(input[..., :d]) * input[..., d:]``, GELU's tanh approximation. Returns ``out``.

    gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))); otherwise as :func:`silu_and_mul`.
    """
    return _act_and_mul("gelu_tanh_and_mul", input, out, rung)


from .norm import (RMSNORM_RUNGS, fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm,  # noqa: E402
                   rmsnorm)
from .layernorm import LAYERNORM_RUNGS, layernorm  # noqa: E402
from .softmax import SOFTMAX_RUNGS, log_softmax, softmax  # noqa: E402
from .quant import QUANT_RUNGS, dequantize, quantize_fp8, quantize_int8  # noqa: E402
from .rope import (ROPE_RUNGS, apply_llama31_rope_pos_ids, apply_llama31_rope_pos_ids_inplace,  # noqa: E402
                   apply_rope_pos_ids, apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache)
from .gemm import GEMM_RUNGS, gemm  # noqa: E402
from .flash_attn_interface import (ATTN_BWD_RUNGS, ATTN_FWD_RUNGS, attention_bwd, attention_fwd, flash_attn_func,  # noqa: E402
                                   flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                   flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                                   flash_attn_with_kvcache)
from .serving import (PAGED_DECODE_RUNGS, PAGED_PREFILL_RUNGS, BatchDecodeWithPagedKVCacheWrapper,  # noqa: E402
                      BatchPrefillWithPagedKVCacheWrapper, append_paged_kv_cache, batch_decode_paged,
                      batch_decode_workspace_bytes, batch_prefill_paged, merge_state, merge_state_in_place, merge_states)
