"""flashlab attention as torch.library custom ops, so that torch.compile sees one opaque op per call
and torch autograd runs flashlab's backward.

flash_attn_interface imports this module the first time it is handed torch tensors (torch is then
loaded; flashlab never imports torch itself), and importing it registers, in namespace ``flashlab``:

* ``torch.ops.flashlab.attention_fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, q_descale,
  k_descale, v_descale, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
  softcap, return_attn_probs, deterministic, rung, dropout_p=0.0, dropout_seed=None, need_lse=True) ->
  (out, softmax_lse, attn_probs)``: the C++ ``attention_fwd``. softmax_lse is written when
  ``need_lse`` (16-bit inputs: the backward reads it) or ``return_attn_probs``, else left unwritten
  (its contents undefined; the kernels run without the LSE stores); :func:`forward` asks for it only
  where autograd will need it. attn_probs is a 0-element tensor unless ``return_attn_probs``.
  ``deterministic`` is the backward's choice, kept for it.
* ``torch.ops.flashlab.attention_bwd(q, k, v, out, dout, softmax_lse, alibi_slopes, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
  deterministic, rung, dropout_p=0.0, dropout_seed=None) -> (dq, dk, dv)``: the C++ ``attention_bwd``.

Dropout: ``dropout_seed`` is a 1-element int64 tensor holding the Philox seed's bits, None meaning
seed 0 (the dropout offset is always 0 here). The real kernels read it with ``.item()`` (keep it on
the CPU: no device sync); it is a tensor, not an int, so that the draw that makes it
(:func:`forward`: ``torch.randint`` on torch's default CPU generator) is traced by torch.compile as
part of the graph, a fresh seed every run of it, while each op stays opaque. The autograd context
keeps the forward's seed tensor and dropout_p, so the backward regenerates the forward's mask.

Both allocate their outputs and write into no input (``mutates_args=()``); their fake kernels
allocate through the same function as the real ones, so shapes and dtypes agree by construction.
The autograd formula of attention_fwd calls attention_bwd (forward options saved in the context);
softmax_lse and attn_probs are not differentiable. Needs torch >= 2.4 (``torch.library.custom_op``).
Varlen is told from cu_seqlens: either given means varlen (C++ then insists on both).
"""

import operator
from typing import Any, Optional

import torch
from torch import Tensor

from . import flash_attn_interface as _fa

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flashlab: torch tensors need torch >= 2.4 (torch.library.custom_op), got torch "
                      f"{torch.__version__}")


def _fwd_outputs(q: Tensor, k: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, return_attn_probs: bool) -> tuple[Tensor, Tensor, Tensor]:
    """New (out, softmax_lse, attn_probs) for the forward, real or fake; attn_probs (0,) when not
    asked for."""
    lse_shape, probs_shape = _fa._output_shapes(
        tuple(q.shape), tuple(k.shape), () if cu_seqlens_q is None else tuple(cu_seqlens_q.shape),
        cu_seqlens_q is not None or cu_seqlens_k is not None, max_seqlen_q, max_seqlen_k)
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return (q.new_empty(q.shape, dtype=out_dtype), q.new_empty(lse_shape, dtype=torch.float32),
            q.new_empty(probs_shape if return_attn_probs else (0,)))


@torch.library.custom_op("flashlab::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                  cu_seqlens_k: Optional[Tensor], q_descale: Optional[Tensor], k_descale: Optional[Tensor],
                  v_descale: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float],
                  causal: bool, window_left: int, window_right: int, softcap: float, return_attn_probs: bool,
                  deterministic: bool, rung: int, dropout_p: float = 0.0,
                  dropout_seed: Optional[Tensor] = None, need_lse: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    out, lse, probs = _fwd_outputs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_attn_probs)
    # The LSE only where it is read. Without it the kernels skip its computation and stores: on an
    # H100 (2026-11-27, bench/experiments/attention_input_dist.py --paths) 1.9% of the call at head
    # dim 64 and 512 keys, 0.4-1.1% at 128 / 256 and 512 (5.9% and 2% before 5e4604a made the LSE
    # cheaper in the kernels). FP8 has no backward (and no attn_probs:
    # return_attn_probs is rejected below, as before), so its lse is never needed: there the kernel
    # that sums P by the tensor cores runs (faster; src/attention_hopper_hdim.cuh).
    want_lse = return_attn_probs or (need_lse and q.dtype != torch.float8_e4m3fn)
    _fa.attention_fwd(q, k, v, out, softmax_lse=lse if want_lse else None, attn_probs=probs if return_attn_probs else None,
                      alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                      window_left=window_left, window_right=window_right, softcap=softcap, q_descale=q_descale,
                      k_descale=k_descale, v_descale=v_descale, rung=rung, dropout_p=dropout_p,
                      dropout_seed=_seed(dropout_seed))
    return out, lse, probs


