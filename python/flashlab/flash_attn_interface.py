"""Attention forward, drop-in for flash-attn 2.x's Python API (C++: include/flashlab/attention.h).

``flash_attn_func`` and its varlen / packed variants take flash-attn's arguments, names, defaults
and return conventions; each adds the keyword ``impl`` (the rung, 1..ATTN_FWD_RUNGS; None: the
top rung that runs here: 4 on Hopper (sm_90) for head dims 64..256 without dropout, else 3).
What differs from flash-attn:

* differentiable: torch tensors go through the custom ops ``torch.ops.flashlab.attention_fwd`` /
  ``attention_bwd`` (``_torch_ops``, registered when the first torch tensors come in), so
  torch.compile sees one opaque op per call (no graph break) and autograd's backward runs
  ``attention_bwd`` on its automatic choice: rung 3 (Hopper, TMA + wgmma) on sm_90 for head dims 64,
  128 and 256 (256 without softcap) without dropout, else rung 2 (FlashAttention-2 style); with ``deterministic=True`` rung 1,
  the naive one (slow); not for FP8 inputs;
* dropout (``dropout_p`` in [0, 1)) runs on some rungs only (include/flashlab/attention.h: forward
  1 and 3, backward 1 and 2; the automatic choices take forward rung 3 and backward rung 2; other
  ``impl`` values are rejected), not with FP8. Each call draws a fresh Philox seed (offset 0):
  torch tensors from torch's default CPU generator (``torch.manual_seed`` makes runs reproducible;
  under torch.compile the draw is part of the graph), other DLPack producers from Python's
  ``random`` module (``random.seed``). The backward reuses the forward's seed, so it regenerates
  the forward's mask. A call captured into a CUDA graph keeps the seed it drew at capture: every
  replay repeats that mask;
* paged KV: ``flash_attn_varlen_func(..., block_table=)`` runs the paged prefill
  (``batch_prefill_paged``: k, v are the (num_blocks, page_block_size, nheads_k, headdim) caches,
  ``cu_seqlens_k`` each sequence's length; forward only, torch tensors, no dropout / ALiBi / FP8 /
  ``return_attn_probs``, a right window of -1 or 0; outside a CUDA-graph capture the lengths are
  read back and checked against the block table's capacity, a synchronization);
  ``flash_attn_with_kvcache`` is in
  ``kvcache.py``; the other functions reject ``block_table``;
* head dims are 32, 64, 96, 128, 192 or 256 (flash-attn pads others; flashlab refuses them);
* with ``return_attn_probs`` the third value ``S_dmask`` is the normalised probabilities
  exp(s_ij - lse_i) in q's dtype, (batch, nheads, seqlen_q, seqlen_k) (varlen: padded to
  (batch, nheads, max_seqlen_q, max_seqlen_k) with zeros), with flash-attn's dropout convention: a
  dropped entry is written -p_ij (its sign bit is the mask; a dropped 0 is -0.0); softmax_lse is
  the lse before dropout;
* ``softmax_scale <= 0`` (or NaN) means the default 1/sqrt(headdim), as in the C++ API;
* FP8 as FlashAttention-3 takes it: ``flash_attn_func`` and ``flash_attn_varlen_func`` accept
  e4m3 (``float8_e4m3fn``) q, k, v with optional fp32 ``q_descale``, ``k_descale``, ``v_descale``
  (one element, or (batch, nheads_kv)) and return bf16; head dim 128 on Hopper only (rung 4).
  Forward only, without ``return_attn_probs``; these compute no lse for it (the faster kernel,
  which sums P by the tensor cores, runs); ``attention_fwd`` with ``softmax_lse`` gives one.

Masks are aligned bottom-right (flash-attn >= 2.1): with sq / sk a batch's lengths, row i sees
keys j in [i + sk - sq - window_left, i + sk - sq + window_right], -1 (any negative size, as
flash-attn) meaning unbounded, and
causal is window_right = 0. A row that sees no key gives 0 output and -inf lse.

Argument checks are in C++ (ValueError naming the op, the argument, what was expected and what
was given); only what C++ never sees is checked here (window_size, packed tensors, block_table,
the range of a Python-int dropout_seed). Tensors are any DLPack producer (torch, CuPy, JAX, ...);
torch is only looked up once the caller has imported it, never imported here.
"""

