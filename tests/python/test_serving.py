"""flashlab.merge_state / merge_state_in_place / merge_states and append_paged_kv_cache
(python/flashlab/serving.py).

CPU part: the C++ validation messages through the bindings (test_bindings' `fake` tensors, which
claim to be on cuda:0 and fail validation before anything runs), and the outputs' default shapes.
GPU part: random states against a float64 numpy reference (some segments empty: s = -inf; a row with
every state empty gives V = 0, S = -inf exactly), fp32 / fp16 / bf16, in place; and attention over
two key segments by flash_attn_func, merged, against attention over all keys (torch float64).
Tolerances as tests/gpu/test_merge_state.cpp: V within u(dtype) |ref| + 2^-20 max|v|, S within
2^-20 (1 + |S|); the split attention within the segments' own measured error + one rounding.
append_paged_kv_cache: messages (CPU); on the GPU the cache byte for byte against torch's
indexing of the same scatter (both layouts, page sizes 1 and 16, strided K/V, a tuple or one
(max_pages, 2, ...) cache), and a bad page index rejected with the cache unchanged.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import flashlab
from numerics import attention_reference
from test_bindings import fake, gpu, raises, torch


def test_messages_name_the_op_and_argument():
    v, s = fake((7, 4, 64), "bfloat16"), fake((7, 4), "float32")
    with raises("merge_state: argument 'v_b': expected shape [7, 4, 64] (same as 'v_a'), got [7, 4, 32]"):
        flashlab.merge_state(v, s, fake((7, 4, 32), "bfloat16"), s, v_out=fake((7, 4, 64), "bfloat16"),
                             s_out=fake((7, 4), "float32"))
    with raises("merge_state: argument 's_a': expected dtype fp32, got bf16"):
        flashlab.merge_state(v, fake((7, 4), "bfloat16"), v, s, v_out=v, s_out=s)
    with raises("merge_states: argument 's': expected shape [7, 3, 4], got [7, 4]"):
        flashlab.merge_states(fake((7, 3, 4, 64), "bfloat16"), fake((7, 4), "float32"),
                              v_out=fake((7, 4, 64), "bfloat16"), s_out=fake((7, 4), "float32"))


def _reference(v, s):
    """float64 merge of v (seq, n, h, d), s (seq, n, h) -> (V, S)."""
    v, s = np.asarray(v, np.float64), np.asarray(s, np.float64)
    m = s.max(axis=1, keepdims=True)
    empty = np.isneginf(m)
    off = np.where(empty, 0.0, m)
    w = np.exp(s - off)
    tot = w.sum(axis=1, keepdims=True)
    S = np.where(empty, -np.inf, off + np.log(np.where(empty, 1.0, tot)))[:, 0]
    V = (v * np.where(empty, 0.0, w / np.where(empty, 1.0, tot))[..., None]).sum(axis=1)
    return V, S


_U = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _check(dtype, got_v, got_s, ref_v, ref_s, max_v, what):
    got_v, got_s = got_v.double().cpu().numpy(), got_s.double().cpu().numpy()
    assert not np.isnan(got_v).any(), what
    bad = np.abs(got_v - ref_v) > _U[dtype] * np.abs(ref_v) + 2.0 ** -20 * max_v
    assert not bad.any(), f"{what}: {bad.sum()} V elements outside the tolerance"
    inf = np.isinf(ref_s)
    assert (got_s[inf] == ref_s[inf]).all(), f"{what}: -inf S must match exactly"
    assert (np.abs(got_s[~inf] - ref_s[~inf]) <= 2.0 ** -20 * (1 + np.abs(ref_s[~inf]))).all(), what


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_random_states(dtype, n):
    g = torch.Generator().manual_seed(7 + n)
    seq, h, d = 29, 3, 128
    v = (torch.rand(seq, n, h, d, generator=g, dtype=torch.float64) * 4 - 2).to(getattr(torch, dtype))
    s = (torch.rand(seq, n, h, generator=g, dtype=torch.float64) * 12 - 6).float()
    s[torch.rand(seq, n, h, generator=g) < 0.2] = -math.inf
    s[0] = -math.inf  # a row with no visible key anywhere
    ref_v, ref_s = _reference(v.double().numpy(), s.double().numpy())
    max_v = float(v.double().abs().max())
    vc, sc = v.cuda(), s.cuda()
    got_v, got_s = flashlab.merge_states(vc, sc)
    torch.cuda.synchronize()
    _check(dtype, got_v, got_s, ref_v, ref_s, max_v, f"merge_states {dtype} n {n}")
    if n != 2:
        return
    va, vb, sa, sb = vc[:, 0].contiguous(), vc[:, 1].contiguous(), sc[:, 0].contiguous(), sc[:, 1].contiguous()
    got_v, got_s = flashlab.merge_state(va, sa, vb, sb)
    _check(dtype, got_v, got_s, ref_v, ref_s, max_v, f"merge_state {dtype}")
    flashlab.merge_state_in_place(va, sa, vb, sb)
    torch.cuda.synchronize()
    _check(dtype, va, sa, ref_v, ref_s, max_v, f"merge_state_in_place {dtype}")


@gpu
def test_split_attention_merges_to_the_whole():
    g = torch.Generator().manual_seed(11)
    sq, sk, k1, h, d = 40, 257, 100, 4, 64
    q, k, v = ((torch.rand(1, n, h, d, generator=g, dtype=torch.float64) * 4 - 2).to(torch.bfloat16).cuda()
               for n in (sq, sk, sk))

    def ref(kk, vv):  # float64 attention, (sq, h, d) and lse (sq, h)
        qd, kd, vd = (x[0].double().transpose(0, 1) for x in (q, kk, vv))
        sc = qd @ kd.transpose(1, 2) / math.sqrt(d)
        lse = torch.logsumexp(sc, dim=-1)
        return (torch.softmax(sc, dim=-1) @ vd).transpose(0, 1), lse.transpose(0, 1)

    parts = []
    for lo, hi in ((0, k1), (k1, sk)):
        out, lse, _ = flashlab.flash_attn_func(q, k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous(), return_attn_probs=True)
        parts.append((out[0], lse[0].transpose(0, 1).contiguous(), ref(k[:, lo:hi], v[:, lo:hi])))
    merged_v, merged_s = flashlab.merge_state(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    whole_v, whole_s = ref(k, v)
    part_err = max(float((o.double() - r[0]).abs().max()) for o, _, r in parts)
    part_s_err = max(float((s.double() - r[1]).abs().max()) for _, s, r in parts)
    max_o = max(float(r[0].abs().max()) for _, _, r in parts)
    err = float((merged_v.double() - whole_v).abs().max())
    assert err <= part_err + 2.0 ** -8 * max_o + 2.0 ** -20 * max_o, (err, part_err)
    err_s = float((merged_s.double() - whole_s).abs().max())
    assert err_s <= part_s_err + 2.0 ** -20 * (1 + float(whole_s.abs().max())), (err_s, part_s_err)


# ---------------------------------------------------------------------------------------------
# append_paged_kv_cache

def test_append_paged_kv_cache_messages():
    k, bi = fake((5, 4, 128), "bfloat16"), fake((5,), "int32")
    cache = (fake((32, 16, 4, 128), "bfloat16"), fake((32, 16, 4, 128), "bfloat16"))
    table = (fake((40,), "int32"), fake((4,), "int32"), fake((3,), "int32"))
    with raises("append_paged_kv_cache: argument 'append_v': expected shape [5, 4, 128], got [5, 4, 64]"):
        flashlab.append_paged_kv_cache(k, fake((5, 4, 64), "bfloat16"), bi, bi, cache, *table)
    with raises("append_paged_kv_cache: argument 'positions': expected dtype int32, got int64"):
        flashlab.append_paged_kv_cache(k, k, bi, fake((5,), "int64"), cache, *table)
    with raises("append_paged_kv_cache: argument 'kv_indptr': expected shape [4], got [3]"):
        flashlab.append_paged_kv_cache(k, k, bi, bi, cache, table[0], fake((3,), "int32"), table[2])
    with pytest.raises(ValueError, match="argument 'kv_layout': expected 'NHD' or 'HND', got 'NDH'"):
        flashlab.append_paged_kv_cache(k, k, bi, bi, cache, *table, kv_layout="NDH")
    with pytest.raises(ValueError, match="argument 'paged_kv_cache': expected \\(k_cache, v_cache\\)"):
        flashlab.append_paged_kv_cache(k, k, bi, bi, cache[:1], *table)


@gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_append_paged_kv_cache(layout, page_size):
    # Requests of lengths 0..70 appending their last tokens into pages from a shuffled pool; the
    # cache against torch's indexing of the same scatter, the untouched slots unchanged.
    g = torch.Generator().manual_seed(31 + page_size)
    lens, appended, h, d = [0, 1, 17, 70, 33], [0, 1, 3, 70, 1], 4, 128
    pages = [(n + page_size - 1) // page_size for n in lens]
    max_pages = sum(pages) + 5
    pool = torch.randperm(max_pages, generator=g)
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    indices = pool[: int(indptr[-1])].to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    bi = torch.tensor([b for b, a in enumerate(appended) for _ in range(a)], dtype=torch.int32)
    pos = torch.tensor([j for n, a in zip(lens, appended) for j in range(n - a, n)], dtype=torch.int32)
    nnz = len(bi)
    qkv = torch.rand(nnz, 3 * h, d, generator=g).to(torch.bfloat16)  # K, V as strided slices of a packed QKV
    shape = (max_pages, page_size, h, d) if layout == "NHD" else (max_pages, h, page_size, d)
    k_cache, v_cache = (torch.rand(*shape, generator=g).to(torch.bfloat16) for _ in range(2))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i in range(nnz):
        b, j = int(bi[i]), int(pos[i])
        page, slot = int(indices[int(indptr[b]) + j // page_size]), j % page_size
        for cache, rows in ((want_k, qkv[i, h:2 * h]), (want_v, qkv[i, 2 * h:])):
            if layout == "NHD":
                cache[page, slot] = rows
            else:
                cache[page, :, slot] = rows
    qkv_d, kc, vc = qkv.cuda(), k_cache.cuda(), v_cache.cuda()
    flashlab.append_paged_kv_cache(qkv_d[:, h:2 * h], qkv_d[:, 2 * h:], bi.cuda(), pos.cuda(), (kc, vc), indices.cuda(),
                                   indptr.cuda(), last.cuda(), kv_layout=layout)
    torch.cuda.synchronize()
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)
    # One (max_pages, 2, ...) tensor holding both.
    both = torch.stack([k_cache, v_cache], dim=1).cuda()
    flashlab.append_paged_kv_cache(qkv_d[:, h:2 * h], qkv_d[:, 2 * h:], bi.cuda(), pos.cuda(), both, indices.cuda(),
                                   indptr.cuda(), last.cuda(), kv_layout=layout)
    torch.cuda.synchronize()
    assert torch.equal(both[:, 0].cpu(), want_k) and torch.equal(both[:, 1].cpu(), want_v)
    # A bad page index: rejected, the cache unchanged.
    bad = indices.clone()
    bad[0] = max_pages
    with raises(f"append_paged_kv_cache: argument 'kv_indices': expected page indices in [0, {max_pages}) (the pages "
                f"of 'k_cache'), got kv_indices[0] = {max_pages}"):
        flashlab.append_paged_kv_cache(qkv_d[:, h:2 * h], qkv_d[:, 2 * h:], bi.cuda(), pos.cuda(), (kc, vc), bad.cuda(),
                                       indptr.cuda(), last.cuda(), kv_layout=layout)
    assert torch.equal(kc.cpu(), want_k)


# ---------------------------------------------------------------------------------------------
# batch_decode_paged

def test_batch_decode_paged_messages():
    q, cache = fake((3, 8, 128), "bfloat16"), (fake((32, 16, 4, 128), "bfloat16"), fake((32, 16, 4, 128), "bfloat16"))
    table = (fake((40,), "int32"), fake((4,), "int32"), fake((3,), "int32"))
    assert flashlab.PAGED_DECODE_RUNGS == 3
    with raises("batch_decode_paged: argument 'q': expected shape [3, 8, 128], got [2, 8, 128]"):
        flashlab.batch_decode_paged(fake((2, 8, 128), "bfloat16"), cache, *table, out=fake((2, 8, 128), "bfloat16"))
    with raises("batch_decode_paged: argument 'rung': expected 1..3, got 4"):
        flashlab.batch_decode_paged(q, cache, *table, out=q, rung=4)
    with pytest.raises(ValueError, match="argument 'kv_layout': expected 'NHD' or 'HND'"):
        flashlab.batch_decode_paged(q, cache, *table, out=q, kv_layout="nhd")


@gpu
@pytest.mark.parametrize("rung", [1, 2, 3])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_decode_paged(layout, rung):
    # GQA 8 / 2, page size 16, requests of 0 .. 300 keys in shuffled pages, against float64 torch
    # attention over each request's gathered keys (tolerance as tests/gpu/test_paged_kv.cpp).
    g = torch.Generator().manual_seed(41)
    lens, hq, hk, d, ps = [0, 1, 16, 17, 300], 8, 2, 128, 16
    pages = [(n + ps - 1) // ps for n in lens]
    max_pages = sum(pages) + 3
    indices = torch.randperm(max_pages, generator=g)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    shape = (max_pages, ps, hk, d) if layout == "NHD" else (max_pages, hk, ps, d)
    kc, vc = ((torch.rand(*shape, generator=g) * 2 - 1).to(torch.bfloat16) for _ in range(2))
    q = (torch.rand(len(lens), hq, d, generator=g) * 2 - 1).to(torch.bfloat16)
    out, lse = flashlab.batch_decode_paged(q.cuda(), (kc.cuda(), vc.cuda()), indices.cuda(), indptr.cuda(), last.cuda(),
                                           kv_layout=layout, return_lse=True, rung=rung)
    torch.cuda.synchronize()
    out, lse = out.double().cpu(), lse.double().cpu()
    max_v = float(vc.double().abs().max())
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all() and torch.isneginf(lse[b]).all()
            continue
        rows = [(int(indices[int(indptr[b]) + j // ps]), j % ps) for j in range(n)]
        if layout == "NHD":
            k = torch.stack([kc[p, s] for p, s in rows]).double()  # (n, hk, d)
            v = torch.stack([vc[p, s] for p, s in rows]).double()
        else:
            k = torch.stack([kc[p, :, s] for p, s in rows]).double()
            v = torch.stack([vc[p, :, s] for p, s in rows]).double()
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)  # (n, hq, d)
        sc = torch.einsum("hd,nhd->hn", q[b].double(), k) / math.sqrt(d)
        ref_lse = torch.logsumexp(sc, dim=-1)
        ref = torch.einsum("hn,nhd->hd", torch.softmax(sc, dim=-1), v)
        tol = (n + 8) * 2.0 ** -23
        # Rung 3 rounds the probabilities to bf16 for the tensor cores' P V: up to 2^-8 max|v| more.
        p_round = 2.0 ** -8 * max_v if rung == 3 else 0.0
        assert (out[b] - ref).abs().le(2.0 ** -8 * ref.abs() + tol * max_v + p_round).all(), f"request {b} ({n} keys)"
        assert (lse[b] - ref_lse).abs().le(tol * (1 + ref_lse.abs())).all(), f"request {b} lse"


# ---------------------------------------------------------------------------------------------
# BatchDecodeWithPagedKVCacheWrapper (plan / run, decode rung 3)

def _decode_reference(q, kc, vc, indices, indptr, last, ps):
    """float64 decode of every request over its gathered pages (NHD), out (b, hq, d) and lse."""
    b_n, hq, d = q.shape
    hk = kc.shape[2]
    out, lse = torch.zeros(b_n, hq, d, dtype=torch.float64), torch.full((b_n, hq), -math.inf, dtype=torch.float64)
    for b in range(b_n):
        pages = indices[int(indptr[b]):int(indptr[b + 1])].long()
        if len(pages) == 0:
            continue
        n = (len(pages) - 1) * ps + int(last[b])
        k = kc[pages].reshape(-1, hk, d)[:n].double().repeat_interleave(hq // hk, dim=1)
        v = vc[pages].reshape(-1, hk, d)[:n].double().repeat_interleave(hq // hk, dim=1)
        sc = torch.einsum("hd,nhd->hn", q[b].double(), k) / math.sqrt(d)
        lse[b] = torch.logsumexp(sc, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(sc, dim=-1), v)
    return out, lse


def _page_table(lens, ps, max_pages, g):
    pages = [(n + ps - 1) // ps for n in lens]
    indices = torch.randperm(max_pages, generator=g)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0] + [sum(pages[: i + 1]) for i in range(len(pages))], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    return indices, indptr, last


def _check_decode(out, lse, ref, ref_lse, lens, max_v, dtype):
    # The fp32 sum's bound, plus one unit roundoff of the output and of the probabilities (16-bit
    # for the tensor cores' P V) times max|v|.
    u = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}[dtype]
    out, lse = out.double().cpu(), lse.double().cpu()
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all() and torch.isneginf(lse[b]).all()
            continue
        tol = (n + 8) * 2.0 ** -23
        assert (out[b] - ref[b]).abs().le(u * ref[b].abs() + (tol + u) * max_v).all(), f"request {b} ({n} keys)"
        assert (lse[b] - ref_lse[b]).abs().le(tol * (1 + ref_lse[b].abs())).all(), f"request {b} lse"


def test_decode_wrapper_messages():
    with pytest.raises(ValueError, match="argument 'kv_layout': expected 'NHD' or 'HND'"):
        flashlab.BatchDecodeWithPagedKVCacheWrapper(fake((1024,), "uint8"), kv_layout="nhd")
    w = flashlab.BatchDecodeWithPagedKVCacheWrapper(fake((1024,), "uint8"))
    with pytest.raises(RuntimeError, match="plan\\(\\) first"):
        w.run(fake((3, 8, 128), "bfloat16"), (fake((32, 16, 4, 128), "bfloat16"),) * 2)
    with pytest.raises(ValueError, match="argument 'window_left': expected -1"):
        w.plan(np.zeros(4, np.int32), None, None, 8, 4, 128, 16, window_left=128)
    with pytest.raises(ValueError, match="argument 'pos_encoding_mode': expected 'NONE'"):
        w.plan(np.zeros(4, np.int32), None, None, 8, 4, 128, 16, pos_encoding_mode="ROPE_LLAMA")


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_decode_wrapper_matches_reference_and_replays_in_a_graph(dtype):
    # GQA 16 / 4, d 128, page 16: a long request (split across the GPU), short and empty ones;
    # then a CUDA graph of run() replayed after a new plan of other lengths (same tensors,
    # updated in place), and again after tokens were appended without a new plan.
    g = torch.Generator().manual_seed(7)
    dt = getattr(torch, dtype)
    hq, hk, d, ps, max_pages = 16, 4, 128, 16, 1600  # lens2 needs 1440 pages, lens3 1442
    kc, vc = ((torch.rand(max_pages, ps, hk, d, generator=g) * 2 - 1).to(dt) for _ in range(2))
    max_v = float(vc.double().abs().max())
    lens = [20000, 0, 1, 300, 17]
    q = (torch.rand(len(lens), hq, d, generator=g) * 2 - 1).to(dt)
    indices, indptr, last = _page_table(lens, ps, max_pages, g)
    ind_d, ptr_d, last_d = (torch.zeros(max_pages, dtype=torch.int32, device="cuda"), indptr.cuda(), last.cuda())
    ind_d[: len(indices)] = indices.cuda()
    ws = torch.empty(flashlab.batch_decode_workspace_bytes(len(lens), hq, hk, d), dtype=torch.uint8, device="cuda")
    w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(ptr_d, ind_d, last_d, hq, hk, d, ps)
    cache = (kc.cuda(), vc.cuda())
    q_d = q.cuda()
    out = torch.full((len(lens), hq, d), float("nan"), dtype=dt, device="cuda")
    lse = torch.full((len(lens), hq), float("nan"), dtype=torch.float32, device="cuda")
    w.run(q_d, cache, out=out, lse=lse)
    torch.cuda.synchronize()
    ref, ref_lse = _decode_reference(q, kc, vc, indices, indptr, last, ps)
    _check_decode(out, lse, ref, ref_lse, lens, max_v, dtype)

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q_d, cache, out=out, lse=lse)  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            w.run(q_d, cache, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)

    lens2 = [5, 18000, 0, 4097, 900]  # other lengths, the same batch
    indices2, indptr2, last2 = _page_table(lens2, ps, max_pages, g)
    ind_d[: len(indices2)] = indices2.cuda()
    ptr_d.copy_(indptr2.cuda())
    last_d.copy_(last2.cuda())
    w.plan(ptr_d, ind_d, last_d, hq, hk, d, ps)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref, ref_lse = _decode_reference(q, kc, vc, indices2, indptr2, last2, ps)
    _check_decode(out, lse, ref, ref_lse, lens2, max_v, dtype)

    # Tokens appended without a new plan: request 1 grows into a new page (its last chunk runs to
    # the end), request 4 within its last page.
    lens3 = [5, 18000 + 20, 0, 4097, 903]
    pages2 = [(n + ps - 1) // ps for n in lens2]
    free = sorted(set(range(max_pages)) - set(indices2.tolist()))
    seq = [indices2[int(indptr2[b]):int(indptr2[b + 1])].tolist() for b in range(len(lens2))]
    seq[1] += free[: (lens3[1] + ps - 1) // ps - pages2[1]]
    indices3 = torch.tensor([p for s in seq for p in s], dtype=torch.int32)
    indptr3 = torch.tensor([0] + [sum(len(s) for s in seq[: i + 1]) for i in range(len(seq))], dtype=torch.int32)
    last3 = torch.tensor([n - (len(s) - 1) * ps if s else 0 for n, s in zip(lens3, seq)], dtype=torch.int32)
    ind_d[: len(indices3)] = indices3.cuda()
    ptr_d.copy_(indptr3.cuda())
    last_d.copy_(last3.cuda())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref, ref_lse = _decode_reference(q, kc, vc, indices3, indptr3, last3, ps)
    _check_decode(out, lse, ref, ref_lse, lens3, max_v, dtype)


def test_decode_wrapper_flashinfer_arguments():
    ws = fake((1024,), "uint8")
    with pytest.raises(ValueError, match="use_cuda_graph=True needs paged_kv_indptr_buffer"):
        flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True)
    w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    with pytest.raises(ValueError, match="argument 'block_tables': expected None"):
        w.plan(np.zeros(4, np.int32), None, None, 8, 4, 128, 16, block_tables=np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match="argument 'disable_split_kv': expected False"):
        w.plan(np.zeros(4, np.int32), None, None, 8, 4, 128, 16, disable_split_kv=True)
    with pytest.raises(TypeError):
        w.plan(np.zeros(4, np.int32), None, None, 8, 4, 128, 16, windw_left=3)  # a typo is not swallowed
    w._plan, w._table = (0,) * 11, (None, None, None)  # past the plan() check: the argument checks of run()
    with pytest.raises(ValueError, match="argument 'q_scale': expected None or 1"):
        w.run(fake((3, 8, 128), "bfloat16"), (fake((32, 16, 4, 128), "bfloat16"),) * 2, q_scale=0.5)
    with pytest.raises(TypeError):
        w.run(fake((3, 8, 128), "bfloat16"), (fake((32, 16, 4, 128), "bfloat16"),) * 2, None)  # out is keyword-only


@gpu
def test_decode_wrapper_cuda_graph_buffers():
    # use_cuda_graph=True: plan() copies each new page table (fresh tensors every step, as a server
    # builds them) into the fixed buffers, which the captured graph reads.
    g = torch.Generator().manual_seed(9)
    dt, hq, hk, d, ps, max_pages, batch = torch.bfloat16, 8, 2, 64, 16, 900, 3
    kc, vc = ((torch.rand(max_pages, ps, hk, d, generator=g) * 2 - 1).to(dt) for _ in range(2))
    max_v = float(vc.double().abs().max())
    q = (torch.rand(batch, hq, d, generator=g) * 2 - 1).to(dt)
    cache, q_d = (kc.cuda(), vc.cuda()), q.cuda()
    ws = torch.empty(flashlab.batch_decode_workspace_bytes(batch, hq, hk, d), dtype=torch.uint8, device="cuda")
    bufs = (torch.zeros(batch + 1, dtype=torch.int32, device="cuda"), torch.zeros(max_pages, dtype=torch.int32, device="cuda"),
            torch.zeros(batch, dtype=torch.int32, device="cuda"))
    w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
                                                    paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    out = torch.empty(batch, hq, d, dtype=dt, device="cuda")
    lse = torch.empty(batch, hq, dtype=torch.float32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    for step, lens in enumerate(([9000, 1, 40], [300, 0, 12000], [17, 5000, 5000])):
        indices, indptr, last = _page_table(lens, ps, max_pages, g)
        w.plan(indptr.cuda(), indices.cuda(), last.cuda(), hq, hk, d, ps)  # new tensors each step
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        if step == 0:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                w.run(q_d, cache, out=out, lse=lse)
                with torch.cuda.graph(graph, stream=stream):
                    w.run(q_d, cache, out=out, lse=lse)
            torch.cuda.current_stream().wait_stream(stream)
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = _decode_reference(q, kc, vc, indices, indptr, last, ps)
        _check_decode(out, lse, ref, ref_lse, lens, max_v, "bfloat16")


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_decode_fp8_cache(dtype):
    # An e4m3 cache with scales, one-shot (rung 3) and plan/run, against the float64 decode over
    # the dequantized cache (k_scale K, v_scale V); rungs 1-2 refuse it.
    g = torch.Generator().manual_seed(13)
    dt = getattr(torch, dtype)
    hq, hk, d, ps, max_pages, k_scale, v_scale = 16, 4, 128, 16, 1500, 0.5, 0.25
    k8, v8 = ((torch.rand(max_pages, ps, hk, d, generator=g) * 8 - 4).to(torch.float8_e4m3fn) for _ in range(2))
    kc, vc = k8.double() * k_scale, v8.double() * v_scale  # the dequantized cache
    max_v = float(vc.abs().max())
    lens = [20000, 0, 1, 300, 17]
    q = (torch.rand(len(lens), hq, d, generator=g) * 2 - 1).to(dt)
    indices, indptr, last = _page_table(lens, ps, max_pages, g)
    table = (indices.cuda(), indptr.cuda(), last.cuda())
    cache = (k8.cuda(), v8.cuda())
    ref, ref_lse = _decode_reference(q, kc, vc, indices, indptr, last, ps)
    out, lse = flashlab.batch_decode_paged(q.cuda(), cache, *table, return_lse=True, rung=3, k_scale=k_scale, v_scale=v_scale)
    torch.cuda.synchronize()
    _check_decode(out, lse, ref, ref_lse, lens, max_v, dtype)
    ws = torch.empty(flashlab.batch_decode_workspace_bytes(len(lens), hq, hk, d), dtype=torch.uint8, device="cuda")
    w = flashlab.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(table[1], table[0], table[2], hq, hk, d, ps, kv_data_type=torch.float8_e4m3fn)
    out2, lse2 = w.run(q.cuda(), cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    torch.cuda.synchronize()
    _check_decode(out2, lse2, ref, ref_lse, lens, max_v, dtype)
    with pytest.raises(ValueError, match=re.escape("batch_decode_paged: argument 'k_cache': expected an fp16 / bf16 cache "
                                                   "at rungs 1-2 (e4m3 caches: rung 3), got e4m3")):
        flashlab.batch_decode_paged(q.cuda(), cache, *table, rung=2, k_scale=k_scale, v_scale=v_scale)
    with pytest.raises(ValueError, match=re.escape("argument 'k_scale': expected a positive finite value, got 0")):
        flashlab.batch_decode_paged(q.cuda(), cache, *table, rung=3, k_scale=0.0)
    name = "bf16" if dtype == "bfloat16" else "fp16"
    with pytest.raises(ValueError, match=re.escape(f"arguments 'k_scale', 'v_scale': expected 1 for a {name} cache")):
        flashlab.batch_decode_paged(q.cuda(), (k8.to(dt).cuda(),) * 2, *table, k_scale=0.5)


# ---------------------------------------------------------------------------------------------
# batch_prefill_paged and BatchPrefillWithPagedKVCacheWrapper

def test_batch_prefill_paged_messages():
    q, cache = fake((30, 8, 128), "bfloat16"), (fake((32, 16, 4, 128), "bfloat16"), fake((32, 16, 4, 128), "bfloat16"))
    table = (fake((40,), "int32"), fake((4,), "int32"), fake((3,), "int32"))
    assert flashlab.PAGED_PREFILL_RUNGS == 2
    with raises("batch_prefill_paged: argument 'qo_indptr': expected shape [4], got [3]"):
        flashlab.batch_prefill_paged(q, fake((3,), "int32"), cache, *table, out=q)
    with raises("batch_prefill_paged: argument 'rung': expected 1..2, got 3"):
        flashlab.batch_prefill_paged(q, fake((4,), "int32"), cache, *table, out=q, rung=3)
    with raises("batch_prefill_paged: argument 'q': expected a head dim (last dim) of 64, 128 or 256, got 96"):
        q96 = fake((30, 8, 96), "bfloat16")
        c96 = (fake((32, 16, 4, 96), "bfloat16"), fake((32, 16, 4, 96), "bfloat16"))
        flashlab.batch_prefill_paged(q96, fake((4,), "int32"), c96, *table, out=q96)
    with raises("batch_prefill_paged: argument 'window_left': expected -1 (unbounded) or a count below 2^31, got -2"):
        flashlab.batch_prefill_paged(q, fake((4,), "int32"), cache, *table, out=q, window_left=-2)
    with pytest.raises(ValueError, match="argument 'pos_encoding_mode': expected 'NONE'"):
        flashlab.BatchPrefillWithPagedKVCacheWrapper().plan(np.zeros(4, np.int32), None, None, None, 8, 4, 128, 16,
                                                            pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(RuntimeError, match="plan\\(\\) first"):
        flashlab.BatchPrefillWithPagedKVCacheWrapper().run(q, cache)


@pytest.mark.skipif(torch is None, reason="needs torch (CPU tensors are enough)")
def test_prefill_wrapper_graph_plan_checks_before_copying():
    # use_cuda_graph: every array is checked (shapes and values by the C++ plan, which reads host
    # arrays directly) and against the buffers before the first copy, so a refused plan leaves the
    # buffers (a captured graph's table) as they were. CPU tensors: no device involved.
    op = "BatchPrefillWithPagedKVCacheWrapper.plan"

    def i32(values):
        return torch.tensor(values, dtype=torch.int32)

    bufs = [i32([7] * 4), i32([7] * 4), i32([7] * 12), i32([7] * 3)]
    w = flashlab.BatchPrefillWithPagedKVCacheWrapper(None, use_cuda_graph=True, qo_indptr_buf=bufs[0],
                                                     paged_kv_indptr_buf=bufs[1], paged_kv_indices_buf=bufs[2],
                                                     paged_kv_last_page_len_buf=bufs[3])
    qo, ptr, ind, last = i32([0, 2, 3, 5]), i32([0, 2, 3, 6]), i32([4, 1, 0, 9, 8, 2]), i32([5, 16, 1])
    plan_op = "batch_prefill_paged_plan"  # the C++ plan checks the arrays' shapes and values
    bad = {
        "last_page_len_length": ((qo, ptr, ind, i32([5, 16, 1, 1])),
                                 f"{plan_op}: argument 'kv_indptr': expected shape [5], got [4]"),
        "indptr_length": ((qo, i32([0, 2, 3, 6, 6]), ind, last),
                          f"{plan_op}: argument 'kv_indptr': expected shape [4], got [5]"),
        "indices_2d": ((qo, ptr, ind.view(2, 3), last),
                       f"{plan_op}: argument 'kv_indices': expected 1 dims, got 2 dims, shape [2, 3]"),
        "indices_short": ((qo, ptr, ind[:5], last),
                          f"{plan_op}: argument 'kv_indices': expected at least kv_indptr[3] = 6 pages, got 5"),
        "buffer_short": ((qo, i32([0, 8, 9, 13]), torch.arange(13, dtype=torch.int32), last),
                         f"{op}: the CUDA-graph buffers (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, "
                         "paged_kv_last_page_len_buf; -1: not 1-D) hold [4, 4, 12, 3]; this plan needs a batch of 3 and "
                         "13 pages: [4, 4, 13, 3]"),
    }
    for what, (arrays, message) in bad.items():
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            w.plan(*arrays, 8, 2, 128, 16, causal=True)
        assert all(torch.equal(b, i32([7] * len(b))) for b in bufs), f"{what}: a buffer was written"
    with pytest.raises(TypeError, match=f"^{re.escape(op)}: argument 'paged_kv_indptr': expected a torch tensor"):
        w.plan(qo, ptr.numpy(), ind, last, 8, 2, 128, 16, causal=True)
    assert all(torch.equal(b, i32([7] * len(b))) for b in bufs), "numpy paged_kv_indptr: a buffer was written"
    # A value the C++ plan refuses (a last page longer than the page size): refused before any copy.
    with pytest.raises(ValueError, match=r"^batch_prefill_paged_plan: argument 'kv_last_page_len': .*"
                                         r"kv_last_page_len\[0\] = 17"):
        w.plan(qo, ptr, ind, i32([17, 16, 1]), 8, 2, 128, 16, causal=True)
    assert all(torch.equal(b, i32([7] * len(b))) for b in bufs), "bad kv_last_page_len: a buffer was written"
    w.plan(qo, ptr, ind, last, 8, 2, 128, 16, causal=True)  # a valid plan copies all four
    assert torch.equal(bufs[0], qo) and torch.equal(bufs[1], ptr) and torch.equal(bufs[3], last)
    assert torch.equal(bufs[2][:6], ind) and torch.equal(bufs[2][6:], i32([7] * 6))


def _prefill_reference(q, qo_lens, kc, vc, indices, indptr, last, ps, causal, window_left=-1, softcap=0.0):
    """float64 attention of each request's queries (its last tokens) over its gathered pages (NHD)."""
    d = q.shape[2]
    hk = kc.shape[2]
    out, lse = torch.zeros(q.shape, dtype=torch.float64), torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    row = 0
    for b, nq in enumerate(qo_lens):
        pages = indices[int(indptr[b]):int(indptr[b + 1])].long()
        n = (len(pages) - 1) * ps + int(last[b]) if len(pages) else 0
        if nq == 0 or n == 0:
            row += nq
            continue
        keys, values = kc[pages].reshape(-1, hk, d)[:n], vc[pages].reshape(-1, hk, d)[:n]
        o, m = attention_reference(q[row:row + nq], keys, values, causal, window_left, softcap)
        out[row:row + nq], lse[row:row + nq] = o, m.transpose(0, 1)
        row += nq
    return out, lse


