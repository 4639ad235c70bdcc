"""The attention as torch.library custom ops (flashlab/_torch_ops.py): fake kernels, torch.compile,
training.

CPU part (torch needed, no GPU): under FakeTensorMode the fake kernels give the shapes and dtypes
the real ops give (fixed length, GQA, packed, varlen, return_attn_probs, FP8 -> bf16 out, the
backward op and autograd through it), FP8 still has no backward, torch.export in strict mode (dynamo
with no graph break allowed) records flash_attn_func as one opaque flashlab op, and the C++
messages come through the ops unchanged. Without torch, the module still works and registers
nothing (a subprocess that hides torch).

GPU part: torch.library.opcheck on both ops; torch.compile(fullgraph=True) of attention + a
projection + a sum against eager flashlab, both within the tolerance rule (numerics.check_close:
2x the error of the naive torch computation in the input dtype against float64, plus a rounding
floor) for the output and dq, dk, dv; a 50-step training check of a small pre-norm transformer
layer with flashlab attention against the same layer with torch SDPA.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashlab
from numerics import check_close
from test_attention import _attend, _cu, _np, _opts, _randn
from test_bindings import gpu, raises, torch

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def test_works_without_torch():
    # torch hidden (an import of it fails): the numpy path runs into C++ and _torch_ops stays unloaded.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, flashlab\n"
            "q = np.zeros((1, 17, 2, 64), np.float16)\n"
            "try:\n"
            "    flashlab.flash_attn_func(q, q, q, return_attn_probs=True)\n"
            "except ValueError as e:\n"
            "    print(e)\n"
            "print('flashlab._torch_ops' in sys.modules)\n")
    path = [str(Path(flashlab.__file__).parents[1])]
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor", "False"]


# ---------------------------------------------------------------------------------------------
# CPU (torch): fake kernels, autograd wiring, export, messages.

def _ops():
    """torch.ops.flashlab, registered (importing _torch_ops registers; flash_attn_func would too)."""
    import flashlab._torch_ops  # noqa: F401
    return torch.ops.flashlab


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode()


def _meta(x):
    """(shape, dtype) of a fake tensor (and that it is one: the real kernel never ran)."""
    from torch._subclasses.fake_tensor import FakeTensor
    assert isinstance(x, FakeTensor), type(x)
    return tuple(x.shape), x.dtype


def _empty(shape, dtype, requires_grad=False):
    return torch.empty(shape, dtype=dtype).requires_grad_(requires_grad)


@needs_torch
def test_fake_fixed_length():
    bf16, f32 = torch.bfloat16, torch.float32
    with _fake_mode():
        q, kv = _empty((2, 33, 8, 64), bf16), _empty((2, 40, 2, 64), bf16)  # GQA 8 / 2, sq != sk
        assert _meta(flashlab.flash_attn_func(q, kv, kv, causal=True)) == ((2, 33, 8, 64), bf16)
        out, lse, probs = flashlab.flash_attn_func(q, kv, kv, window_size=(8, 0), return_attn_probs=True)
        assert [_meta(x) for x in (out, lse, probs)] == [((2, 33, 8, 64), bf16), ((2, 8, 33), f32),
                                                         ((2, 8, 33, 40), bf16)]
        # The op itself: softmax_lse always, attn_probs a 0-element placeholder unless asked for.
        res = _ops().attention_fwd(q, kv, kv, None, None, None, None, None, None, 0, 0, None, True, -1,
                                               -1, 0.0, False, False, -1)
        assert [_meta(x) for x in res] == [((2, 33, 8, 64), bf16), ((2, 8, 33), f32), ((0,), bf16)]
        qkv, f16 = _empty((3, 17, 3, 4, 32), torch.float16), torch.float16
        out, lse, probs = flashlab.flash_attn_qkvpacked_func(qkv, return_attn_probs=True)
        assert [_meta(x) for x in (out, lse, probs)] == [((3, 17, 4, 32), f16), ((3, 4, 17), f32),
                                                         ((3, 4, 17, 17), f16)]
        kv = _empty((3, 50, 2, 1, 32), f16)
        assert _meta(flashlab.flash_attn_kvpacked_func(qkv[:, :, 0], kv)) == ((3, 17, 4, 32), f16)


@needs_torch
def test_fake_varlen():
    f16, f32 = torch.float16, torch.float32
    with _fake_mode():
        q, kv = _empty((100, 4, 128), f16), _empty((120, 2, 128), f16)
        cu_q, cu_k = _empty((4,), torch.int32), _empty((4,), torch.int32)  # batch 3
        assert _meta(flashlab.flash_attn_varlen_func(q, kv, kv, cu_q, cu_k, 50, 70, causal=True)) == \
            ((100, 4, 128), f16)
        out, lse, probs = flashlab.flash_attn_varlen_func(q, kv, kv, cu_q, cu_k, 50, 70, return_attn_probs=True)
        assert [_meta(x) for x in (out, lse, probs)] == [((100, 4, 128), f16), ((4, 100), f32),
                                                         ((3, 4, 50, 70), f16)]
        qkv = _empty((100, 3, 4, 128), f16)
        out, lse, probs = flashlab.flash_attn_varlen_qkvpacked_func(qkv, cu_q, 60, return_attn_probs=True)
        assert [_meta(x) for x in (out, lse, probs)] == [((100, 4, 128), f16), ((4, 100), f32),
                                                         ((3, 4, 60, 60), f16)]
        kv = _empty((120, 2, 2, 128), f16)
        assert _meta(flashlab.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 50, 70)) == ((100, 4, 128), f16)


@needs_torch
@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e4m3fn"), reason="torch without float8_e4m3fn")
def test_fake_fp8():
    with _fake_mode():
        q = _empty((2, 64, 4, 128), torch.float8_e4m3fn, requires_grad=True)
        k = _empty((2, 64, 2, 128), torch.float8_e4m3fn)
        descale = _empty((1,), torch.float32)
        out = flashlab.flash_attn_func(q, k, k, causal=True, q_descale=descale, k_descale=descale, v_descale=descale)
        assert _meta(out) == ((2, 64, 4, 128), torch.bfloat16) and out.requires_grad
        with pytest.raises(NotImplementedError, match=r"^flashlab: no backward for FP8 \(e4m3\) attention"):
            out.float().sum().backward()


@needs_torch
def test_fake_backward():
    bf16 = torch.bfloat16
    with _fake_mode():
        q, k, v = _empty((2, 33, 8, 64), bf16), _empty((2, 40, 2, 64), bf16), _empty((2, 40, 2, 64), bf16)
        out, dout, lse = _empty((2, 33, 8, 64), bf16), _empty((2, 33, 8, 64), bf16), _empty((2, 8, 33), torch.float32)
        grads = _ops().attention_bwd(q, k, v, out, dout, lse, None, None, None, 0, 0, None, True, -1, -1, 0.0, False,
                                     -1)
        assert [_meta(g) for g in grads] == [((2, 33, 8, 64), bf16), ((2, 40, 2, 64), bf16), ((2, 40, 2, 64), bf16)]
        # Autograd reaches the backward op: dk, dv per KV head (GQA); lse and probs take no gradient.
        leaves = [x.requires_grad_(True) for x in (q, k, v)]
        out, lse, probs = flashlab.flash_attn_func(*leaves, causal=True, return_attn_probs=True)
        assert out.requires_grad and not lse.requires_grad and not probs.requires_grad
        grads = torch.autograd.grad(out.float().square().sum(), leaves)
        assert [_meta(g) for g in grads] == [((2, 33, 8, 64), bf16), ((2, 40, 2, 64), bf16), ((2, 40, 2, 64), bf16)]
        tq, tkv = _empty((100, 4, 64), bf16, True), _empty((120, 2, 64), bf16, True)
        cu = _empty((4,), torch.int32)
        grads = torch.autograd.grad(flashlab.flash_attn_varlen_func(tq, tkv, tkv, cu, cu, 50, 70).sum(), [tq, tkv])
        assert [_meta(g) for g in grads] == [((100, 4, 64), bf16), ((120, 2, 64), bf16)]


@needs_torch
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_export_sees_one_opaque_op(varlen):
    # Strict export traces with dynamo and fails on any graph break; the real kernel never runs.
    class Model(torch.nn.Module):
        def forward(self, q, k, v, w, cu):
            if varlen:
                o = flashlab.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
            else:
                o = flashlab.flash_attn_func(q, k, v, causal=True, softcap=5.0)
            return (o.flatten(-2) @ w).float().sum()

    shape = (2, 40, 4, 64) if not varlen else (80, 4, 64)
    q, k, v = (torch.randn(shape).to(torch.bfloat16) for _ in range(3))
    w = torch.randn(256, 16).to(torch.bfloat16)
    cu = torch.tensor([0, 40, 80], dtype=torch.int32)
    graph = torch.export.export(Model(), (q, k, v, w, cu), strict=True).graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert targets.count("flashlab.attention_fwd.default") == 1, targets
    assert not any("softmax" in t or "bmm" in t for t in targets), targets  # attention not decomposed


@needs_torch
def test_cpp_messages_come_through_the_ops():
    # CPU torch tensors: the C++ device check, as a ValueError, through the dispatcher.
    q = torch.zeros(1, 17, 2, 64, dtype=torch.float16)
    with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.flash_attn_func(q, q, q)
    with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.flash_attn_func(q.clone().requires_grad_(True), q, q, causal=True, return_attn_probs=True)
    cu = torch.tensor([0, 17], dtype=torch.int32)
    with raises("attention_fwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        flashlab.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 17, 17)
    lse = torch.zeros(1, 2, 17)
    with raises("attention_bwd: argument 'q': expected a CUDA tensor, got cpu tensor"):
        _ops().attention_bwd(q, q, q, q, q, lse, None, None, None, 0, 0, None, False, -1, -1, 0.0, False, -1)


# ---------------------------------------------------------------------------------------------
# GPU: opcheck, torch.compile against eager, training against SDPA.

def _fwd_args(q, k, v, *, cu_q=None, cu_k=None, msq=0, msk=0, causal=False, probs=False):
    """attention_fwd's positional arguments; deterministic=True: see test_opcheck."""
    return (q, k, v, None, cu_q, cu_k, None, None, None, msq, msk, None, causal, -1, -1, 0.0, probs, True, -1)