from __future__ import annotations

import operator
import random
import sys
from typing import Any

from . import _alloc
from . import _ffi  # set by __init__ before this module is imported

# 1 naive (S in global memory), 2 FlashAttention-1 (tiled, online softmax, CUDA cores),
# 3 FlashAttention-2 (mma.sync + ldmatrix + cp.async, exp2 softmax), 4 Hopper (TMA, wgmma, warp
# specialization, pingpong; sm_90, head dims 64..256) (top)
ATTN_FWD_RUNGS = 4
_RUNG_AUTO = -1  # C++ kAttnFwdRungAuto: 4 where it runs, else 3

# 1 naive (P and dS materialised in global memory; deterministic), 2 FlashAttention-2 style (mma.sync,
# P recomputed per block, dQ by fp32 atomics), 3 Hopper (TMA, wgmma, warp specialization; sm_90, head
# dims 64, 128 and 256 (256 without softcap), no dropout, positive strides on q, k, v, dout; dQ by fp32 atomics) (top).
# Automatic: 3 where it runs, else 2 (an expanded dout, stride 0, takes 2); ``deterministic=True``
# takes rung 1.
ATTN_BWD_RUNGS = 3

_NO_FP8_BACKWARD = ("flashlab: no backward for FP8 (e4m3) attention (forward only). Call with inputs that "
                    "do not require grad, or under torch.no_grad().")


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in x.shape)


def _plain(x: Any) -> Any:
    # torch will not export a tensor that requires grad through DLPack; the kernels record no
    # autograd of their own (for torch tensors, flash_attn_* go through _torch_ops' custom ops, whose
    # autograd formula calls attention_bwd).
    return x.detach() if getattr(x, "requires_grad", False) else x


def attention_fwd(q: Any, k: Any, v: Any, out: Any = None, *, softmax_lse: Any = None, attn_probs: Any = None,
                  alibi_slopes: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                  max_seqlen_q: int = 0, max_seqlen_k: int = 0, softmax_scale: float | None = None,
                  causal: bool = False, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                  q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
                  rung: int | None = None, dropout_p: float = 0.0, dropout_seed: int = 0,
                  dropout_offset: int = 0) -> Any:
    """The C++ ``flashlab::attention_fwd`` as it is: no autograd, outputs given or not. Returns ``out``.

    ``out`` defaults to a new tensor like ``q`` (bf16 for e4m3 q); ``softmax_lse`` and ``attn_probs``
    are written only when given (attn_probs needs softmax_lse too). Shapes as
    include/flashlab/attention.h says. Dropout: ``dropout_p`` in [0, 1) (0: none), the mask a function
    of ``dropout_seed`` (a uint64; a negative int64 is taken as its bits) and ``dropout_offset``
    (0 .. 2^32 - 1) alone: the caller picks a new seed or offset for every call that must not repeat
    a mask, and gives the same three to :func:`attention_bwd`.
    """
    if out is None:
        out = _alloc.empty(q, _shape(q), "bfloat16" if _is_e4m3(q) else None)
    q, k, v, alibi_slopes = _plain(q), _plain(k), _plain(v), _plain(alibi_slopes)
    _ffi.attention_fwd(q, k, v, out, softmax_lse, attn_probs, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                       int(max_seqlen_q), int(max_seqlen_k), softmax_scale, bool(causal), window_left,
                       window_right, float(softcap), q_descale, k_descale, v_descale,
                       _RUNG_AUTO if rung is None else rung, float(dropout_p),
                       _seed_bits("attention_fwd", dropout_seed), dropout_offset)
    return out


