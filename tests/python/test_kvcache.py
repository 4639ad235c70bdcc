"""flashlab.flash_attn_with_kvcache (python/flashlab/kvcache.py) and flash_attn_varlen_func's
paged path (block_table).

CPU part: what it refuses (non-torch q, ALiBi, a right window); with torch (CPU tensors are enough)
every check that must fire before the cache is written (dtypes, head dims, shapes, cache_seqlens,
the block table, the capacity, rotary), each asserting the cache is unchanged; the CSR page table
of a sequence longer than its block_table row; negative windows taken as unbounded; and, with the
kernels replaced by spies, the positions q and the new k are rotated at (flash-attn's rule written
out, the rotation recomputed in float64). GPU part: the rotation against float64 (one rounding);
then paged and contiguous caches with new tokens appended (rotary both layouts, causal, local and
non-causal), decode (one query: the split-KV decode) and prefill-shaped calls (several queries, a
window, softcap): the cache must hold the old values and the new ones at cache_seqlens (rotated
ones within one bf16 rounding of float64), and out / softmax_lse must match float64 attention over
the updated cache (tolerance as test_serving's prefill checks); a call captured in a CUDA graph.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
import flashlab.flash_attn_interface as fai
import flashlab.kvcache as kvcache
from flashlab.kvcache import _rotate, csr_page_table
from numerics import attention_reference
from test_bindings import gpu, torch

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (CPU tensors are enough)")


def test_refusals():
    with pytest.raises(TypeError, match="argument 'q': expected a torch tensor"):
        flashlab.flash_attn_with_kvcache([1.0], None, None)
    if torch is None:
        return
    q = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16)
    kc = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="argument 'alibi_slopes'"):
        flashlab.flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="argument 'window_size': expected a right window of -1 or 0"):
        flashlab.flash_attn_with_kvcache(q, kc, kc, window_size=(-1, 4))


# ---------------------------------------------------------------------------------------------
# CPU: the checks that fire before the cache is written (CPU tensors: a call that passes them
# writes the cache and is then refused by the kernels' device check, so "unchanged" is a real test).

def _case(d=64, sq=2, new=2, h=4, hk=2, paged=True, dtype=None):
    """Arguments of a valid call but for the tensors' device: batch 2, page 16, 4 blocks a row (64
    tokens), a pool of 9 pages; contiguous: 3 rows of 64."""
    g = torch.Generator().manual_seed(7)
    dtype = torch.bfloat16 if dtype is None else dtype

    def rnd(*shape):
        return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)

    kc = rnd(9, 16, hk, d) if paged else rnd(3, 64, hk, d)
    a = dict(q=rnd(2, sq, h, d), k_cache=kc, v_cache=rnd(*kc.shape), k=rnd(2, new, hk, d), v=rnd(2, new, hk, d),
             cache_seqlens=torch.tensor([5, 40], dtype=torch.int32), causal=True)
    if paged:
        a["block_table"] = torch.tensor([[3, 1, 4, 0], [2, 8, 5, 7]], dtype=torch.int32)
    return a


def _rotary(rows=64, half=16):
    theta = torch.arange(rows, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    return dict(rotary_cos=theta.cos().float(), rotary_sin=theta.sin().float())


def _with(**changes):
    def build():
        a = _case(**{k: changes.pop(k) for k in ("d", "sq", "new", "h", "hk", "paged", "dtype") if k in changes})
        for key, value in changes.items():
            if callable(value):
                a[key] = value(a)
            elif value is _DROP:
                del a[key]
            else:
                a[key] = value
        return a
    return build


_DROP = object()
_I32, _I64 = "int32", "int64"


def _t(values, dtype=_I32):
    return torch.tensor(values, dtype=getattr(torch, dtype))


def _before_write_cases():
    """name: (arguments builder, the message after 'flash_attn_with_kvcache: ')."""
    return {
        # dtypes (flash-attn: one dtype, fp16 / bf16, nothing converted)
        "q_fp32": (_with(q=lambda a: a["q"].float()), "argument 'q': expected fp16 or bf16, got torch.float32"),
        "cache_fp16": (_with(k_cache=lambda a: a["k_cache"].half(), v_cache=lambda a: a["v_cache"].half()),
                       "argument 'k_cache': expected q's dtype torch.bfloat16, got torch.float16"),
        "k_fp16": (_with(k=lambda a: a["k"].half()), "argument 'k': expected q's dtype torch.bfloat16, got torch.float16"),
        "v_fp32": (_with(v=lambda a: a["v"].float()), "argument 'v': expected q's dtype torch.bfloat16, got torch.float32"),
        # head dims: the prefill takes 64 / 128 / 256, the decode (one query, no window / softcap) more
        "prefill_d96": (_with(d=96), "argument 'q': expected a head dim in (64, 128, 256) (the prefill kernel), got 96"),
        "decode_d80": (_with(d=80, sq=1, new=1),
                       "argument 'q': expected a head dim in (32, 64, 96, 128, 192, 256) (the decode kernel), got 80"),
        "decode_window_d96": (_with(d=96, sq=1, new=1, window_size=(8, -1)),
                              "argument 'q': expected a head dim in (64, 128, 256) (the prefill kernel), got 96"),
        "cache_d128": (_with(k_cache=lambda a: torch.zeros(9, 16, 2, 128, dtype=torch.bfloat16),
                             v_cache=lambda a: torch.zeros(9, 16, 2, 128, dtype=torch.bfloat16)),
                       "argument 'k_cache': expected q's head dim 64, got [9, 16, 2, 128]"),
        # shapes
        "v_cache_shape": (_with(v_cache=lambda a: a["v_cache"][:8]),
                          "argument 'v_cache': expected k_cache's shape [9, 16, 2, 64], got [8, 16, 2, 64]"),
        "cache_stride": (_with(k_cache=lambda a: torch.zeros(9, 16, 2, 128, dtype=torch.bfloat16)[..., ::2]),
                         "argument 'k_cache': expected a contiguous head dim (stride 1), got stride 2"),
        "heads": (_with(h=4, hk=3), "argument 'k_cache': expected a KV head count dividing q's 4 heads, got 3"),
        "k_heads": (_with(k=lambda a: a["k"].repeat(1, 1, 2, 1)),
                    "argument 'k': expected (batch, seqlen_new, nheads_k, headdim) = [2, 2, 2, 64], got [2, 2, 4, 64]"),
        "v_length": (_with(v=lambda a: torch.cat((a["v"], a["v"]), 1)),
                     "argument 'v': expected (batch, seqlen_new, nheads_k, headdim) = [2, 2, 2, 64], got [2, 4, 2, 64]"),
        "k_only": (_with(v=_DROP), "arguments 'k', 'v': expected both or neither"),
        # cache_seqlens (flash-attn: an int or int32 (batch,))
        "seqlens_int64": (_with(cache_seqlens=_t([5, 40], _I64)),
                          "argument 'cache_seqlens': expected an int or an int32 tensor (batch = 2,), got torch.int64 [2]"),
        "seqlens_shape": (_with(cache_seqlens=_t([5, 40, 0])),
                          "argument 'cache_seqlens': expected an int or an int32 tensor (batch = 2,), got torch.int32 [3]"),
        "seqlens_negative": (_with(cache_seqlens=_t([5, -1])),
                             "argument 'cache_seqlens': expected values >= 0, got -1 for sequence 1"),
        "seqlens_negative_int": (_with(cache_seqlens=-3), "argument 'cache_seqlens': expected a value >= 0, got -3"),
        "seqlens_none_with_k": (_with(cache_seqlens=None),
                                "argument 'cache_seqlens': expected the cache's lengths with new"),
        # the capacity: block_table.shape[1] x page_block_size, or seqlen_cache
        "past_the_table": (_with(cache_seqlens=_t([5, 63])),
                           "argument 'cache_seqlens': expected cache_seqlens + seqlen_new (k's length) <= 64 (block_table's "
                           "4 blocks of page_block_size 16), got 63 + 2 for sequence 1"),
        "past_the_table_int": (_with(cache_seqlens=70, k=_DROP, v=_DROP),
                               "argument 'cache_seqlens': expected cache_seqlens + seqlen_new (k's length) <= 64 "
                               "(block_table's 4 blocks of page_block_size 16), got 70 + 0 for sequence 0"),
        "past_the_rows": (_with(paged=False, cache_seqlens=_t([0, 63])),
                          "argument 'cache_seqlens': expected cache_seqlens + seqlen_new (k's length) <= 64 (seqlen_cache "
                          "64), got 63 + 2 for sequence 1"),
        # the table / rows the call uses
        "table_int64": (_with(block_table=lambda a: a["block_table"].long()),
                        "argument 'block_table': expected int32 (batch = 2, max_blocks), got torch.int64 [2, 4]"),
        "table_rows": (_with(block_table=lambda a: a["block_table"][:1]),
                       "argument 'block_table': expected int32 (batch = 2, max_blocks), got torch.int32 [1, 4]"),
        "table_past_pool": (_with(block_table=_t([[3, 1, 4, 0], [2, 8, 9, 7]])),  # 40 + 2 tokens: blocks 0..2 of row 1
                            "argument 'block_table': expected page indices (the blocks of 'k_cache') in [0, 9), got 9 "
                            "(sequence 1, entry 2)"),
        "table_negative": (_with(block_table=_t([[-1, 1, 4, 0], [2, 8, 5, 7]])),
                           "argument 'block_table': expected page indices (the blocks of 'k_cache') in [0, 9), got -1 "
                           "(sequence 0, entry 0)"),
        "batch_idx_and_table": (_with(cache_batch_idx=_t([0, 1])),
                                "argument 'cache_batch_idx': expected None with 'block_table'"),
        "batch_idx_int64": (_with(paged=False, cache_batch_idx=_t([2, 0], _I64)),
                            "argument 'cache_batch_idx': expected int32 (batch = 2,), got torch.int64 [2]"),
        "batch_idx_past_rows": (_with(paged=False, cache_batch_idx=_t([2, 3])),
                                "argument 'cache_batch_idx': expected rows of 'k_cache' in [0, 3), got 3 "
                                "(sequence 1, entry 0)"),
        "rows_below_batch": (_with(paged=False, k_cache=lambda a: a["k_cache"][:1], v_cache=lambda a: a["v_cache"][:1]),
                             "argument 'k_cache': expected at least batch = 2 sequences without 'cache_batch_idx', got 1"),
        # rotary (flash-attn: only with new k / v)
        "rotary_without_k": (_with(k=_DROP, v=_DROP, **_rotary()),
                             "arguments 'rotary_cos', 'rotary_sin': expected new 'k', 'v' with them"),
        "rotary_rows": (_with(**_rotary(rows=41)),
                        "argument 'rotary_cos': expected at least cache_seqlens + 2 = 42 rows (the rotated positions of "
                        "sequence 1), got 41"),
        "rotary_dim": (_with(**_rotary(half=40)),
                       "argument 'rotary_cos': expected (seqlen_ro, rotary_dim / 2) with rotary_dim <= headdim 64"),
    }


_BEFORE_WRITE = _before_write_cases() if torch is not None else {"torch missing": None}


@needs_torch
@pytest.mark.parametrize("case", sorted(_BEFORE_WRITE))
def test_checked_before_the_cache_is_written(case):
    build, message = _BEFORE_WRITE[case]
    a = build()
    k_before, v_before = a["k_cache"].clone(), a["v_cache"].clone()
    with pytest.raises(ValueError, match="^" + re.escape("flash_attn_with_kvcache: " + message)):
        flashlab.flash_attn_with_kvcache(**a)
    assert torch.equal(a["k_cache"], k_before) and torch.equal(a["v_cache"], v_before), "the cache was written"


@needs_torch
def test_csr_page_table_past_the_row():
    # 4 blocks of 16 a row; sequence 0 needs 5 pages: the fifth is the pool's size (9 + 21 = 30),
    # out of range, where the row's last page used to be repeated.
    table = _t([[10, 11, 12, 13], [0, 1, 2, 3], [20, 21, 22, 23]])
    ind, ptr, last = csr_page_table(torch, table, _t([80, 0, 16]), 16, 30)
    assert ptr.tolist() == [0, 5, 5, 6] and last.tolist() == [16, 0, 16]
    assert ind.dtype == torch.int32 and ind[:6].tolist() == [10, 11, 12, 13, 30, 20]
    ind, ptr, last = csr_page_table(torch, table, _t([64, 1, 17]), 16, 30)  # within the rows
    assert ptr.tolist() == [0, 4, 5, 7] and last.tolist() == [16, 1, 1]
    assert ind[:7].tolist() == [10, 11, 12, 13, 0, 20, 21]


class _Spy:
    """Stands in for a kernel: records its arguments, returns zeros of the right shapes."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, *args, **kwargs):
        self.calls.append((q, args, kwargs))
        return torch.zeros_like(q), torch.zeros(q.shape[:2])