@gpu
def test_opcheck():
    # opcheck runs each op eagerly and through AOTAutograd (dynamic shapes too) and compares the
    # results, the gradients included. dQ by fp32 atomics (backward rungs 2 and 3) may differ in its
    # last bits from run to run, so the backward runs deterministic (rung 1): the comparison is exact.
    b, sq, sk, h, hkv, d = 2, 77, 100, 4, 2, 64
    q = _randn((b, sq, h, d), "bfloat16", 1).requires_grad_(True)
    k, v = (_randn((b, sk, hkv, d), "bfloat16", s).requires_grad_(True) for s in (2, 3))
    fwd, bwd = _ops().attention_fwd.default, _ops().attention_bwd.default
    torch.library.opcheck(fwd, _fwd_args(q, k, v, causal=True))
    lens_q, lens_k = [17, 60], [40, 60]
    tq = _randn((sum(lens_q), h, d), "bfloat16", 4).requires_grad_(True)
    tk, tv = (_randn((sum(lens_k), hkv, d), "bfloat16", s).requires_grad_(True) for s in (5, 6))
    torch.library.opcheck(fwd, _fwd_args(tq, tk, tv, cu_q=_cu(lens_q), cu_k=_cu(lens_k), msq=60, msk=60, causal=True,
                                         probs=True))
    with torch.no_grad():
        out, lse, _ = fwd(*_fwd_args(q, k, v, causal=True))
    dout = _randn((b, sq, h, d), "bfloat16", 7)
    torch.library.opcheck(bwd, (q.detach(), k.detach(), v.detach(), out, dout, lse, None, None, None, 0, 0, None,
                                True, -1, -1, 0.0, True, -1))


