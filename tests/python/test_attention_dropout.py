"""Attention dropout from Python: ``dropout_p`` of the flash-attn 2.x drop-ins and the
``dropout_p`` / ``dropout_seed`` / ``dropout_offset`` of flashlab.attention_fwd / attention_bwd.

CPU part: the C++ validation messages through the bindings with test_bindings' `fake` tensors (they
claim to be on cuda:0 and fail validation before anything runs): dropout_p out of [0, 1), a forward
rung without dropout (2, 4), the backward rung without it (3), FP8 with dropout, the binding's dropout_offset range, Python's dropout_seed
range. Then how seeds flow, seen through a recorder put in place of the FFI module (every call
reaches it with the arguments C++ would get; it writes nothing): numpy inputs draw the seed from
Python's `random`; torch tensors from torch's default CPU generator (torch.manual_seed reproduces
it, dropout_p = 0 draws nothing), the backward gets the forward's dropout_p and seed, and so it
does under torch.compile(fullgraph=True) (backend aot_eager: the real ops run, on the recorder).
Without a GPU too: the fake kernels' shapes with dropout, and torch.export's graph (the seed is a
randint node feeding the opaque op).

GPU part: the forward with return_attn_probs gives S_dmask, whose sign bit is the mask (flash-attn's
convention); on the visible entries that mask must keep about 1 - p of them (within 5 sigma), and
out, lse and |S_dmask| must match a float64 reference that applies the same mask (o_i = sum_j p_ij
keep_ij / (1 - p) v_j, lse before dropout). Tolerance (numerics.check_close): 2x the error of the
same masked computation done naively in the input dtype, plus one unit roundoff of max|ref|. The
gradients: float64 autograd of that masked reference (causal + GQA, varlen). Seeds: the same
torch.manual_seed gives bit-identical results, consecutive calls different masks, the op's seed is
the CPU generator's next draw (flashlab.attention_fwd / attention_bwd with that seed reproduce
flash_attn_func and its autograd bit for bit), and explicit seeds / offsets behave (a uint64 seed
and its int64 bits are one seed; offset and seed both change the mask). torch.compile(fullgraph)
and torch.library.opcheck with dropout; impl=2 and FP8 with dropout are rejected. The tiled rungs
that have dropout (forward 3, backward 2: the automatic choices with dropout) are checked under
the mask of rung 1 for the same seed and offset. Sizes stay small: several tests run the naive
rung 1 (P materialised), explicitly or through deterministic=True.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import flashlab
from flashlab import flash_attn_interface
from numerics import check_close
from test_attention import _attend, _aux, _cu, _fixed, _fp8_inputs, _keep, _np, _opts, _randn
from test_attention_bwd import _args as _bwd_args
from test_attention_bwd import _autograd, _check_grads
from test_bindings import gpu, raises, torch

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

# The forward rungs that have dropout: 1 and 3 (the automatic choice takes 3).
RUNG_MSG = ("attention_fwd: argument 'rung': expected 1, 3 or -1 (auto) with dropout_p > 0 (dropout runs on rungs 1 "
            "and 3 so far), got {}")


# ---------------------------------------------------------------------------------------------
# CPU: C++ validation messages through the bindings.

@pytest.mark.parametrize("p,shown", [(1.0, "1"), (-0.1, "-0.1"), (float("nan"), "nan"), (float("inf"), "inf"),
                                     (1e300, "inf"), (0.99999999, "1")])
def test_dropout_p_range(p, shown):
    # 1e300 is beyond fp32 (inf, not a rounded valid value); 0.99999999 rounds to fp32's 1.
    with raises(f"attention_fwd: argument 'dropout_p': expected a finite value in [0, 1), got {shown}"):
        flashlab.attention_fwd(*_fixed(), dropout_p=p)
    with raises(f"attention_bwd: argument 'dropout_p': expected a finite value in [0, 1), got {shown}"):
        flashlab.attention_bwd(*_bwd_args(), dropout_p=p)


@pytest.mark.parametrize("rung", [2, 4])
def test_forward_rungs_without_dropout(rung):
    # (Rungs 1 and 3 take dropout: a fake call there would pass validation, so none is made.)
    with raises(RUNG_MSG.format(rung)):
        flashlab.attention_fwd(*_fixed(), dropout_p=0.5, rung=rung)


def test_backward_rung_without_dropout():
    # Backward rungs 1 and 2 take dropout (auto: 2); rung 3 (Hopper) has none.
    with raises("attention_bwd: argument 'dropout_p': expected 0 for rung 3 (rung 2 or auto takes dropout), got 0.5"):
        flashlab.attention_bwd(*_bwd_args(), dropout_p=0.5, rung=3)


def test_no_fp8_dropout():
    fp8 = _fixed(d=128, dtype="float8_e4m3fn", out_dtype="bfloat16")
    with raises("attention_fwd: argument 'dropout_p': expected 0 for e4m3 inputs (no FP8 dropout), got 0.1"):
        flashlab.attention_fwd(*fp8, dropout_p=0.1)
    with raises("attention_fwd: argument 'dropout_p': expected 0 for e4m3 inputs (no FP8 dropout), got 0.5"):
        flashlab.attention_fwd(*fp8, dropout_p=0.5, q_descale=_aux([1]), rung=4)


@pytest.mark.parametrize("offset", [-1, 2**32, -(2**40), 2**62])
def test_dropout_offset_range(offset):
    # The binding's own check: the C++ API takes a uint32 offset, and a wrapped one would repeat a mask.
    with raises(f"attention_fwd: argument 'dropout_offset': expected 0 .. 2^32 - 1, got {offset}"):
        flashlab.attention_fwd(*_fixed(), dropout_p=0.1, dropout_offset=offset)
    with raises(f"attention_bwd: argument 'dropout_offset': expected 0 .. 2^32 - 1, got {offset}"):
        flashlab.attention_bwd(*_bwd_args(), dropout_p=0.1, dropout_offset=offset)


def test_dropout_seed_and_offset_extremes_pass():
    # The widest seeds and offsets get through to C++, which then rejects what the test breaks.
    for seed in (0, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)):
        with raises("attention_fwd: argument 'dropout_p': expected a finite value in [0, 1), got 1"):
            flashlab.attention_fwd(*_fixed(), dropout_p=1.0, dropout_seed=seed, dropout_offset=2**32 - 1)
        with raises("attention_bwd: argument 'dropout_p': expected a finite value in [0, 1), got 1"):
            flashlab.attention_bwd(*_bwd_args(), dropout_p=1.0, dropout_seed=seed, dropout_offset=0)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_dropout_seed_range(seed):
    msg = ("argument 'dropout_seed': expected an integer in [-2^63, 2^64) (a uint64 seed, or the int64 of its bits), "
           "got ")
    with raises(f"attention_fwd: {msg}{seed}"):
        flashlab.attention_fwd(*_fixed(), dropout_p=0.1, dropout_seed=seed)
    with raises(f"attention_bwd: {msg}{seed}"):
        flashlab.attention_bwd(*_bwd_args(), dropout_p=0.1, dropout_seed=seed)


def test_every_function_takes_dropout():
    # No NotImplementedError any more: dropout goes on to C++ (which rejects the host memory).
    q = np.zeros((1, 17, 2, 64), np.float16)
    cu = np.array([0, 17], np.int32)
    for fn, args in ((flashlab.flash_attn_func, (q, q, q)),
                     (flashlab.flash_attn_varlen_func, (q[0], q[0], q[0], cu, cu, 17, 17)),
                     (flashlab.flash_attn_qkvpacked_func, (np.zeros((1, 17, 3, 2, 64), np.float16),)),
                     (flashlab.flash_attn_kvpacked_func, (q, np.zeros((1, 17, 2, 2, 64), np.float16))),
                     (flashlab.flash_attn_varlen_qkvpacked_func, (np.zeros((17, 3, 2, 64), np.float16), cu, 17)),
                     (flashlab.flash_attn_varlen_kvpacked_func, (q[0], np.zeros((17, 2, 2, 64), np.float16),
                                                                 cu, cu, 17, 17))):
        with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
            fn(*args, dropout_p=0.5)
        with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
            fn(*args, dropout_p=0.1, causal=True, return_attn_probs=True, impl=1)
    # Paged KV (the paged prefill) has no dropout.
    if torch is not None:
        t = torch.zeros(17, 2, 64, dtype=torch.float16)
        with pytest.raises(NotImplementedError,
                           match="^flash_attn_varlen_func: argument 'dropout_p': not supported with 'block_table'"):
            flashlab.flash_attn_varlen_func(t, t, t, cu, cu, 17, 17, dropout_p=0.1,
                                            block_table=torch.zeros((1, 1), dtype=torch.int32))


# ---------------------------------------------------------------------------------------------
# CPU: how seeds flow, seen by a recorder in place of the FFI module.

class _Recorder:
    """Stands in for the FFI module: records (op, rung, dropout_p, dropout_seed, dropout_offset) of
    each call (the binding's trailing arguments) and writes nothing."""

    def __init__(self):
        self.calls = []

    def attention_fwd(self, *args):
        assert len(args) == 23, len(args)
        self.calls.append(("fwd", *args[19:]))

    def attention_bwd(self, *args):
        assert len(args) == 24, len(args)
        self.calls.append(("bwd", *args[20:]))


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(flash_attn_interface, "_ffi", rec)
    return rec


def _int64_bits(x: int) -> int:
    return x - 2**64 if x >= 2**63 else x


def test_numpy_seeds_come_from_random(recorder):
    q = np.zeros((1, 17, 2, 64), np.float16)
    flashlab.flash_attn_func(q, q, q)
    assert recorder.calls[-1] == ("fwd", -1, 0.0, 0, 0)  # no dropout: seed 0, no draw
    random.seed(1234)
    expected = random.getrandbits(64)
    random.seed(1234)
    flashlab.flash_attn_func(q, q, q, dropout_p=0.25)
    assert recorder.calls[-1] == ("fwd", -1, 0.25, _int64_bits(expected), 0)
    flashlab.flash_attn_qkvpacked_func(np.zeros((1, 17, 3, 2, 64), np.float16), dropout_p=0.25, impl=1)
    assert recorder.calls[-1][:3] == ("fwd", 1, 0.25) and recorder.calls[-1][3] != recorder.calls[-2][3]
    # The low-level API passes seed and offset as given (a uint64 as its int64 bits).
    flashlab.attention_fwd(q, q, q, dropout_p=0.5, dropout_seed=2**64 - 3, dropout_offset=77)
    flashlab.attention_bwd(q, q, q, q, q, np.zeros((1, 2, 17), np.float32), dropout_p=0.5, dropout_seed=5,
                           dropout_offset=2**32 - 1)
    assert recorder.calls[-2:] == [("fwd", -1, 0.5, -3, 77), ("bwd", -1, 0.5, 5, 2**32 - 1)]


def _cpu_inputs(requires_grad: bool):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 17, 4, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 23, 2, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def _next_seed() -> int:
    """The seed flash_attn_func draws next for torch tensors (torch's default CPU generator)."""
    from flashlab import _torch_ops
    state = torch.random.get_rng_state()
    seed = int(torch.randint(0, _torch_ops._SEED_END, (1,), dtype=torch.int64).item())
    torch.random.set_rng_state(state)
    return seed


@needs_torch
def test_torch_seeds_come_from_the_cpu_generator(recorder):
    q, k, v = _cpu_inputs(False)
    state = torch.random.get_rng_state()
    flashlab.flash_attn_func(q, k, v, causal=True)
    assert recorder.calls[-1] == ("fwd", -1, 0.0, 0, 0)
    assert torch.equal(torch.random.get_rng_state(), state), "dropout_p = 0 drew a seed"
    torch.manual_seed(7)
    expected = _next_seed()
    flashlab.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    assert recorder.calls[-1] == ("fwd", -1, 0.3, expected, 0)
    flashlab.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    assert recorder.calls[-1][3] != expected, "consecutive calls share a seed"
    torch.manual_seed(7)
    flashlab.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    assert recorder.calls[-1] == ("fwd", -1, 0.3, expected, 0)
    # The packed and varlen variants draw the same way.
    torch.manual_seed(7)
    flashlab.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), dropout_p=0.3)
    cu = torch.tensor([0, 17], dtype=torch.int32)
    torch.manual_seed(7)
    flashlab.flash_attn_varlen_func(q[0], k[0, :17], v[0, :17], cu, cu, 17, 17, dropout_p=0.3, impl=1)
    assert recorder.calls[-2] == ("fwd", -1, 0.3, expected, 0) and recorder.calls[-1] == ("fwd", 1, 0.3, expected, 0)


