"""The flashlab Python package over TVM-FFI.

CPU part (runs anywhere): every validation message comes from C++ through the bindings, as a
ValueError naming the op, the argument, what was expected and what was given. Besides numpy
arrays (CPU tensors, rejected by the device check first), it uses tensors that *claim* to be on a
CUDA device while pointing at host memory (`fake`): the C++ API validates before it touches
memory or CUDA, so each such call fails on the check under test and nothing runs. Every fake call
here is built to fail validation.

GPU part (torch + CUDA): every rung on fresh random inputs against a float64 reference, outputs
poisoned with NaN first; the tolerance is 2x the error of the naive computation in the output's
dtype plus a rounding floor (docs: DESIGN.md, Tests), and NaN never passes.
"""

from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest
import tvm_ffi

import flashlab
from numerics import UNIT_ROUNDOFF

try:
    import torch
except ImportError:  # the CPU machine has no torch
    torch = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAVE_CUDA, reason="needs torch with a CUDA device (torch missing or no GPU)")


def raises(message: str):
    """pytest.raises(ValueError) for exactly the C++ message."""
    return pytest.raises(ValueError, match="^" + re.escape(message) + "$")


# ---------------------------------------------------------------------------------------------
# Fake CUDA tensors: a DLPack capsule whose DLTensor says "CUDA" (or any device) over host memory.

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # null: nothing to free


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"

# DLPack (type code, bits) of each dtype name.
_DLPACK_DTYPE = {
    "float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "float64": (2, 64),
    "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8), "int8": (0, 8), "uint8": (1, 8),
    "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "bool": (6, 8),
}
kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM = 1, 2, 3, 10

# Everything a fake tensor points at stays alive for the whole session (the TVM-FFI tensor
# reads the DLManagedTensor when it is freed).
_KEEP: list = []
_HOST = np.zeros(1 << 16, dtype=np.uint8)
_HOST_BASE = (_HOST.ctypes.data + 255) // 256 * 256  # 256-byte aligned host address


def fake(shape, dtype="float32", device=(kDLCUDA, 0), strides=None, byte_offset=0, offset_bytes=0, null=False):
    """A tvm_ffi.Tensor claiming to live on `device` (default cuda:0); data is host memory at
    `_HOST_BASE + offset_bytes` (a distinct base per tensor is not needed: calls fail first),
    or a null pointer when `null`."""
    code, bits = _DLPACK_DTYPE[dtype]
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides) if strides is not None else None
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(
        ctypes.c_void_p(None if null else _HOST_BASE + offset_bytes), _DLDevice(*device), ndim, _DLDataType(code, bits, 1),
        ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)),
        ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr is not None else None,
        byte_offset)
    _KEEP.extend([shape_arr, strides_arr, managed])
    return tvm_ffi.from_dlpack(_PyCapsule_New(ctypes.addressof(managed), _CAPSULE_NAME, None))


# ---------------------------------------------------------------------------------------------
# CPU-runnable: loading, numpy inputs, rungs, dtypes, shapes, devices, strides, alignment.

def test_module_loads():
    assert flashlab.library_path().endswith("flashlab_ffi.so")
    assert (flashlab.VECTOR_ADD_RUNGS, flashlab.SUM_RUNGS) == (3, 6)


