#!/usr/bin/env bash
# The one entry on a GPU machine (no registry there): build (Release, sm_90a, all cores), GPU
# tests, benchmarks with peers, all results and logs into OUTDIR.
#   scripts/device.sh [OUTDIR]
# Environment:
#   FLASHLAB_FILTER=vector_add   run one op's tests and benchmarks (a substring of case names)
#   FLASHLAB_QUICK=1             smaller benchmark sizes
#   FLASHLAB_BENCH=0             skip the benchmarks (tests and sanitizer only)
#   FLASHLAB_TESTS=0             skip the C++ and Python tests (build, sanitizer, benchmarks)
#   FLASHLAB_SANITIZE=1          also run the GPU tests under compute-sanitizer (memcheck, racecheck)
#   FLASHLAB_PROFILE=SUBSTR      also run scripts/profile.sh on matching benchmark cases
#   FLASHLAB_COMMIT=<sha>        the commit being measured (the GPU machine has no .git)
#   FLASHLAB_STEP_TIMEOUT=300    seconds each test / benchmark step may take (a hung kernel fails
#                                its step instead of the whole call)
#   FLASHLAB_TARGETS="a b"       build only these CMake targets besides the library, the tests,
#                                the bindings and the benchmark (e.g. experiment_softmax_long_rows);
#                                unset: everything
# Needs, carried in .deps/: wheels/ (apache-tvm-ffi cp312, nvidia-cutlass) and googletest/.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-build/device-out}" && cd "${1:-build/device-out}" && pwd)
log="$out/device.log"
: >"$log"
exec > >(tee -a "$log") 2>&1
export PATH=/usr/local/cuda/bin:$PATH
export FLASHLAB_COMMIT=${FLASHLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
filter=${FLASHLAB_FILTER:-}
step_timeout=${FLASHLAB_STEP_TIMEOUT:-300}
status=0
step() { printf '\n==== %s ====\n' "$*"; }
fail() { echo "FAILED: $*"; status=1; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || fail "nvidia-smi"
nvcc --version | tail -n 2
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' || true
export FLASHLAB_DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)

step "offline Python deps (.deps/wheels -> /tmp/flashlab-site)"
site=/tmp/flashlab-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  .deps/wheels/apache_tvm_ffi-*-cp312-*.whl || fail "installing apache-tvm-ffi wheel"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if [ ! -f .deps/cutlass/include/cute/tensor.hpp ]; then
  bash scripts/unpack_cutlass.sh .deps/wheels/nvidia_cutlass-4.2.0.0-*.whl .deps/cutlass || fail "unpacking CUTLASS"
fi

step "build (preset gpu, $(nproc) jobs)"
cmake --preset gpu -DPython3_EXECUTABLE="$(command -v python3)" -DFLASHLAB_PTXAS_VERBOSE=ON \
  -DFLASHLAB_BUILD_PYTHON=ON -DFLASHLAB_BUILD_TESTS=ON -DFLASHLAB_BUILD_BENCH=ON \
  -DFLASHLAB_REQUIRE_CUTLASS=ON >"$out/build.log" 2>&1 &&
  if [ -n "${FLASHLAB_TARGETS:-}" ]; then
    # shellcheck disable=SC2086  # a space-separated list of target names
    cmake --build --preset gpu -j "$(nproc)" --target flashlab test_cpu test_gpu flashlab_ffi flashlab_bench \
      $FLASHLAB_TARGETS >>"$out/build.log" 2>&1
  else
    cmake --build --preset gpu -j "$(nproc)" >>"$out/build.log" 2>&1
  fi || { tail -n 60 "$out/build.log"; fail "build"; }
# Resource report: every kernel's registers, smem, stack and spills, in one file.
grep -E "Compiling entry|Function properties|spill|Used [0-9]+ registers" "$out/build.log" >"$out/ptxas.txt" || true
spills=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$out/ptxas.txt" | wc -l)
echo "kernels with spills: $spills"
[ "$spills" -eq 0 ] || fail "register spills (see ptxas.txt)"
# ptxas "Potential Performance Loss: wgmma.mma_async instructions are serialized" (C7518: a
# wgmma group in flight through a divergent path; C7512: not enough registers to keep it in
# flight): a wait after every wgmma, the asynchronous tensor-core pipeline silently gone
# (backward rung 3, b5bb99f: 17-24% slower).
serialized=$(grep -c "Potential Performance Loss: wgmma" "$out/build.log")
echo "wgmma serialization notes (ptxas C75xx): $serialized"
[ "$serialized" -eq 0 ] || { grep "Potential Performance Loss: wgmma" "$out/build.log" | head -n 5; fail "wgmma serialized by ptxas"; }
# SASS: count of 128-bit global loads/stores and shuffles per kernel, to check the rungs do what they say.
if [ -f build/gpu/libflashlab.so ]; then
  cuobjdump --dump-sass build/gpu/libflashlab.so | python3 scripts/sass_summary.py >"$out/sass.txt" || true
fi

step "C++ tests"
# FLASHLAB_FILTER may name several ops, comma-separated: their GPU tests, Python tests and
# benchmarks run.
gtest_filter='*'
py_tests=(tests/python)
if [ -n "$filter" ]; then
  gtest_parts=()
  py_tests=()
  IFS=',' read -ra filter_parts <<<"$filter"
  for part in "${filter_parts[@]}"; do
    case "$part" in
      vector_add*) gtest_parts+=('VectorAdd*'); py_tests+=(tests/python/test_bindings.py) ;;
      reduce*|sum*) gtest_parts+=('Sum*:RowSum*'); py_tests+=(tests/python/test_bindings.py) ;;
      row_sum*) gtest_parts+=('RowSum*'); py_tests+=(tests/python/test_bindings.py) ;;
      streams*) gtest_parts+=('Streams*') ;;
      rmsnorm*|fused_add_rmsnorm*) gtest_parts+=('RmsNorm*:FusedAddRmsNorm*'); py_tests+=(tests/python/test_norm.py) ;;
      layernorm*) gtest_parts+=('LayerNorm*:Welford*'); py_tests+=(tests/python/test_layernorm.py) ;;
      softmax*|log_softmax*) gtest_parts+=('Softmax*:LogSoftmax*:OnlineSoftmax*'); py_tests+=(tests/python/test_softmax.py) ;;
      *_and_mul*) gtest_parts+=('*Activation*:*AndMul*'); py_tests+=(tests/python/test_bindings.py) ;;
      rope*) gtest_parts+=('Rope*'); py_tests+=(tests/python/test_rope.py) ;;
      quantize*) gtest_parts+=('Quantize*:Dequantize*:QuantReference*:RowDivisor*'); py_tests+=(tests/python/test_quant.py) ;;
      gemm*) gtest_parts+=('Gemm*'); py_tests+=(tests/python/test_gemm.py) ;;
      attn_bwd*) gtest_parts+=('AttentionBwd*'); py_tests+=(tests/python/test_attention_bwd.py) ;;
      attn*|attention*) gtest_parts+=('Attention*:MergeState*:PagedKv*:PagedDecode*:PagedPrefill*'); py_tests+=(tests/python/test_attention.py tests/python/test_attention_bwd.py tests/python/test_attention_compile.py tests/python/test_attention_dropout.py tests/python/test_serving.py tests/python/test_kvcache.py) ;;
      merge*|serving*|paged*) gtest_parts+=('MergeState*:PagedKv*:PagedDecode*:PagedPrefill*'); py_tests+=(tests/python/test_serving.py tests/python/test_kvcache.py) ;;
      *) gtest_parts+=('*') ;;
    esac
  done
  gtest_filter=$(IFS=:; echo "${gtest_parts[*]}")
