"""Serving attention ops (C++: include/flashlab/serving.h): so far the merge of attention states,
FlashInfer's ``merge_state`` / ``merge_states`` / ``merge_state_in_place``, and the paged KV
cache's ``append_paged_kv_cache`` and ``batch_decode_paged``.

An attention state is the output ``v`` of attention over one segment of the keys, (seq, nheads,
headdim), and its log-sum-exp ``s``, fp32 (seq, nheads), natural log as ``softmax_lse`` (note:
flash_attn_func's lse is (batch, nheads, seqlen): transpose it), -inf for a segment with no visible
key. Merging the states of disjoint segments gives the state of their union. Tensors are any
DLPack producer; outputs default to new tensors like the inputs.
"""

from __future__ import annotations

from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in x.shape)


def merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any, v_out: Any = None, s_out: Any = None) -> tuple[Any, Any]:
    """``S = log(e^s_a + e^s_b)``, ``V = v_a e^(s_a - S) + v_b e^(s_b - S)``. Returns ``(V, S)``.

    v: (seq, nheads, headdim) contiguous, fp32 / fp16 / bf16, headdim a multiple of 16 bytes' worth;
    s: fp32 (seq, nheads) contiguous. ``v_out`` / ``s_out`` may be ``v_a`` / ``s_a`` (in place).
    """
    v_out = _alloc.empty(v_a, _shape(v_a)) if v_out is None else v_out
    s_out = _alloc.empty(s_a, _shape(s_a), "float32") if s_out is None else s_out
    _ffi.merge_state(v_a, s_a, v_b, s_b, v_out, s_out)
    return v_out, s_out


def merge_state_in_place(v: Any, s: Any, v_other: Any, s_other: Any) -> None:
    """``(v, s)`` becomes the merge of ``(v, s)`` and ``(v_other, s_other)`` (FlashInfer's name)."""
    _ffi.merge_state(v, s, v_other, s_other, v, s)


def merge_states(v: Any, s: Any, v_out: Any = None, s_out: Any = None) -> tuple[Any, Any]:
    """The merge of the states along dim 1: v (seq, num_states, nheads, headdim), s fp32 (seq,
    num_states, nheads) -> ``(V, S)``, (seq, nheads, headdim) and (seq, nheads)."""
    seq, _, nheads, headdim = _shape(v) if len(_shape(v)) == 4 else (0, 0, 0, 0)
    v_out = _alloc.empty(v, (seq, nheads, headdim)) if v_out is None else v_out
    s_out = _alloc.empty(s, (seq, nheads), "float32") if s_out is None else s_out
    _ffi.merge_states(v, s, v_out, s_out)
    return v_out, s_out


_LAYOUTS = {"NHD": 0, "HND": 1}


def append_paged_kv_cache(append_key: Any, append_value: Any, batch_indices: Any, positions: Any, paged_kv_cache: Any,
                          kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any, kv_layout: str = "NHD") -> None:
    """Writes new tokens into a paged KV cache (FlashInfer's ``append_paged_kv_cache``).

    append_key / append_value: (nnz, nheads_kv, headdim), the cache's dtype (fp32 / fp16 / bf16);
    batch_indices / positions: int32 (nnz,), token i goes to position ``positions[i]`` of request
    ``batch_indices[i]``; paged_kv_cache: ``(k_cache, v_cache)``, each (max_pages, page_size,
    nheads_kv, headdim) for ``kv_layout="NHD"`` or (max_pages, nheads_kv, page_size, headdim) for
    ``"HND"``, or one tensor with both along dim 1, (max_pages, 2, ...); kv_indices / kv_indptr /
    kv_last_page_len: the int32 page table in CSR form (request b: pages
    ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, the last one holding ``kv_last_page_len[b]``
    tokens), already covering the new tokens. Only the appended slots are written.
    """
    layout, k_cache, v_cache = _paged_cache("append_paged_kv_cache", paged_kv_cache, kv_layout)
    _ffi.append_paged_kv_cache(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
                               kv_last_page_len, layout)


def _paged_cache(op: str, paged_kv_cache: Any, kv_layout: str) -> tuple[int, Any, Any]:
    """The layout code and (k_cache, v_cache) of a tuple or of one (max_pages, 2, ...) tensor."""
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"{op}: argument 'kv_layout': expected 'NHD' or 'HND', got {kv_layout!r}")
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"{op}: argument 'paged_kv_cache': expected (k_cache, v_cache), got {len(paged_kv_cache)} tensors")
        return _LAYOUTS[kv_layout], paged_kv_cache[0], paged_kv_cache[1]
    shape = _shape(paged_kv_cache)
    if len(shape) != 5 or shape[1] != 2:
        raise ValueError(f"{op}: argument 'paged_kv_cache': expected (k_cache, v_cache) or one (max_pages, 2, ...) tensor, "
                         f"got shape {list(shape)}")
    return _LAYOUTS[kv_layout], paged_kv_cache[:, 0], paged_kv_cache[:, 1]


PAGED_DECODE_RUNGS = 2  # 1 naive, 2 GQA-aware (top)


def batch_decode_paged(q: Any, paged_kv_cache: Any, kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any,
                       kv_layout: str = "NHD", sm_scale: float | None = None, return_lse: bool = False, out: Any = None,
                       rung: int | None = None) -> Any:
    """One query token per request attending to its paged KV (C++ ``batch_decode_paged``).

    q: (batch, nheads, headdim), the cache's dtype, headdim 32, 64, 96, 128, 192 or 256, nheads a
    multiple of the cache's KV heads (GQA);
    paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout: as
    ``append_paged_kv_cache`` (batch = len(kv_last_page_len)). Returns out (like q), or
    ``(out, lse)`` with ``return_lse`` (fp32 (batch, nheads), natural log: merge_state's ``s``).
    A request without keys gets out = 0, lse = -inf. ``sm_scale``: default 1 / sqrt(headdim).
    """
    layout, k_cache, v_cache = _paged_cache("batch_decode_paged", paged_kv_cache, kv_layout)
    out = _alloc.empty(q, _shape(q)) if out is None else out
    shape = _shape(q)
    lse = _alloc.empty(q, shape[:2], "float32") if return_lse and len(shape) == 3 else None
    _ffi.batch_decode_paged(q, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout,
                            0.0 if sm_scale is None else float(sm_scale), PAGED_DECODE_RUNGS if rung is None else rung)
    return (out, lse) if return_lse else out
