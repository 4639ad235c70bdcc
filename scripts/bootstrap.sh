#!/usr/bin/env bash
# Installs what is missing, idempotently; with .deps/ and .venv/ already filled it needs no network.
#   - Debian packages: cmake, ninja, GoogleTest (only when missing; needs root and apt)
#   - .venv/: the project's Python packages (pinned in requirements-dev.txt)
#   - .deps/cutlass/include: CUTLASS/CuTe headers from the pinned nvidia-cutlass wheel
#   - .deps/googletest: GoogleTest sources, for machines without the Debian package (the GPU machine)
#   - .deps/wheels: wheels the GPU machine installs offline (cp312: apache-tvm-ffi; CUTLASS)
# Environment: FLASHLAB_SKIP_GPU_WHEELS=1 skips the GPU machine's wheels.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '[bootstrap] %s\n' "$*"; }

CUTLASS_VERSION=4.2.0.0
TVM_FFI_VERSION=0.1.15.post2

# ---- CUDA toolkit: part of the machine image, not installable from the registries here.
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  else
    echo "[bootstrap] error: CUDA toolkit (nvcc, CUDA 13) not found; flashlab needs it to build (no GPU needed)." >&2
    exit 1
  fi
fi

# ---- Debian packages, only what is missing.
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
[ -f /usr/src/googletest/CMakeLists.txt ] || [ -f .deps/googletest/CMakeLists.txt ] || missing+=(googletest)
{ [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/aarch64-linux-gnu/libgtest.a ] || \
  [ -f .deps/googletest/CMakeLists.txt ]; } || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "[bootstrap] error: missing ${missing[*]} and cannot apt-get install (not root or no apt)" >&2
    exit 1
  fi
fi
mkdir -p .deps
if [ ! -f .deps/googletest/CMakeLists.txt ] && [ -f /usr/src/googletest/CMakeLists.txt ]; then
  say "copying GoogleTest sources to .deps/googletest"
  cp -r /usr/src/googletest .deps/googletest
fi

# ---- Python venv with the pinned packages; reinstalled only when the pins change.
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$py" -m venv .venv
fi
stamp=.venv/.flashlab-requirements
if ! cmp -s requirements-dev.txt "$stamp"; then
  say "installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  cp requirements-dev.txt "$stamp"
fi

# ---- CUTLASS headers (pinned wheel; headers only, never committed).
mkdir -p .deps/wheels
cutlass_whl=$(ls .deps/wheels/nvidia_cutlass-${CUTLASS_VERSION}-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$cutlass_whl" ]; then
  say "downloading nvidia-cutlass==${CUTLASS_VERSION}"
  .venv/bin/python -m pip download -q --no-deps "nvidia-cutlass==${CUTLASS_VERSION}" -d .deps/wheels
  cutlass_whl=$(ls .deps/wheels/nvidia_cutlass-${CUTLASS_VERSION}-*.whl | head -n1)
fi
if [ ! -f .deps/cutlass/include/cute/tensor.hpp ]; then
  say "unpacking CUTLASS headers to .deps/cutlass/include"
  bash scripts/unpack_cutlass.sh "$cutlass_whl" .deps/cutlass
fi

# ---- Wheels for the GPU machine (python 3.12, x86-64, no registry there).
if [ "${FLASHLAB_SKIP_GPU_WHEELS:-0}" != 1 ] && ! ls .deps/wheels/apache_tvm_ffi-${TVM_FFI_VERSION}-cp312-*.whl >/dev/null 2>&1; then
  say "downloading apache-tvm-ffi==${TVM_FFI_VERSION} for cp312 (GPU machine)"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .deps/wheels "apache-tvm-ffi==${TVM_FFI_VERSION}"
fi
say "ready"
