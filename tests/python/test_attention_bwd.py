"""Attention backward from Python: flashlab.attention_bwd and the gradients of the flash-attn 2.x
drop-ins (flash_attn_func, flash_attn_varlen_func and the packed variants, through torch autograd).

CPU part: validation messages from C++ through the bindings with test_bindings' `fake` tensors
(they claim to be on cuda:0 and fail validation before anything runs): the backward's own checks
(rung, softmax_lse, dtypes, dout / dq / dk / dv shapes, layouts, overlaps, what rung 3 takes) and
the forward's checks, which the backward shares, under the name attention_bwd.

GPU part: dq, dk, dv against a float64 reference computed by torch autograd through
test_attention's `_attend` (gradients of sum(out * dout)). Tolerance (numerics.check_close): 2x the
error of the same autograd computation in the input dtype, plus one unit roundoff of the input
dtype times max|ref|. Rows that see no key get dq exactly 0, keys that no row sees dk = dv = 0.
Sizes stay small: backward rung 1 (deterministic=True, rung=1) materialises P and dS.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashlab
from numerics import check_close
from test_attention import (MB, _attend, _aux, _cu, _fixed, _fp8_inputs, _hopper_here, _keep, _np, _opts, _randn,
                            _slopes, _varlen)
from test_bindings import _HOST_BASE, fake, gpu, raises, torch


# ---------------------------------------------------------------------------------------------
# CPU: C++ validation messages through the bindings.

def _grads(b=2, sq=17, sk=33, h=4, hkv=2, d=64, dtype="float16", **kw):
    """Fake dout, dq, dk, dv (fixed length) past q, k, v, out and the lse (slots 1..4 of _aux);
    kw: '<name>_shape', '<name>_dtype', '<name>_strides' override one tensor."""
    shapes = {"dout": [b, sq, h, d], "dq": [b, sq, h, d], "dk": [b, sk, hkv, d], "dv": [b, sk, hkv, d]}
    return tuple(_aux(kw.get(f"{n}_shape", s), kw.get(f"{n}_dtype", dtype), slot=1 + i, strides=kw.get(f"{n}_strides"))
                 for i, (n, s) in enumerate(shapes.items()))


def _args(b=2, sq=17, sk=33, h=4, hkv=2, d=64, dtype="float16", lse_shape=None, lse_dtype="float32", **kw):
    """[q, k, v, out, dout, softmax_lse, dq, dk, dv] (attention_bwd's positional order), all fake;
    kw as _fixed's and _grads'."""
    q, k, v, out = _fixed(b, sq, sk, h, hkv, d, dtype, **kw)
    dout, dq, dk, dv = _grads(b, sq, sk, h, hkv, d, dtype, **kw)
    return [q, k, v, out, dout, _aux(lse_shape or [b, h, sq], lse_dtype), dq, dk, dv]


def _call(args, **kw):
    return flashlab.attention_bwd(*args, **kw)


def _with(args, **tensors):
    """args with some of them replaced by name."""
    names = ["q", "k", "v", "out", "dout", "softmax_lse", "dq", "dk", "dv"]
    return [tensors.get(n, a) for n, a in zip(names, args)]


def test_rungs_constant_and_exports():
    assert flashlab.ATTN_BWD_RUNGS == 3
    assert "attention_bwd" in flashlab.__all__ and "ATTN_BWD_RUNGS" in flashlab.__all__
    from flashlab.flash_attn_interface import ATTN_BWD_RUNGS, attention_bwd
    assert attention_bwd is flashlab.attention_bwd and ATTN_BWD_RUNGS == flashlab.ATTN_BWD_RUNGS


@pytest.mark.parametrize("rung", [0, 4, 5, -2])
def test_bad_rung(rung):
    with raises(f"attention_bwd: argument 'rung': expected 1..3 or -1 (auto), got {rung}"):
        _call(_args(), rung=rung)


@pytest.mark.parametrize("rung", [2**40, -(2**40)])
def test_bad_rung_past_int32(rung):
    with raises(f"attention_bwd: argument 'rung': expected 1..3, got {rung}"):
        _call(_args(), rung=rung)


def test_rung_is_checked_first():
    with raises("attention_bwd: argument 'rung': expected 1..3 or -1 (auto), got 4"):
        _call(_with(_args(dtype="float32"), softmax_lse=None), rung=4)


@pytest.mark.parametrize("rung", [2, 3])
def test_deterministic_refused_by_the_atomic_rungs(rung):
    with raises(f"attention_bwd: argument 'deterministic': expected false for rung {rung} (its dQ atomics add in a "
                "varying order; rung 1 or auto is deterministic), got true"):
        _call(_args(), rung=rung, deterministic=True)


def test_rung3_rejections():
    # Rung 3 (TMA + wgmma): head dims 64, 128 and 256 (without softcap), no dropout, positive strides
    # on q, k, v and dout; checked in that order, after the shared and gradient checks. (Then sm_90:
    # needs a device.)
    for d in (32, 96, 192):
        with raises(f"attention_bwd: argument 'q': expected head dim (last dim) 64, 128 or 256 for rung 3, got {d}"):
            _call(_args(d=d), rung=3)
    with raises("attention_bwd: argument 'q': expected head dim (last dim) 64, 128 or 256 for rung 3, got 32"):
        _call(_args(d=32), rung=3, dropout_p=0.5)
    with raises("attention_bwd: argument 'softcap': expected 0 at head dim 256 for rung 3 (rung 2 or auto takes it), got 5"):
        _call(_args(d=256), rung=3, softcap=5.0)
    with raises("attention_bwd: argument 'dropout_p': expected 0 for rung 3 (rung 2 or auto takes dropout), got 0.5"):
        _call(_args(k_strides=[0, 128, 64, 1]), rung=3, dropout_p=0.5)  # (test_attention_dropout: alone)
    tma = "expected positive strides on every dim of size > 1 for rung 3 (TMA)"
    with raises(f"attention_bwd: argument 'k': {tma}, got strides [0, 128, 64, 1]"):
        _call(_args(k_strides=[0, 128, 64, 1]), rung=3)  # k broadcast over the batch
    with raises(f"attention_bwd: argument 'dout': {tma}, got strides [1088, 64, 0, 1]"):
        _call(_args(dout_strides=[1088, 64, 0, 1]), rung=3)  # dout broadcast over the heads
    with raises("attention_bwd: argument 'dq': expected shape [2, 17, 4, 32] (same as 'q'), got [2, 17, 4, 64]"):
        _call(_args(d=32, dq_shape=[2, 17, 4, 64]), rung=3)


def test_softmax_lse_is_required():
    with raises("attention_bwd: argument 'softmax_lse': expected the forward's log-sum-exp (the backward recomputes P "
                "from it), got none"):
        _call(_with(_args(), softmax_lse=None))


def test_numpy_inputs():
    # dq, dk, dv default to new arrays like q, k, v; C++ then rejects the host memory.
    q, k = np.zeros((1, 17, 2, 64), np.float16), np.zeros((1, 33, 2, 64), np.float16)
    lse = np.zeros((1, 2, 17), np.float32)
    with raises("attention_bwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.attention_bwd(q, k, k, q, q, lse)
    with raises("attention_bwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.attention_bwd(q, k, k, q, q, lse, causal=True, window_left=4, softcap=2.0, deterministic=True, rung=1)
    with raises("attention_bwd: argument 'softmax_lse': expected the forward's log-sum-exp (the backward recomputes P "
                "from it), got none"):
        flashlab.attention_bwd(q, k, k, q, q, None)
    with raises("attention_bwd: argument 'q': expected dtype fp16 or bf16, got fp32"):
        flashlab.attention_bwd(q.astype(np.float32), k, k, q, q, lse)


def test_dtypes():
    with raises("attention_bwd: argument 'q': expected dtype fp16 or bf16, got fp32"):
        _call(_args(dtype="float32"))
    with raises("attention_bwd: argument 'q': expected dtype fp16 or bf16, got e4m3"):  # no FP8 backward
        _call(_args(d=128, dtype="float8_e4m3fn", out_dtype="bfloat16", dout_dtype="bfloat16"))
    with raises("attention_bwd: argument 'k': expected dtype fp16 (same as 'q'), got bf16"):
        _call(_args(k_dtype="bfloat16"))
    with raises("attention_bwd: argument 'out': expected dtype bf16 (same as 'q'), got fp16"):
        _call(_args(dtype="bfloat16", out_dtype="float16"))
    with raises("attention_bwd: argument 'dout': expected dtype fp16 (same as 'q'), got bf16"):
        _call(_args(dout_dtype="bfloat16"))
    with raises("attention_bwd: argument 'dq': expected dtype bf16 (same as 'q'), got fp32"):
        _call(_args(dtype="bfloat16", dq_dtype="float32"))
    with raises("attention_bwd: argument 'dk': expected dtype fp16 (same as 'q'), got bf16"):
        _call(_args(dk_dtype="bfloat16"))
    with raises("attention_bwd: argument 'dv': expected dtype fp16 (same as 'q'), got fp32"):
        _call(_args(dv_dtype="float32"))
    with raises("attention_bwd: argument 'softmax_lse': expected dtype fp32, got fp16"):
        _call(_args(lse_dtype="float16"))


def test_gradient_shapes():
    with raises("attention_bwd: argument 'dout': expected shape [2, 17, 4, 64] (same as 'out'), got [2, 17, 4, 32]"):
        _call(_args(dout_shape=[2, 17, 4, 32]))
    with raises("attention_bwd: argument 'dout': expected shape [2, 17, 4, 64] (same as 'out'), got [2, 16, 4, 64]"):
        _call(_args(dout_shape=[2, 16, 4, 64]))
    with raises("attention_bwd: argument 'dq': expected shape [2, 17, 4, 64] (same as 'q'), got [2, 17, 2, 64]"):
        _call(_args(dq_shape=[2, 17, 2, 64]))
    with raises("attention_bwd: argument 'dk': expected shape [2, 33, 2, 64] (same as 'k'), got [2, 33, 4, 64]"):
        _call(_args(dk_shape=[2, 33, 4, 64]))  # dk is per KV head, like k
    with raises("attention_bwd: argument 'dv': expected shape [2, 33, 2, 64] (same as 'k'), got [2, 32, 2, 64]"):
        _call(_args(dv_shape=[2, 32, 2, 64]))
    with raises("attention_bwd: argument 'dout': expected 4 dims, got 3 dims, shape [17, 4, 64]"):
        _call(_args(dout_shape=[17, 4, 64]))
    with raises("attention_bwd: argument 'dq': expected 4 dims, got 5 dims, shape [2, 17, 4, 1, 64]"):
        _call(_args(dq_shape=[2, 17, 4, 1, 64]))


def test_gradient_layouts():
    with raises("attention_bwd: argument 'dout': expected unit stride in the last dim, got strides "
                "[8704, 512, 128, 2]"):
        _call(_args(dout_strides=[8704, 512, 128, 2]))
    with raises("attention_bwd: argument 'dk': expected strides that are multiples of 8 elements (16-byte aligned "
                "rows), got strides [4356, 132, 66, 1]"):
        _call(_args(dk_strides=[4356, 132, 66, 1]))
    addr = _HOST_BASE + 8 * 8 * MB + 8
    misaligned_dv = fake([2, 33, 2, 64], "float16", offset_bytes=8 * 8 * MB + 8)
    with raises(f"attention_bwd: argument 'dv': expected a data pointer aligned to 16 bytes, got address 0x{addr:x} "
                "(offset 8)"):
        _call(_with(_args(), dv=misaligned_dv))
    dq1 = fake([2, 17, 4, 64], "float16", device=(2, 1), offset_bytes=6 * 8 * MB)  # cuda:1
    with raises("attention_bwd: argument 'dq': expected a tensor on cuda:0 (same as 'q'), got cuda:1"):
        _call(_with(_args(), dq=dq1))
    with raises("attention_bwd: argument 'dout': expected a CUDA tensor, got cpu tensor"):
        _call(_with(_args(), dout=np.zeros((2, 17, 4, 64), np.float16)))
    # Several heads written through one address.
    with raises("attention_bwd: argument 'dq': expected strides under which no two elements share an address, got "
                "strides [1088, 64, 0, 1] for shape [2, 17, 4, 64]"):
        _call(_args(dq_strides=[1088, 64, 0, 1]))


def test_outputs_overlap_nothing():
    args = _args()
    with raises("attention_bwd: argument 'dq': expected memory disjoint from 'q', got the same memory as 'q'"):
        _call(_with(args, dq=fake([2, 17, 4, 64], "float16")))  # q's address
    with raises("attention_bwd: argument 'dk': expected memory disjoint from 'v' or identical to it, got a partial "
                "overlap"):
        _call(_with(args, dk=fake([2, 33, 2, 64], "float16", offset_bytes=2 * 8 * MB + 64)))
    with raises("attention_bwd: argument 'dv': expected memory disjoint from 'softmax_lse', got the same memory as "
                "'softmax_lse'"):
        _call(_with(args, dv=fake([2, 33, 2, 64], "float16", offset_bytes=4 * 8 * MB)))
    with raises("attention_bwd: argument 'dq': expected memory disjoint from 'dout', got the same memory as 'dout'"):
        _call(_with(args, dq=args[4]))
    with raises("attention_bwd: argument 'dk': expected memory disjoint from 'dv', got the same memory as 'dv'"):
        _call(_with(args, dk=args[8]))


def test_forward_checks_name_the_backward():
    with raises("attention_bwd: argument 'q': expected head dim (last dim) one of 32, 64, 96, 128, 192, 256, got 80"):
        _call(_args(d=80))
    with raises("attention_bwd: argument 'k': expected a number of heads that divides q's 4 (GQA/MQA), got 3"):
        _call(_args(h=4, hkv=3))
    with raises("attention_bwd: argument 'out': expected shape [2, 17, 4, 64] (same as 'q'), got [2, 17, 4, 32]"):
        _call(_args(out_shape=[2, 17, 4, 32]))
    with raises("attention_bwd: argument 'q': expected 4 dims, got 3 dims, shape [17, 4, 64]"):
        _call(_args(q_shape=[17, 4, 64]))
    with raises("attention_bwd: argument 'softmax_lse': expected shape [2, 4, 17], got [2, 17, 4]"):
        _call(_args(lse_shape=[2, 17, 4]))
    with raises("attention_bwd: argument 'window_left': expected >= -1 (-1: unbounded), got -2"):
        _call(_args(), window_left=-2)
    with raises("attention_bwd: argument 'window_right': expected >= -1 (-1: unbounded), got -5"):
        _call(_args(), window_right=-5)
    with raises("attention_bwd: argument 'softcap': expected a finite value >= 0, got -1"):
        _call(_args(), softcap=-1.0)
    with raises("attention_bwd: argument 'softmax_scale': expected a finite value, got inf"):
        _call(_args(), softmax_scale=1e300)
    with raises("attention_bwd: argument 'alibi_slopes': expected shape [4] or [2, 4], got [3]"):
        _call(_args(), alibi_slopes=_aux([3], slot=5))
    with raises("attention_bwd: argument 'alibi_slopes': expected dtype fp32, got bf16"):
        _call(_args(), alibi_slopes=_aux([4], "bfloat16", slot=5))


def test_varlen_arguments():
    # Only what fails before the cu_seqlens values are read from the device: every host-side check.
    q, k, v, out = _varlen()
    grads = [_aux([40, 4, 64], "float16", slot=1), _aux([40, 4, 64], "float16", slot=2),
             _aux([50, 2, 64], "float16", slot=3), _aux([50, 2, 64], "float16", slot=4)]
    cu_q, cu_k = _aux([3], "int32", slot=6), _aux([3], "int32", slot=7)
    args = [q, k, v, out, grads[0], _aux([4, 40]), *grads[1:]]
    with raises("attention_bwd: arguments 'cu_seqlens_q' and 'cu_seqlens_k': expected both or neither, "
                "got only 'cu_seqlens_k'"):
        _call(args, cu_seqlens_k=cu_k, max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_bwd: argument 'softmax_lse': expected shape [4, 40], got [2, 4, 20]"):
        _call(_with(args, softmax_lse=_aux([2, 4, 20])), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=20,
              max_seqlen_k=25)
    with raises("attention_bwd: argument 'cu_seqlens_k': expected dtype int32, got int64"):
        _call(args, cu_seqlens_q=cu_q, cu_seqlens_k=_aux([3], "int64", slot=7), max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_bwd: argument 'max_seqlen_q': expected 0 .. 2^30 - 1, got -1"):
        _call(args, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=-1, max_seqlen_k=25)
    with raises("attention_bwd: argument 'q': expected 3 dims, got 4 dims, shape [2, 17, 4, 64]"):
        _call(_args(), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=17, max_seqlen_k=33)
    # The gradients' checks come before that read too.
    with raises("attention_bwd: argument 'dq': expected shape [40, 4, 64] (same as 'q'), got [50, 2, 64]"):
        _call(_with(args, dq=grads[3]), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=20, max_seqlen_k=25)


# ---------------------------------------------------------------------------------------------
# GPU: gradients against float64 torch autograd.

def _autograd(fn, inputs, dout):
    """Gradients of sum(fn(*inputs) * dout) with respect to fresh leaf copies of `inputs` (zeros
    for an input that fn's output does not depend on)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    loss = (fn(*leaves) * dout).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads))


def _fixed_references(q, k, v, dout, slopes, o):
    """(float64 reference, naive) gradients (dq, dk, dv) through _attend: autograd in float64 and in
    q's dtype."""
    s64 = None if slopes is None else slopes.double()
    ref = _autograd(lambda a, b, c: _attend(a, b, c, s64, **o)[0], (q.double(), k.double(), v.double()), dout.double())
    naive = _autograd(lambda a, b, c: _attend(a, b, c, slopes, **o)[0], (q, k, v), dout)
    return ref, naive


def _check_grads(got, ref, naive, dtype: str, what: str):
    for name, g, r, n in zip(("dq", "dk", "dv"), got, ref, naive):
        assert g.dtype == getattr(torch, dtype) and g.shape == r.shape, f"{what}: {name} {g.dtype} {tuple(g.shape)}"
        assert torch.isfinite(r).all(), f"{what}: the reference {name} is not finite"
        check_close(g, _np(r), _np(n), dtype, f"{what}: {name}")


def _assert_unseen_zero(dq, dk, dv, keep, what: str):
    """One batch entry: dq (sq, h, d), dk / dv (sk, hkv, d), keep (sq, sk). Rows that see no key
    get dq exactly 0; keys that no row sees get dk = dv = 0."""
    rows, cols = ~keep.any(1), ~keep.any(0)
    assert (dq[rows] == 0).all(), f"{what}: dq of rows that see no key is not 0"
    assert (dk[cols] == 0).all() and (dv[cols] == 0).all(), f"{what}: dk / dv of keys that no row sees are not 0"


def _inputs(b, sq, sk, h, hkv, d, dtype, seed, amp=1.0):
    q, k, v = (_randn(s, dtype, seed + i, amp) for i, s in enumerate(((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d))))
    return q, k, v, _randn((b, sq, h, d), dtype, seed + 5)


def _run_grads(b, sq, sk, h, hkv, d, dtype, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None,
               seed=0, amp=1.0, impl=None):
    """flash_attn_func's gradients against the reference; returns (q, k, v, dout, slopes, (dq, dk, dv))."""
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, dtype, seed, amp)
    slopes = _slopes(alibi, b, h, seed + 3)
    what = (f"{dtype} b{b} sq{sq} sk{sk} h{h}/{hkv} d{d} causal {causal} window {window} softcap {softcap} "
            f"alibi {alibi} scale {scale} forward impl {impl}")
    got = _autograd(lambda a, b_, c: flashlab.flash_attn_func(a, b_, c, softmax_scale=scale, causal=causal,
                                                              window_size=window, softcap=softcap,
                                                              alibi_slopes=slopes, impl=impl), (q, k, v), dout)
    o = _opts(causal, window, softcap, scale, d)
    ref, naive = _fixed_references(q, k, v, dout, slopes, o)
    _check_grads(got, ref, naive, dtype, what)
    keep = _keep(sq, sk, causal, window[0], window[1])
    for bi in range(b):
        _assert_unseen_zero(got[0][bi], got[1][bi], got[2][bi], keep, f"{what} batch {bi}")
    return q, k, v, dout, slopes, got


# (b, sq, sk, h, hkv, d, dtype, options): both dtypes, head dims 32..256, sq != sk both ways,
# each feature alone and combined.
BWD_CASES = [
    (2, 17, 17, 4, 4, 64, "float16", {}),
    (2, 113, 77, 4, 2, 128, "bfloat16", {}),                                        # GQA, sq > sk
    (1, 65, 256, 4, 1, 64, "float16", dict(causal=True)),                           # MQA, sq < sk
    (2, 200, 64, 2, 2, 128, "bfloat16", dict(causal=True)),                         # 136 rows see no key
    (1, 128, 300, 2, 2, 32, "float16", dict(window=(32, 8))),
    (1, 300, 128, 2, 1, 256, "bfloat16", dict(window=(16, 0))),                      # window leaves rows empty
    (1, 96, 96, 4, 2, 96, "float16", dict(softcap=5.0, amp=3.0)),
    (2, 77, 129, 4, 4, 64, "bfloat16", dict(causal=True, softcap=30.0, amp=3.0)),
    (2, 64, 100, 4, 2, 128, "float16", dict(alibi="h")),
    (2, 100, 64, 4, 4, 64, "bfloat16", dict(causal=True, alibi="bh")),
    (1, 33, 33, 2, 2, 128, "float16", dict(window=(-1, 5), scale=0.3)),
    (1, 1, 113, 4, 2, 64, "bfloat16", {}),                                          # one query row
    (2, 113, 5, 2, 1, 64, "float16", dict(causal=True)),                            # few keys, most rows empty
    (1, 150, 150, 8, 2, 64, "bfloat16", dict(causal=True, window=(40, -1), softcap=10.0, alibi="bh", amp=2.0)),
    (1, 128, 192, 2, 2, 256, "float16", dict(causal=True, alibi="h")),
    (2, 90, 130, 4, 2, 256, "bfloat16", dict(alibi="bh")),                           # d 256 ALiBi both ways of i - j
    (1, 70, 90, 2, 1, 256, "bfloat16", dict(softcap=5.0, amp=3.0)),                 # d 256 softcap: auto takes rung 2
]


@gpu
@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: f"{c[6]}-b{c[0]}-sq{c[1]}-sk{c[2]}-h{c[3]}/{c[4]}-d{c[5]}")
def test_gradients(case):
    b, sq, sk, h, hkv, d, dtype, opts = case
    _run_grads(b, sq, sk, h, hkv, d, dtype, seed=sq * 7 + sk, **opts)


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fully_masked_rows_get_zero_dq(dtype):
    # Causal with sq > sk, the diagonal at the bottom right: rows 0 .. sq - sk - 1 see no key.
    b, sq, sk = 2, 150, 40
    *_, (dq, dk, dv) = _run_grads(b, sq, sk, 4, 2, 64, dtype, causal=True, seed=11)
    assert (dq[:, :sq - sk] == 0).all()
    assert (dq[:, sq - sk:] != 0).any() and (dk != 0).any() and (dv != 0).any()


