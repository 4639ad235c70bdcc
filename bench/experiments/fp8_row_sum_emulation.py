"""Float64 emulation of rung 4's FP8 softmax normalisation (docs/ladder/attention.md, "FP8 on
2026-11-26 (19)"): does O / l stay within test_fp8's bound when l sums P *after* its e4m3 rounding
(the sums by the tensor cores, kSumByMma) rather than before, with and without P shifted by 2^8
before the rounding (kAttnFp8PShiftLog2)?

Inputs as tests/python/test_attention.py::_fp8_inputs (q, k ~ 2 N(0, 1), v ~ 4 N(0, 1), all
rounded to e4m3; descales in [0.25, 1)); the kernel's order: key blocks, a running max, P rounded
to e4m3 per block at the running max, O and l rescaled when the max grows. Prints the max abs
error against the float64 reference of: the test's naive computation (P rounded at the global max,
l the unrounded sum), the kernel with l = sum of P, and with l = sum of the rounded P.

    python3 bench/experiments/fp8_row_sum_emulation.py    (numpy; a few seconds)
"""
import numpy as np


def e4m3(x):
    """Round to e4m3 (3 mantissa bits, normal from 2^-6, subnormal steps of 2^-9, saturate at 448)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-300))), -6.0)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def run(rng, sq, sk, causal, block=128, d=128, shift=0.0):
    q = e4m3(rng.standard_normal((sq, d)) * 2)
    k = e4m3(rng.standard_normal((sk, d)) * 2)
    v = e4m3(rng.standard_normal((sk, d)) * 4)
    dq, dk, dv = rng.random(3) * 0.75 + 0.25
    s = (q * dq) @ (k * dk).T * d ** -0.5
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = p @ (v * dv) / p.sum(1, keepdims=True)
    naive = e4m3(p) @ (v * dv) / p.sum(1, keepdims=True)
    o = np.zeros((sq, d))
    l_fp32, l_rounded = np.zeros((sq, 1)), np.zeros((sq, 1))
    mx = np.full((sq, 1), -np.inf)
    for k0 in range(0, sk, block):
        sb = s[:, k0:k0 + block] * np.log2(np.e)
        new = np.maximum(mx, sb.max(1, keepdims=True))
        base = np.where(np.isinf(new), 0.0, new)
        r = np.where(new > mx, np.exp2(np.where(np.isinf(mx), -np.inf, mx) - base), 1.0)
        pb = np.exp2(sb - base + shift)
        pt = e4m3(pb)
        o = o * r + pt @ v[k0:k0 + block]
        l_fp32 = l_fp32 * r + pb.sum(1, keepdims=True)
        l_rounded = l_rounded * r + pt.sum(1, keepdims=True)
        mx = new
    err = lambda x: np.abs(x - ref).max()
    print(f"shift {shift:g}  sq {sq:5d} sk {sk:5d} causal {int(causal)} block {block}:  naive {err(naive):.3e}  "
          f"l = sum P {err(o * dv / l_fp32):.3e}  l = sum e4m3(P) {err(o * dv / l_rounded):.3e}  "
          f"max|ref| {np.abs(ref).max():.3f}")


def main():
    for shift in (0.0, 8.0):
        rng = np.random.default_rng(0)
        run(rng, 1000, 1000, False, shift=shift)
        run(rng, 300, 517, True, shift=shift)
        run(rng, 200, 2100, True, block=192, shift=shift)
        run(rng, 130, 4500, False, block=224, shift=shift)
        run(rng, 2000, 2000, False, block=224, shift=shift)


if __name__ == "__main__":
    main()