@needs_torch
def test_backward_gets_the_forwards_seed(recorder):
    q, k, v = _cpu_inputs(True)
    for p in (0.0, 0.2):
        recorder.calls.clear()
        torch.manual_seed(3)
        expected = _next_seed() if p else 0
        out = flashlab.flash_attn_func(q, k, v, dropout_p=p, causal=True, impl=1)
        torch.randint(0, 10, (5,))  # the generator moves on: the backward must not draw again
        torch.autograd.grad(out, [q, k, v], torch.ones_like(out))
        # The forward's rung is its own; the backward's is automatic (dropout: rung 2).
        assert recorder.calls == [("fwd", 1, p, expected, 0), ("bwd", -1, p, expected, 0)], recorder.calls


@needs_torch
def test_compile_draws_a_seed_per_call(recorder):
    # fullgraph: a graph break raises. aot_eager runs the real ops (on the recorder) with the seed
    # drawn by the traced randint, forward and backward from compiled graphs.
    torch._dynamo.reset()
    q, k, v = _cpu_inputs(True)
    fn = torch.compile(lambda a, b, c: flashlab.flash_attn_func(a, b, c, dropout_p=0.4, causal=True),
                       fullgraph=True, backend="aot_eager")
    seeds = []
    for reseed in (True, False, True):
        if reseed:
            torch.manual_seed(11)
        recorder.calls.clear()
        out = fn(q, k, v)
        torch.autograd.grad(out.float().sum(), [q, k, v])
        assert [c[0] for c in recorder.calls] == ["fwd", "bwd"], recorder.calls
        assert recorder.calls[0][2:] == recorder.calls[1][2:] and recorder.calls[0][2] == 0.4, recorder.calls
        seeds.append(recorder.calls[0][3])
    assert seeds[0] != seeds[1], "the compiled function reused its seed"
    assert seeds[0] == seeds[2], "torch.manual_seed does not reproduce the compiled function's seed"