def _seed(dropout_seed: Optional[Tensor]) -> int:
    # Real tensors only (the fake kernels never read it): an int64's bits, which the binding takes.
    return 0 if dropout_seed is None else int(dropout_seed.item())


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale, v_descale,
                        max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                        return_attn_probs, deterministic, rung, dropout_p=0.0, dropout_seed=None, need_lse=True):
    return _fwd_outputs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_attn_probs)


@torch.library.custom_op("flashlab::attention_bwd", mutates_args=())
def attention_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, softmax_lse: Tensor,
                  alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                  max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float], causal: bool, window_left: int,
                  window_right: int, softcap: float, deterministic: bool, rung: int, dropout_p: float = 0.0,
                  dropout_seed: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    # The kernels read dout with 16-byte aligned rows and a unit head-dim stride; autograd may hand
    # over an expanded, strided or misaligned (a view at an odd offset) gradient. Real tensors only
    # here: the fake kernel never asks for a data pointer.
    if not dout.is_contiguous() or dout.data_ptr() % 16 != 0:
        dout = dout.clone(memory_format=torch.contiguous_format)
    dq, dk, dv = (x.new_empty(x.shape) for x in (q, k, v))
    return _fa.attention_bwd(q, k, v, out, dout, softmax_lse, dq, dk, dv, alibi_slopes=alibi_slopes,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                             window_left=window_left, window_right=window_right, softcap=softcap,
                             deterministic=deterministic, rung=rung, dropout_p=dropout_p,
                             dropout_seed=_seed(dropout_seed))


@attention_bwd.register_fake
def _attention_bwd_fake(q, k, v, out, dout, softmax_lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic, rung,
                        dropout_p=0.0, dropout_seed=None):
    return tuple(x.new_empty(x.shape) for x in (q, k, v))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    (q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, _q_descale, _k_descale, _v_descale, max_seqlen_q, max_seqlen_k,
     softmax_scale, causal, window_left, window_right, softcap, _return_attn_probs, deterministic, _rung, dropout_p,
     dropout_seed, _need_lse) = inputs  # defaults filled in by torch
    out, lse, probs = output
    # The seed tensor and dropout_p too: the backward regenerates the forward's dropout mask.
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, dropout_seed)
    ctx.options = dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                       causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
                       deterministic=deterministic, dropout_p=dropout_p)
    ctx.mark_non_differentiable(lse, probs)


def _backward(ctx: Any, dout: Tensor, _dlse: Any, _dprobs: Any) -> tuple[Optional[Tensor], ...]:
    q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, dropout_seed = ctx.saved_tensors
    if q.dtype == torch.float8_e4m3fn:
        raise NotImplementedError(_fa._NO_FP8_BACKWARD)
    # The backward's rung is its own, not the forward's (auto: 3 on Hopper for head dims 64, 128 and
    # 256 (256 without softcap) without dropout, else 2; rung 1 with deterministic=True).
    dq, dk, dv = torch.ops.flashlab.attention_bwd.default(q, k, v, out, dout, lse, alibi_slopes, cu_seqlens_q,
                                                          cu_seqlens_k, rung=_fa._RUNG_AUTO, dropout_seed=dropout_seed,
                                                          **ctx.options)
    return (dq, dk, dv) + (None,) * 19  # nothing for the forward's other 19 arguments


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# Dropout seeds are drawn from [0, _SEED_END): 63 random bits, not 64, because Inductor's CPU randint
# computes high - low in int64, which the full int64 range overflows.
_SEED_END = (1 << 63) - 1


def _int(x: Any) -> Any:
    # A SymInt (torch.compile, dynamic shapes) goes into the op as it is.
    return x if isinstance(x, (int, torch.SymInt)) else operator.index(x)


def forward(q: Tensor, k: Tensor, v: Tensor, *, return_attn_probs: bool, alibi_slopes: Optional[Tensor],
            cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: Any, max_seqlen_k: Any,
            softmax_scale: Any, causal: Any, window_left: int, window_right: int, softcap: Any,
            descales: tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]], deterministic: Any,
            rung: Optional[int], dropout_p: Any = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """attention_fwd with flash_attn_interface's arguments (Python scalars of any numeric type). With
    dropout, a fresh seed from torch's default CPU generator (torch.manual_seed reproduces it)."""
    dropout_p = float(dropout_p)
    seed = torch.randint(0, _SEED_END, (1,), dtype=torch.int64, device="cpu") if dropout_p != 0 else None
    # The LSE is read by the backward only: written where autograd will run it.
    need_lse = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    return torch.ops.flashlab.attention_fwd.default(
        q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *descales, _int(max_seqlen_q), _int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), bool(causal), int(window_left), int(window_right),
        float(softcap), bool(return_attn_probs), bool(deterministic), _fa._RUNG_AUTO if rung is None else _int(rung),
        dropout_p, seed, need_lse)