@gpu
def test_lse_only_where_needed():
    # The op skips the LSE's stores with need_lse=False (what flash_attn_func asks for when no input
    # requires grad and there is no return_attn_probs): out must not change by a bit, with or
    # without a mask (a ragged shape: the masked kernel; 1k keys without causal: the no-mask one).
    fwd = _ops().attention_fwd.default
    for sq, sk in ((300, 333), (1024, 1024)):
        b, h, hkv, d = 2, 4, 2, 64
        q = _randn((b, sq, h, d), "bfloat16", 11)
        k, v = (_randn((b, sk, hkv, d), "bfloat16", s) for s in (12, 13))
        for causal in (False, True):
            out_lse, _, _ = fwd(*_fwd_args(q, k, v, causal=causal), 0.0, None, True)
            out_none, _, _ = fwd(*_fwd_args(q, k, v, causal=causal), 0.0, None, False)
            assert torch.equal(out_lse, out_none)
            assert torch.equal(flashlab.flash_attn_func(q, k, v, causal=causal), out_lse)


def _loss_fn(attend):
    """attention -> a projection -> a sum of squares: (attention output, loss) of (q, k, v, w)."""
    def fn(q, k, v, w):
        o = attend(q, k, v)
        return o, (o.flatten(-2) @ w).float().square().sum()
    return fn


