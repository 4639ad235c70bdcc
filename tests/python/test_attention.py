"""Attention forward from Python: flashlab.attention_fwd and the flash-attn 2.x drop-ins
(flash_attn_func, flash_attn_varlen_func and the packed variants).

CPU part: validation messages from C++ through the bindings (test_bindings' `fake` tensors, which
claim to be on cuda:0 and fail validation before anything runs), and what only Python checks
(block_table, window_size, packed shapes; dropout: test_attention_dropout.py).

GPU part: every rung against a float64 torch reference written here from attention.h (S
materialised, scale, softcap, ALiBi, bottom-right mask, softmax, P @ V, lse), outputs poisoned
with NaN first. Tolerance (numerics.check_close): 2x the error of the same computation done naively
in the input dtype with torch (scores, softmax, P @ V in fp16/bf16; the naive lse is the fp32
logsumexp of those rounded scores), plus one unit roundoff of the input dtype times max|ref|.
Fully masked rows must give exactly 0 output and -inf lse.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch
from numerics import check_close

HEAD_DIMS = (32, 64, 96, 128, 192, 256)
MB = 1 << 20


# ---------------------------------------------------------------------------------------------
# CPU: C++ validation messages through the bindings.

def _fixed(b=2, sq=17, sk=33, h=4, hkv=2, d=64, dtype="float16", **kw):
    """Fake q, k, v, out (fixed length) at distinct host offsets; kw: '<name>_shape', '<name>_dtype',
    '<name>_strides' override one tensor."""
    shapes = {"q": [b, sq, h, d], "k": [b, sk, hkv, d], "v": [b, sk, hkv, d], "out": [b, sq, h, d]}
    return tuple(fake(kw.get(f"{n}_shape", s), kw.get(f"{n}_dtype", dtype), strides=kw.get(f"{n}_strides"),
                      offset_bytes=i * 8 * MB) for i, (n, s) in enumerate(shapes.items()))


def _varlen(total_q=40, total_k=50, h=4, hkv=2, d=64, dtype="float16", **kw):
    shapes = {"q": [total_q, h, d], "k": [total_k, hkv, d], "v": [total_k, hkv, d], "out": [total_q, h, d]}
    return tuple(fake(kw.get(f"{n}_shape", s), kw.get(f"{n}_dtype", dtype), strides=kw.get(f"{n}_strides"),
                      offset_bytes=i * 8 * MB) for i, (n, s) in enumerate(shapes.items()))


def _aux(shape, dtype="float32", slot=0, **kw):
    """A fake optional tensor (lse, probs, slopes, cu_seqlens) past the four main ones."""
    return fake(shape, dtype, offset_bytes=(4 + slot) * 8 * MB, **kw)


def _call(q, k, v, out, **kw):
    return flashlab.attention_fwd(q, k, v, out, **kw)


def test_rungs_constant():
    assert flashlab.ATTN_FWD_RUNGS == 4
    from flashlab.flash_attn_interface import flash_attn_func  # the flash-attn module path works too
    assert flash_attn_func is flashlab.flash_attn_func


def test_numpy_input_hits_the_cpp_device_check():
    q = np.zeros((1, 17, 2, 64), np.float16)
    for fn, args in ((flashlab.flash_attn_func, (q, q, q)),
                     (flashlab.flash_attn_qkvpacked_func, (np.zeros((1, 17, 3, 2, 64), np.float16),)),
                     (flashlab.flash_attn_kvpacked_func, (q, np.zeros((1, 17, 2, 2, 64), np.float16))),
                     (flashlab.flash_attn_varlen_func, (q[0], q[0], q[0], np.array([0, 17], np.int32),
                                                        np.array([0, 17], np.int32), 17, 17)),
                     (flashlab.flash_attn_varlen_qkvpacked_func, (np.zeros((17, 3, 2, 64), np.float16),
                                                                  np.array([0, 17], np.int32), 17)),
                     (flashlab.flash_attn_varlen_kvpacked_func, (q[0], np.zeros((17, 2, 2, 64), np.float16),
                                                                 np.array([0, 17], np.int32),
                                                                 np.array([0, 17], np.int32), 17, 17))):
        with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
            fn(*args)
        with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
            fn(*args, return_attn_probs=True, causal=True, window_size=(3, 0), impl=1)


@pytest.mark.parametrize("rung", [0, 5, -2])
def test_bad_rung(rung):
    with raises(f"attention_fwd: argument 'rung': expected 1..4 or -1 (auto), got {rung}"):
        _call(*_fixed(), rung=rung)


def test_bad_rung_past_int32():
    with raises("attention_fwd: argument 'rung': expected 1..4, got 1099511627776"):
        _call(*_fixed(), rung=2**40)


def test_rung4_takes_head_dims_from_64():
    with raises("attention_fwd: argument 'q': expected head dim (last dim) 64, 96, 128, 192 or 256 for rung 4 "
                "(64-column TMA boxes), got 32"):
        _call(*_fixed(d=32), rung=4)


def test_ranks_and_dtypes():
    with raises("attention_fwd: argument 'q': expected 4 dims, got 3 dims, shape [17, 4, 64]"):
        _call(*_fixed(q_shape=[17, 4, 64]))
    with raises("attention_fwd: argument 'out': expected 4 dims, got 5 dims, shape [2, 17, 4, 1, 64]"):
        _call(*_fixed(out_shape=[2, 17, 4, 1, 64]))
    with raises("attention_fwd: argument 'k': expected dtype fp16 (same as 'q'), got bf16"):
        _call(*_fixed(k_dtype="bfloat16"))
    with raises("attention_fwd: argument 'v': expected dtype fp16 (same as 'q'), got fp32"):
        _call(*_fixed(v_dtype="float32"))
    with raises("attention_fwd: argument 'out': expected dtype bf16 (same as 'q'), got fp16"):
        _call(*_fixed(dtype="bfloat16", out_dtype="float16"))
    with raises("attention_fwd: argument 'q': expected dtype fp16 or bf16 or e4m3, got fp32"):
        _call(*_fixed(dtype="float32"))
    q, _, v, out = _fixed()
    k1 = fake([2, 33, 2, 64], "float16", device=(2, 1), offset_bytes=8 * MB)  # cuda:1
    with raises("attention_fwd: argument 'k': expected a tensor on cuda:0 (same as 'q'), got cuda:1"):
        _call(q, k1, v, out)


@pytest.mark.parametrize("d", [16, 80, 100, 160, 512])
def test_unsupported_head_dim(d):
    with raises(f"attention_fwd: argument 'q': expected head dim (last dim) one of 32, 64, 96, 128, 192, 256, got {d}"):
        _call(*_fixed(d=d))


def test_shapes():
    with raises("attention_fwd: argument 'k': expected a number of heads that divides q's 4 (GQA/MQA), got 3"):
        _call(*_fixed(h=4, hkv=3))
    with raises("attention_fwd: argument 'k': expected a number of heads that divides q's 6 (GQA/MQA), got 4"):
        _call(*_fixed(h=6, hkv=4))
    with raises("attention_fwd: argument 'v': expected shape [2, 32, 2, 64] (same as 'k'), got [2, 33, 2, 64]"):
        _call(*_fixed(k_shape=[2, 32, 2, 64]))
    with raises("attention_fwd: argument 'out': expected shape [2, 17, 4, 64] (same as 'q'), got [2, 17, 4, 32]"):
        _call(*_fixed(out_shape=[2, 17, 4, 32]))
    with raises("attention_fwd: argument 'k': expected head dim 64 (as 'q'), got 128"):
        _call(*_fixed(k_shape=[2, 33, 2, 128], v_shape=[2, 33, 2, 128]))
    with raises("attention_fwd: argument 'k': expected batch 2 (as 'q'), got 3"):
        _call(*_fixed(k_shape=[3, 33, 2, 64], v_shape=[3, 33, 2, 64]))
    with raises("attention_fwd: argument 'q': expected at least one element, got shape [2, 0, 4, 64]"):
        _call(*_fixed(sq=0))
    with raises("attention_fwd: argument 'k': expected at least one element, got shape [2, 0, 2, 64]"):
        _call(*_fixed(sk=0))


def test_strides_and_overlap():
    with raises("attention_fwd: argument 'q': expected unit stride in the last dim, got strides [4352, 256, 64, 2]"):
        _call(*_fixed(q_strides=[4352, 256, 64, 2]))
    with raises("attention_fwd: argument 'v': expected strides that are multiples of 8 elements (16-byte aligned "
                "rows), got strides [4356, 132, 66, 1]"):
        _call(*_fixed(v_strides=[4356, 132, 66, 1]))
    q, k, v, _ = _fixed()
    with raises("attention_fwd: argument 'out': expected memory disjoint from 'k' or identical to it, "
                "got a partial overlap"):
        _call(q, k, v, fake([2, 17, 4, 64], "float16", offset_bytes=8 * MB + 64))


def test_window_and_scalars():
    with raises("attention_fwd: argument 'window_left': expected >= -1 (-1: unbounded), got -2"):
        _call(*_fixed(), window_left=-2)
    with raises("attention_fwd: argument 'window_right': expected >= -1 (-1: unbounded), got -5"):
        _call(*_fixed(), window_right=-5)
    with raises("attention_fwd: argument 'softcap': expected a finite value >= 0, got -1"):
        _call(*_fixed(), softcap=-1.0)
    with raises("attention_fwd: argument 'softmax_scale': expected a finite value, got inf"):
        _call(*_fixed(), softmax_scale=float("inf"))
    with raises("attention_fwd: argument 'softmax_scale': expected a finite value, got inf"):
        _call(*_fixed(), softmax_scale=1e300)  # beyond fp32: not rounded into a valid value


def test_optional_tensors():
    b, sq, h = 2, 17, 4
    with raises("attention_fwd: argument 'softmax_lse': expected shape [2, 4, 17], got [2, 17, 4]"):
        _call(*_fixed(b=b, sq=sq, h=h), softmax_lse=_aux([b, sq, h]))
    with raises("attention_fwd: argument 'softmax_lse': expected dtype fp32, got fp16"):
        _call(*_fixed(b=b, sq=sq, h=h), softmax_lse=_aux([b, h, sq], "float16"))
    with raises("attention_fwd: argument 'alibi_slopes': expected shape [4] or [2, 4], got [3]"):
        _call(*_fixed(b=b, sq=sq, h=h), alibi_slopes=_aux([3]))
    with raises("attention_fwd: argument 'alibi_slopes': expected dtype fp32, got bf16"):
        _call(*_fixed(b=b, sq=sq, h=h), alibi_slopes=_aux([4], "bfloat16"))
    with raises("attention_fwd: argument 'attn_probs': expected together with 'softmax_lse' (P is computed from "
                "it), got no softmax_lse"):
        _call(*_fixed(b=b, sq=sq, h=h), attn_probs=_aux([b, h, sq, 33], "float16"))
    with raises("attention_fwd: argument 'attn_probs': expected shape [2, 4, 17, 33], got [2, 4, 17, 17]"):
        _call(*_fixed(b=b, sq=sq, h=h), softmax_lse=_aux([b, h, sq]),
              attn_probs=_aux([b, h, sq, sq], "float16", slot=1))


def test_varlen_arguments():
    cu = _aux([3], "int32", slot=1)
    with raises("attention_fwd: arguments 'cu_seqlens_q' and 'cu_seqlens_k': expected both or neither, "
                "got only 'cu_seqlens_q'"):
        _call(*_varlen(), cu_seqlens_q=cu, max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_fwd: argument 'cu_seqlens_k': expected shape [3], got [4]"):
        _call(*_varlen(), cu_seqlens_q=cu, cu_seqlens_k=_aux([4], "int32", slot=2), max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_fwd: argument 'cu_seqlens_q': expected shape [batch + 1] with batch >= 1, got [1]"):
        _call(*_varlen(), cu_seqlens_q=_aux([1], "int32", slot=1), cu_seqlens_k=_aux([1], "int32", slot=2),
              max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_fwd: argument 'cu_seqlens_q': expected dtype int32, got int64"):
        _call(*_varlen(), cu_seqlens_q=_aux([3], "int64", slot=1), cu_seqlens_k=_aux([3], "int32", slot=2),
              max_seqlen_q=20, max_seqlen_k=25)
    with raises("attention_fwd: argument 'max_seqlen_k': expected 0 .. 2^30 - 1, got -1"):
        _call(*_varlen(), cu_seqlens_q=cu, cu_seqlens_k=_aux([3], "int32", slot=2), max_seqlen_q=20, max_seqlen_k=-1)
    with raises("attention_fwd: argument 'q': expected 3 dims, got 4 dims, shape [2, 17, 4, 64]"):
        _call(*_fixed(), cu_seqlens_q=cu, cu_seqlens_k=_aux([3], "int32", slot=2), max_seqlen_q=17, max_seqlen_k=33)
    with raises("attention_fwd: argument 'softmax_lse': expected shape [4, 40], got [2, 4, 20]"):
        _call(*_varlen(), cu_seqlens_q=cu, cu_seqlens_k=_aux([3], "int32", slot=2), max_seqlen_q=20,
              max_seqlen_k=25, softmax_lse=_aux([2, 4, 20], slot=3))


def test_python_side_checks():
    q = np.zeros((1, 17, 2, 64), np.float16)
    cu = np.array([0, 17], np.int32)
    for fn, args in ((flashlab.flash_attn_varlen_func, (q[0], q[0], q[0], cu, cu, 17, 17)),
                     (flashlab.flash_attn_qkvpacked_func, (np.zeros((1, 17, 3, 2, 64), np.float16),)),
                     (flashlab.flash_attn_kvpacked_func, (q, np.zeros((1, 17, 2, 2, 64), np.float16))),
                     (flashlab.flash_attn_varlen_qkvpacked_func, (np.zeros((17, 3, 2, 64), np.float16), cu, 17)),
                     (flashlab.flash_attn_varlen_kvpacked_func, (q[0], np.zeros((17, 2, 2, 64), np.float16),
                                                                 cu, cu, 17, 17))):
        with pytest.raises(ValueError, match=f"^{fn.__name__}: argument 'window_size': expected \\(left, right\\)"):
            fn(*args, window_size=(4,))
        with pytest.raises(ValueError, match=f"^{fn.__name__}: argument 'window_size'"):
            fn(*args, window_size=(4.5, 0))
    with pytest.raises(TypeError, match="^flash_attn_varlen_func: argument 'q': expected a torch tensor with 'block_table'"):
        flashlab.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 17, 17, block_table=np.zeros((1, 1), np.int32))
    # Dropout 0 and deterministic pass on to C++ (which rejects the CPU tensor).
    with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.flash_attn_func(q, q, q, dropout_p=0.0, deterministic=True)


def test_packed_shapes():
    bad = [(flashlab.flash_attn_qkvpacked_func, "qkv", (np.zeros((1, 17, 2, 2, 64), np.float16),),
            "(batch, seqlen, 3, nheads, headdim)", [1, 17, 2, 2, 64]),
           (flashlab.flash_attn_qkvpacked_func, "qkv", (np.zeros((17, 3, 2, 64), np.float16),),
            "(batch, seqlen, 3, nheads, headdim)", [17, 3, 2, 64]),
           (flashlab.flash_attn_kvpacked_func, "kv", (np.zeros((1, 17, 2, 64), np.float16),
                                                      np.zeros((1, 17, 3, 2, 64), np.float16)),
            "(batch, seqlen_k, 2, nheads_kv, headdim)", [1, 17, 3, 2, 64]),
           (flashlab.flash_attn_varlen_qkvpacked_func, "qkv", (np.zeros((1, 17, 3, 2, 64), np.float16),
                                                               np.array([0, 17], np.int32), 17),
            "(total, 3, nheads, headdim)", [1, 17, 3, 2, 64]),
           (flashlab.flash_attn_varlen_kvpacked_func, "kv", (np.zeros((17, 2, 64), np.float16),
                                                             np.zeros((17, 3, 2, 64), np.float16),
                                                             np.array([0, 17], np.int32),
                                                             np.array([0, 17], np.int32), 17, 17),
            "(total_k, 2, nheads_kv, headdim)", [17, 3, 2, 64])]
    for fn, name, args, layout, got in bad:
        with pytest.raises(ValueError) as e:
            fn(*args)
        assert str(e.value) == f"{fn.__name__}: argument '{name}': expected shape {layout}, got {got}"


# ---------------------------------------------------------------------------------------------
# GPU: numerics against a float64 torch reference.

def _gen(seed: int):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _randn(shape, dtype: str, seed: int, amp: float = 1.0):
    return (torch.randn(shape, device="cuda", generator=_gen(seed)) * amp).to(getattr(torch, dtype))


def _slopes(kind, b: int, h: int, seed: int):
    """ALiBi slopes: None, 'h' -> (nheads,), 'bh' -> (batch, nheads); fp32 in (0, 1]."""
    if kind is None:
        return None
    base = 2.0 ** (-8.0 * torch.arange(1, h + 1, device="cuda", dtype=torch.float32) / h)
    if kind == "h":
        return base.contiguous()
    return (base[None, :] * torch.rand(b, h, device="cuda", generator=_gen(seed))).contiguous()


def _keep(sq: int, sk: int, causal: bool, wl: int, wr: int):
    """(sq, sk) bool: key j visible to row i, the diagonal aligned bottom-right (attention.h)."""
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    diag = i + sk - sq
    keep = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    if causal:
        wr = 0
    if wl >= 0:
        keep &= j >= diag - wl
    if wr >= 0:
        keep &= j <= diag + wr
    return keep


def _attend(q, k, v, slopes, *, scale, softcap, causal, wl, wr):
    """Attention of one fixed-length group computed in q's dtype: float64 = the reference, fp16/bf16
    = the naive computation. q (b, sq, h, d), k/v (b, sk, hkv, d), slopes None, (h,) or (b, h).
    Returns out (b, sq, h, d), lse (b, h, sq) (float64 or fp32), probs (b, h, sq, sk)."""
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dt = q.dtype
    if sk == 0:
        return (torch.zeros_like(q), torch.full((b, h, sq), -math.inf, device="cuda",
                                                dtype=torch.float64 if dt == torch.float64 else torch.float32),
                torch.zeros(b, h, sq, 0, device="cuda", dtype=dt))
    kx = k.repeat_interleave(h // hkv, dim=2).transpose(1, 2)  # (b, h, sk, d)
    vx = v.repeat_interleave(h // hkv, dim=2).transpose(1, 2)
    s = (q.transpose(1, 2) @ kx.transpose(-1, -2)) * scale  # (b, h, sq, sk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        dist = (i + sk - sq - j).abs().to(dt)
        s = s - slopes.to(dt).reshape(slopes.shape[0] if slopes.dim() == 2 else 1, h, 1, 1) * dist
    s = s.masked_fill(~_keep(sq, sk, causal, wl, wr), -math.inf)
    if dt == torch.float64:
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    else:
        lse = torch.logsumexp(s.float(), -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)  # fully masked rows: NaN -> 0
    return (p @ vx).transpose(1, 2), lse, p


def _np(t):
    return t.detach().double().cpu().numpy()


def _compare(got, ref, naive, dtype: str, what: str):
    """got / ref / naive: (out, lse, probs); lse and probs may be None in got (not asked for)."""
    check_close(got[0], _np(ref[0]), _np(naive[0]), dtype, f"{what}: out")
    if got[1] is not None:
        check_close(got[1], _np(ref[1]), _np(naive[1]), dtype, f"{what}: lse")
    if got[2] is not None:
        check_close(got[2], _np(ref[2]), _np(naive[2]), dtype, f"{what}: probs")
    masked = torch.isneginf(ref[1])  # (b, h, sq) or (h, total_q)
    if masked.any():
        o = got[0].detach()
        rows = masked.transpose(1, 2) if o.dim() == 4 else masked.transpose(0, 1)  # like out's (.., rows, h)
        assert (o[rows] == 0).all(), f"{what}: fully masked rows are not 0"
        assert got[1] is None or torch.isneginf(got[1][masked]).all(), f"{what}: fully masked rows' lse is not -inf"


def _opts(causal, window, softcap, scale, d):
    return dict(scale=(scale if scale else 1.0 / math.sqrt(d)), softcap=softcap, causal=causal,
                wl=window[0], wr=window[1])


PROBS_MAX = 1 << 22  # probs are checked when b * h * sq * sk is at most this


def _run_fixed(b, sq, sk, h, hkv, d, dtype, *, rung, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
               scale=None, seed=0, amp=1.0, api=True):
    q, k, v = (_randn(s, dtype, seed + i, amp) for i, s in enumerate(((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d))))
    slopes = _slopes(alibi, b, h, seed + 3)
    what = (f"{dtype} b{b} sq{sq} sk{sk} h{h}/{hkv} d{d} causal {causal} window {window} softcap {softcap} "
            f"alibi {alibi} scale {scale} rung {rung}")
    with_probs = b * h * sq * sk <= PROBS_MAX
    out = torch.full_like(q, math.nan)
    lse = torch.full((b, h, sq), math.nan, device="cuda")
    probs = torch.full((b, h, sq, sk), math.nan, device="cuda", dtype=q.dtype) if with_probs else None
    assert flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, attn_probs=probs, alibi_slopes=slopes,
                                  softmax_scale=scale, causal=causal, window_left=window[0], window_right=window[1],
                                  softcap=softcap, rung=rung) is out
    o = _opts(causal, window, softcap, scale, d)
    ref = _attend(q.double(), k.double(), v.double(), None if slopes is None else slopes.double(), **o)
    naive = _attend(q, k, v, slopes, **o)
    _compare((out, lse, probs), ref, naive, dtype, what)
    if api:  # the same call through flash-attn's API (outputs allocated, returned flash-attn's way)
        res = flashlab.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                                       softcap=softcap, alibi_slopes=slopes, return_attn_probs=with_probs, impl=rung)
        if with_probs:
            assert isinstance(res, tuple) and len(res) == 3
            assert res[1].dtype == torch.float32 and tuple(res[1].shape) == (b, h, sq)
            assert res[2].dtype == q.dtype and tuple(res[2].shape) == (b, h, sq, sk)
        else:
            assert isinstance(res, torch.Tensor)
            res = (res, None, None)
        assert tuple(res[0].shape) == (b, sq, h, d) and res[0].dtype == q.dtype
        _compare(res, ref, naive, dtype, what + " (flash_attn_func)")


def _cu(lens):
    return torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device="cuda")


def _run_varlen(lens_q, lens_k, h, hkv, d, dtype, *, rung, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                scale=None, seed=0, max_pad=0, api=True):
    batch = len(lens_q)
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v = (_randn(s, dtype, seed + i) for i, s in enumerate(((tq, h, d), (tk, hkv, d), (tk, hkv, d))))
    slopes = _slopes(alibi, batch, h, seed + 3)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    msq, msk = max(lens_q) + max_pad, max(lens_k) + max_pad
    what = (f"varlen {dtype} q {lens_q} k {lens_k} h{h}/{hkv} d{d} causal {causal} window {window} "
            f"softcap {softcap} alibi {alibi} rung {rung}")
    with_probs = batch * h * msq * msk <= PROBS_MAX
    out = torch.full_like(q, math.nan)
    lse = torch.full((h, tq), math.nan, device="cuda")
    probs = torch.full((batch, h, msq, msk), math.nan, device="cuda", dtype=q.dtype) if with_probs else None
    assert flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, attn_probs=probs, alibi_slopes=slopes,
                                  cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=msq, max_seqlen_k=msk,
                                  softmax_scale=scale, causal=causal, window_left=window[0], window_right=window[1],
                                  softcap=softcap, rung=rung) is out
    o = _opts(causal, window, softcap, scale, d)

    def per_batch(qq, kk, vv, sl):
        outs, lses = [], []
        p_all = torch.zeros(batch, h, msq, msk, device="cuda", dtype=qq.dtype)
        for bi in range(batch):
            a, e = int(cu_q[bi]), int(cu_q[bi + 1])
            c, f = int(cu_k[bi]), int(cu_k[bi + 1])
            s_b = None if sl is None else (sl if sl.dim() == 1 else sl[bi:bi + 1])
            ob, lb, pb = _attend(qq[None, a:e], kk[None, c:f], vv[None, c:f], s_b, **o)
            outs.append(ob[0])
            lses.append(lb[0])
            p_all[bi, :, :e - a, :f - c] = pb[0]
        return torch.cat(outs, 0), torch.cat(lses, 1), p_all

    ref = per_batch(q.double(), k.double(), v.double(), None if slopes is None else slopes.double())
    naive = per_batch(q, k, v, slopes)
    _compare((out, lse, probs), ref, naive, dtype, what)
    if api:
        res = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, msq, msk, softmax_scale=scale, causal=causal,
                                              window_size=window, softcap=softcap, alibi_slopes=slopes,
                                              return_attn_probs=with_probs, impl=rung)
        if with_probs:
            assert tuple(res[1].shape) == (h, tq) and tuple(res[2].shape) == (batch, h, msq, msk)
        else:
            res = (res, None, None)
        assert tuple(res[0].shape) == (tq, h, d)
        _compare(res, ref, naive, dtype, what + " (flash_attn_varlen_func)")


# The top rung: every seqlen of {1, 17, 113, 128, 256, 1023, 2049} as q and as k, sq != sk both
# ways, every head dim, both dtypes, each feature alone and combined.
# (b, sq, sk, h, hkv, d, dtype, options)
TOP_CASES = [
    (2, 1, 1, 4, 4, 64, "float16", {}),
    (2, 17, 17, 4, 2, 128, "bfloat16", dict(causal=True)),
    (1, 113, 1023, 4, 1, 96, "float16", dict(causal=True)),                          # MQA, sq < sk
    (1, 1023, 113, 4, 4, 32, "bfloat16", dict(causal=True)),                         # fully masked rows
    (2, 128, 128, 6, 2, 192, "float16", dict(window=(32, 0))),
    (1, 256, 2049, 2, 2, 256, "bfloat16", dict(window=(100, 50))),
    (1, 2049, 256, 2, 1, 64, "float16", dict(softcap=5.0, amp=3.0)),
    (1, 2049, 2049, 2, 2, 128, "bfloat16", dict(causal=True)),
    (2, 1, 2049, 4, 2, 128, "float16", dict(alibi="h")),                               # decode shape
    (1, 1023, 1, 4, 4, 256, "bfloat16", dict(causal=True)),                          # one visible row
    (2, 113, 17, 8, 2, 64, "float16", dict(causal=True, softcap=10.0, alibi="bh", amp=2.0)),
    (1, 17, 128, 4, 4, 96, "bfloat16", dict(window=(0, 0))),
    (3, 256, 113, 4, 4, 32, "float16", dict(window=(-1, 7))),
    (1, 1023, 1023, 4, 2, 192, "bfloat16", dict(causal=True, window=(255, -1), alibi="h")),
    (1, 128, 256, 2, 2, 256, "float16", dict(scale=0.3)),
    (2, 256, 256, 8, 1, 128, "bfloat16", dict(causal=True, window=(64, 16), softcap=20.0)),  # causal wins over wr
]


# ---------------------------------------------------------------------------------------------
# FP8 (e4m3 q, k, v; bf16 out; Hopper, head dim 128).

def test_fp8_validation():
    with raises("attention_fwd: argument 'out': expected dtype bf16, got e4m3"):
        _call(*_fixed(d=128, dtype="float8_e4m3fn"))
    with raises("attention_fwd: argument 'q': expected head dim (last dim) 128 for e4m3 inputs, got 64"):
        _call(*_fixed(dtype="float8_e4m3fn", out_dtype="bfloat16"))
    with raises("attention_fwd: argument 'q_descale': expected no descale factor for fp16 / bf16 inputs (FP8 e4m3 "
                "only), got a tensor"):
        _call(*_fixed(), q_descale=_aux([1]))
    with raises("attention_fwd: argument 'v_descale': expected one element or shape [2, 2] (batch, nheads_kv), "
                "got [2, 4]"):
        _call(*_fixed(d=128, dtype="float8_e4m3fn", out_dtype="bfloat16"), v_descale=_aux([2, 4]))
    with raises("attention_fwd: argument 'rung': expected 4 or -1 (auto) for e4m3 inputs (FP8 runs on the Hopper "
                "rung only), got 3"):
        _call(*_fixed(d=128, dtype="float8_e4m3fn", out_dtype="bfloat16"), rung=3)


def _fp8_inputs(shape_q, shape_k, seed: int, per_head: bool, b: int, hkv: int):
    """e4m3 q, k, v (from scaled normals) and fp32 descales (one element or (b, hkv))."""
    g = _gen(seed)
    q = (torch.randn(shape_q, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    k = (torch.randn(shape_k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    v = (torch.randn(shape_k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
    n = (b, hkv) if per_head else (1,)
    descales = [(torch.rand(n, device="cuda", generator=g) * 0.75 + 0.25).contiguous() for _ in range(3)]
    return q, k, v, descales


def _fp8_reference(q, k, v, descales, *, per_head, scale, causal, softcap=0.0):
    """(float64 reference, naive FP8) (out, lse) of fixed-length e4m3 inputs: the reference on the
    dequantized values; the naive computation in fp32 with P rounded to e4m3 before P V, bf16 out."""
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]

    def deq(x, f):
        f = f.double().reshape(b, 1, hkv, 1) if per_head else f.double().reshape(1, 1, 1, 1)
        xd = x.double().reshape(x.shape[0], x.shape[1], hkv, -1, d) * f[..., None]
        return xd.reshape(x.shape)

    qd, kd, vd = deq(q, descales[0]), deq(k, descales[1]), deq(v, descales[2])
    ref, ref_lse, _ = _attend(qd, kd, vd, None, scale=scale, softcap=softcap, causal=causal, wl=-1, wr=-1)
    kx = kd.float().repeat_interleave(h // hkv, dim=2).transpose(1, 2)
    vx = vd.float().repeat_interleave(h // hkv, dim=2).transpose(1, 2)
    s = (qd.float().transpose(1, 2) @ kx.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~_keep(sq, sk, causal, -1, -1), -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    naive = ((p.to(torch.float8_e4m3fn).float() @ vx) / l).to(torch.bfloat16).transpose(1, 2)
    return (ref, ref_lse), (naive, (m + torch.log(l)).squeeze(-1))


@gpu
@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e4m3fn"), reason="torch without float8_e4m3fn")
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
# Rows of up to 4.5k keys (ragged ends of the 128-key blocks and of the 192-row query tiles, the
# zero-filled end of the transposed V); softcap takes the other FP8 kernel (two consumer warpgroups,
# src/attention_hopper_hdim.cuh). The LSE too (the kernels' P is 256 times larger, kAttnFp8PShiftLog2),
# with which the library takes the kernel that sums P in fp32.
@pytest.mark.parametrize("b,sq,sk,h,hkv,causal,softcap", [
    (2, 128, 128, 4, 4, False, 0.0), (1, 300, 517, 4, 2, True, 0.0), (2, 1000, 1000, 2, 1, False, 0.0),
    (1, 77, 1, 2, 2, False, 0.0), (1, 200, 2100, 2, 1, True, 0.0), (2, 130, 4500, 2, 2, False, 0.0),
    (1, 300, 700, 4, 2, True, 20.0)])
def test_fp8(b, sq, sk, h, hkv, causal, softcap, per_head):
    if not _hopper_here():
        pytest.skip("FP8 attention runs on sm_90 only")
    d = 128
    q, k, v, descales = _fp8_inputs((b, sq, h, d), (b, sk, hkv, d), sq + sk, per_head, b, hkv)
    out = flashlab.flash_attn_func(q, k, v, causal=causal, softcap=softcap, q_descale=descales[0],
                                   k_descale=descales[1], v_descale=descales[2])
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    ref, naive = _fp8_reference(q, k, v, descales, per_head=per_head, scale=d ** -0.5, causal=causal, softcap=softcap)
    what = f"fp8 b{b} sq{sq} sk{sk} h{h}/{hkv} causal={causal} softcap={softcap}"
    check_close(out, _np(ref[0]), _np(naive[0]), "bfloat16", what)
    # The same call with the LSE, into outputs poisoned with NaN (another kernel without softcap:
    # the rows' sums in fp32 rather than by the tensor cores, src/attention_hopper_hdim.cuh).
    out2 = torch.full_like(out, math.nan)
    lse = torch.full((b, h, sq), math.nan, device="cuda")
    flashlab.attention_fwd(q, k, v, out2, softmax_lse=lse, causal=causal, softcap=softcap, q_descale=descales[0],
                           k_descale=descales[1], v_descale=descales[2])
    check_close(out2, _np(ref[0]), _np(naive[0]), "bfloat16", f"{what} (with lse)")
    check_close(lse, _np(ref[1]), _np(naive[1]), "bfloat16", f"{what}: lse")


def _hopper_here() -> bool:
    return torch.cuda.get_device_capability()[0] == 9


# The top cases run on the FA2 rung and on the default choice (impl=None: rung 4 on Hopper for
# head dims >= 64, rung 3 otherwise).
@gpu
@pytest.mark.parametrize("rung", [3, None], ids=["fa2", "auto"])
@pytest.mark.parametrize("case", TOP_CASES, ids=lambda c: f"{c[6]}-b{c[0]}-sq{c[1]}-sk{c[2]}-h{c[3]}/{c[4]}-d{c[5]}")
def test_top_rung(case, rung):
    b, sq, sk, h, hkv, d, dtype, opts = case
    _run_fixed(b, sq, sk, h, hkv, d, dtype, rung=rung, seed=sq * 7 + sk, **opts)


@gpu
def test_default_is_the_hopper_rung_on_sm90():
    q, k, v = (_randn((2, 300, 4, 128), "bfloat16", s) for s in (1, 2, 3))
    auto = flashlab.flash_attn_func(q, k, v, causal=True)
    expected = 4 if _hopper_here() else 3
    assert torch.equal(auto, flashlab.flash_attn_func(q, k, v, causal=True, impl=expected))
    q32 = _randn((1, 70, 2, 32), "float16", 4)
    assert torch.equal(flashlab.flash_attn_func(q32, q32, q32), flashlab.flash_attn_func(q32, q32, q32, impl=3))


# Every rung on smaller sizes (rungs 1-2 are slow by design).
LADDER_CASES = [
    (2, 17, 17, 4, 4, 64, "float16", {}),
    (1, 113, 256, 4, 2, 128, "bfloat16", dict(causal=True)),
    (2, 128, 17, 2, 1, 32, "float16", dict(causal=True)),                            # fully masked rows
    (1, 256, 128, 4, 4, 96, "bfloat16", dict(window=(16, 8), softcap=5.0, amp=3.0)),
    (1, 1, 113, 2, 2, 256, "float16", dict(alibi="h")),
    (1, 113, 113, 2, 2, 192, "bfloat16", dict(causal=True, alibi="bh", scale=0.05)),
]


@gpu
@pytest.mark.parametrize("rung", range(1, 5))
@pytest.mark.parametrize("case", LADDER_CASES, ids=lambda c: f"{c[6]}-b{c[0]}-sq{c[1]}-sk{c[2]}-d{c[5]}")
def test_every_rung(rung, case):
    b, sq, sk, h, hkv, d, dtype, opts = case
    if rung == 4 and (d < 64 or not _hopper_here()):
        pytest.skip("rung 4: sm_90 and head dims >= 64")
    _run_fixed(b, sq, sk, h, hkv, d, dtype, rung=rung, seed=rung + sq, api=rung == 1, **opts)


# Varlen: ragged lengths, an empty query entry, an empty key entry (its rows: 0 and -inf).
VARLEN_CASES = [
    ([17, 0, 113, 1, 128], [17, 5, 0, 256, 128], 4, 2, 64, "float16", dict(causal=True, window=(32, 8))),
    ([1023, 1, 256], [2049, 17, 113], 4, 1, 128, "bfloat16", dict(causal=True)),
    ([128, 17], [113, 256], 2, 2, 256, "float16", dict(alibi="bh", softcap=8.0, max_pad=5)),
    ([1, 1, 1, 1], [1023, 1, 128, 17], 8, 2, 32, "bfloat16", dict(window=(64, -1), alibi="h")),
]


@gpu
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"{c[5]}-q{sum(c[0])}-k{sum(c[1])}-d{c[4]}")
@pytest.mark.parametrize("rung", [3, None], ids=["fa2", "auto"])
def test_varlen_top_rung(case, rung):
    lens_q, lens_k, h, hkv, d, dtype, opts = case
    _run_varlen(lens_q, lens_k, h, hkv, d, dtype, rung=rung, seed=len(lens_q), **opts)


@gpu
@pytest.mark.parametrize("rung", range(1, 5))
def test_varlen_every_rung(rung):
    if rung == 4 and not _hopper_here():
        pytest.skip("rung 4: sm_90")
    _run_varlen([17, 0, 113, 64], [33, 9, 0, 128], 4, 2, 64, "bfloat16", rung=rung, causal=True, window=(24, -1),
                alibi="h", seed=rung, api=False)
    _run_varlen([1, 128], [256, 1], 2, 1, 128, "float16", rung=rung, softcap=4.0, seed=rung + 10, api=False)


@gpu
def test_packed_variants_match_unpacked():
    b, s, h, d = 2, 113, 4, 64
    qkv = _randn((b, s, 3, h, d), "float16", 1)
    ref = flashlab.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(flashlab.flash_attn_qkvpacked_func(qkv, causal=True), ref)
    q = _randn((b, s, h, d), "float16", 2)
    kv = _randn((b, 129, 2, 2, d), "float16", 3)
    ref = flashlab.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], window_size=(16, 16))
    assert torch.equal(flashlab.flash_attn_kvpacked_func(q, kv, window_size=(16, 16)), ref)
    cu = _cu([17, 96])
    tqkv = qkv.reshape(b * s, 3, h, d)[:113]
    got = flashlab.flash_attn_varlen_qkvpacked_func(tqkv, cu, 96, causal=True, return_attn_probs=True)
    ref = flashlab.flash_attn_varlen_func(tqkv[:, 0], tqkv[:, 1], tqkv[:, 2], cu, cu, 96, 96, causal=True,
                                          return_attn_probs=True)
    assert len(got) == 3 and all(torch.equal(x, y) for x, y in zip(got, ref))
    tkv = kv.reshape(b * 129, 2, 2, d)
    cu_k = _cu([129, 129])
    got = flashlab.flash_attn_varlen_kvpacked_func(q.reshape(b * s, h, d), tkv, _cu([s, s]), cu_k, s, 129)
    assert torch.equal(got, flashlab.flash_attn_varlen_func(q.reshape(b * s, h, d), tkv[:, 0], tkv[:, 1],
                                                            _cu([s, s]), cu_k, s, 129))


@gpu
def test_strided_views():
    # q: a slice of a wider head dim; k: a view into packed kv; v: a (b, h, s, d) tensor seen as
    # (b, s, h, d); out: a strided view whose padding must stay untouched.
    b, sq, sk, h, hkv, d = 2, 113, 256, 4, 2, 64
    q = _randn((b, sq, h, d + 16), "bfloat16", 1)[..., :d]
    kv = _randn((b, sk, 2, hkv, d), "bfloat16", 2)
    k = kv[:, :, 0]
    v = _randn((b, hkv, sk, d), "bfloat16", 3).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    o = _opts(True, (-1, -1), 0.0, None, d)
    ref = _attend(q.double(), k.double(), v.double(), None, **o)
    naive = _attend(q, k, v, None, **o)
    for rung in range(1, 4):
        out_base = torch.full((b, sq, h, d + 8), math.nan, device="cuda", dtype=torch.bfloat16)
        out = out_base[..., :d]
        lse = torch.full((b, h, sq), math.nan, device="cuda")
        flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, causal=True, rung=rung)
        _compare((out, lse, None), ref, naive, "bfloat16", f"strided views rung {rung}")
        assert torch.isnan(out_base[..., d:]).all(), f"rung {rung} wrote into out's padding"
        res = flashlab.flash_attn_func(q, k, v, causal=True, impl=rung)
        check_close(res, _np(ref[0]), _np(naive[0]), "bfloat16", f"strided views flash_attn_func impl {rung}")


@gpu
def test_autograd_records():
    # What autograd records; the gradients' numerics are test_attention_bwd.py's.
    q, k, v = (_randn((1, 17, 2, 64), "float16", i) for i in range(3))
    out = flashlab.flash_attn_func(q, k, v)
    assert not out.requires_grad and out.grad_fn is None
    q.requires_grad_(True)
    out, lse, probs = flashlab.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.requires_grad and out.grad_fn is not None
    assert not lse.requires_grad and not probs.requires_grad  # non-differentiable outputs
    check_close(out.detach(), _np(_attend(q.detach().double(), k.double(), v.double(), None,
                                          **_opts(True, (-1, -1), 0.0, None, 64))[0]),
                _np(_attend(q.detach(), k, v, None, **_opts(True, (-1, -1), 0.0, None, 64))[0]), "float16", "autograd")
    out.float().sum().backward()  # the backward runs
    assert q.grad is not None and q.grad.shape == q.shape and q.grad.dtype == q.dtype and torch.isfinite(q.grad).all()
    assert k.grad is None and v.grad is None  # they do not require grad
    with torch.no_grad():
        assert not flashlab.flash_attn_func(q, k, v).requires_grad
        assert not flashlab.flash_attn_func(q, k, v, return_attn_probs=True)[0].requires_grad
    cu = _cu([17])
    out = flashlab.flash_attn_varlen_func(q[0].detach(), k[0], v[0].clone().requires_grad_(True), cu, cu, 17, 17)
    assert out.requires_grad  # v alone requires grad
    qkv = _randn((1, 17, 3, 2, 64), "float16", 4).requires_grad_(True)
    out = flashlab.flash_attn_qkvpacked_func(qkv)
    assert out.requires_grad
    out.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()


@gpu
def test_runs_on_torchs_current_stream():
    q0, k, v = (_randn((1, 256, 2, 64), "float16", i) for i in range(3))
    q1 = _randn((1, 256, 2, 64), "float16", 9)
    q = q0.clone()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        q.copy_(q1)
        out = flashlab.flash_attn_func(q, k, v)
    s.synchronize()
    o = _opts(False, (-1, -1), 0.0, None, 64)
    check_close(out, _np(_attend(q1.double(), k.double(), v.double(), None, **o)[0]),
                _np(_attend(q1, k, v, None, **o)[0]), "float16", "side stream")


@gpu
@pytest.mark.skipif(torch is None or not hasattr(torch.nn.functional, "scaled_dot_product_attention"),
                    reason="needs torch SDPA")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_agrees_with_sdpa(dtype):
    b, s, h, d = 2, 1023, 4, 128
    q, k, v = (_randn((b, s, h, d), dtype, 20 + i) for i in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            is_causal=True).transpose(1, 2)
    out = flashlab.flash_attn_func(q, k, v, causal=True)
    ref = _attend(q.double(), k.double(), v.double(), None, **_opts(True, (-1, -1), 0.0, None, d))[0]
    # Our error is at most twice SDPA's (plus the rounding floor), and we agree with it closely.
    check_close(out, _np(ref), _np(sdpa), dtype, f"vs SDPA {dtype}")
    u = 2.0 ** -11 if dtype == "float16" else 2.0 ** -8
    assert (out.float() - sdpa.float()).abs().max().item() <= 8 * u * ref.abs().max().item()


@gpu
def test_gpu_errors_carry_the_cpp_message():
    q = _randn((1, 17, 4, 80), "float16", 1)
    with raises("attention_fwd: argument 'q': expected head dim (last dim) one of 32, 64, 96, 128, 192, 256, got 80"):
        flashlab.flash_attn_func(q, q, q)
    q, k = _randn((1, 17, 4, 64), "float16", 1), _randn((1, 17, 3, 64), "float16", 2)
    with raises("attention_fwd: argument 'k': expected a number of heads that divides q's 4 (GQA/MQA), got 3"):
        flashlab.flash_attn_func(q, k, k)