# ---------------------------------------------------------------------------------------------
# CPU (torch): fake kernels and export.

@needs_torch
def test_fake_shapes_with_dropout():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    bf16, f32 = torch.bfloat16, torch.float32

    def meta(x):
        assert isinstance(x, FakeTensor), type(x)
        return tuple(x.shape), x.dtype

    with FakeTensorMode():
        q = torch.empty(2, 33, 8, 64, dtype=bf16).requires_grad_(True)
        k, v = (torch.empty(2, 40, 2, 64, dtype=bf16).requires_grad_(True) for _ in range(2))
        out, lse, probs = flashlab.flash_attn_func(q, k, v, dropout_p=0.1, causal=True, return_attn_probs=True)
        assert [meta(x) for x in (out, lse, probs)] == [((2, 33, 8, 64), bf16), ((2, 8, 33), f32),
                                                         ((2, 8, 33, 40), bf16)]
        grads = torch.autograd.grad(out.float().sum(), [q, k, v])
        assert [meta(g) for g in grads] == [((2, 33, 8, 64), bf16), ((2, 40, 2, 64), bf16), ((2, 40, 2, 64), bf16)]
        tq, tkv = torch.empty(100, 4, 64, dtype=bf16), torch.empty(120, 2, 64, dtype=bf16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse, probs = flashlab.flash_attn_varlen_func(tq, tkv, tkv, cu, cu, 50, 70, dropout_p=0.5,
                                                          return_attn_probs=True)
        assert [meta(x) for x in (out, lse, probs)] == [((100, 4, 64), bf16), ((4, 100), f32), ((3, 4, 50, 70), bf16)]
        # The ops themselves, the dropout arguments given.
        from flashlab import _torch_ops  # noqa: F401 (registers the ops)
        seed = torch.zeros(1, dtype=torch.int64)
        ops = torch.ops.flashlab
        res = ops.attention_fwd(q, k, v, None, None, None, None, None, None, 0, 0, None, True, -1, -1, 0.0, False,
                                False, -1, 0.25, seed)
        assert [meta(x) for x in res] == [((2, 33, 8, 64), bf16), ((2, 8, 33), f32), ((0,), bf16)]
        grads = ops.attention_bwd(q, k, v, res[0], res[0], res[1], None, None, None, 0, 0, None, True, -1, -1, 0.0,
                                  False, -1, 0.25, seed)
        assert [meta(g) for g in grads] == [((2, 33, 8, 64), bf16), ((2, 40, 2, 64), bf16), ((2, 40, 2, 64), bf16)]


@needs_torch
def test_export_records_the_seed_draw():
    # Strict export traces with dynamo (no graph break allowed): the seed is drawn by an aten.randint
    # node of the graph, a CPU int64 of one element that goes into the opaque op.
    class Model(torch.nn.Module):
        def forward(self, q, k, v):
            return flashlab.flash_attn_func(q, k, v, dropout_p=0.1, causal=True).float().sum()

    q, k, v = _cpu_inputs(False)
    graph = torch.export.export(Model(), (q, k, v), strict=True).graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    targets = [str(n.target) for n in calls]
    assert targets.count("flashlab.attention_fwd.default") == 1, targets
    (attn,) = [n for n in calls if str(n.target) == "flashlab.attention_fwd.default"]
    p, seed = attn.args[19:21] if len(attn.args) > 19 else (attn.kwargs["dropout_p"], attn.kwargs["dropout_seed"])
    assert p == 0.1
    assert str(seed.target).startswith("aten.randint"), seed.target
    val = seed.meta["val"]
    assert tuple(val.shape) == (1,) and val.dtype == torch.int64 and val.device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# GPU: numerics against a float64 reference with the kernel's own mask.

def _dropout_attend(q, k, v, keep, dropout_p, o):
    """Attention of one fixed-length group with the probabilities masked by `keep` (b, h, sq, sk)
    and the kept ones scaled by 1 / (1 - dropout_p), computed in q's dtype (float64: the reference;
    fp16 / bf16: the naive computation). Returns out (b, sq, h, d), lse before dropout (b, h, sq),
    probs before dropout (b, h, sq, sk)."""
    _, lse, p = _attend(q, k, v, None, **o)
    h, hkv = q.shape[2], k.shape[2]
    vx = v.repeat_interleave(h // hkv, dim=2).transpose(1, 2)  # (b, h, sk, d)
    z = keep.to(p.dtype) * (1.0 / (1.0 - dropout_p))
    return ((p * z) @ vx).transpose(1, 2), lse, p


def _mask(probs, visible):
    """The kept entries: S_dmask's sign bit clear (a dropped 0 is -0.0), on the visible entries."""
    return ~torch.signbit(probs) & visible


def _inputs(b, sq, sk, h, hkv, d, dtype, seed, amp=1.0):
    """q (b, sq, h, d), k and v (b, sk, hkv, d), dout like q: _randn with seeds seed .. seed + 3."""
    shapes = ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, h, d))
    return tuple(_randn(shape, dtype, seed + i, amp) for i, shape in enumerate(shapes))