def _check_prefill(out, lse, ref, ref_lse, max_v, n_max, what):
    # As _check_decode: the fp32 sums' bound plus one bf16 rounding of out and of P, times max|v|.
    u, tol = 2.0 ** -8, (n_max + 8) * 2.0 ** -23
    out, lse = out.double().cpu(), lse.double().cpu()
    assert not torch.isnan(out).any(), what
    assert (out - ref).abs().le(u * ref.abs() + (tol + u) * max_v).all(), what
    inf = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), inf), f"{what}: -inf lse rows"
    assert (lse[~inf] - ref_lse[~inf]).abs().le(tol * (1 + ref_lse[~inf].abs()) + 1e-5).all(), f"{what} (lse)"


@gpu
@pytest.mark.parametrize("rung", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_prefill_paged(rung, causal):
    # GQA 8 / 2, page size 16, ragged requests (one without queries, one without keys, one query
    # longer than its keys), pages shuffled, against float64 torch attention over gathered keys.
    if rung == 2 and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("rung 2 needs sm_90 (elsewhere rung 1 runs)")
    g = torch.Generator().manual_seed(43)
    qo_lens, kv_lens, hq, hk, d, ps = [5, 0, 40, 129, 3], [5, 9, 300, 1000, 0], 8, 2, 128, 16
    indices, indptr, last = _page_table(kv_lens, ps, sum((n + ps - 1) // ps for n in kv_lens) + 3, g)
    max_pages = int(indices.max()) + 4
    kc, vc = ((torch.rand(max_pages, ps, hk, d, generator=g) * 2 - 1).to(torch.bfloat16) for _ in range(2))
    q = (torch.rand(sum(qo_lens), hq, d, generator=g) * 2 - 1).to(torch.bfloat16)
    qo_indptr = torch.tensor([0] + [sum(qo_lens[: i + 1]) for i in range(len(qo_lens))], dtype=torch.int32)
    ref, ref_lse = _prefill_reference(q, qo_lens, kc, vc, indices, indptr, last, ps, causal)
    args = (q.cuda(), qo_indptr.cuda(), (kc.cuda(), vc.cuda()), indices.cuda(), indptr.cuda(), last.cuda())
    out, lse = flashlab.batch_prefill_paged(*args, causal=causal, return_lse=True, rung=rung)
    torch.cuda.synchronize()
    _check_prefill(out, lse, ref, ref_lse, float(vc.double().abs().max()), max(kv_lens), f"rung {rung}")
    if causal:  # a sliding window and softcap on the same batch
        ref, ref_lse = _prefill_reference(q, qo_lens, kc, vc, indices, indptr, last, ps, True, 50, 20.0)
        out, lse = flashlab.batch_prefill_paged(*args, causal=True, window_left=50, logits_soft_cap=20.0,
                                                return_lse=True, rung=rung)
        torch.cuda.synchronize()
        _check_prefill(out, lse, ref, ref_lse, float(vc.double().abs().max()), max(kv_lens), f"rung {rung} window")


@gpu
def test_prefill_wrapper_matches_the_call_and_replays_in_a_graph():
    # plan / run gives the one-shot call's bits; with use_cuda_graph a captured run replays after a
    # new plan of grown requests (same batch, no request over the first plan's query count).
    g = torch.Generator().manual_seed(44)
    hq, hk, d, ps = 8, 2, 128, 16
    qo_lens, kv_lens = [64, 10, 30], [200, 10, 500]
    qo2, kv2 = [20, 44, 40], [260, 60, 520]  # 104 queries again, each <= 64
    max_pages = sum((n + ps - 1) // ps for n in kv2) + 2
    kc, vc = ((torch.rand(max_pages, ps, hk, d, generator=g) * 2 - 1).to(torch.bfloat16).cuda() for _ in range(2))
    q = ((torch.rand(sum(qo_lens), hq, d, generator=g) * 2 - 1).to(torch.bfloat16)).cuda()

    def table(qo, kv):
        pages = [(n + ps - 1) // ps for n in kv]
        indices = torch.arange(sum(pages), dtype=torch.int32)  # distinct pages per request
        indptr = torch.tensor([0] + [sum(pages[: i + 1]) for i in range(len(pages))], dtype=torch.int32)
        lastl = torch.tensor([n - (p - 1) * ps for n, p in zip(kv, pages)], dtype=torch.int32)
        qo_indptr = torch.tensor([0] + [sum(qo[: i + 1]) for i in range(len(qo))], dtype=torch.int32)
        return qo_indptr.cuda(), indptr.cuda(), indices.cuda(), lastl.cuda()

    t1 = table(qo_lens, kv_lens)
    w = flashlab.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1, dtype=torch.uint8, device="cuda"))
    w.plan(*t1, hq, hk, d, ps, causal=True)
    want = flashlab.batch_prefill_paged(q, t1[0], (kc, vc), t1[2], t1[1], t1[3], causal=True)
    assert torch.equal(w.run(q, (kc, vc)), want)

    bufs = [torch.zeros(4, dtype=torch.int32, device="cuda"), torch.zeros(4, dtype=torch.int32, device="cuda"),
            torch.zeros(max_pages, dtype=torch.int32, device="cuda"), torch.zeros(3, dtype=torch.int32, device="cuda")]
    wg = flashlab.BatchPrefillWithPagedKVCacheWrapper(None, use_cuda_graph=True, qo_indptr_buf=bufs[0],
                                                     paged_kv_indptr_buf=bufs[1], paged_kv_indices_buf=bufs[2],
                                                     paged_kv_last_page_len_buf=bufs[3])
    wg.plan(*t1, hq, hk, d, ps, causal=True)
    out = torch.empty_like(q)
    wg.run(q, (kc, vc), out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wg.run(q, (kc, vc), out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    t2 = table(qo2, kv2)
    wg.plan(*t2, hq, hk, d, ps, causal=True)
    out.fill_(float("nan"))
    graph.replay()
    want2 = flashlab.batch_prefill_paged(q, t2[0], (kc, vc), t2[2], t2[1], t2[3], causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out, want2)
    with pytest.raises(ValueError, match="must not exceed the first plan's 64 queries"):
        wg.plan(*table([70, 4, 30], kv2), hq, hk, d, ps, causal=True)
