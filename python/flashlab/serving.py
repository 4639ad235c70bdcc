"""Serving attention ops (C++: include/flashlab/serving.h): so far the merge of attention states,
FlashInfer's ``merge_state`` / ``merge_states`` / ``merge_state_in_place``, and the paged KV
cache's ``append_paged_kv_cache``, ``batch_decode_paged`` and the plan/run wrapper
``BatchDecodeWithPagedKVCacheWrapper`` (FlashInfer's, for CUDA-graph decode steps), and
``batch_prefill_paged`` with ``BatchPrefillWithPagedKVCacheWrapper``.

An attention state is the output ``v`` of attention over one segment of the keys, (seq, nheads,
headdim), and its log-sum-exp ``s``, fp32 (seq, nheads), natural log as ``softmax_lse`` (note:
flash_attn_func's lse is (batch, nheads, seqlen): transpose it), -inf for a segment with no visible
key. Merging the states of disjoint segments gives the state of their union. Tensors are any
DLPack producer; outputs default to new tensors like the inputs.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

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


PAGED_DECODE_RUNGS = 3  # 1 naive, 2 GQA-aware, 3 split-KV on tensor cores (top; fp32 runs rung 2)


def batch_decode_paged(q: Any, paged_kv_cache: Any, kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any,
                       kv_layout: str = "NHD", sm_scale: float | None = None, return_lse: bool = False, out: Any = None,
                       rung: int | None = None, k_scale: float | None = None, v_scale: float | None = None) -> Any:
    """One query token per request attending to its paged KV (C++ ``batch_decode_paged``).

    q: (batch, nheads, headdim), the cache's dtype, headdim 32, 64, 96, 128, 192 or 256, nheads a
    multiple of the cache's KV heads (GQA);
    paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout: as
    ``append_paged_kv_cache`` (batch = len(kv_last_page_len)). Returns out (like q), or
    ``(out, lse)`` with ``return_lse`` (fp32 (batch, nheads), natural log: merge_state's ``s``).
    A request without keys gets out = 0, lse = -inf. ``sm_scale``: default 1 / sqrt(headdim).
    An e4m3 cache (``torch.float8_e4m3fn``; rung 3) with fp16 / bf16 q takes its dequantization
    scales ``k_scale`` / ``v_scale`` (default 1).
    """
    layout, k_cache, v_cache = _paged_cache("batch_decode_paged", paged_kv_cache, kv_layout)
    out = _alloc.empty(q, _shape(q)) if out is None else out
    shape = _shape(q)
    lse = _alloc.empty(q, shape[:2], "float32") if return_lse and len(shape) == 3 else None
    _ffi.batch_decode_paged(q, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout,
                            0.0 if sm_scale is None else float(sm_scale), PAGED_DECODE_RUNGS if rung is None else rung,
                            1.0 if k_scale is None else float(k_scale), 1.0 if v_scale is None else float(v_scale))
    return (out, lse) if return_lse else out


def _host_int32(op: str, name: str, x: Any) -> Any:
    """x on the host as a contiguous array (torch: a CPU tensor; numpy as is; else via .get())."""
    if hasattr(x, "is_cuda") and hasattr(x, "cpu"):  # torch
        return x.detach().cpu().contiguous()
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    if hasattr(x, "get"):  # CuPy
        return np.ascontiguousarray(x.get())
    raise TypeError(f"{op}: argument '{name}': expected a torch tensor, a numpy array or a CuPy array, got {type(x).__name__}")


def batch_decode_workspace_bytes(batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, device: int = 0) -> int:
    """Bytes of the workspace a ``BatchDecodeWithPagedKVCacheWrapper`` plan needs for this shape."""
    return int(_ffi.batch_decode_workspace_bytes(batch, num_qo_heads, num_kv_heads, head_dim, device))


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode over a paged KV cache, planned once per batch shape (FlashInfer's wrapper of
    the same name; C++ ``batch_decode_plan`` / ``batch_decode_run``, decode rung 3, fp16 / bf16).

    ``plan()`` reads the page counts on the host (``indptr`` is copied there: call it outside a
    CUDA-graph capture), cuts long requests into chunks that spread over the GPU and copies that
    plan into ``float_workspace_buffer`` (a CUDA uint8 tensor of at least
    ``batch_decode_workspace_bytes(...)`` bytes; one workspace per wrapper: a run whose workspace
    another plan wrote since is rejected). ``run()`` launches with fixed addresses and grid.
    ``use_cuda_graph=True`` (with the three ``paged_kv_*_buffer`` tensors, as FlashInfer): every
    ``plan()`` copies the page table into those buffers, so a decode step captured in a CUDA graph
    replays correctly after a new ``plan()`` of other lengths (same batch and heads), and after
    tokens are appended to the buffers' table without one. ``use_tensor_cores`` is accepted and
    ignored (rung 3 always uses them). The lse is the natural log (as ``flash_attn``'s
    ``softmax_lse`` and ``merge_state`` here).
    """

    def __init__(self, float_workspace_buffer: Any, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: Any = None, paged_kv_indices_buffer: Any = None,
                 paged_kv_last_page_len_buffer: Any = None) -> None:
        op = "BatchDecodeWithPagedKVCacheWrapper"
        if kv_layout not in _LAYOUTS:
            raise ValueError(f"{op}: argument 'kv_layout': expected 'NHD' or 'HND', got {kv_layout!r}")
        buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        if use_cuda_graph and any(b is None for b in buffers):
            raise ValueError(f"{op}: use_cuda_graph=True needs paged_kv_indptr_buffer, paged_kv_indices_buffer and "
                             "paged_kv_last_page_len_buffer (the fixed tensors the graph reads)")
        self._workspace = float_workspace_buffer
        self._kv_layout = kv_layout
        self._buffers = buffers if use_cuda_graph else None
        self._plan: Any = None
        self._table: tuple[Any, Any, Any] | None = None
        self._sm_scale = 0.0

    def plan(self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None, q_data_type: Any = None, kv_data_type: Any = None,
             data_type: Any = None, sm_scale: float | None = None, rope_scale: float | None = None,
             rope_theta: float | None = None, non_blocking: bool = True, block_tables: Any = None,
             seq_lens: Any = None, fixed_split_size: int | None = None, disable_split_kv: bool = False) -> None:
        """Plans the decode of the batch whose page table is (indptr, indices, last_page_len),
        int32 CUDA tensors (``run()`` reads them, or, with ``use_cuda_graph``, the buffers they are
        copied into); ``kv_data_type`` ``torch.float8_e4m3fn`` (or "float8_e4m3fn") plans for an
        e4m3 cache's kernel. Features flashlab's decode lacks (rotary inside the kernel, a sliding
        window, logit soft-capping, block tables, fixed or disabled splits) are rejected; dtypes
        come from ``run()``'s tensors."""
        op = "BatchDecodeWithPagedKVCacheWrapper.plan"
        if pos_encoding_mode != "NONE":
            raise ValueError(f"{op}: argument 'pos_encoding_mode': expected 'NONE' (apply RoPE before the decode: "
                             f"flashlab.apply_rope), got {pos_encoding_mode!r}")
        if window_left != -1:
            raise ValueError(f"{op}: argument 'window_left': expected -1 (no sliding window), got {window_left}")
        if logits_soft_cap not in (None, 0, 0.0):
            raise ValueError(f"{op}: argument 'logits_soft_cap': expected None or 0, got {logits_soft_cap}")
        for name, value in (("block_tables", block_tables), ("seq_lens", seq_lens), ("fixed_split_size", fixed_split_size)):
            if value is not None:
                raise ValueError(f"{op}: argument '{name}': expected None (not supported), got {type(value).__name__}")
        if disable_split_kv:
            raise ValueError(f"{op}: argument 'disable_split_kv': expected False (not supported), got True")
        host = _host_int32(op, "indptr", indptr)
        if self._buffers is not None:
            ptr_buf, ind_buf, last_buf = self._buffers
            batch, nnz = len(host) - 1, int(host[-1])
            if _shape(ptr_buf)[0] != batch + 1 or _shape(last_buf)[0] != batch or _shape(ind_buf)[0] < nnz:
                raise ValueError(f"{op}: the CUDA-graph buffers hold a batch of {_shape(ptr_buf)[0] - 1} and "
                                 f"{_shape(ind_buf)[0]} pages; this plan has a batch of {batch} and {nnz} pages")
            ptr_buf.copy_(indptr, non_blocking=non_blocking)
            ind_buf[:nnz].copy_(indices[:nnz], non_blocking=non_blocking)
            last_buf.copy_(last_page_len, non_blocking=non_blocking)
            table = (ind_buf, ptr_buf, last_buf)
        else:
            table = (indices, indptr, last_page_len)
        kv_fp8 = "float8_e4m3" in str(kv_data_type if kv_data_type is not None else q_data_type)
        self._plan = _ffi.batch_decode_plan(host, page_size, num_qo_heads, num_kv_heads, head_dim, self._workspace, kv_fp8)
        self._table = table
        self._sm_scale = 0.0 if sm_scale is None else float(sm_scale)

    def run(self, q: Any, paged_kv_cache: Any, *, q_scale: float | None = None, k_scale: float | None = None,
            v_scale: float | None = None, out: Any = None, lse: Any = None, return_lse: bool = False) -> Any:
        """out = the decode of q (batch, num_qo_heads, head_dim) over ``paged_kv_cache``
        (``(k_cache, v_cache)`` or one (max_pages, 2, ...) tensor, the wrapper's layout), or
        ``(out, lse)`` with ``return_lse`` (lse fp32 (batch, num_qo_heads), natural log). An e4m3
        cache takes ``k_scale`` / ``v_scale``; ``q_scale`` must be None or 1."""
        op = "BatchDecodeWithPagedKVCacheWrapper.run"
        if self._plan is None or self._table is None:
            raise RuntimeError(f"{op}: plan() first")
        if q_scale not in (None, 1, 1.0):
            raise ValueError(f"{op}: argument 'q_scale': expected None or 1 (an FP8 query is not supported), got {q_scale}")
        layout, k_cache, v_cache = _paged_cache(op, paged_kv_cache, self._kv_layout)
        shape = _shape(q)
        out = _alloc.empty(q, shape) if out is None else out
        if lse is None and return_lse and len(shape) == 3:
            lse = _alloc.empty(q, shape[:2], "float32")
        indices, indptr, last_page_len = self._table
        _ffi.batch_decode_run(self._plan, self._workspace, q, k_cache, v_cache, indices, indptr, last_page_len, out, lse,
                              layout, self._sm_scale, 1.0 if k_scale is None else float(k_scale),
                              1.0 if v_scale is None else float(v_scale))
        return (out, lse) if return_lse else out

    forward = run  # FlashInfer's older name


PAGED_PREFILL_RUNGS = 2  # 1 FlashAttention-2 (mma.sync, cp.async), 2 Hopper (wgmma, TMA per page; top, sm_90)


def _prefill_options(op: str, pos_encoding_mode: str, logits_soft_cap: float | None) -> float:
    """The softcap (0: none); rejects what flashlab's prefill lacks (rotary inside the kernel)."""
    if pos_encoding_mode != "NONE":
        raise ValueError(f"{op}: argument 'pos_encoding_mode': expected 'NONE' (apply RoPE before the prefill: "
                         f"flashlab.apply_rope), got {pos_encoding_mode!r}")
    return 0.0 if logits_soft_cap is None else float(logits_soft_cap)


def batch_prefill_paged(q: Any, qo_indptr: Any, paged_kv_cache: Any, kv_indices: Any, kv_indptr: Any,
                        kv_last_page_len: Any, kv_layout: str = "NHD", causal: bool = False, window_left: int = -1,
                        logits_soft_cap: float | None = None, sm_scale: float | None = None, return_lse: bool = False,
                        out: Any = None, max_qo_len: int | None = None, rung: int | None = None) -> Any:
    """Each request's queries attending to its paged KV (C++ ``batch_prefill_paged``).

    q: (total_q, num_qo_heads, head_dim) packed, request b's rows ``qo_indptr[b]:qo_indptr[b + 1]``
    (int32 CUDA), fp16 / bf16 (the cache's dtype), head_dim 64, 128 or 256; the cache and page table
    as ``append_paged_kv_cache``. The queries are each request's last tokens (already appended):
    ``causal`` aligns the mask bottom-right; ``window_left`` >= 0 limits how far back a query
    sees; ``logits_soft_cap`` > 0 caps the logits. Returns out (like q), or ``(out, lse)`` with
    ``return_lse`` (fp32 (total_q, num_qo_heads), natural log). ``max_qo_len``: the longest
    request's query count (default: read from qo_indptr, which a CUDA-graph capture cannot do).
    """
    layout, k_cache, v_cache = _paged_cache("batch_prefill_paged", paged_kv_cache, kv_layout)
    shape = _shape(q)
    out = _alloc.empty(q, shape) if out is None else out
    lse = _alloc.empty(q, shape[:2], "float32") if return_lse and len(shape) == 3 else None
    _ffi.batch_prefill_paged(q, qo_indptr, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout,
                             bool(causal), int(window_left), 0.0 if logits_soft_cap is None else float(logits_soft_cap),
                             0.0 if sm_scale is None else float(sm_scale), -1 if max_qo_len is None else int(max_qo_len),
                             PAGED_PREFILL_RUNGS if rung is None else rung)
    return (out, lse) if return_lse else out


def _check_graph_buffers(op: str, arrays: tuple[Any, ...], buffers: tuple[Any, ...], batch: int, nnz: int) -> None:
    """A CUDA-graph prefill plan's (qo_indptr, paged_kv_indptr, paged_kv_indices,
    paged_kv_last_page_len), their values already checked by the C++ plan (batch requests, nnz
    pages), against the buffers they are copied into, before the first copy (a copy failing midway
    would leave a captured graph a mixed table)."""
    torch = sys.modules.get("torch")
    names = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len")
    for name, x in zip(names, arrays):
        if torch is None or not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}': expected a torch tensor (use_cuda_graph copies it into its "
                            f"buffer), got {type(x).__name__}")
    sizes = [_shape(b)[0] if len(_shape(b)) == 1 else -1 for b in buffers]
    if sizes[0] != batch + 1 or sizes[1] != batch + 1 or sizes[2] < nnz or sizes[3] != batch:
        raise ValueError(f"{op}: the CUDA-graph buffers (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, "
                         f"paged_kv_last_page_len_buf; -1: not 1-D) hold {sizes}; this plan needs a batch of {batch} "
                         f"and {nnz} pages: {[batch + 1, batch + 1, nnz, batch]}")


