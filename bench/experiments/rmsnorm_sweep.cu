// Experiment (not a rung): RMSNorm rung 4's vectors per thread (1, 2, 4; 8 spilled: the block size
// follows) and whether the weight is loaded with the row or after the reduction, for
// rmsnorm and fused_add_rmsnorm at LLM shapes. Built as build/*/bench/experiment_rmsnorm_sweep;
// its output on an H100 is quoted in docs/ladder/rmsnorm.md. Inputs are pseudo-random.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "kernels/norm/04_block_vec16_regs.cuh"

using namespace flashlab;
using namespace flashlab::kernels;

template <typename T, bool kFused, int kVpt, bool kPrefetch>
void run(bench::Harness& h, const char* dt, RmsNormParams p, double copy_tbps) {
  const int64_t nvec = p.hidden / Vec<T>::kN;
  const int64_t per_row = (nvec + kVpt - 1) / kVpt;
  const int threads = static_cast<int>(std::clamp<int64_t>((per_row + 31) / 32 * 32, 32, kRmsNormRegsMaxThreads));
  if (static_cast<int64_t>(threads) * kVpt < nvec) return;  // does not cover the row
  const double ms = h.time_ms([&] {
    rmsnorm_block_vec16_regs_kernel<T, kFused, false, kVpt, kPrefetch><<<static_cast<int>(p.rows), threads, 0, h.stream()>>>(p);
  });
  const double bytes = (kFused ? 4.0 : 2.0) * p.rows * p.hidden * sizeof(T);
  std::printf("%-17s %s %6lldx%-6lld vpt=%d threads=%4d weight=%-5s %8.4f ms %6.1f%% copy\n",
              kFused ? "fused_add_rmsnorm" : "rmsnorm", dt, (long long)p.rows, (long long)p.hidden, kVpt, threads,
              kPrefetch ? "early" : "late", ms, 100.0 * bytes / (ms * 1e-3) / 1e12 / copy_tbps);
}

template <typename T, bool kFused>
void sweep(bench::Harness& h, const char* dt, int64_t rows, int64_t hidden, double copy_tbps) {
  void *x, *r, *w;
  cudaMalloc(&x, rows * hidden * sizeof(T));
  cudaMalloc(&r, rows * hidden * sizeof(T));
  cudaMalloc(&w, hidden * sizeof(T));
  const int code = sizeof(T) == 2 ? 1 : 0;
  bench::fill_random(x, rows * hidden, code, 1, h.stream());
  bench::fill_random(r, rows * hidden, code, 2, h.stream());
  bench::fill_random(w, hidden, code, 3, h.stream());
  const RmsNormParams p{x, x, kFused ? r : nullptr, w, rows, hidden, hidden, hidden, hidden, 1e-6f};
  run<T, kFused, 1, true>(h, dt, p, copy_tbps);
  run<T, kFused, 2, true>(h, dt, p, copy_tbps);
  run<T, kFused, 4, true>(h, dt, p, copy_tbps);
  run<T, kFused, 2, false>(h, dt, p, copy_tbps);
  run<T, kFused, 4, false>(h, dt, p, copy_tbps);
  cudaFree(x);
  cudaFree(r);
  cudaFree(w);
}

int main() {
  bench::Options opt;
  opt.min_reps = 20;
  opt.max_reps = 100;
  bench::Harness h(opt);
  h.measure_peaks();
  const double c = h.copy_TBps();
  for (int64_t hidden : {4096, 8192}) {
    sweep<__nv_bfloat16, false>(h, "bf16", 16384, hidden, c);
    sweep<__nv_bfloat16, true>(h, "bf16", 16384, hidden, c);
  }
  sweep<float, false>(h, "fp32", 16384, 4096, c);
  sweep<float, true>(h, "fp32", 16384, 4096, c);
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