fi
if [ "${FLASHLAB_TESTS:-1}" = 0 ]; then
  echo "skipped (FLASHLAB_TESTS=0)"
  py_tests=()
else
  ./build/gpu/tests/test_cpu --gtest_brief=1 || fail "CPU tests"
  timeout "$step_timeout" ./build/gpu/tests/test_gpu --gtest_filter="$gtest_filter" --gtest_brief=1 || fail "GPU tests"
fi
if [ "${FLASHLAB_SANITIZE:-0}" = 1 ]; then
  step "compute-sanitizer"
  for tool in memcheck racecheck; do
    timeout "$step_timeout" compute-sanitizer --tool "$tool" --error-exitcode 9 ./build/gpu/tests/test_gpu \
      --gtest_filter="${FLASHLAB_SANITIZE_FILTER:-VectorAdd.AnyAlignment*:Sum.Determ*:RowSum*}" --gtest_brief=1 \
      >"$out/sanitizer_$tool.log" 2>&1 && echo "$tool: clean" || { tail -n 30 "$out/sanitizer_$tool.log"; fail "$tool"; }
  done
fi

step "Python tests"
mapfile -t py_run < <(printf '%s\n' ${py_tests[@]+"${py_tests[@]}"} | grep -v '^$' | sort -u)
if [ ${#py_run[@]} -gt 0 ]; then
  PYTHONPATH="$root/python:$PYTHONPATH" FLASHLAB_LIB_DIR="$root/build/gpu/bindings" \
    timeout "$step_timeout" python3 -m pytest "${py_run[@]}" -q -p no:cacheprovider || fail "Python tests"
else
  echo "no Python tests for FLASHLAB_FILTER=$filter"
fi

step "benchmarks"
if [ "${FLASHLAB_BENCH:-1}" = 0 ]; then
  echo "skipped (FLASHLAB_BENCH=0)"
else
bench_args=(--out build/gpu/bench.json)
[ -n "$filter" ] && bench_args+=(--filter "$filter")
[ "${FLASHLAB_QUICK:-0}" = 1 ] && bench_args+=(--quick)
if timeout "$step_timeout" ./build/gpu/bench/flashlab_bench "${bench_args[@]}"; then
  # Peers in the same run; the merged file is named bench/results/<gpu>_<date>_<sha>.json.
  peer_args=(--in build/gpu/bench.json)
  [ "${FLASHLAB_QUICK:-0}" = 1 ] && peer_args+=(--quick)
  if python3 bench/peers.py "${peer_args[@]}"; then
    cp "$(ls -t bench/results/*.json | head -n1)" "$out/"
  else
    fail "peers"
  fi
else
  fail "flashlab_bench"
fi
fi
if [ -n "${FLASHLAB_PROFILE:-}" ]; then
  step "ncu profile: $FLASHLAB_PROFILE"
  bash scripts/profile.sh "$FLASHLAB_PROFILE" "$out/profile" || fail "profile"
fi

step "summary"
ls -la "$out"
[ $status -eq 0 ] && echo "device.sh: all steps passed" || echo "device.sh: some steps FAILED"
exit $status