@gpu
@pytest.mark.parametrize("impl", [1, 2, 3, 4])
def test_after_every_forward_rung(impl):
    # The backward reads the lse that each forward rung writes.
    if impl == 4 and not _hopper_here():
        pytest.skip("rung 4: sm_90")
    _run_grads(2, 113, 129, 4, 2, 64, "bfloat16", causal=True, softcap=8.0, seed=impl, impl=impl)


# Varlen: (lens_q, lens_k, h, hkv, d, dtype, options); empty query and key entries.
VARLEN_BWD_CASES = [
    ([17, 0, 113, 1, 64], [17, 5, 0, 128, 64], 4, 2, 64, "float16", dict(causal=True)),
    ([100, 37], [60, 200], 2, 1, 128, "bfloat16", dict(window=(24, 8), alibi="bh", max_pad=3)),
    ([1, 50, 0], [77, 50, 20], 4, 4, 32, "bfloat16", dict(softcap=5.0, amp=3.0, alibi="h")),
]


@gpu
@pytest.mark.parametrize("case", VARLEN_BWD_CASES, ids=lambda c: f"{c[5]}-q{sum(c[0])}-k{sum(c[1])}-d{c[4]}")
def test_varlen_gradients(case):
    lens_q, lens_k, h, hkv, d, dtype, opts = case
    causal, window = opts.get("causal", False), opts.get("window", (-1, -1))
    softcap, alibi = opts.get("softcap", 0.0), opts.get("alibi")
    amp, max_pad = opts.get("amp", 1.0), opts.get("max_pad", 0)
    batch, tq, tk = len(lens_q), sum(lens_q), sum(lens_k)
    seed = tq + tk
    q, k, v = (_randn(s, dtype, seed + i, amp) for i, s in enumerate(((tq, h, d), (tk, hkv, d), (tk, hkv, d))))
    dout = _randn((tq, h, d), dtype, seed + 5)
    slopes = _slopes(alibi, batch, h, seed + 3)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    msq, msk = max(lens_q) + max_pad, max(lens_k) + max_pad
    what = f"varlen {dtype} q {lens_q} k {lens_k} h{h}/{hkv} d{d} {opts}"
    o = _opts(causal, window, softcap, None, d)
    bounds_q, bounds_k = [int(x) for x in cu_q], [int(x) for x in cu_k]

    def per_batch(sl):
        def fn(qq, kk, vv):
            outs = []
            for bi in range(batch):
                a, e, c, f = bounds_q[bi], bounds_q[bi + 1], bounds_k[bi], bounds_k[bi + 1]
                s_b = None if sl is None else (sl if sl.dim() == 1 else sl[bi:bi + 1])
                outs.append(_attend(qq[None, a:e], kk[None, c:f], vv[None, c:f], s_b, **o)[0][0])
            return torch.cat(outs, 0)
        return fn

    ref = _autograd(per_batch(None if slopes is None else slopes.double()), (q.double(), k.double(), v.double()),
                    dout.double())
    naive = _autograd(per_batch(slopes), (q, k, v), dout)
    options = dict(alibi_slopes=slopes, causal=causal, softcap=softcap)
    got = _autograd(lambda a, b, c: flashlab.flash_attn_varlen_func(a, b, c, cu_q, cu_k, msq, msk, window_size=window,
                                                                    **options), (q, k, v), dout)
    _check_grads(got, ref, naive, dtype, what + " (flash_attn_varlen_func)")

    # The direct call into outputs poisoned with NaN: every row and key is written, the
    # entries of an empty query / key sequence with 0.
    out = torch.full_like(q, math.nan)
    lse = torch.full((h, tq), math.nan, device="cuda")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=msq, max_seqlen_k=msk, window_left=window[0],
                  window_right=window[1], **options)
    flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, **varlen)
    dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, k, v))
    res = flashlab.attention_bwd(q, k, v, out, dout, lse, dq, dk, dv, **varlen)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    _check_grads((dq, dk, dv), ref, naive, dtype, what + " (attention_bwd)")
    assert all(torch.equal(x, y) for x, y in zip((dq, dk, dv), got)), f"{what}: attention_bwd != autograd"
    for bi in range(batch):
        a, e, c, f = bounds_q[bi], bounds_q[bi + 1], bounds_k[bi], bounds_k[bi + 1]
        _assert_unseen_zero(dq[a:e], dk[c:f], dv[c:f], _keep(e - a, f - c, causal, window[0], window[1]),
                            f"{what} batch {bi}")