def _masked_grads(q, k, v, dout, keep, dropout_p, o):
    """(float64 autograd, naive in-dtype autograd) of the reference masked by `keep`: the pair
    _check_grads holds a kernel's gradients to."""
    def attend(a, b_, c):
        return _dropout_attend(a, b_, c, keep, dropout_p, o)[0]
    return (_autograd(attend, (q.double(), k.double(), v.double()), dout.double()),
            _autograd(attend, (q, k, v), dout))


def _check_forward(res, q, k, v, dropout_p, o, dtype, what):
    """res: flash_attn_func's (out, lse, S_dmask) for fixed-length q, k, v. Returns the mask."""
    out, lse, probs = res
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    assert probs.shape == (b, h, sq, sk) and probs.dtype == q.dtype
    keep = _mask(probs, _keep(sq, sk, o["causal"], o["wl"], o["wr"]))
    ref = _dropout_attend(q.double(), k.double(), v.double(), keep, dropout_p, o)
    naive = _dropout_attend(q, k, v, keep, dropout_p, o)
    check_close(out, _np(ref[0]), _np(naive[0]), dtype, f"{what}: out")
    check_close(lse, _np(ref[1]), _np(naive[1]), dtype, f"{what}: lse")
    check_close(probs.abs(), _np(ref[2]), _np(naive[2]), dtype, f"{what}: |S_dmask|")
    return keep


