"""The tolerance rule of the Python GPU tests (DESIGN.md, Tests), shared by every op's test file:
an output's max error against the float64 reference must be at most 2x the error of the same
computation done naively in the output dtype, plus one unit roundoff of max|ref|. NaN never
passes; infinite reference values must be matched exactly."""

from __future__ import annotations

import math

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def check_close(got, ref: np.ndarray, naive: np.ndarray, dtype: str, what: str, extra_floor: float = 0.0) -> None:
    """got: a torch tensor; ref: float64 reference; naive: the naive same-dtype result (float64);
    extra_floor: added to the floor (an op's own rounding terms, e.g. GEMM's fp32 accumulation)."""
    got = got.double().cpu().numpy()
    assert not np.isnan(got).any(), f"{what}: NaN in the output"
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), f"{what}: infinite outputs differ from the reference"
    got, ref, naive = (np.where(inf, 0.0, a) for a in (got, ref, naive))
    err, naive_err = np.abs(got - ref).max(), np.abs(naive - ref).max()
    bound = 2 * naive_err + UNIT_ROUNDOFF[dtype] * np.abs(ref).max() + extra_floor
    assert err <= bound, f"{what}: error {err:.3e} > 2 x naive {naive_err:.3e} + floor"


def attention_reference(q, keys, values, causal=False, window_left=-1, softcap=0.0):
    """float64 attention (torch) of q (sq, h, d) over keys / values (sk, hk, d) (GQA: query head h
    reads KV head h // (h / hk)), scale 1 / sqrt(d), softcap, the mask aligned bottom-right (query i
    at position sk - sq + i). Returns out (sq, h, d) and lse (h, sq); rows that see no key: 0, -inf."""
    import torch  # the GPU tests' files import it first
    sq, h, d = q.shape
    sk, hk = keys.shape[0], keys.shape[1]
    k = keys.double().repeat_interleave(h // hk, dim=1)
    v = values.double().repeat_interleave(h // hk, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.double(), k) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window_left >= 0:
        visible &= j >= i - window_left
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isneginf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return torch.einsum("hij,jhd->ihd", p, v), lse