@gpu
def test_qkvpacked_gradients():
    b, s, h, d = 2, 113, 4, 64
    qkv = _randn((b, s, 3, h, d), "float16", 1)
    dout = _randn((b, s, h, d), "float16", 2)
    (dqkv,) = _autograd(lambda x: flashlab.flash_attn_qkvpacked_func(x, causal=True), (qkv,), dout)
    assert dqkv.shape == qkv.shape
    # The same as flash_attn_func on the three views, bit for bit, and right.
    unpacked = _autograd(lambda x: flashlab.flash_attn_func(x[:, :, 0], x[:, :, 1], x[:, :, 2], causal=True),
                         (qkv,), dout)[0]
    assert torch.equal(dqkv, unpacked)
    ref, naive = _fixed_references(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dout, None,
                                   _opts(True, (-1, -1), 0.0, None, d))
    _check_grads(dqkv.unbind(2), ref, naive, "float16", "qkvpacked")

    # Varlen: (total, 3, h, d), one cu_seqlens.
    lens = [17, 96]
    tqkv = qkv.reshape(b * s, 3, h, d)[:sum(lens)]
    cu = _cu(lens)
    tdout = dout.reshape(b * s, h, d)[:sum(lens)]
    (got,) = _autograd(lambda x: flashlab.flash_attn_varlen_qkvpacked_func(x, cu, 96, window_size=(8, 8)), (tqkv,),
                       tdout)
    (ref,) = _autograd(lambda x: flashlab.flash_attn_varlen_func(x[:, 0], x[:, 1], x[:, 2], cu, cu, 96, 96,
                                                                 window_size=(8, 8)), (tqkv,), tdout)
    assert got.shape == tqkv.shape and torch.equal(got, ref)