@needs_torch
def test_negative_windows_are_unbounded(monkeypatch):
    prefill, decode = _Spy(), _Spy()
    monkeypatch.setattr(kvcache, "batch_prefill_paged", prefill)
    monkeypatch.setattr(kvcache, "batch_decode_paged", decode)
    flashlab.flash_attn_with_kvcache(**_with(window_size=(-5, -3))())  # -3: unbounded right, not causal
    assert prefill.calls[-1][2]["window_left"] == -1 and prefill.calls[-1][2]["causal"] is True
    flashlab.flash_attn_with_kvcache(**_with(window_size=(-7, -1), causal=False)())
    assert prefill.calls[-1][2]["causal"] is False
    flashlab.flash_attn_with_kvcache(**_with(sq=1, new=1, window_size=(-2, -1))())  # the decode: no window
    assert len(decode.calls) == 1 and len(prefill.calls) == 2
    # flash_attn_func / flash_attn_varlen_func: the same, down to the C++ call's window
    seen = {}
    monkeypatch.setattr(fai, "attention_fwd", lambda *a, **kw: seen.update(kw))
    x = np.zeros((1, 4, 2, 64), np.float16)
    flashlab.flash_attn_func(x, x, x, window_size=(-4, -9))
    assert (seen["window_left"], seen["window_right"]) == (-1, -1)