def attention_bwd(q: Any, k: Any, v: Any, out: Any, dout: Any, softmax_lse: Any, dq: Any = None, dk: Any = None,
                  dv: Any = None, *, alibi_slopes: Any = None, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                  max_seqlen_q: int = 0, max_seqlen_k: int = 0, softmax_scale: float | None = None,
                  causal: bool = False, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                  deterministic: bool = False, rung: int | None = None, dropout_p: float = 0.0,
                  dropout_seed: int = 0, dropout_offset: int = 0) -> tuple[Any, Any, Any]:
    """The C++ ``flashlab::attention_bwd``: gradients of ``sum(dout * out)`` for ``out =
    attention_fwd(q, k, v, ...)`` with the same options, from the forward's ``softmax_lse``; with
    dropout, the forward's ``dropout_p``, ``dropout_seed`` and ``dropout_offset`` (they regenerate its
    mask). ``rung`` None: 3 on Hopper for head dims 64, 128 and 256 (256 without softcap) without
    dropout, else 2; rung 1 with ``deterministic`` (rungs 2 and 3 refuse it: their dQ atomics add
    in a varying order).

    ``dq`` / ``dk`` / ``dv`` default to new tensors like ``q`` / ``k`` / ``v``. Returns ``(dq, dk, dv)``.
    """
    dq = _alloc.empty(q, _shape(q)) if dq is None else dq
    dk = _alloc.empty(k, _shape(k)) if dk is None else dk
    dv = _alloc.empty(v, _shape(v)) if dv is None else dv
    q, k, v, out, dout = _plain(q), _plain(k), _plain(v), _plain(out), _plain(dout)
    _ffi.attention_bwd(q, k, v, out, dout, dq, dk, dv, softmax_lse, _plain(alibi_slopes), cu_seqlens_q, cu_seqlens_k,
                       int(max_seqlen_q), int(max_seqlen_k), softmax_scale, bool(causal), window_left, window_right,
                       float(softcap), bool(deterministic), _RUNG_AUTO if rung is None else rung, float(dropout_p),
                       _seed_bits("attention_bwd", dropout_seed), dropout_offset)
    return dq, dk, dv


def _seed_bits(op: str, seed: Any) -> int:
    """A uint64 dropout seed (or an int64, taken as its bits) as the int64 of the same bits, which
    the binding takes."""
    seed = operator.index(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"{op}: argument 'dropout_seed': expected an integer in [-2^63, 2^64) (a uint64 seed, or "
                         f"the int64 of its bits), got {seed}")
    return seed - (1 << 64) if seed >= (1 << 63) else seed


def _is_e4m3(x: Any) -> bool:
    # torch.float8_e4m3fn, ml_dtypes' float8_e4m3fn, ...: the name is the common ground.
    return "float8_e4m3" in str(getattr(x, "dtype", ""))


# ---------------------------------------------------------------------------------------------
# flash-attn's argument handling: only what C++ never sees.