@gpu
def test_kvpacked_gradients():
    b, sq, sk, h, hkv, d = 2, 77, 129, 4, 2, 128
    q = _randn((b, sq, h, d), "bfloat16", 1)
    kv = _randn((b, sk, 2, hkv, d), "bfloat16", 2)
    dout = _randn((b, sq, h, d), "bfloat16", 3)
    dq, dkv = _autograd(lambda x, y: flashlab.flash_attn_kvpacked_func(x, y, window_size=(16, 16)), (q, kv), dout)
    assert dkv.shape == kv.shape
    ref, naive = _fixed_references(q, kv[:, :, 0], kv[:, :, 1], dout, None, _opts(False, (16, 16), 0.0, None, d))
    _check_grads((dq, dkv[:, :, 0], dkv[:, :, 1]), ref, naive, "bfloat16", "kvpacked")

    tq, tkv = q.reshape(b * sq, h, d), kv.reshape(b * sk, 2, hkv, d)
    cu_q, cu_k = _cu([sq, sq]), _cu([sk, sk])
    tdout = dout.reshape(b * sq, h, d)
    got = _autograd(lambda x, y: flashlab.flash_attn_varlen_kvpacked_func(x, y, cu_q, cu_k, sq, sk, causal=True),
                    (tq, tkv), tdout)
    want = _autograd(lambda x, y: flashlab.flash_attn_varlen_func(x, y[:, 0], y[:, 1], cu_q, cu_k, sq, sk, causal=True),
                     (tq, tkv), tdout)
    assert got[1].shape == tkv.shape and all(torch.equal(x, y) for x, y in zip(got, want))


