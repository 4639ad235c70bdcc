#!/usr/bin/env bash
# The one test command: bootstrap, build, every test. CPU tests always; GPU tests when a GPU is
# present (without one they report skipped). Exits non-zero if anything fails.
#   scripts/test.sh            (uses the `cpu` preset, or `gpu` when nvidia-smi sees a GPU)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh
export PATH=/usr/local/cuda/bin:$PATH

preset=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then preset=gpu; fi
jobs=${MAX_JOBS:-$(nproc)}
echo "[test] configure + build (preset $preset, $jobs jobs)"
cmake --preset "$preset" -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
cmake --build --preset "$preset" -j "$jobs"

echo "[test] C++ tests"
if [ "$preset" = cpu ]; then
  echo "[test] no GPU on this machine: GPU tests will report skipped"
fi
ctest --test-dir "build/$preset" --output-on-failure -j "$jobs"

echo "[test] Python tests"
PYTHONPATH="$root/python" FLASHLAB_LIB_DIR="$root/build/$preset/bindings" \
  .venv/bin/python -m pytest tests/python -q