# flash-attn's rotary positions, written out: new key i of sequence b at cache_seqlens[b] + i; query
# i at cache_seqlens[b] + i when the mask is causal or local, else every query at cache_seqlens[b].
def _q_positions(lens, seqlen_q, causal, window_left):
    return [[n + i if causal or window_left >= 0 else n for i in range(seqlen_q)] for n in lens]


def _rope64(x, cos, sin, positions, interleaved):
    """x (s, h, d) of one sequence rotated in float64, row i at positions[i]: each pair (2j, 2j + 1)
    (interleaved) or (j, j + rotary_dim / 2) turned by the angle of cos[p, j], sin[p, j]."""
    x = x.double().cpu().clone()
    half = cos.shape[1]
    first = [2 * j if interleaved else j for j in range(half)]
    second = [2 * j + 1 if interleaved else j + half for j in range(half)]
    for i, p in enumerate(positions):
        c, s = cos[p].double().cpu(), sin[p].double().cpu()
        a, b = x[i][:, first].clone(), x[i][:, second].clone()
        x[i][:, first], x[i][:, second] = a * c - b * s, a * s + b * c
    return x


def _within_one_rounding(got, want):
    # fp32 ops rounded once to bf16 against float64: half an ulp plus the fp32 terms
    return (got.double() - want).abs().le(2.0 ** -8 * want.abs() + 2.0 ** -20).all()