@gpu
def test_deterministic():
    b, sq, sk, h, hkv, d = 2, 256, 200, 8, 2, 64
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, "bfloat16", 7)
    runs = [_autograd(lambda a, b_, c: flashlab.flash_attn_func(a, b_, c, causal=True, deterministic=True), (q, k, v),
                      dout) for _ in range(3)]
    for run in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], run)), "gradients differ between runs"
    cu_q, cu_k = _cu([100, 156]), _cu([50, 150])
    tq, tk, tdout = q.reshape(b * sq, h, d)[:256], k.reshape(b * sk, hkv, d)[:200], dout.reshape(b * sq, h, d)[:256]
    runs = [_autograd(lambda a, b_, c: flashlab.flash_attn_varlen_func(a, b_, c, cu_q, cu_k, 156, 150,
                                                                       deterministic=True), (tq, tk, tk), tdout)
            for _ in range(3)]
    for run in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], run)), "varlen gradients differ between runs"


@gpu
@pytest.mark.parametrize("rung", [1, 2, 3, None], ids=["rung1", "rung2", "rung3", "auto"])
def test_direct_call_writes_given_outputs(rung):
    if rung == 3 and not _hopper_here():
        pytest.skip("rung 3: sm_90")
    b, sq, sk, h, hkv, d = 2, 130, 70, 4, 2, 64  # causal, sq > sk: rows without keys; d: rung 3 has it
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, "float16", 21)
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, h, sq), math.nan, device="cuda")
    flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, causal=True)
    dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, k, v))
    res = flashlab.attention_bwd(q, k, v, out, dout, lse, dq, dk, dv, causal=True, rung=rung)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    ref, naive = _fixed_references(q, k, v, dout, None, _opts(True, (-1, -1), 0.0, None, d))
    _check_grads((dq, dk, dv), ref, naive, "float16", f"attention_bwd rung {rung}")
    assert (dq[:, :sq - sk] == 0).all()
    # Outputs allocated when not given; the same bits on rung 1 (rungs 2 and 3 add dQ by atomics in
    # an order that may vary).
    again = flashlab.attention_bwd(q, k, v, out, dout, lse, causal=True, rung=rung)
    if rung == 1:
        assert all(torch.equal(x, y) for x, y in zip(again, (dq, dk, dv)))
    else:
        _check_grads(again, ref, naive, "float16", f"attention_bwd rung {rung}, outputs allocated")