def _assert_keep_rate(keep, visible_count: int, dropout_p: float, what: str):
    rate = keep.sum().item() / visible_count
    sigma = math.sqrt(dropout_p * (1 - dropout_p) / visible_count)
    assert abs(rate - (1 - dropout_p)) <= 5 * sigma, \
        f"{what}: keep rate {rate:.5f}, expected {1 - dropout_p} +- {5 * sigma:.5f}"


@gpu
@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_forward_and_keep_rate(dropout_p):
    b, s, h, hkv, d, dtype = 2, 256, 4, 2, 64, "float16"
    q, k, v, _ = _inputs(b, s, s, h, hkv, d, dtype, 100)
    o = _opts(False, (-1, -1), 0.0, None, d)
    res = flashlab.flash_attn_func(q, k, v, dropout_p=dropout_p, return_attn_probs=True)
    keep = _check_forward(res, q, k, v, dropout_p, o, dtype, f"p {dropout_p}")
    _assert_keep_rate(keep, b * h * s * s, dropout_p, f"p {dropout_p}")
    # One mask per (batch, head): heads that share a KV head, and batch entries, differ.
    assert not torch.equal(keep[:, 0], keep[:, 1]) and not torch.equal(keep[0], keep[1])


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forward_causal_window_softcap(dtype):
    b, sq, sk, h, hkv, d, dropout_p = 1, 113, 200, 4, 1, 128, 0.3
    q, k, v, _ = _inputs(b, sq, sk, h, hkv, d, dtype, 7, 2.0)
    o = _opts(True, (48, -1), 5.0, None, d)
    res = flashlab.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True, window_size=(48, -1), softcap=5.0,
                                   return_attn_probs=True)
    keep = _check_forward(res, q, k, v, dropout_p, o, dtype, f"{dtype} causal window softcap")
    visible = _keep(sq, sk, True, 48, -1)
    _assert_keep_rate(keep, b * h * int(visible.sum()), dropout_p, "causal window softcap")