def _paged_varlen(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, window, softcap,
                  alibi_slopes, dropout_p, return_attn_probs, block_table, impl, descales):
    """flash_attn_varlen_func over a paged cache (``block_table``): the paged prefill, forward only."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        raise TypeError(f"{fn}: argument 'q': expected a torch tensor with 'block_table' (its page table is built "
                        f"with torch ops), got {type(q).__name__}")
    unsupported = {"dropout_p": dropout_p != 0, "alibi_slopes": alibi_slopes is not None,
                   "return_attn_probs": bool(return_attn_probs), "impl": impl is not None,
                   "q_descale": descales[0] is not None, "k_descale": descales[1] is not None,
                   "v_descale": descales[2] is not None}
    for name, present in unsupported.items():
        if present:
            raise NotImplementedError(f"{fn}: argument '{name}': not supported with 'block_table' (the paged prefill)")
    left, right = window
    if right not in (-1, 0):
        raise ValueError(f"{fn}: argument 'window_size': expected a right window of -1 or 0 with 'block_table', got {right}")
    if q.requires_grad or k.requires_grad or v.requires_grad:
        raise NotImplementedError(f"{fn}: the paged prefill ('block_table') has no backward: pass tensors that do not "
                                  "require grad")
    from .kvcache import capturing, check_block_table, csr_page_table
    from .serving import batch_prefill_paged
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{fn}: argument '{name}': expected the paged cache (num_blocks, page_block_size, nheads_k, "
                             f"headdim) with 'block_table', got {list(x.shape)}")
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != 1 or x.shape[0] < 1 or \
                x.shape != cu_seqlens_q.shape:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{fn}: argument '{name}': expected int32 (batch + 1,), cu_seqlens_k as cu_seqlens_q, "
                             f"got {got}")
    batch = cu_seqlens_q.shape[0] - 1
    check_block_table(torch, fn, block_table, batch)
    page_size = int(k.shape[1])
    seqlen_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    if not capturing(torch, q):  # one device read: the lengths must fit the block table
        capacity = block_table.shape[1] * page_size
        for b, n in enumerate(seqlen_k.tolist()):
            if not 0 <= n <= capacity:
                raise ValueError(f"{fn}: argument 'cu_seqlens_k': expected non-decreasing values, sequence lengths <= "
                                 f"{capacity} (block_table's {block_table.shape[1]} blocks of page_block_size "
                                 f"{page_size}), got {n} for sequence {b}")
    kv_indices, kv_indptr, last = csr_page_table(torch, block_table, seqlen_k, page_size, int(k.shape[0]))
    return batch_prefill_paged(q, cu_seqlens_q, (k, v), kv_indices, kv_indptr, last, causal=bool(causal) or right == 0,
                               window_left=int(left), logits_soft_cap=float(softcap) if softcap else None,
                               sm_scale=softmax_scale, max_qo_len=int(max_seqlen_q))


def _window(fn: str, window_size: Any) -> tuple[int, int]:
    """(left, right) as ints, a negative side as -1: flash-attn takes any negative size as unbounded
    (the C++ API takes only -1)."""
    try:
        left, right = window_size
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: argument 'window_size': expected (left, right) ints, got {window_size!r}") from None
    return max(left, -1), max(right, -1)


def _check_packed(fn: str, name: str, x: Any, layout: str, dim: int, count: int) -> None:
    shape = _shape(x)
    if len(shape) != layout.count(",") + 1 or shape[dim] != count:
        raise ValueError(f"{fn}: argument '{name}': expected shape {layout}, got {list(shape)}")


def _split(x: Any, dim: int, count: int) -> tuple[Any, ...]:
    """x split along `dim` (of size `count`): qkv -> (q, k, v), kv -> (k, v); views, no copies."""
    index = (slice(None),) * dim
    return tuple(x[index + (i,)] for i in range(count))


def _output_shapes(q_shape: tuple[Any, ...], k_shape: tuple[Any, ...], cu_seqlens_q_shape: tuple[Any, ...],
                   varlen: bool, max_seqlen_q: Any, max_seqlen_k: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The shapes of (softmax_lse, attn_probs), for both paths (the torch path's may hold SymInts).
    Sizes that cannot be read off a wrongly shaped q, k or cu_seqlens_q are 0: C++ rejects those
    arguments before it looks at the outputs."""
    if varlen:
        total_q, nheads = (q_shape[0], q_shape[1]) if len(q_shape) == 3 else (0, 0)
        batch = max(cu_seqlens_q_shape[0] - 1, 0) if len(cu_seqlens_q_shape) == 1 else 0
        return (nheads, total_q), (batch, nheads, max(max_seqlen_q, 0), max(max_seqlen_k, 0))
    b, sq, nheads = (q_shape[0], q_shape[1], q_shape[2]) if len(q_shape) == 4 else (0, 0, 0)
    return (b, nheads, sq), (b, nheads, sq, k_shape[1] if len(k_shape) == 4 else 0)


# ---------------------------------------------------------------------------------------------
# One call of the forward: torch tensors through the torch.library custom ops (_torch_ops:
# autograd, torch.compile), any other DLPack producer straight into attention_fwd.