@gpu
def test_strided_views():
    # q: a slice of a wider head dim; k: a view into packed kv; v: (b, hkv, s, d) seen as
    # (b, s, hkv, d); dout strided; dq, dk, dv: strided views whose padding must stay untouched.
    b, sq, sk, h, hkv, d = 2, 113, 200, 4, 2, 64
    q_base = _randn((b, sq, h, d + 16), "bfloat16", 1)
    kv = _randn((b, sk, 2, hkv, d), "bfloat16", 2)
    v_base = _randn((b, hkv, sk, d), "bfloat16", 3)
    q, k, v = q_base[..., :d], kv[:, :, 0], v_base.transpose(1, 2)
    dout = _randn((b, sq, h, d + 8), "bfloat16", 4)[..., :d]
    assert not any(x.is_contiguous() for x in (q, k, v, dout))
    out = torch.empty((b, sq, h, d), device="cuda", dtype=torch.bfloat16)
    lse = torch.empty((b, h, sq), device="cuda")
    flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, softcap=6.0, window_left=48, window_right=0)
    dq_base = torch.full((b, sq, h, d + 8), math.nan, device="cuda", dtype=torch.bfloat16)
    dk_base = torch.full((b, sk, hkv, d + 16), math.nan, device="cuda", dtype=torch.bfloat16)
    dv_base = torch.full((b, hkv, sk, d), math.nan, device="cuda", dtype=torch.bfloat16)
    dq, dk, dv = dq_base[..., :d], dk_base[..., :d], dv_base.transpose(1, 2)
    flashlab.attention_bwd(q, k, v, out, dout, lse, dq, dk, dv, softcap=6.0, window_left=48, window_right=0)
    ref, naive = _fixed_references(q, k, v, dout, None, _opts(False, (48, 0), 6.0, None, d))
    _check_grads((dq, dk, dv), ref, naive, "bfloat16", "strided views")
    assert torch.isnan(dq_base[..., d:]).all() and torch.isnan(dk_base[..., d:]).all(), "wrote into the padding"
    # The same through autograd, the views taken of leaves (whose gradients are 0 outside them).
    g_q, g_kv, g_v = _autograd(lambda a, b_, c: flashlab.flash_attn_func(a[..., :d], b_[:, :, 0], c.transpose(1, 2),
                                                                         softcap=6.0, window_size=(48, 0)),
                               (q_base, kv, v_base), dout)
    _check_grads((g_q[..., :d], g_kv[:, :, 0], g_v.transpose(1, 2)), ref, naive, "bfloat16",
                 "strided views (flash_attn_func)")
    assert (g_q[..., d:] == 0).all() and (g_kv[:, :, 1] == 0).all()