@gpu
def test_same_seed_same_result_and_fresh_masks():
    b, s, h, d, dropout_p = 2, 128, 4, 64, 0.5
    q, k, v, _ = _inputs(b, s, s, h, h, d, "bfloat16", 30)

    def run(**kw):
        return flashlab.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True, return_attn_probs=True, **kw)

    def bits(x):  # exact comparison, -0.0 and 0.0 told apart
        return x.view(torch.int16) if x.dtype == torch.bfloat16 else x.view(torch.int32)

    torch.manual_seed(5)
    first = run()
    second = run()
    torch.manual_seed(5)
    again = run()
    assert all(torch.equal(bits(x), bits(y)) for x, y in zip(first, again)), "same seed, different results"
    assert not torch.equal(torch.signbit(first[2]), torch.signbit(second[2])), "consecutive calls share a mask"
    assert not torch.equal(first[0], second[0])
    assert torch.equal(first[1], second[1])  # the lse is before dropout
    # The mask does not depend on whether S_dmask is asked for, nor on the packing.
    torch.manual_seed(5)
    assert torch.equal(flashlab.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True), first[0])
    torch.manual_seed(5)
    assert torch.equal(flashlab.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), dropout_p=dropout_p,
                                                          causal=True), first[0])
    # Reseeding torch's CUDA generator alone changes nothing: the seed comes from the CPU one.
    # (The same rung as `first`, the automatic one: rung 1 and rung 3 round differently, and this
    # compared rung 1 with the automatic choice from when that was rung 1, before 239cf86.)
    torch.manual_seed(5)
    torch.cuda.manual_seed(12345)
    assert torch.equal(run()[0], first[0])


@gpu
def test_seed_is_the_cpu_generators_next_draw():
    # flash_attn_func's seed is torch.randint's next draw on the CPU generator, offset 0: the
    # low-level API given that seed reproduces its forward, and its backward, bit for bit (both
    # deterministic, whichever rungs the automatic choices take).
    b, sq, sk, h, hkv, d, dropout_p = 1, 77, 100, 4, 2, 64, 0.2
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, "float16", 40)
    torch.manual_seed(9)
    seed = _next_seed()
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = flashlab.flash_attn_func(*leaves, dropout_p=dropout_p, causal=True, deterministic=True)
    grads = torch.autograd.grad(out, leaves, dout)
    lse = torch.empty(b, h, sq, device="cuda")
    low = flashlab.attention_fwd(q, k, v, softmax_lse=lse, causal=True, dropout_p=dropout_p, dropout_seed=seed)
    assert torch.equal(low, out.detach())
    low_grads = flashlab.attention_bwd(q, k, v, low, dout, lse, causal=True, deterministic=True, dropout_p=dropout_p,
                                       dropout_seed=seed)
    assert all(torch.equal(x, y) for x, y in zip(low_grads, grads))


@gpu
def test_explicit_seed_and_offset():
    b, s, h, d, dropout_p = 1, 96, 2, 64, 0.5
    q, k, v, _ = _inputs(b, s, s, h, h, d, "bfloat16", 50)

    def run(seed, offset):
        lse = torch.empty(b, h, s, device="cuda")
        probs = torch.empty(b, h, s, s, device="cuda", dtype=torch.bfloat16)
        out = flashlab.attention_fwd(q, k, v, softmax_lse=lse, attn_probs=probs, dropout_p=dropout_p,
                                     dropout_seed=seed, dropout_offset=offset)
        return out, lse, probs

    seed = 2**64 - 12345
    a = run(seed, 7)
    assert torch.equal(run(seed - 2**64, 7)[0], a[0])  # a uint64 seed and its int64 bits: one seed
    mask = torch.signbit(a[2])
    for other in (run(seed, 8), run(seed ^ (1 << 40), 7), run(seed ^ 1, 7)):  # the offset, high and low seed words
        assert not torch.equal(torch.signbit(other[2]), mask)
    keep = _check_forward(a, q, k, v, dropout_p, _opts(False, (-1, -1), 0.0, None, d), "bfloat16", "explicit seed")
    _assert_keep_rate(keep, b * h * s * s, dropout_p, "explicit seed")


def _check_dropout_grads(q, k, v, dout, dropout_p, o, dtype, what, **kw):
    """flash_attn_func's gradients with dropout against float64 autograd of the reference masked by
    the forward's own S_dmask (fixed length)."""
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse, probs = flashlab.flash_attn_func(*leaves, dropout_p=dropout_p, return_attn_probs=True, **kw)
    got = torch.autograd.grad(out, leaves, dout)
    keep = _check_forward((out.detach(), lse, probs), q, k, v, dropout_p, o, dtype, what)
    ref, naive = _masked_grads(q, k, v, dout, keep, dropout_p, o)
    _check_grads(got, ref, naive, dtype, what)


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gradients_causal_gqa(dtype):
    b, sq, sk, h, hkv, d, dropout_p = 2, 100, 130, 4, 2, 64, 0.2
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, dtype, 60)
    _check_dropout_grads(q, k, v, dout, dropout_p, _opts(True, (-1, -1), 0.0, None, d), dtype,
                         f"{dtype} causal GQA p {dropout_p}", causal=True)