def _custom_ops(tensors: tuple[Any, ...]) -> Any:
    """The module _torch_ops when tensors[:3] (q, k, v) are torch tensors and the rest torch tensors
    or None, else None. torch is only looked up, never imported."""
    torch = sys.modules.get("torch")
    if torch is None or not all(isinstance(t, torch.Tensor) for t in tensors[:3]) or \
            not all(t is None or isinstance(t, torch.Tensor) for t in tensors[3:]):
        return None
    # The first import registers the ops. Under torch.compile, dynamo runs this import for real
    # while tracing, so a first call inside a compiled function works too.
    from . import _torch_ops
    return _torch_ops


def _attend(q: Any, k: Any, v: Any, *, return_attn_probs: bool, softmax_scale: Any, causal: bool,
            window: tuple[Any, Any], softcap: float, alibi_slopes: Any, cu_seqlens_q: Any = None,
            cu_seqlens_k: Any = None, max_seqlen_q: int = 0, max_seqlen_k: int = 0, impl: int | None = None,
            descales: tuple[Any, Any, Any] = (None, None, None), deterministic: bool = False,
            dropout_p: float = 0.0) -> Any:
    """The forward with these options (varlen when cu_seqlens are given); flash-attn's return: out, or
    (out, softmax_lse, attn_probs). With dropout, a fresh seed per call (offset 0): torch's default
    CPU generator for torch tensors (drawn in _torch_ops.forward), Python's ``random`` otherwise."""
    options = dict(alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                   window_left=window[0], window_right=window[1], softcap=softcap)
    ops = _custom_ops((q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *descales))
    if ops is not None:
        out, lse, probs = ops.forward(q, k, v, return_attn_probs=return_attn_probs, descales=descales,
                                      deterministic=deterministic, rung=impl, dropout_p=dropout_p, **options)
        return (out, lse, probs) if return_attn_probs else out
    lse, probs = None, None
    if return_attn_probs:
        cu_shape = () if cu_seqlens_q is None else _shape(cu_seqlens_q)
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        lse_shape, probs_shape = _output_shapes(_shape(q), _shape(k), cu_shape, varlen, int(max_seqlen_q),
                                                int(max_seqlen_k))
        lse, probs = _alloc.empty(q, lse_shape, "float32"), _alloc.empty(q, probs_shape)
    # No autograd here, so nothing keeps the seed: a caller that wants the backward of a dropout
    # forward calls attention_fwd / attention_bwd with a seed of its own.
    seed = random.getrandbits(64) if dropout_p != 0 else 0
    out = attention_fwd(q, k, v, softmax_lse=lse, attn_probs=probs, q_descale=descales[0], k_descale=descales[1],
                        v_descale=descales[2], rung=impl, dropout_p=dropout_p, dropout_seed=seed, **options)
    return (out, lse, probs) if return_attn_probs else out


# ---------------------------------------------------------------------------------------------
# flash-attn 2.x's functions.

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, q_descale=None,
                    k_descale=None, v_descale=None, impl=None):
    """Attention over fixed-length batches.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim), nheads a
    multiple of nheads_kv (GQA / MQA); fp16 or bf16; any batch/row/head strides with a contiguous
    head dim (multiples of 8 elements, 16-byte aligned). alibi_slopes: fp32 (nheads,) or (batch,
    nheads). ``deterministic``: bit-identical gradients run to run (the backward then takes its
    naive rung 1). FP8: e4m3 q, k, v (head dim 128, Hopper) with optional fp32 descale factors (one
    element or (batch, nheads_kv)); out bf16.
    ``dropout_p``: in [0, 1), each probability dropped with that chance (a fresh mask per call, the
    same one in the backward; not every rung has it, see the module docstring).

    Returns out (batch, seqlen_q, nheads, headdim), or with ``return_attn_probs``
    ``(out, softmax_lse, S_dmask)``: softmax_lse fp32 (batch, nheads, seqlen_q), S_dmask the
    probabilities (batch, nheads, seqlen_q, seqlen_k) in q's dtype, dropped ones negated.
    """
    fn = "flash_attn_func"
    return _attend(q, k, v, return_attn_probs=return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, window=_window(fn, window_size), softcap=softcap, alibi_slopes=alibi_slopes,
                   impl=impl, descales=(q_descale, k_descale, v_descale), deterministic=deterministic,
                   dropout_p=dropout_p)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, q_descale=None,
                           k_descale=None, v_descale=None, impl=None):
    """Attention over variable-length batches packed along the rows.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_kv, headdim); cu_seqlens_q / _k: int32
    (batch + 1,) row offsets (0 first, non-decreasing; a batch entry may be empty); max_seqlen_q /
    _k: at least every batch's length. Otherwise as :func:`flash_attn_func`.

    Returns out (total_q, nheads, headdim), or ``(out, softmax_lse, S_dmask)`` with softmax_lse fp32
    (nheads, total_q) and S_dmask (batch, nheads, max_seqlen_q, max_seqlen_k), zero past a batch's
    lengths.
    """
    fn = "flash_attn_varlen_func"
    if block_table is not None:
        return _paged_varlen(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal,
                             _window(fn, window_size), softcap, alibi_slopes, dropout_p, return_attn_probs, block_table,
                             impl, (q_descale, k_descale, v_descale))
    return _attend(q, k, v, return_attn_probs=return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, window=_window(fn, window_size), softcap=softcap, alibi_slopes=alibi_slopes,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                   max_seqlen_k=max_seqlen_k, impl=impl, descales=(q_descale, k_descale, v_descale),
                   deterministic=deterministic, dropout_p=dropout_p)