class BatchPrefillWithPagedKVCacheWrapper:
    """Batch prefill / append over a paged KV cache (FlashInfer's wrapper of the same name; C++
    ``batch_prefill_paged``, its top rung).

    ``plan()`` (outside a CUDA-graph capture) reads ``qo_indptr`` and the page table from the
    device once and checks them (C++ ``batch_prefill_paged_plan``; the longest request's query
    count fixes the grid); ``run()`` (``batch_prefill_paged_run``) then checks its tensors against
    the plan on the host and launches without reading the device: no wait per call or layer, and
    it can be captured. As FlashInfer's, the planned arrays must not change until the next plan.
    ``use_cuda_graph=True`` (with ``qo_indptr_buf`` and the three
    ``paged_kv_*_buf`` tensors, as FlashInfer): every ``plan()`` copies its arrays into those
    buffers, so a captured ``run()`` replays correctly after a new ``plan()`` whose longest request
    has no more queries than at capture time (same batch). ``float_workspace_buffer`` is accepted
    and unused (the prefill needs no workspace). The lse is the natural log.
    """

    def __init__(self, float_workspace_buffer: Any = None, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: Any = None, paged_kv_indptr_buf: Any = None, paged_kv_indices_buf: Any = None,
                 paged_kv_last_page_len_buf: Any = None, custom_mask_buf: Any = None, mask_indptr_buf: Any = None,
                 backend: str = "auto", jit_args: Any = None) -> None:
        op = "BatchPrefillWithPagedKVCacheWrapper"
        if kv_layout not in _LAYOUTS:
            raise ValueError(f"{op}: argument 'kv_layout': expected 'NHD' or 'HND', got {kv_layout!r}")
        buffers = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf)
        if use_cuda_graph and any(b is None for b in buffers):
            raise ValueError(f"{op}: use_cuda_graph=True needs qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf "
                             "and paged_kv_last_page_len_buf (the fixed tensors the graph reads)")
        for name, value in (("custom_mask_buf", custom_mask_buf), ("mask_indptr_buf", mask_indptr_buf), ("jit_args", jit_args)):
            if value is not None:
                raise ValueError(f"{op}: argument '{name}': expected None (not supported), got {type(value).__name__}")
        self._kv_layout = kv_layout
        self._buffers = buffers if use_cuda_graph else None
        self._table: tuple[Any, Any, Any, Any] | None = None
        self._plan: Any = None  # C++ batch_prefill_paged_plan's integers
        self._max_qo_len = -1
        self._options: tuple[bool, int, float, float] = (False, -1, 0.0, 0.0)

    def plan(self, qo_indptr: Any, paged_kv_indptr: Any, paged_kv_indices: Any, paged_kv_last_page_len: Any,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: int | None = None,
             custom_mask: Any = None, packed_custom_mask: Any = None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: float | None = None, window_left: int = -1,
             logits_soft_cap: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
             q_data_type: Any = None, kv_data_type: Any = None, non_blocking: bool = True, **unsupported: Any) -> None:
        """Plans the prefill of the batch whose queries are split by ``qo_indptr`` and whose page
        table is (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len), int32 CUDA tensors
        (with ``use_cuda_graph``, host tensors too: they are checked, then copied into the buffers).
        Shapes and dtypes come from ``run()``'s tensors (checked there); features flashlab's
        prefill lacks (custom masks, rotary inside the kernel, a different value head dim) are
        rejected."""
        op = "BatchPrefillWithPagedKVCacheWrapper.plan"
        softcap = _prefill_options(op, pos_encoding_mode, logits_soft_cap)
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(f"{op}: arguments 'custom_mask', 'packed_custom_mask': expected None (not supported)")
        if head_dim_vo not in (None, head_dim_qk):
            raise ValueError(f"{op}: argument 'head_dim_vo': expected None or head_dim_qk ({head_dim_qk}), got {head_dim_vo}")
        for name, value in unsupported.items():
            if value not in (None, 0):
                raise ValueError(f"{op}: argument '{name}': expected None (not supported), got {type(value).__name__}")
        table = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        # The values read and checked once here (a wait; host arrays are read directly), so that run()
        # reads nothing. The plan's integers: batch, total_q, max_qo_len, page_size, kv_pages, ...
        plan = _ffi.batch_prefill_paged_plan(qo_indptr, paged_kv_indices, paged_kv_indptr, paged_kv_last_page_len,
                                             int(page_size))
        max_qo_len = int(plan[2])
        if self._buffers is not None:  # checked before the buffers are written: a refused plan leaves them as they were
            _check_graph_buffers(op, table, self._buffers, int(plan[0]), int(plan[4]))
            if self._table is not None and max_qo_len > self._max_qo_len:
                raise ValueError(f"{op}: a CUDA-graph plan's longest request must not exceed the first plan's "
                                 f"{self._max_qo_len} queries (the captured grid), got {max_qo_len}")
            qo_buf, ptr_buf, ind_buf, last_buf = self._buffers
            nnz = int(plan[4])
            qo_buf.copy_(qo_indptr, non_blocking=non_blocking)
            ptr_buf.copy_(paged_kv_indptr, non_blocking=non_blocking)
            ind_buf[:nnz].copy_(paged_kv_indices[:nnz], non_blocking=non_blocking)
            last_buf.copy_(paged_kv_last_page_len, non_blocking=non_blocking)
            table = (qo_buf, ptr_buf, ind_buf, last_buf)
            max_qo_len = max(max_qo_len, self._max_qo_len)  # the grid of the first plan (a capture's) stays
            # The plan of the buffers' addresses (run() checks them), read after the copies on this stream.
            plan = _ffi.batch_prefill_paged_plan(qo_buf, ind_buf, ptr_buf, last_buf, int(page_size))
        self._plan = plan
        self._table = table
        self._max_qo_len = max_qo_len
        self._options = (bool(causal), int(window_left), softcap, 0.0 if sm_scale is None else float(sm_scale))

    def run(self, q: Any, paged_kv_cache: Any, *, q_scale: float | None = None, k_scale: float | None = None,
            v_scale: float | None = None, out: Any = None, lse: Any = None, return_lse: bool = False) -> Any:
        """out = the prefill of q (total_q, num_qo_heads, head_dim) over ``paged_kv_cache``
        (``(k_cache, v_cache)`` or one (max_pages, 2, ...) tensor, the wrapper's layout), or
        ``(out, lse)`` with ``return_lse`` (lse fp32 (total_q, num_qo_heads)). Scales must be None
        or 1 (FP8 prefill is not supported)."""
        op = "BatchPrefillWithPagedKVCacheWrapper.run"
        if self._table is None:
            raise RuntimeError(f"{op}: plan() first")
        for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
            if value not in (None, 1, 1.0):
                raise ValueError(f"{op}: argument '{name}': expected None or 1 (FP8 prefill is not supported), got {value}")
        layout, k_cache, v_cache = _paged_cache(op, paged_kv_cache, self._kv_layout)
        shape = _shape(q)
        out = _alloc.empty(q, shape) if out is None else out
        if lse is None and return_lse and len(shape) == 3:
            lse = _alloc.empty(q, shape[:2], "float32")
        qo_indptr, kv_indptr, kv_indices, kv_last = self._table
        causal, window_left, softcap, sm_scale = self._options
        _ffi.batch_prefill_paged_run(self._plan, q, qo_indptr, k_cache, v_cache, kv_indices, kv_indptr, kv_last, out, lse,
                                     layout, causal, window_left, softcap, sm_scale, PAGED_PREFILL_RUNGS)
        return (out, lse) if return_lse else out

    forward = run  # FlashInfer's older name
