#!/usr/bin/env bash
# Benchmarks: bootstrap, build, C++ harness (peaks + every rung), torch peers in the same run,
# results JSON under bench/results/, README table and roofline plot regenerated.
#   scripts/bench.sh [--filter SUBSTR] [--quick]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[bench] no NVIDIA GPU on this machine: benchmarks need one (see scripts/device.sh for a lent GPU)." >&2
  exit 1
fi
bash scripts/bootstrap.sh
export PATH=/usr/local/cuda/bin:$PATH
cmake --preset gpu -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
cmake --build --preset gpu -j "${MAX_JOBS:-$(nproc)}"
export FLASHLAB_COMMIT=${FLASHLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
./build/gpu/bench/flashlab_bench --out build/gpu/bench.json "$@"
py=${BENCH_PYTHON:-python3}  # the interpreter that has torch
"$py" bench/peers.py --in build/gpu/bench.json --out-dir bench/results
"$py" bench/report.py --readme README.md --plots docs/plots --docs docs/ladder