def _packed(fn: str, name: str, packed: Any, layout: str, dim: int, count: int, q: Any, dropout_p: float,
            window_size: Any, return_attn_probs: bool, **options: Any) -> Any:
    """The packed variants: flash-attn's checks, then q, k, v (count 3) or k, v beside q (count 2)
    split out of ``packed`` along ``dim`` and run like the unpacked functions (``options``: _attend's)."""
    window = _window(fn, window_size)
    _check_packed(fn, name, packed, layout, dim, count)
    # Views of `packed`: autograd takes the gradients of q, k, v back into it.
    inputs = _split(packed, dim, 3) if count == 3 else (q, *_split(packed, dim, 2))
    return _attend(*inputs, return_attn_probs=return_attn_probs, window=window, dropout_p=dropout_p, **options)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              impl=None):
    """:func:`flash_attn_func` with q, k, v packed: qkv (batch, seqlen, 3, nheads, headdim)."""
    return _packed("flash_attn_qkvpacked_func", "qkv", qkv, "(batch, seqlen, 3, nheads, headdim)", 2, 3, None,
                   dropout_p, window_size, return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, softcap=softcap, alibi_slopes=alibi_slopes, impl=impl,
                   deterministic=deterministic)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             impl=None):
    """:func:`flash_attn_func` with k, v packed: kv (batch, seqlen_k, 2, nheads_kv, headdim)."""
    return _packed("flash_attn_kvpacked_func", "kv", kv, "(batch, seqlen_k, 2, nheads_kv, headdim)", 2, 2, q,
                   dropout_p, window_size, return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, softcap=softcap, alibi_slopes=alibi_slopes, impl=impl,
                   deterministic=deterministic)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, impl=None):
    """:func:`flash_attn_varlen_func` with q, k, v packed: qkv (total, 3, nheads, headdim), one
    cu_seqlens and max_seqlen for queries and keys."""
    return _packed("flash_attn_varlen_qkvpacked_func", "qkv", qkv, "(total, 3, nheads, headdim)", 1, 3, None,
                   dropout_p, window_size, return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens,
                   cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, impl=impl,
                   deterministic=deterministic)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, impl=None):
    """:func:`flash_attn_varlen_func` with k, v packed: kv (total_k, 2, nheads_kv, headdim)."""
    return _packed("flash_attn_varlen_kvpacked_func", "kv", kv, "(total_k, 2, nheads_kv, headdim)", 1, 2, q,
                   dropout_p, window_size, return_attn_probs, softmax_scale=softmax_scale,
                   causal=causal, softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, impl=impl,
                   deterministic=deterministic)


# flash-attn's inference entry point (python/flashlab/kvcache.py), importable from here as from flash_attn.
from .kvcache import flash_attn_with_kvcache  # noqa: E402,F401