def _run(fn, inputs):
    """fn's attention output and the gradients of its loss with respect to fresh leaf copies of
    q, k, v (inputs: q, k, v, w)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    o, loss = fn(*leaves)
    return o.detach(), torch.autograd.grad(loss, leaves[:3])


def _check_compiled(flash, reference, inputs, dtype, what):
    """Eager and compiled flashlab (fullgraph: a graph break raises) against the float64 reference."""
    ref = _run(_loss_fn(reference), [x.double() for x in inputs])
    naive = _run(_loss_fn(reference), inputs)
    eager = _run(_loss_fn(flash), inputs)
    compiled = _run(torch.compile(_loss_fn(flash), fullgraph=True), inputs)
    for name, got in (("eager", eager), ("compiled", compiled)):
        check_close(got[0], _np(ref[0]), _np(naive[0]), dtype, f"{what} {name}: out")
        for g, r, n, grad in zip(got[1], ref[1], naive[1], ("dq", "dk", "dv")):
            assert g.dtype == getattr(torch, dtype)
            check_close(g, _np(r), _np(n), dtype, f"{what} {name}: {grad}")
    # The same kernel on the same inputs: the compiled forward is bit for bit the eager one.
    assert torch.equal(compiled[0], eager[0]), f"{what}: compiled out != eager out"


@gpu
def test_compile_fixed_causal_gqa():
    torch._dynamo.reset()
    b, s, h, hkv, d, dtype = 2, 256, 8, 2, 64, "bfloat16"
    inputs = [_randn((b, s, h, d), dtype, 1), _randn((b, s, hkv, d), dtype, 2), _randn((b, s, hkv, d), dtype, 3),
              _randn((h * d, 64), dtype, 4, amp=0.05)]
    o = _opts(True, (-1, -1), 0.0, None, d)
    _check_compiled(lambda q, k, v: flashlab.flash_attn_func(q, k, v, causal=True),
                    lambda q, k, v: _attend(q, k, v, None, **o)[0], inputs, dtype, "fixed causal GQA")


@gpu
def test_compile_varlen():
    # Two sets of lengths: the second call recompiles, with dynamo's automatic dynamic shapes
    # (symbolic sizes and max_seqlen through the fake kernel).
    torch._dynamo.reset()
    h, hkv, d, dtype = 4, 2, 128, "float16"
    o = _opts(True, (-1, -1), 0.0, None, d)
    for seed, lens_q, lens_k in ((1, [100, 37, 1], [130, 37, 64]), (2, [64, 200], [64, 256])):
        cu_q, cu_k, msq, msk = _cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k)
        bq, bk = [int(x) for x in cu_q], [int(x) for x in cu_k]

        def reference(q, k, v):
            return torch.cat([_attend(q[None, bq[i]:bq[i + 1]], k[None, bk[i]:bk[i + 1]], v[None, bk[i]:bk[i + 1]],
                                      None, **o)[0][0] for i in range(len(lens_q))])

        inputs = [_randn((sum(lens_q), h, d), dtype, seed), _randn((sum(lens_k), hkv, d), dtype, seed + 1),
                  _randn((sum(lens_k), hkv, d), dtype, seed + 2), _randn((h * d, 64), dtype, seed + 3, amp=0.05)]
        _check_compiled(lambda q, k, v: flashlab.flash_attn_varlen_func(q, k, v, cu_q, cu_k, msq, msk, causal=True),
                        reference, inputs, dtype, f"varlen causal GQA q {lens_q} k {lens_k}")


class _Layer(torch.nn.Module if torch is not None else object):
    """A pre-norm transformer layer (attention + 4x GELU MLP) and an output head: d_model 256, 4
    heads of 64, causal attention by flashlab or torch SDPA."""

    D, H, HD = 256, 4, 64

    def __init__(self):
        super().__init__()
        d = self.D
        self.use_flashlab = True
        self.ln1, self.ln2, self.ln_out = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2, self.head = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.H, self.HD).unbind(2)  # (b, s, h, hd) views
        if self.use_flashlab:
            o = flashlab.flash_attn_func(q, k, v, causal=True)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), is_causal=True).transpose(1, 2)
        x = x + self.proj(o.reshape(b, s, d))
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(self.ln_out(x))


@gpu
def test_training_matches_sdpa():
    # Regression onto a causal target (the running mean of the inputs, mixed by a fixed matrix, plus
    # a skip term): only attention can mix positions. fp32 weights, bf16 autocast (q, k, v bf16),
    # Adam, the same data every step, two copies with the same initial weights.
    steps, batch, seqlen, d = 50, 8, 256, _Layer.D
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, seqlen, d, device="cuda", generator=g)
    mix = torch.randn(d, d, device="cuda", generator=g) / d ** 0.5
    running_mean = x.cumsum(1) / torch.arange(1, seqlen + 1, device="cuda")[None, :, None]
    target = 4 * running_mean @ mix + 0.5 * x
    torch.manual_seed(0)
    initial = _Layer().cuda()
    curves = []
    for use_flashlab in (True, False):
        model = copy.deepcopy(initial)
        model.use_flashlab = use_flashlab
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pred = model(x)
            loss = torch.nn.functional.mse_loss(pred.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses, dtype=torch.float64))
    flash, sdpa = curves
    assert torch.isfinite(flash).all() and torch.isfinite(sdpa).all()
    # Not vacuous: the loss falls to well under half (to about a quarter, 0.97 -> 0.25, with a
    # float32 CPU stand-in for the kernels).
    assert flash[-1] < 0.5 * flash[0] and sdpa[-1] < 0.5 * sdpa[0], (flash.tolist(), sdpa.tolist())
    # The bound. The two runs differ only in the attention kernels, whose outputs and gradients
    # differ element by element by about one bf16 rounding (2^-8 relative) with uncorrelated signs.
    # Step 0: the loss averages B*S*D = 524288 squared errors, so the difference is ~2^-8 / sqrt(N),
    # below 1e-5 relative. Later steps: Adam normalises each parameter's step by its gradient's
    # running RMS, so ~2^-8 relative gradient noise moves each weight by ~lr * 2^-8 per step with
    # random sign; over 50 steps that is a random walk of ~sqrt(50) * 1e-3 * 2^-8 ~ 3e-5 against
    # weights of ~1/sqrt(3 D) ~ 0.04 (nn.Linear's init), i.e. ~1e-3 relative at most, and the loss,
    # a smooth average, moves less. So we expect 1e-5..1e-3 (the CPU stand-in against CPU SDPA:
    # 9e-5) and allow 1e-2 at every step, 10x over the pessimistic end. What it catches: Adam
    # ignores a gradient's scale, so a wrongly scaled dq / dk / dv passes here (test_attention_bwd
    # checks gradient values); a missing gradient (dq = 0 moves the stand-in's curve by 2.6% by
    # step 50) or a wrong mask (non-causal: 23%) does not.
    rel = ((flash - sdpa).abs() / sdpa).max().item()
    assert rel <= 1e-2, f"loss curves differ by {rel:.2e} relative: {flash.tolist()} vs {sdpa.tolist()}"
