"""flashlab.apply_rope_pos_ids (+ _inplace, llama31) and apply_rope_with_cos_sin_cache from Python.

CPU part: validation messages through the bindings (with test_bindings' `fake` tensors).
GPU part: every rung against a float64 torch reference, outputs poisoned with NaN first,
tolerance 2x the error of the same fp32 computation rounded to the dtype plus one unit roundoff
of max|ref|, positions up to 1M.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashlab
from test_bindings import fake, gpu, raises, torch
from numerics import check_close


def test_numpy_input_hits_the_cpp_device_check():
    q, k = np.zeros((4, 2, 64), np.float32), np.zeros((4, 1, 64), np.float32)
    with raises("apply_rope_pos_ids: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.apply_rope_pos_ids(q, k, np.zeros(4, np.int32))


def _qk(dtype="bfloat16", nnz=4, hq=2, hk=1, d=64):
    return (fake([nnz, hq, d], dtype), fake([nnz, hk, d], dtype, offset_bytes=4096),
            fake([nnz, hq, d], dtype, offset_bytes=8192), fake([nnz, hk, d], dtype, offset_bytes=12288))


def test_bad_inputs_name_the_argument():
    q, k, qo, ko = _qk()
    pos = fake([4], "int32", offset_bytes=16384)
    f = flashlab._ffi.apply_rope_pos_ids
    with raises("apply_rope_pos_ids: argument 'rotary_dim': expected an even value in 2..head_dim (64), got 63"):
        f(q, k, qo, ko, pos, 63, False, 1e4, 1.0, False, 1.0, 4.0, 8.0, 8192, 2)
    with raises("apply_rope_pos_ids: argument 'rope_theta': expected a finite value > 0, got -10000"):
        f(q, k, qo, ko, pos, 64, False, -1e4, 1.0, False, 1.0, 4.0, 8.0, 8192, 2)
    with raises("apply_rope_pos_ids: argument 'pos_ids': expected dtype int32 or int64, got fp32"):
        f(q, k, qo, ko, fake([4], "float32", offset_bytes=16384), 64, False, 1e4, 1.0, False, 1.0, 4.0, 8.0, 8192, 2)
    with raises("apply_rope_pos_ids: argument 'k': expected head_dim 64 (same as 'q'), got 32"):
        f(q, fake([4, 1, 32], "bfloat16", offset_bytes=4096), qo, ko, pos, 64, False, 1e4, 1.0, False, 1.0, 4.0,
          8.0, 8192, 2)
    with raises("apply_rope_pos_ids: argument 'rung': expected 1..2, got 3"):
        f(q, k, qo, ko, pos, 64, False, 1e4, 1.0, False, 1.0, 4.0, 8.0, 8192, 3)
    with raises("apply_rope_pos_ids: argument 'high_freq_factor': expected a finite value > low_freq_factor (4), "
                "got 2"):
        f(q, k, qo, ko, pos, 64, False, 5e5, 1.0, True, 4.0, 2.0, 8.0, 8192, 2)


def test_cos_sin_cache_bad_inputs():
    f = flashlab._ffi.apply_rope_with_cos_sin_cache
    pos = fake([4], "int64", offset_bytes=16384)
    query, key = fake([4, 128], "bfloat16"), fake([4, 64], "bfloat16", offset_bytes=4096)
    qo, ko = fake([4, 128], "bfloat16", offset_bytes=8192), fake([4, 64], "bfloat16", offset_bytes=12288)
    with raises("apply_rope_with_cos_sin_cache: argument 'query': expected a last dim that is a positive multiple "
                "of head_size (48), got [4, 128]"):
        f(pos, query, key, qo, ko, 48, fake([16, 64], "float32", offset_bytes=20480), False, 2)
    with raises("apply_rope_with_cos_sin_cache: argument 'cos_sin_cache': expected dtype fp32, got bf16"):
        f(pos, query, key, qo, ko, 64, fake([16, 64], "bfloat16", offset_bytes=20480), False, 2)
    with raises("apply_rope_with_cos_sin_cache: argument 'cos_sin_cache': expected an even rotary_dim (second dim) "
                "<= head_dim (64), got 66"):
        f(pos, query, key, qo, ko, 64, fake([16, 66], "float32", offset_bytes=20480), False, 2)


# ---------------------------------------------------------------------------------------------
# GPU

def _inv_freq64(rd, theta, scale, llama31=False, factor=8.0, low=1.0, high=4.0, old=8192):
    base = theta ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    if not llama31:
        return base / scale
    s = np.clip((old * base / (2 * math.pi) - low) / (high - low), 0.0, 1.0)
    return (1 - s) * base / factor + s * base


def _rotate(x, cos, sin, rd, interleave):
    """x [nnz, h, d] float64/float32 numpy; cos/sin [nnz, rd/2]."""
    y = x.copy()
    c, s = cos[:, None, :], sin[:, None, :]
    if interleave:
        x0, x1 = x[..., 0:rd:2], x[..., 1:rd:2]
        y[..., 0:rd:2], y[..., 1:rd:2] = x0 * c - x1 * s, x1 * c + x0 * s
    else:
        x0, x1 = x[..., : rd // 2], x[..., rd // 2: rd]
        y[..., : rd // 2], y[..., rd // 2: rd] = x0 * c - x1 * s, x1 * c + x0 * s
    return y


def _expected(x, pos, inv64, rd, interleave):
    """(float64 reference, fp32 naive rounded to x's dtype) for x at positions pos."""
    x64 = x.double().cpu().numpy()
    p = pos.cpu().numpy().astype(np.float64)
    ang = p[:, None] * inv64[None, :]
    ref = _rotate(x64, np.cos(ang), np.sin(ang), rd, interleave)
    ang32 = pos.cpu().numpy().astype(np.float32)[:, None] * inv64.astype(np.float32)[None, :]
    cos32 = np.cos(ang32.astype(np.float64)).astype(np.float32)
    sin32 = np.sin(ang32.astype(np.float64)).astype(np.float32)
    naive = _rotate(x.float().cpu().numpy(), cos32, sin32, rd, interleave)
    return ref, torch.from_numpy(naive).to(x.dtype).double().numpy()


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.ROPE_RUNGS + 1))
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 64])
@pytest.mark.parametrize("llama31", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope(dtype, rung, interleave, rotary_dim, llama31, inplace):
    dt = getattr(torch, dtype)
    nnz, hq, hk, d = 77, 32, 8, 128
    q = torch.randn(nnz, hq, d, device="cuda").to(dt)
    k = torch.randn(nnz, hk, d, device="cuda").to(dt)
    pos = torch.randint(0, 1 << 20, (nnz,), device="cuda", dtype=torch.int32)
    rd = d if rotary_dim is None else rotary_dim
    if llama31:
        inv = _inv_freq64(rd, 5e5, 1.0, True)
        kw = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=8.0, rope_theta=5e5, rung=rung)
        fn = flashlab.apply_llama31_rope_pos_ids_inplace if inplace else flashlab.apply_llama31_rope_pos_ids
    else:
        inv = _inv_freq64(rd, 1e4, 2.0)
        kw = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=2.0, rope_theta=1e4, rung=rung)
        fn = flashlab.apply_rope_pos_ids_inplace if inplace else flashlab.apply_rope_pos_ids
    rq, nq = _expected(q, pos, inv, rd, interleave)
    rk, nk = _expected(k, pos, inv, rd, interleave)
    if inplace:
        qi, ki = q.clone(), k.clone()
        assert fn(qi, ki, pos, **kw) is None
        q_rope, k_rope = qi, ki
    else:
        q_rope, k_rope = fn(q, k, pos, **kw)
    what = f"rope {dtype} rung {rung} interleave={interleave} rd={rd} llama31={llama31} inplace={inplace}"
    check_close(q_rope, rq, nq, dtype, what + " (q)")
    check_close(k_rope, rk, nk, dtype, what + " (k)")


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rung", range(1, flashlab.ROPE_RUNGS + 1))
def test_cos_sin_cache_vllm_layout(dtype, is_neox, rung):
    dt = getattr(torch, dtype)
    nnz, hq, hk, hs, rd, max_pos = 100, 32, 8, 128, 64, 4096
    inv = _inv_freq64(rd, 1e4, 1.0)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    cache = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)).cuda()
    qkv = torch.randn(nnz, (hq + 2 * hk) * hs, device="cuda").to(dt)  # vLLM: q, k split from a fused qkv
    query, key = qkv[:, : hq * hs], qkv[:, hq * hs: (hq + hk) * hs]
    positions = torch.randint(0, max_pos, (nnz,), device="cuda", dtype=torch.int64)
    q_out, k_out = flashlab.apply_rope_with_cos_sin_cache(positions, query, key, hs, cache, is_neox, rung=rung)
    c64 = cache.double().cpu().numpy()[positions.cpu().numpy()]
    for x, got, h in ((query, q_out, hq), (key, k_out, hk)):
        x3 = x.reshape(nnz, h, hs)
        ref = _rotate(x3.double().cpu().numpy(), c64[:, : rd // 2], c64[:, rd // 2:], rd, not is_neox)
        naive = _rotate(x3.float().cpu().numpy(), c64[:, : rd // 2].astype(np.float32),
                        c64[:, rd // 2:].astype(np.float32), rd, not is_neox)
        naive = torch.from_numpy(naive).to(dt).double().numpy()
        check_close(got.reshape(nnz, h, hs), ref, naive, dtype, f"cache {dtype} neox={is_neox} rung {rung}")