def test_numpy_inputs_hit_the_cpp_device_check():
    a = np.ones(16, np.float32)
    with raises("vector_add: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(a, a)
    with raises("vector_add: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(a, a, out=np.empty_like(a), rung=1)
    with raises("sum: argument 'x': expected a CUDA tensor, got cpu tensor"):
        flashlab.sum(a)
    with raises("row_sum: argument 'x': expected a CUDA tensor, got cpu tensor"):
        flashlab.row_sum(a.reshape(4, 4))


def test_cpu_argument_after_a_cuda_one_is_named():
    a = fake([16])
    with raises("vector_add: argument 'b': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(a, np.ones(16, np.float32), out=fake([16]))
    with raises("vector_add: argument 'out': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(a, a, out=np.empty(16, np.float32))
    with raises("sum: argument 'out': expected a CUDA tensor, got cpu tensor"):
        flashlab.sum(a, out=np.empty(1, np.float32))


@pytest.mark.parametrize("rung", [0, -1, 4, 2**40])
def test_vector_add_bad_rung(rung):
    a = np.ones(16, np.float32)  # the rung is checked before anything else
    with raises(f"vector_add: argument 'rung': expected 1..{flashlab.VECTOR_ADD_RUNGS}, got {rung}"):
        flashlab.vector_add(a, a, rung=rung)


@pytest.mark.parametrize("rung", [0, 7, -(2**40)])
def test_sum_bad_rung(rung):
    with raises(f"sum: argument 'rung': expected 1..{flashlab.SUM_RUNGS}, got {rung}"):
        flashlab.sum(np.ones(16, np.float32), rung=rung)


def test_unsupported_dlpack_dtype_names_the_argument():
    known = "fp32, fp16, bf16, e4m3, e5m2, int8, uint8, int32, int64"
    with raises(f"vector_add: argument 'a': expected a dtype flashlab knows ({known}), got float64"):
        flashlab.vector_add(np.ones(4), np.ones(4))
    with raises(f"vector_add: argument 'b': expected a dtype flashlab knows ({known}), got int16"):
        flashlab.vector_add(fake([4]), fake([4], "int16"), out=fake([4]))
    with raises(f"row_sum: argument 'out': expected a dtype flashlab knows ({known}), got bool"):
        flashlab.row_sum(fake([2, 2]), out=fake([2], "bool"))


@pytest.mark.parametrize("dtype,name", [
    ("float16", "fp16"), ("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"), ("int8", "int8"),
    ("uint8", "uint8"), ("int32", "int32"), ("int64", "int64")])
def test_dlpack_dtype_mapping(dtype, name):
    # Each DLPack dtype reaches C++ as the flashlab dtype that the message names.
    with raises(f"vector_add: argument 'a': expected dtype fp32 or bf16, got {name}"):
        flashlab.vector_add(fake([8], dtype), fake([8], dtype), out=fake([8], dtype))
    with raises(f"sum: argument 'x': expected dtype fp32 or bf16, got {name}"):
        flashlab.sum(fake([8], dtype), out=fake([1]))


def test_dtype_mismatch():
    with raises("vector_add: argument 'b': expected dtype fp32 (same as 'a'), got bf16"):
        flashlab.vector_add(fake([8]), fake([8], "bfloat16"), out=fake([8]))
    with raises("vector_add: argument 'out': expected dtype bf16 (same as 'a'), got fp32"):
        flashlab.vector_add(fake([8], "bfloat16"), fake([8], "bfloat16"), out=fake([8]))
    with raises("sum: argument 'out': expected dtype fp32, got bf16"):
        flashlab.sum(fake([8]), out=fake([1], "bfloat16"))
    with raises("row_sum: argument 'out': expected dtype fp32, got fp16"):
        flashlab.row_sum(fake([2, 4]), out=fake([2], "float16"))


def test_mismatched_shapes():
    with raises("vector_add: argument 'b': expected shape [1024] (same as 'a'), got [1000]"):
        flashlab.vector_add(fake([1024]), fake([1000]), out=fake([1024]))
    with raises("vector_add: argument 'out': expected shape [4, 8] (same as 'a'), got [32]"):
        flashlab.vector_add(fake([4, 8]), fake([4, 8]), out=fake([32]))
    with raises("sum: argument 'out': expected shape [1], got [2]"):
        flashlab.sum(fake([8]), out=fake([2]))
    with raises("row_sum: argument 'out': expected shape [4], got [5]"):
        flashlab.row_sum(fake([4, 8]), out=fake([5]))
    with raises("row_sum: argument 'x': expected 2 dims, got 1 dims, shape [8]"):
        flashlab.row_sum(fake([8]), out=fake([8]))


def test_length_zero():
    with raises("vector_add: argument 'a': expected at least one element, got shape [0]"):
        flashlab.vector_add(fake([0]), fake([0]), out=fake([0]))
    with raises("sum: argument 'x': expected at least one element, got shape [3, 0]"):
        flashlab.sum(fake([3, 0]), out=fake([1]))
    with raises("row_sum: argument 'x': expected at least one element, got shape [0, 5]"):
        flashlab.row_sum(fake([0, 5]), out=fake([0]))


def test_null_pointer():
    with raises("vector_add: argument 'a': expected a non-null data pointer, got null"):
        flashlab.vector_add(fake([16], null=True), fake([16]), out=fake([16]))
    with raises("sum: argument 'out': expected a non-null data pointer, got null"):
        flashlab.sum(fake([16]), out=fake([1], null=True))


def test_devices():
    with raises("vector_add: argument 'b': expected a tensor on cuda:0 (same as 'a'), got cuda:1"):
        flashlab.vector_add(fake([8]), fake([8], device=(kDLCUDA, 1)), out=fake([8]))
    with raises("sum: argument 'out': expected a tensor on cuda:2 (same as 'x'), got cuda:0"):
        flashlab.sum(fake([8], device=(kDLCUDA, 2)), out=fake([1]))
    with raises("vector_add: argument 'a': expected a CUDA tensor, got cuda_host (pinned cpu) tensor"):
        flashlab.vector_add(fake([8], device=(kDLCUDAHost, 0)), fake([8]), out=fake([8]))
    with raises("row_sum: argument 'x': expected a cpu, cuda or cuda_host tensor, got DLPack device type 10 (id 0)"):
        flashlab.row_sum(fake([2, 2], device=(kDLROCM, 0)), out=fake([2]))


def test_strides_reach_cpp_in_elements():
    with raises("vector_add: argument 'a': expected a contiguous tensor, got strides [2] for shape [8]"):
        flashlab.vector_add(fake([8], strides=[2]), fake([8]), out=fake([8]))
    with raises("sum: argument 'x': expected a contiguous tensor, got strides [1, 4] for shape [4, 4]"):
        flashlab.sum(fake([4, 4], strides=[1, 4]), out=fake([1]))
    with raises("row_sum: argument 'x': expected unit stride in the last dim, got strides [1, 4]"):
        flashlab.row_sum(fake([4, 4], strides=[1, 4]), out=fake([4]))
    with raises("row_sum: argument 'x': expected >= cols row stride (rows must not overlap), "
                "got row stride 3 for cols 4"):
        flashlab.row_sum(fake([4, 4], strides=[3, 1]), out=fake([4]))


def test_byte_offset_is_added_to_the_pointer():
    addr = _HOST_BASE + 2
    with raises(f"vector_add: argument 'a': expected a data pointer aligned to 4 bytes, got address {addr:#x} (offset 2)"):
        flashlab.vector_add(fake([8], byte_offset=2), fake([8]), out=fake([8]))
    addr = _HOST_BASE + 64 + 8
    with raises(f"vector_add: argument 'b': expected a data pointer aligned to 16 bytes, got address {addr:#x} (offset 8)"):
        flashlab.vector_add(fake([8]), fake([8], offset_bytes=64, byte_offset=8), out=fake([8], offset_bytes=128), rung=2)


def test_rung_2_needs_whole_vectors():
    with raises("vector_add: argument 'a': expected numel a multiple of 4 for rung 2 "
                "(whole 16-byte vectors; rung 3 takes any length), got 1001"):
        flashlab.vector_add(fake([1001]), fake([1001], offset_bytes=8192), out=fake([1001], offset_bytes=16384),
                            rung=2)
    with raises("vector_add: argument 'a': expected numel a multiple of 8 for rung 2 "
                "(whole 16-byte vectors; rung 3 takes any length), got 12"):
        flashlab.vector_add(fake([12], "bfloat16"), fake([12], "bfloat16", offset_bytes=64),
                            fake([12], "bfloat16", offset_bytes=128), rung=2)


def test_partial_overlap():
    with raises("vector_add: argument 'out': expected memory disjoint from 'a' or identical to it, got a partial overlap"):
        flashlab.vector_add(fake([8]), fake([8], offset_bytes=64), out=fake([8], offset_bytes=4))


def test_out_allocation_needs_a_known_framework():
    with pytest.raises(TypeError, match="pass out= explicitly"):
        flashlab.vector_add(fake([8]), fake([8]))


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_cpu_tensor_hits_the_cpp_device_check():
    x = torch.ones(8, 8)
    with raises("vector_add: argument 'a': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(x, x)
    with raises("row_sum: argument 'x': expected a CUDA tensor, got cpu tensor"):
        flashlab.row_sum(x)


# ---------------------------------------------------------------------------------------------
# CPU-runnable: the gated activations (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul).

ACT_OPS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")


def test_activation_rungs_constant():
    assert flashlab.ACTIVATION_RUNGS == 2


@pytest.mark.parametrize("op", ACT_OPS)
def test_activation_numpy_input_hits_the_cpp_device_check(op):
    x = np.ones((4, 16), np.float32)
    with raises(f"{op}: argument 'input': expected a CUDA tensor, got cpu tensor"):
        getattr(flashlab, op)(x)  # out allocated by numpy, shape (4, 8)
    with raises(f"{op}: argument 'out': expected a CUDA tensor, got cpu tensor"):
        getattr(flashlab, op)(fake([4, 16]), out=np.empty((4, 8), np.float32))


@pytest.mark.parametrize("op", ACT_OPS)
@pytest.mark.parametrize("rung", [0, 3, 2**40])
def test_activation_bad_rung(op, rung):
    with raises(f"{op}: argument 'rung': expected 1..2, got {rung}"):
        getattr(flashlab, op)(np.ones((2, 4), np.float32), rung=rung)


@pytest.mark.parametrize("op", ACT_OPS)
def test_activation_shapes(op):
    fn = getattr(flashlab, op)
    with raises(f"{op}: argument 'input': expected an even last dim ([..., 2d]: gate then up), got shape [4, 7]"):
        fn(fake([4, 7], "bfloat16"), out=fake([4, 3], "bfloat16"))
    with raises(f"{op}: argument 'out': expected shape [4, 8] ('input' with the last dim halved), got [4, 16]"):
        fn(fake([4, 16]), out=fake([4, 16], offset_bytes=4096))
    with raises(f"{op}: argument 'out': expected shape [2, 3, 8] ('input' with the last dim halved), got [6, 8]"):
        fn(fake([2, 3, 16]), out=fake([6, 8], offset_bytes=4096))
    with raises(f"{op}: argument 'input': expected at least one element, got shape [0, 16]"):
        fn(fake([0, 16]), out=fake([0, 8]))
    with raises(f"{op}: argument 'input': expected at least 1 dim ([..., 2d]), got a 0-dim tensor"):
        fn(fake([]), out=fake([]))


@pytest.mark.parametrize("op", ACT_OPS)
def test_activation_dtypes_and_devices(op):
    fn = getattr(flashlab, op)
    with raises(f"{op}: argument 'input': expected dtype fp32 or fp16 or bf16, got int32"):
        fn(fake([4, 16], "int32"), out=fake([4, 8], "int32"))
    with raises(f"{op}: argument 'out': expected dtype fp16 (same as 'input'), got bf16"):
        fn(fake([4, 16], "float16"), out=fake([4, 8], "bfloat16"))
    with raises(f"{op}: argument 'out': expected a tensor on cuda:0 (same as 'input'), got cuda:1"):
        fn(fake([4, 16]), out=fake([4, 8], device=(kDLCUDA, 1)))
    with raises(f"{op}: argument 'input': expected a non-null data pointer, got null"):
        fn(fake([4, 16], null=True), out=fake([4, 8]))


@pytest.mark.parametrize("op", ACT_OPS)
def test_activation_strides_alignment_overlap(op):
    fn = getattr(flashlab, op)
    with raises(f"{op}: argument 'input': expected unit stride in the last dim, got strides [32, 2]"):
        fn(fake([4, 16], strides=[32, 2]), out=fake([4, 8], offset_bytes=4096))
    with raises(f"{op}: argument 'input': expected >= 2d row stride (rows must not overlap), "
                "got row stride 8 for last dim 16"):
        fn(fake([4, 16], strides=[8, 1]), out=fake([4, 8], offset_bytes=4096))
    with raises(f"{op}: argument 'input': expected leading dims that flatten to one row stride, "
                "got strides [100, 32, 1] for shape [2, 3, 16]"):
        fn(fake([2, 3, 16], strides=[100, 32, 1]), out=fake([2, 3, 8], offset_bytes=4096))
    with raises(f"{op}: argument 'out': expected a contiguous tensor, got strides [16, 1] for shape [4, 8]"):
        fn(fake([4, 16]), out=fake([4, 8], strides=[16, 1], offset_bytes=4096))
    addr = _HOST_BASE + 1
    with raises(f"{op}: argument 'input': expected a data pointer aligned to 2 bytes, got address {addr:#x} (offset 1)"):
        fn(fake([4, 16], "bfloat16", byte_offset=1), out=fake([4, 8], "bfloat16", offset_bytes=4096))
    with raises(f"{op}: argument 'out': expected memory disjoint from 'input' (no in-place form: out is half as "
                "wide), got the same data pointer"):
        fn(fake([4, 16]), out=fake([4, 8]))
    with raises(f"{op}: argument 'out': expected memory disjoint from 'input' or identical to it, got a partial overlap"):
        fn(fake([4, 16]), out=fake([4, 8], offset_bytes=64))


def test_activation_out_allocation_needs_a_known_framework():
    with pytest.raises(TypeError, match="pass out= explicitly"):
        flashlab.silu_and_mul(fake([4, 16]))


# ---------------------------------------------------------------------------------------------
# GPU: numerics of every rung, strides, out=, stream, errors.

_EPS32 = float(np.finfo(np.float32).eps)
_U32 = _EPS32 / 2  # unit roundoff of fp32, 2^-24


def _assert_within(out, ref64: np.ndarray, naive_err: float, floor: float, what: str):
    got = out.detach().double().cpu().numpy()
    assert not np.isnan(got).any(), f"{what}: NaN in the output"
    err = float(np.abs(got - ref64).max())
    bound = 2 * naive_err + floor
    assert err <= bound, f"{what}: error {err:.3e} > 2 x naive {naive_err:.3e} + floor {floor:.3e}"


def _sum_floor(x32: np.ndarray) -> float:
    # 4 unit roundoffs of sum|x| (cancellation makes |sum| a poor scale), as tests/gpu does.
    return 4 * _U32 * float(np.abs(x32.astype(np.float64)).sum())


def _gen(seed: int):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


VECTOR_SIZES = [1, 7, 111, 500, 1024, 4097, (1 << 20) + 3]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.VECTOR_ADD_RUNGS + 1))
@pytest.mark.parametrize("n", VECTOR_SIZES)
def test_vector_add(dtype, rung, n):
    dt = getattr(torch, dtype)
    vec = 16 // torch.empty(0, dtype=dt).element_size()
    if rung == 2 and n % vec:
        n += vec - n % vec  # rung 2 takes whole vectors only (its error is tested on the CPU)
    g = _gen(1000 * rung + n)
    a = torch.randn(n, device="cuda", generator=g).to(dt)
    b = torch.randn(n, device="cuda", generator=g).to(dt)
    ref64 = a.double().cpu().numpy() + b.double().cpu().numpy()
    naive_err = float(np.abs((a + b).double().cpu().numpy() - ref64).max())
    floor = _EPS32 * float(np.abs(ref64).max())

    out = torch.full_like(a, float("nan"))
    assert flashlab.vector_add(a, b, out=out, rung=rung) is out
    _assert_within(out, ref64, naive_err, floor, f"vector_add rung {rung} {dtype} n={n} (out given)")

    fresh = flashlab.vector_add(a, b, rung=rung)
    assert fresh.dtype == dt and fresh.shape == a.shape and fresh.device == a.device
    _assert_within(fresh, ref64, naive_err, floor, f"vector_add rung {rung} {dtype} n={n} (out allocated)")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("offset", [1, 3])
def test_vector_add_unaligned_views(dtype, offset):
    # Views that start mid-vector: rung 3's head/tail path (same offset everywhere) and its
    # grid-stride fallback (different offsets).
    dt = getattr(torch, dtype)
    n = 10_000
    g = _gen(offset)
    a = torch.randn(n + 8, device="cuda", generator=g).to(dt)[offset:offset + n]
    b = torch.randn(n + 8, device="cuda", generator=g).to(dt)[offset:offset + n]
    ref64 = a.double().cpu().numpy() + b.double().cpu().numpy()
    naive_err = float(np.abs((a + b).double().cpu().numpy() - ref64).max())
    for out in (torch.full((n + 8,), float("nan"), device="cuda", dtype=dt)[offset:offset + n],
                torch.full((n,), float("nan"), device="cuda", dtype=dt)):
        flashlab.vector_add(a, b, out=out, rung=3)
        _assert_within(out, ref64, naive_err, _EPS32 * float(np.abs(ref64).max()), "vector_add view")
    if offset % (16 // a.element_size()):
        with pytest.raises(ValueError, match=re.escape("vector_add: argument 'a': expected a data pointer aligned to 16 bytes")):
            flashlab.vector_add(a, b, out=torch.empty_like(a), rung=2)


@gpu
def test_vector_add_in_place():
    a = torch.randn(4096, device="cuda")
    b = torch.randn(4096, device="cuda")
    ref64 = a.double().cpu().numpy() + b.double().cpu().numpy()
    assert flashlab.vector_add(a, b, out=a) is a
    _assert_within(a, ref64, 0.0, _EPS32 * float(np.abs(ref64).max()), "vector_add in place")


SUM_SIZES = [1, 2, 31, 256, 257, 1000, 3 * 4096 + 1, 1 << 20, (1 << 22) + 7]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rung", range(2, flashlab.SUM_RUNGS + 1))
@pytest.mark.parametrize("n", SUM_SIZES)
def test_sum(dtype, rung, n):
    dt = getattr(torch, dtype)
    x = torch.randn(n, device="cuda", generator=_gen(7 * n + rung)).to(dt)
    x32 = x.float().cpu().numpy()
    ref64 = np.array([x32.astype(np.float64).sum()])
    naive = np.add.accumulate(x32, dtype=np.float32)[-1]  # one fp32 accumulator, in order
    naive_err = abs(float(naive) - ref64[0])
    floor = _sum_floor(x32)

    out = torch.full((1,), float("nan"), device="cuda")
    assert flashlab.sum(x, out=out, rung=rung) is out
    _assert_within(out, ref64, naive_err, floor, f"sum rung {rung} {dtype} n={n} (out given)")
    fresh = flashlab.sum(x.view(-1, 1) if n % 2 else x, rung=rung)  # any contiguous shape
    assert fresh.dtype == torch.float32 and tuple(fresh.shape) == (1,)
    _assert_within(fresh, ref64, naive_err, floor, f"sum rung {rung} {dtype} n={n} (out allocated)")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", SUM_SIZES)
def test_sum_atomic_rung(dtype, n):
    # Rung 1 adds in whatever order the atomics arrive, so its rounding varies between runs.
    # Small integers: every partial sum is exact in fp32, so any order gives the exact sum.
    # Random data: inside the worst-case bound of fp32 summation in any order, (n - 1) u sum|x|.
    dt = getattr(torch, dtype)
    g = _gen(11 * n)
    ints = torch.randint(-8, 9, (n,), device="cuda", generator=g).to(dt)
    out = torch.full((1,), float("nan"), device="cuda")
    flashlab.sum(ints, out=out, rung=1)
    assert out.item() == float(ints.double().sum().item())
    x = torch.randn(n, device="cuda", generator=g).to(dt)
    x32 = x.float().cpu().numpy()
    got = flashlab.sum(x, rung=1).item()
    assert not math.isnan(got)
    ref = float(x32.astype(np.float64).sum())
    assert abs(got - ref) <= max(n - 1, 0) * _U32 * float(np.abs(x32.astype(np.float64)).sum()) * 1.01


def _row_sum_check(x, out, what):
    x32 = x.float().cpu().numpy()
    ref64 = x32.astype(np.float64).sum(axis=1)
    naive = np.add.accumulate(x32, axis=1, dtype=np.float32)[:, -1]
    naive_err = float(np.abs(naive.astype(np.float64) - ref64).max())
    floor = max(_sum_floor(row) for row in x32)
    _assert_within(out, ref64, naive_err, floor, what)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (3, 2048), (3, 2049), (128, 4099), (1000, 17)])
def test_row_sum(dtype, rows, cols):
    dt = getattr(torch, dtype)
    x = torch.randn(rows, cols, device="cuda", generator=_gen(rows * cols)).to(dt)
    out = torch.full((rows,), float("nan"), device="cuda")
    assert flashlab.row_sum(x, out=out) is out
    _row_sum_check(x, out, f"row_sum {dtype} {rows}x{cols} (out given)")
    fresh = flashlab.row_sum(x)
    assert fresh.dtype == torch.float32 and tuple(fresh.shape) == (rows,)
    _row_sum_check(x, fresh, f"row_sum {dtype} {rows}x{cols} (out allocated)")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_sum_strided(dtype):
    dt = getattr(torch, dtype)
    base = torch.randn(64, 3001, device="cuda", generator=_gen(5)).to(dt)
    for x, what in ((base[:, 1:2990], "column slice, row stride 3001 > cols"),
                    (base[::3, :1000], "every third row"),
                    (base[5:6, 7:], "one row at an odd offset")):
        assert not x.is_contiguous() or x.shape[0] == 1
        out = torch.full((x.shape[0],), float("nan"), device="cuda")
        flashlab.row_sum(x, out=out)
        _row_sum_check(x, out, f"row_sum {dtype} {what}")
    with raises("row_sum: argument 'x': expected unit stride in the last dim, got strides [1, 3001]"):
        flashlab.row_sum(base[:, :64].t())


@gpu
def test_runs_on_torchs_current_stream():
    # On a non-default stream: a long sleep, then the inputs are written, then flashlab runs.
    # Only a kernel enqueued on that same stream sees the new inputs.
    n = 1 << 22
    a = torch.ones(n, device="cuda")
    b = torch.full((n,), 3.0, device="cuda")
    x = torch.ones(64, 1000, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # a few tens of ms of GPU time on s
        a.fill_(2.0)
        x.fill_(2.0)
        out = flashlab.vector_add(a, b)
        total = flashlab.sum(a)
        rows = flashlab.row_sum(x)
    s.synchronize()
    assert torch.equal(out, torch.full_like(out, 5.0))
    assert total.item() == 2.0 * n
    assert torch.equal(rows, torch.full_like(rows, 2000.0))


@gpu
def test_gpu_errors_carry_the_cpp_message():
    a = torch.ones(1024, device="cuda")
    with raises("vector_add: argument 'a': expected dtype fp32 or bf16, got fp16"):
        flashlab.vector_add(a.half(), a.half())
    with raises("vector_add: argument 'b': expected shape [1024] (same as 'a'), got [1000]"):
        flashlab.vector_add(a, a[:1000], out=torch.empty_like(a))
    with raises("vector_add: argument 'b': expected a CUDA tensor, got cpu tensor"):
        flashlab.vector_add(a, a.cpu())
    with raises("vector_add: argument 'a': expected at least one element, got shape [0]"):
        flashlab.vector_add(a[:0], a[:0])
    with raises("vector_add: argument 'rung': expected 1..3, got 4"):
        flashlab.vector_add(a, a, rung=4)
    with raises("sum: argument 'x': expected dtype fp32 or bf16, got e4m3"):
        flashlab.sum(a.to(torch.float8_e4m3fn))
    with raises("sum: argument 'x': expected a contiguous tensor, got strides [2] for shape [512]"):
        flashlab.sum(a[::2])
    with raises("row_sum: argument 'out': expected shape [4], got [5]"):
        flashlab.row_sum(a.view(4, 256), out=torch.empty(5, device="cuda"))


# ---- gated activations

def _act64(op: str, x):
    """act(x[..., :d]) * x[..., d:] in float64 on the CPU (x: a torch tensor of any dtype)."""
    x64 = x.detach().double().cpu()
    d = x64.shape[-1] // 2
    g, u = x64[..., :d], x64[..., d:]
    if op == "silu_and_mul":
        a = g / (1 + torch.exp(-g))
    elif op == "gelu_and_mul":
        a = 0.5 * g * torch.erfc(-g / math.sqrt(2))
    else:
        a = g / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    return (a * u).numpy(), (g * u).abs().max().item()


def _act_naive(op: str, x):
    """The same function in fp32 on the GPU (torch), rounded once to x's dtype."""
    xf = x.float()
    d = xf.shape[-1] // 2
    act = {"silu_and_mul": torch.nn.functional.silu,
           "gelu_and_mul": lambda t: torch.nn.functional.gelu(t, approximate="none"),
           "gelu_tanh_and_mul": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[op]
    return (act(xf[..., :d]) * xf[..., d:]).to(x.dtype)




def _act_check(op: str, x, out, what: str):
    # Rounding floor as tests/gpu/test_activation.cpp: the output's unit roundoff x max|ref| + 2 fp32
    # unit roundoffs x max|gate x up| (CUDA's transcendentals are within 2 ulps).
    ref64, max_gu = _act64(op, x)
    naive_err = float(np.abs(_act_naive(op, x).double().cpu().numpy() - ref64).max())
    floor = UNIT_ROUNDOFF[str(x.dtype).split(".")[-1]] * float(np.abs(ref64).max()) + 2 * _U32 * max_gu
    assert tuple(out.shape) == tuple(ref64.shape) and out.dtype == x.dtype
    _assert_within(out, ref64, naive_err, floor, what)


@gpu
@pytest.mark.parametrize("op", ACT_OPS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rung", range(1, flashlab.ACTIVATION_RUNGS + 1))
@pytest.mark.parametrize("rows,d", [(1, 1), (7, 111), (99, 500), (3, 4097), (16, 8192), (2048, 7)])
def test_activation(op, dtype, rung, rows, d):
    dt = getattr(torch, dtype)
    x = (3 * torch.randn(rows, 2 * d, device="cuda", generator=_gen(rows * d + rung))).to(dt)
    fn = getattr(flashlab, op)
    out = torch.full((rows, d), float("nan"), device="cuda", dtype=dt)
    assert fn(x, out=out, rung=rung) is out
    _act_check(op, x, out, f"{op} rung {rung} {dtype} {rows}x{d} (out given)")
    _act_check(op, x, fn(x, rung=rung), f"{op} rung {rung} {dtype} {rows}x{d} (out allocated)")


@gpu
@pytest.mark.parametrize("op", ACT_OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_activation_views(op, dtype):
    dt = getattr(torch, dtype)
    fn = getattr(flashlab, op)
    vec = 16 // torch.empty(0, dtype=dt).element_size()
    base = (3 * torch.randn(64, 9000, device="cuda", generator=_gen(17))).to(dt)
    for x, what in ((base[:, :8192], "column slice, row stride 9000"),
                    (base[::3, 1:4097], "every third row, odd start"),
                    (base[:60, :2000].view(20, 3, 2000), "3 dims over strided rows"),
                    (base.view(-1)[3:3 + 5 * 8192].view(5, 8192), "contiguous, odd start")):
        shape = (*x.shape[:-1], x.shape[-1] // 2)
        n = math.prod(shape)
        fresh = fn(x)  # out 16-byte aligned
        _act_check(op, x, fresh, f"{op} {dtype} {what}, out allocated")
        off = x.storage_offset() % vec  # out at the input's offset: vector body + scalar head/tail
        out = torch.full((n + vec,), float("nan"), device="cuda", dtype=dt)[off:off + n].view(shape)
        assert fn(x, out=out) is out
        _act_check(op, x, out, f"{op} {dtype} {what}, out at offset {off}")


@gpu
def test_activation_gpu_errors_carry_the_cpp_message():
    x = torch.randn(4, 16, device="cuda")
    with raises("silu_and_mul: argument 'input': expected an even last dim ([..., 2d]: gate then up), got shape [4, 15]"):
        flashlab.silu_and_mul(x[:, :15])
    with raises("gelu_and_mul: argument 'out': expected dtype fp32 (same as 'input'), got bf16"):
        flashlab.gelu_and_mul(x, out=torch.empty(4, 8, device="cuda", dtype=torch.bfloat16))
    with raises("gelu_tanh_and_mul: argument 'out': expected shape [4, 8] ('input' with the last dim halved), got [4, 16]"):
        flashlab.gelu_tanh_and_mul(x, out=torch.empty_like(x))
    with raises("silu_and_mul: argument 'input': expected dtype fp32 or fp16 or bf16, got e4m3"):
        flashlab.silu_and_mul(x.to(torch.float8_e4m3fn))