@needs_torch
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal, window_left", [(True, -1), (False, -1), (False, 6)])
def test_rotary_positions(monkeypatch, interleaved, causal, window_left):
    prefill = _Spy()
    monkeypatch.setattr(kvcache, "batch_prefill_paged", prefill)
    a = _with(sq=3, new=3, causal=causal, window_size=(window_left, -1), rotary_interleaved=interleaved, **_rotary())()
    q, k, kc = a["q"].clone(), a["k"].clone(), a["k_cache"].clone()
    flashlab.flash_attn_with_kvcache(**a)
    lens, cos, sin = [5, 40], a["rotary_cos"], a["rotary_sin"]
    q_pos = _q_positions(lens, 3, causal, window_left)
    got_q = prefill.calls[0][0].view(2, 3, 4, 64)
    for b in range(2):
        assert _within_one_rounding(got_q[b], _rope64(q[b], cos, sin, q_pos[b], interleaved)), f"q of sequence {b}"
        want_k = _rope64(k[b], cos, sin, [lens[b] + i for i in range(3)], interleaved)
        for i in range(3):  # appended at block_table[b, p // 16], slot p % 16
            p = lens[b] + i
            page = int(a["block_table"][b, p // 16])
            assert _within_one_rounding(a["k_cache"][page, p % 16], want_k[i]), f"k {i} of sequence {b}"
            kc[page, p % 16] = a["k_cache"][page, p % 16]
    assert torch.equal(a["k_cache"], kc), "only the appended slots change"


@needs_torch
def test_varlen_block_table_checks():
    fn = "flash_attn_varlen_func"
    kc = torch.zeros(9, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(10, 4, 64, dtype=torch.bfloat16)
    cu_q, cu_k, table = _t([0, 4, 10]), _t([0, 30, 94]), _t([[3, 1, 4, 0], [2, 8, 5, 7]])
    with pytest.raises(ValueError, match=rf"^{fn}: argument 'block_table': expected int32 \(batch = 2, max_blocks\), "
                                         r"got torch.int64 \[2, 4\]"):
        flashlab.flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 6, 64, block_table=table.long())
    with pytest.raises(ValueError, match=rf"^{fn}: argument 'block_table': expected int32 \(batch = 2, max_blocks\), "
                                         r"got torch.int32 \[3, 4\]"):
        flashlab.flash_attn_varlen_func(q, kc, kc, cu_q, cu_k, 6, 64, block_table=torch.cat((table, table[:1])))
    with pytest.raises(ValueError, match=rf"^{fn}: argument 'cu_seqlens_k': expected int32 \(batch \+ 1,\)"):
        flashlab.flash_attn_varlen_func(q, kc, kc, cu_q, cu_k.long(), 6, 64, block_table=table)
    with pytest.raises(ValueError, match=rf"^{fn}: argument 'cu_seqlens_k': expected non-decreasing values, sequence "
                                         r"lengths <= 64 \(block_table's 4 blocks of page_block_size 16\), got 65 for "
                                         r"sequence 1"):
        flashlab.flash_attn_varlen_func(q, kc, kc, cu_q, _t([0, 30, 95]), 6, 65, block_table=table)
    with pytest.raises(ValueError, match=rf"^{fn}: argument 'k': expected the paged cache"):
        flashlab.flash_attn_varlen_func(q, kc[0], kc[0], cu_q, cu_k, 6, 64, block_table=table)


@needs_torch
def test_varlen_block_table_reaches_the_prefill(monkeypatch):
    # 64 tokens fill sequence 1's row exactly; a negative left window is unbounded
    prefill = _Spy()
    monkeypatch.setattr(flashlab.serving, "batch_prefill_paged", prefill)
    kc = torch.zeros(9, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(10, 4, 64, dtype=torch.bfloat16)
    flashlab.flash_attn_varlen_func(q, kc, kc, _t([0, 4, 10]), _t([0, 30, 94]), 6, 64, window_size=(-3, -1),
                                    block_table=_t([[3, 1, 4, 0], [2, 8, 5, 7]]))
    _, (qo, _cache, ind, ptr, last), kw = prefill.calls[0]
    assert kw["window_left"] == -1 and ptr.tolist() == [0, 2, 6] and last.tolist() == [14, 16]
    assert ind[:6].tolist() == [3, 1, 2, 8, 5, 7]


@gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_matches_float64(interleaved):
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(2, 3, 4, 128, generator=g) * 4 - 2).to(torch.bfloat16)
    theta = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    cos, sin = theta.cos().float(), theta.sin().float()  # rotary_dim 64 of 128
    pos = torch.randint(0, 40, (2, 3), generator=g)
    got = _rotate(torch, x.cuda(), cos.cuda(), sin.cuda(), pos.cuda(), interleaved).double().cpu()
    xd, c, s = x.double(), cos.double()[pos].unsqueeze(2), sin.double()[pos].unsqueeze(2)
    if interleaved:
        x1, x2 = xd[..., 0:64:2], xd[..., 1:64:2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xd[..., :32], xd[..., 32:64]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    want = torch.cat((rot, xd[..., 64:]), dim=-1)
    assert (got - want).abs().le(2.0 ** -8 * want.abs() + 2.0 ** -20).all()
    assert torch.equal(got[..., 64:], xd[..., 64:])  # past rotary_dim: untouched


def _run_case(paged, seqlen_q, seqlen_new, causal, window_left=-1, softcap=0.0, rotary=None, g=None):
    b, h, hk, d, ps = 3, 8, 2, 128, 16
    lens = torch.tensor([5, 40, 0], dtype=torch.int32)
    if paged:
        blocks = 8
        kc = (torch.rand(3 * blocks + 2, ps, hk, d, generator=g) * 2 - 1).to(torch.bfloat16)
        table = torch.randperm(3 * blocks + 2, generator=g)[: 3 * blocks].view(3, blocks).to(torch.int32)
        rows_of = lambda bb, n: [(int(table[bb, p // ps]), p % ps) for p in range(n)]  # noqa: E731
        extra = {"block_table": table.cuda()}
    else:
        kc = (torch.rand(4, 64, hk, d, generator=g) * 2 - 1).to(torch.bfloat16)
        idx = torch.tensor([2, 0, 3], dtype=torch.int32)
        rows_of = lambda bb, n: [(int(idx[bb]), p) for p in range(n)]  # noqa: E731
        extra = {"cache_batch_idx": idx.cuda()}
    vc = (torch.rand(kc.shape, generator=g) * 2 - 1).to(torch.bfloat16)
    q = (torch.rand(b, seqlen_q, h, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    k = (torch.rand(b, seqlen_new, hk, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda() if seqlen_new else None
    v = (torch.rand(b, seqlen_new, hk, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda() if seqlen_new else None
    kc_d, vc_d = kc.cuda(), vc.cuda()
    if rotary is not None:
        theta = torch.arange(128, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
        extra.update(rotary_cos=theta.cos().float().cuda(), rotary_sin=theta.sin().float().cuda(), rotary_interleaved=rotary)
    out, lse = flashlab.flash_attn_with_kvcache(q, kc_d, vc_d, k, v, cache_seqlens=lens.cuda(), causal=causal,
                                                window_size=(window_left, -1), softcap=softcap, return_softmax_lse=True,
                                                **extra)
    torch.cuda.synchronize()
    # What the call must have done to q and k: flash-attn's positions (_q_positions, written out),
    # the rotation recomputed in float64 (_rope64), then q rounded to bf16 as the kernel got it.
    lens_list = [int(n) for n in lens]
    kc_after, vc_after = kc_d.cpu(), vc_d.cpu()
    qr, kr = q.cpu().double(), None if k is None else k.cpu().double()
    if rotary is not None:
        cos, sin = extra["rotary_cos"].cpu(), extra["rotary_sin"].cpu()
        q_pos = _q_positions(lens_list, seqlen_q, causal, window_left)
        qr = torch.stack([_rope64(q[bb], cos, sin, q_pos[bb], rotary) for bb in range(b)])
        kr = torch.stack([_rope64(k[bb], cos, sin, [n + i for i in range(seqlen_new)], rotary)
                          for bb, n in enumerate(lens_list)])
    want_k, want_v = kc.double(), vc.double()
    for bb in range(b):
        for i, (row, slot) in enumerate(rows_of(bb, lens_list[bb] + seqlen_new)[lens_list[bb]:]):
            want_k[row, slot], want_v[row, slot] = kr[bb, i], v[bb, i].cpu().double()
    assert torch.equal(vc_after.double(), want_v), "v cache after the append"
    if rotary is None:
        assert torch.equal(kc_after.double(), want_k), "k cache after the append"
    else:  # rotated in fp32, rounded once: within one bf16 rounding of float64
        assert _within_one_rounding(kc_after, want_k), "k cache after the rotated append"
    qr = qr.to(torch.bfloat16)
    out, lse = out.double().cpu(), lse.double().cpu()
    assert out.shape == (b, seqlen_q, h, d) and lse.shape == (b, h, seqlen_q)
    max_v = float(vc_after.double().abs().max())
    for bb in range(b):
        rows = rows_of(bb, int(lens[bb]) + seqlen_new)
        keys = torch.stack([kc_after[r, s] for r, s in rows]) if rows else torch.zeros(0, hk, d)
        values = torch.stack([vc_after[r, s] for r, s in rows]) if rows else torch.zeros(0, hk, d)
        ref, ref_lse = attention_reference(qr[bb].cpu(), keys, values, causal, window_left, softcap)
        tol = (len(rows) + 8) * 2.0 ** -23
        assert not torch.isnan(out[bb]).any()
        assert (out[bb] - ref).abs().le(2.0 ** -8 * ref.abs() + (tol + 2.0 ** -8) * max_v).all(), f"sequence {bb}"
        inf = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse[bb]), inf), f"sequence {bb}: -inf lse"
        assert (lse[bb][~inf] - ref_lse[~inf]).abs().le(tol * (1 + ref_lse[~inf].abs()) + 1e-5).all(), f"sequence {bb} lse"


@gpu
@pytest.mark.parametrize("paged", [True, False])
def test_prefill_appends_and_attends(paged):
    g = torch.Generator().manual_seed(61)
    _run_case(paged, seqlen_q=7, seqlen_new=7, causal=True, rotary=False, g=g)
    _run_case(paged, seqlen_q=7, seqlen_new=7, causal=True, rotary=True, g=g)
    _run_case(paged, seqlen_q=7, seqlen_new=7, causal=False, rotary=True, g=g)  # every query at cache_seqlens
    _run_case(paged, seqlen_q=7, seqlen_new=7, causal=False, rotary=False, g=g)
    _run_case(paged, seqlen_q=7, seqlen_new=7, causal=False, window_left=5, rotary=True, g=g)  # local: as causal
    _run_case(paged, seqlen_q=9, seqlen_new=0, causal=False, g=g)  # queries over the cache alone


@gpu
@pytest.mark.parametrize("paged", [True, False])
def test_decode_step(paged):
    g = torch.Generator().manual_seed(62)
    _run_case(paged, seqlen_q=1, seqlen_new=1, causal=True, rotary=True, g=g)  # the split-KV decode
    _run_case(paged, seqlen_q=1, seqlen_new=1, causal=True, window_left=8, softcap=30.0, g=g)  # the prefill kernel


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_block_table_is_the_contiguous_forward(causal):
    # flash_attn_varlen_func(block_table=) runs the paged prefill; over the same keys gathered into
    # contiguous k, v the varlen forward is the same kernel family: the bits must agree.
    g = torch.Generator().manual_seed(63)
    h, hk, d, ps, blocks = 8, 2, 128, 16, 6
    lq, lk = [3, 50, 17], [40, 90, 17]
    cache_k = (torch.rand(3 * blocks + 1, ps, hk, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    cache_v = (torch.rand(3 * blocks + 1, ps, hk, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    table = torch.randperm(3 * blocks + 1, generator=g)[: 3 * blocks].view(3, blocks).to(torch.int32).cuda()
    q = ((torch.rand(sum(lq), h, d, generator=g) * 2 - 1).to(torch.bfloat16)).cuda()
    cu_q = torch.tensor([0, 3, 53, 70], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 130, 147], dtype=torch.int32, device="cuda")
    got = flashlab.flash_attn_varlen_func(q, cache_k, cache_v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                          block_table=table)
    k = torch.cat([cache_k[table[b].long()].reshape(-1, hk, d)[:n] for b, n in enumerate(lk)])
    v = torch.cat([cache_v[table[b].long()].reshape(-1, hk, d)[:n] for b, n in enumerate(lk)])
    want = flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@gpu
def test_captured_in_a_cuda_graph():
    # During a capture nothing is read back (the length checks are skipped): the call captures, and
    # a replay gives the eager call's bits (the prefill kernel; the append rewrites the same slots).
    g = torch.Generator().manual_seed(64)
    h, hk, d, ps = 8, 2, 128, 16

    def rnd(*shape):
        return ((torch.rand(*shape, generator=g) * 2 - 1).to(torch.bfloat16)).cuda()

    kc, vc = rnd(20, ps, hk, d), rnd(20, ps, hk, d)
    table = torch.randperm(20, generator=g)[:16].view(2, 8).to(torch.int32).cuda()
    q, k, v = rnd(2, 4, h, d), rnd(2, 4, hk, d), rnd(2, 4, hk, d)
    args = dict(k=k, v=v, cache_seqlens=torch.tensor([5, 40], dtype=torch.int32, device="cuda"), block_table=table,
                causal=True)
    want = flashlab.flash_attn_with_kvcache(q, kc, vc, **args)
    out = torch.empty_like(want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(flashlab.flash_attn_with_kvcache(q, kc, vc, **args))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