@gpu
def test_expanded_and_strided_dout_through_autograd():
    b, sq, sk, h, hkv, d = 2, 77, 100, 4, 2, 64
    q, k, v, _ = _inputs(b, sq, sk, h, hkv, d, "float16", 31)
    o = _opts(True, (-1, -1), 0.0, None, d)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    # out.sum() hands the backward an expanded gradient (every stride 0).
    flashlab.flash_attn_func(*leaves, causal=True).sum().backward()
    ref, naive = _fixed_references(q, k, v, torch.ones_like(q), None, o)
    _check_grads(tuple(x.grad for x in leaves), ref, naive, "float16", "expanded dout")
    # Non-contiguous gradients: a padded head dim, a transposed (b, h, sq, d) tensor.
    padded = _randn((b, sq, h, d + 8), "float16", 32)[..., :d]
    transposed = _randn((b, h, sq, d), "float16", 33).transpose(1, 2)
    for name, dout in (("padded", padded), ("transposed", transposed)):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = flashlab.flash_attn_func(*leaves, causal=True)
        got = torch.autograd.grad(out, leaves, dout)
        ref, naive = _fixed_references(q, k, v, dout, None, o)
        _check_grads(got, ref, naive, "float16", f"{name} dout")


@gpu
def test_misaligned_dout_through_autograd():
    # A contiguous gradient whose data pointer is not 16-byte aligned, as autograd hands over a
    # narrow() of a bigger gradient (CatBackward does): the backward must still run.
    b, sq, sk, h, d = 1, 33, 40, 2, 64
    q, k, v, dout = _inputs(b, sq, sk, h, h, d, "bfloat16", 41)
    storage = torch.empty(dout.numel() + 1, device="cuda", dtype=torch.bfloat16)
    misaligned = storage[1:].view(dout.shape)
    misaligned.copy_(dout)
    assert misaligned.is_contiguous() and misaligned.data_ptr() % 16 != 0
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    got = torch.autograd.grad(flashlab.flash_attn_func(*leaves), leaves, misaligned)
    ref, naive = _fixed_references(q, k, v, dout, None, _opts(False, (-1, -1), 0.0, None, d))
    _check_grads(got, ref, naive, "bfloat16", "misaligned dout")


