"""flashlab.flash_attn_with_kvcache (python/flashlab/kvcache.py).

CPU part: what it refuses (non-torch q, ALiBi, a right window) with the message naming the argument.
GPU part: the rotation against float64 (one rounding); then paged and contiguous caches with new
tokens appended (rotary both layouts), decode (one query: the split-KV decode) and prefill-shaped
calls (several queries, a window, softcap): the cache must hold the old values and the rotated new
ones at cache_seqlens (exactly: the same torch ops), and out / softmax_lse must match float64
attention over the updated cache (tolerance as test_serving's prefill checks).
"""

from __future__ import annotations

import pytest

import flashlab
from flashlab.kvcache import _rotate
from numerics import attention_reference
from test_bindings import gpu, torch


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
    # What the call must have done to q and k: the same torch ops (so the bits are the same).
    qr, kr = q, k
    if rotary is not None:
        pos = lens.cuda().long().view(b, 1) + torch.arange(max(seqlen_q, seqlen_new), device="cuda").view(1, -1)
        qpos = pos[:, :seqlen_q] if causal or window_left >= 0 else lens.cuda().long().view(b, 1).expand(b, seqlen_q)
        qr = _rotate(torch, q, extra["rotary_cos"], extra["rotary_sin"], qpos, rotary)
        kr = _rotate(torch, k, extra["rotary_cos"], extra["rotary_sin"], pos[:, :seqlen_new], rotary) if k is not None else None
    kc_after, vc_after = kc_d.cpu(), vc_d.cpu()
    want_k, want_v = kc.clone(), vc.clone()
    for bb in range(b):
        for i, (row, slot) in enumerate(rows_of(bb, int(lens[bb]) + seqlen_new)[int(lens[bb]):]):
            want_k[row, slot], want_v[row, slot] = kr[bb, i].cpu(), v[bb, i].cpu()
    assert torch.equal(kc_after, want_k) and torch.equal(vc_after, want_v), "the cache after the append"
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