@gpu
def test_gradients_high_dropout_mqa():
    b, sq, sk, h, d, dropout_p = 1, 64, 64, 4, 128, 0.8
    q, k, v, dout = _inputs(b, sq, sk, h, 1, d, "bfloat16", 70)
    _check_dropout_grads(q, k, v, dout, dropout_p, _opts(False, (-1, -1), 0.0, None, d), "bfloat16",
                         f"MQA p {dropout_p}")


@gpu
def test_varlen_forward_and_gradients():
    lens_q, lens_k, h, hkv, d, dtype, dropout_p = [17, 60, 1], [40, 60, 33], 4, 2, 64, "float16", 0.3
    cu_q, cu_k, msq, msk = _cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k)
    bq, bk = [int(x) for x in cu_q], [int(x) for x in cu_k]
    q, dout = _randn((sum(lens_q), h, d), dtype, 80), _randn((sum(lens_q), h, d), dtype, 81)
    k, v = _randn((sum(lens_k), hkv, d), dtype, 82), _randn((sum(lens_k), hkv, d), dtype, 83)
    o = _opts(True, (-1, -1), 0.0, None, d)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse, probs = flashlab.flash_attn_varlen_func(*leaves, cu_q, cu_k, msq, msk, dropout_p=dropout_p, causal=True,
                                                      return_attn_probs=True)
    got = torch.autograd.grad(out, leaves, dout)
    assert probs.shape == (len(lens_q), h, msq, msk)
    keeps = [_mask(probs[i, :, :lens_q[i], :lens_k[i]], _keep(lens_q[i], lens_k[i], True, -1, -1))[None]
             for i in range(len(lens_q))]

    def attend(qq, kk, vv, part):
        res = [_dropout_attend(qq[None, bq[i]:bq[i + 1]], kk[None, bk[i]:bk[i + 1]], vv[None, bk[i]:bk[i + 1]],
                               keeps[i], dropout_p, o) for i in range(len(lens_q))]
        return torch.cat([r[0][0] for r in res]) if part == "out" else torch.cat([r[1][0] for r in res], 1)

    ref = [attend(q.double(), k.double(), v.double(), p) for p in ("out", "lse")]
    naive = [attend(q, k, v, p) for p in ("out", "lse")]
    check_close(out.detach(), _np(ref[0]), _np(naive[0]), dtype, "varlen: out")
    check_close(lse, _np(ref[1]), _np(naive[1]), dtype, "varlen: lse")
    visible = sum(h * int(_keep(lq, lk, True, -1, -1).sum()) for lq, lk in zip(lens_q, lens_k))
    _assert_keep_rate(torch.stack([kp.sum() for kp in keeps]), visible, dropout_p, "varlen")
    ref_g = _autograd(lambda a, b_, c: attend(a, b_, c, "out"), (q.double(), k.double(), v.double()), dout.double())
    naive_g = _autograd(lambda a, b_, c: attend(a, b_, c, "out"), (q, k, v), dout)
    _check_grads(got, ref_g, naive_g, dtype, f"varlen causal GQA p {dropout_p}")


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tiled_rungs_share_the_mask(dtype):
    # Forward rung 3 and backward rung 2 (the automatic choices with dropout) against the same
    # reference, under the mask of forward rung 1 for the same seed and offset: the sign bits of
    # S_dmask must agree entry by entry, the gradients come from a forward whose output is rung 3's.
    # The automatic forward is rung 3 bit for bit (no atomics); the automatic backward is checked
    # against the reference (rung 2's dQ atomics vary in their last bits).
    b, sq, sk, h, hkv, d, dropout_p = 2, 77, 140, 4, 2, 128, 0.3
    q, k, v, dout = _inputs(b, sq, sk, h, hkv, d, dtype, 110)
    o = _opts(True, (-1, -1), 0.0, None, d)
    res = {}
    for rung in (1, 3, None):
        lse = torch.full((b, h, sq), math.nan, device="cuda")
        probs = torch.full((b, h, sq, sk), math.nan, device="cuda", dtype=q.dtype)
        out = torch.full_like(q, math.nan)
        flashlab.attention_fwd(q, k, v, out, softmax_lse=lse, attn_probs=probs, causal=True, rung=rung,
                               dropout_p=dropout_p, dropout_seed=2024, dropout_offset=3)
        res[rung] = (out, lse, probs)
    keep = _check_forward(res[1], q, k, v, dropout_p, o, dtype, f"{dtype} rung 1")
    assert torch.equal(_check_forward(res[3], q, k, v, dropout_p, o, dtype, f"{dtype} rung 3"), keep)
    assert all(torch.equal(x, y) for x, y in zip(res[None], res[3])), "the automatic forward is not rung 3"
    ref, naive = _masked_grads(q, k, v, dout, keep, dropout_p, o)
    out, lse, _ = res[3]
    for rung in (1, 2, None):
        got = flashlab.attention_bwd(q, k, v, out, dout, lse, causal=True, rung=rung, dropout_p=dropout_p,
                                     dropout_seed=2024, dropout_offset=3)
        _check_grads(got, ref, naive, dtype, f"{dtype} backward rung {rung} after forward rung 3")


