"""Finds and loads the TVM-FFI module ``flashlab_ffi.so`` (built from bindings/).

Search order, first hit wins:
  1. ``$FLASHLAB_LIB_DIR`` when set (and nothing else: a wrong setting is an error, not a fallback);
  2. this package's own directory (``pip install .`` puts the module and libflashlab.so there);
  3. ``<repo>/build/*/bindings`` (the CMake presets build into build/cpu and build/gpu), newest
     build first.
"""

from __future__ import annotations

import os
from pathlib import Path

import tvm_ffi

LIB_NAME = "flashlab_ffi.so"
_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_DIR = _PACKAGE_DIR.parents[1]  # python/flashlab -> repo root, in a source checkout


def candidates() -> list[Path]:
    """Paths where the module is looked for, in order."""
    env = os.environ.get("FLASHLAB_LIB_DIR")
    if env:
        return [Path(env) / LIB_NAME]
    builds = sorted(_REPO_DIR.glob(f"build/*/bindings/{LIB_NAME}"),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    return [_PACKAGE_DIR / LIB_NAME, *builds]


def find_library() -> Path:
    """The module file that :func:`load` loads."""
    tried = candidates()
    for path in tried:
        if path.is_file():
            return path
    where = ", ".join(str(p) for p in tried) or f"{_REPO_DIR}/build/*/bindings/{LIB_NAME}"
    raise ImportError(
        f"flashlab: cannot find {LIB_NAME} (looked at: {where}). Build it with "
        "`cmake --preset cpu && cmake --build --preset cpu`, install the package with "
        "`pip install .`, or point FLASHLAB_LIB_DIR at the directory that holds it.")


def load() -> tuple[tvm_ffi.Module, Path]:
    path = find_library()
    return tvm_ffi.load_module(str(path)), path
