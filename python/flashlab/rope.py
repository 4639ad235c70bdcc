"""Rotary position embedding, FlashInfer names and semantics (C++: include/flashlab/rope.h).

``q`` is [nnz, num_q_heads, head_dim] and ``k`` [nnz, num_k_heads, head_dim] (fp32, fp16 or
bf16, one dtype; token and head strides free, the last dim contiguous); ``pos_ids`` is [nnz]
int32 or int64. The first ``rotary_dim`` dims of every head turn by ``pos * inv_freq_i`` (NeoX
pairs ``(i, i + rotary_dim/2)``, or GPT-J pairs ``(2i, 2i+1)`` with ``interleave=True``), the
rest are kept; angles and cos/sin in fp32 (full-range sincos), each output rounded once.
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

ROPE_RUNGS = 2  # 1 thread per pair, 2 block per token with shared cos/sin and 16-byte vectors (top)


def _run(q: Any, k: Any, q_out: Any, k_out: Any, pos_ids: Any, rotary_dim: int | None, interleave: bool,
         rope_scale: float, rope_theta: float, llama31: bool, low_freq_factor: float, high_freq_factor: float,
         llama31_factor: float, old_context_len: int, rung: int | None) -> None:
    rd = 0 if rotary_dim is None else int(rotary_dim)  # 0: the C++ API takes head_dim
    _ffi.apply_rope_pos_ids(q, k, q_out, k_out, pos_ids, rd, bool(interleave), float(rope_theta),
                            float(rope_scale), bool(llama31), float(low_freq_factor), float(high_freq_factor),
                            float(llama31_factor), int(old_context_len), ROPE_RUNGS if rung is None else rung)


def apply_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: int | None = None, interleave: bool = False,
                       rope_scale: float = 1.0, rope_theta: float = 1e4, rung: int | None = None) -> tuple[Any, Any]:
    """RoPE with ``inv_freq_i = 1 / (rope_scale * rope_theta ** (2i / rotary_dim))``.

    Returns new tensors ``(q_rope, k_rope)``; ``rotary_dim`` defaults to head_dim.
    """
    q_rope, k_rope = _alloc.empty(q, tuple(q.shape)), _alloc.empty(k, tuple(k.shape))
    _run(q, k, q_rope, k_rope, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False, 1.0, 4.0, 8.0, 8192,
         rung)
    return q_rope, k_rope


def apply_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, rotary_dim: int | None = None,
                               interleave: bool = False, rope_scale: float = 1.0, rope_theta: float = 1e4,
                               rung: int | None = None) -> None:
    """:func:`apply_rope_pos_ids` writing into ``q`` and ``k``."""
    _run(q, k, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False, 1.0, 4.0, 8.0, 8192, rung)


def apply_llama31_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: int | None = None, interleave: bool = False,
                               rope_scale: float = 8.0, rope_theta: float = 5e5, low_freq_factor: float = 1.0,
                               high_freq_factor: float = 4.0, old_context_len: int = 8192,
                               rung: int | None = None) -> tuple[Any, Any]:
    """RoPE with Llama 3.1's frequency bands; ``rope_scale`` is Llama's ``factor`` (as in FlashInfer).

    Wavelengths ``2 pi / base_i`` above ``old_context_len / low_freq_factor`` are slowed by
    ``rope_scale``, those below ``old_context_len / high_freq_factor`` kept, the band between
    interpolated. Returns new tensors ``(q_rope, k_rope)``.
    """
    q_rope, k_rope = _alloc.empty(q, tuple(q.shape)), _alloc.empty(k, tuple(k.shape))
    _run(q, k, q_rope, k_rope, pos_ids, rotary_dim, interleave, 1.0, rope_theta, True, low_freq_factor,
         high_freq_factor, rope_scale, old_context_len, rung)
    return q_rope, k_rope


def apply_llama31_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, rotary_dim: int | None = None,
                                       interleave: bool = False, rope_scale: float = 8.0, rope_theta: float = 5e5,
                                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                                       old_context_len: int = 8192, rung: int | None = None) -> None:
    """:func:`apply_llama31_rope_pos_ids` writing into ``q`` and ``k``."""
    _run(q, k, q, k, pos_ids, rotary_dim, interleave, 1.0, rope_theta, True, low_freq_factor, high_freq_factor,
         rope_scale, old_context_len, rung)


def apply_rope_with_cos_sin_cache(positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any,
                                  is_neox: bool = True, rung: int | None = None) -> tuple[Any, Any]:
    """vLLM/FlashInfer layout: ``query`` [nnz, num_q_heads * head_size], ``key`` [nnz, num_k_heads *
    head_size], ``cos_sin_cache`` [max_pos, rotary_dim] fp32 (cos, then sin), ``positions`` [nnz].

    ``is_neox=False`` is the GPT-J (interleaved) layout. Returns new ``(query_out, key_out)``.
    """
    q_out, k_out = _alloc.empty(query, tuple(query.shape)), _alloc.empty(key, tuple(key.shape))
    _ffi.apply_rope_with_cos_sin_cache(positions, query, key, q_out, k_out, int(head_size), cos_sin_cache,
                                       not is_neox, ROPE_RUNGS if rung is None else rung)
    return q_out, k_out