@gpu
def test_only_inputs_that_require_grad_get_one():
    b, sq, sk, h, hkv, d = 1, 64, 80, 4, 1, 128
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, "bfloat16", 51)
    kk = k.clone().requires_grad_(True)
    out, lse, probs = flashlab.flash_attn_func(q, kk, v, alibi_slopes=_slopes("h", b, h, 52), return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad and not probs.requires_grad
    (dk,) = torch.autograd.grad((out * dout).sum(), [kk])
    ref, naive = _fixed_references(q, k, v, dout, _slopes("h", b, h, 52), _opts(False, (-1, -1), 0.0, None, d))
    check_close(dk, _np(ref[1]), _np(naive[1]), "bfloat16", "dk alone")
    # With return_attn_probs the gradients are those of the plain call, bit for bit.
    plain = _autograd(lambda a, b_, c: flashlab.flash_attn_func(a, b_, c, causal=True), (q, k, v), dout)
    with_probs = _autograd(lambda a, b_, c: flashlab.flash_attn_func(a, b_, c, causal=True, return_attn_probs=True)[0],
                           (q, k, v), dout)
    assert all(torch.equal(x, y) for x, y in zip(plain, with_probs))


@gpu
@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e4m3fn"), reason="torch without float8_e4m3fn")
def test_fp8_has_no_backward():
    if not _hopper_here():
        pytest.skip("FP8 attention runs on sm_90 only")
    b, s, h, d = 1, 128, 2, 128
    q, k, v, descales = _fp8_inputs((b, s, h, d), (b, s, h, d), 3, False, b, h)
    q.requires_grad_(True)
    out = flashlab.flash_attn_func(q, k, v, causal=True, q_descale=descales[0], k_descale=descales[1],
                                   v_descale=descales[2])
    assert out.requires_grad and out.dtype == torch.bfloat16
    with pytest.raises(NotImplementedError, match=r"^flashlab: no backward for FP8 \(e4m3\) attention"):
        out.float().sum().backward()
    with torch.no_grad():  # the forward alone still runs
        assert not flashlab.flash_attn_func(q, k, v, q_descale=descales[0], k_descale=descales[1],
                                            v_descale=descales[2]).requires_grad
