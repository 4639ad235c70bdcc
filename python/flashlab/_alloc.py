"""Output allocation in the caller's framework, so ``out=None`` works for any DLPack producer.

torch tensors get ``torch.empty`` on the same device; numpy arrays ``numpy.empty``; other arrays
that speak the array API standard (CuPy, JAX, ...) ``xp.empty`` on their device. torch is never
imported here: a torch tensor can only exist once the caller has imported torch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def empty(like: Any, shape: tuple[int, ...], dtype: str | None = None) -> Any:
    """A new uninitialised tensor of ``shape`` on ``like``'s device, in ``like``'s framework.

    ``dtype`` is a name such as ``"float32"``; None means ``like``'s dtype.
    """
    torch_tensor = _torch_tensor_type()
    if torch_tensor is not None and isinstance(like, torch_tensor):
        torch = sys.modules["torch"]
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype if dtype is None else dtype)
    if hasattr(like, "__array_namespace__"):
        xp = like.__array_namespace__()
        dt = like.dtype if dtype is None else getattr(xp, dtype)
        return xp.empty(shape, dtype=dt, device=like.device)
    raise TypeError(
        f"flashlab: cannot allocate an output like a {type(like).__module__}.{type(like).__name__}; "
        "pass out= explicitly")
