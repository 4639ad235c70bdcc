"""flashlab.merge_state / merge_state_in_place / merge_states (python/flashlab/serving.py).

CPU part: the C++ validation messages through the bindings (test_bindings' `fake` tensors, which
claim to be on cuda:0 and fail validation before anything runs), and the outputs' default shapes.
GPU part: random states against a float64 numpy reference (some segments empty: s = -inf; a row with
every state empty gives V = 0, S = -inf exactly), fp32 / fp16 / bf16, in place; and attention over
two key segments by flash_attn_func, merged, against attention over all keys (torch float64).
Tolerances as tests/gpu/test_merge_state.cpp: V within u(dtype) |ref| + 2^-20 max|v|, S within
2^-20 (1 + |S|); the split attention within the segments' own measured error + one rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashlab
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