@gpu
def test_compile_fullgraph_with_dropout():
    torch._dynamo.reset()
    b, s, h, hkv, d, dtype, dropout_p = 2, 128, 4, 2, 64, "bfloat16", 0.25
    q, k, v, dout = _inputs(b, s, s, h, hkv, d, dtype, 90)

    def fn(a, b_, c):
        out, _, probs = flashlab.flash_attn_func(a, b_, c, dropout_p=dropout_p, causal=True, return_attn_probs=True)
        return out * 2, probs  # something for Inductor around the op

    compiled = torch.compile(fn, fullgraph=True)  # a graph break raises
    o = _opts(True, (-1, -1), 0.0, None, d)
    masks = []
    for reseed in (True, False, True):
        if reseed:
            torch.manual_seed(21)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out2, probs = compiled(*leaves)
        got = torch.autograd.grad(out2, leaves, dout)
        assert torch.isfinite(out2).all() and all(torch.isfinite(g).all() for g in got)
        keep = _mask(probs, _keep(s, s, True, -1, -1))
        _assert_keep_rate(keep, b * h * s * (s + 1) // 2, dropout_p, "compiled")
        ref = _dropout_attend(q.double(), k.double(), v.double(), keep, dropout_p, o)[0]
        naive = _dropout_attend(q, k, v, keep, dropout_p, o)[0]
        check_close(out2.detach() / 2, _np(ref), _np(naive), dtype, "compiled: out")
        fn_ref = lambda a, b_, c: 2 * _dropout_attend(a, b_, c, keep, dropout_p, o)[0]  # noqa: E731
        _check_grads(got, _autograd(fn_ref, (q.double(), k.double(), v.double()), dout.double()),
                     _autograd(fn_ref, (q, k, v), dout), dtype, "compiled")
        masks.append(torch.signbit(probs))
    assert not torch.equal(masks[0], masks[1]), "the compiled function reused its seed"
    assert torch.equal(masks[0], masks[2]), "torch.manual_seed does not reproduce the compiled function's mask"


@gpu
def test_opcheck_with_dropout():
    # Eager against AOTAutograd (dynamic shapes too), gradients included: exact, as the seed is fixed
    # and the backward deterministic (_fwd_args: deterministic=True).
    from flashlab import _torch_ops  # noqa: F401 (registers the ops)
    from test_attention_compile import _fwd_args
    b, sq, sk, h, hkv, d = 2, 45, 70, 4, 2, 64
    q = _randn((b, sq, h, d), "bfloat16", 1).requires_grad_(True)
    k, v = (_randn((b, sk, hkv, d), "bfloat16", s).requires_grad_(True) for s in (2, 3))
    seed = torch.tensor([987654321], dtype=torch.int64)
    fwd, bwd = torch.ops.flashlab.attention_fwd.default, torch.ops.flashlab.attention_bwd.default
    torch.library.opcheck(fwd, _fwd_args(q, k, v, causal=True, probs=True) + (0.3, seed))
    with torch.no_grad():
        out, lse, _ = fwd(*_fwd_args(q, k, v, causal=True) + (0.3, seed))
    dout = _randn((b, sq, h, d), "bfloat16", 7)
    torch.library.opcheck(bwd, (q.detach(), k.detach(), v.detach(), out, dout, lse, None, None, None, 0, 0, None, True,
                                -1, -1, 0.0, True, -1, 0.3, seed))


@gpu
def test_gpu_rejections():
    q, k, v = (_randn((1, 33, 2, 64), "float16", i) for i in range(3))
    with raises(RUNG_MSG.format(2)):
        flashlab.flash_attn_func(q, k, v, dropout_p=0.1, impl=2)
    with raises("attention_fwd: argument 'dropout_p': expected a finite value in [0, 1), got 1"):
        flashlab.flash_attn_func(q, k, v, dropout_p=1.0)
    if hasattr(torch, "float8_e4m3fn"):  # rejected before the FP8 rung's own sm_90 check: any GPU
        fq, fk, fv, descales = _fp8_inputs((1, 64, 2, 128), (1, 64, 2, 128), 3, False, 1, 2)
        with raises("attention_fwd: argument 'dropout_p': expected 0 for e4m3 inputs (no FP8 dropout), got 0.1"):
            flashlab.flash_attn_func(fq, fk, fv, dropout_p=0.1, q_descale=descales[0], k_descale=descales[1],
                                     v_descale=descales[2])
