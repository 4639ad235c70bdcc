// Experiment (not a rung): RMSNorm rung 4's vectors per thread (1, 2, 4; 8 spilled: the block size
// follows) and whether the weight is loaded with the row or after the reduction, for
// rmsnorm and fused_add_rmsnorm at LLM shapes; then, for the fused op (bf16, hidden 4096), the
// cache policy of its loads and stores and a one-barrier block reduction (variant kernel below). Built as build/*/bench/experiment_rmsnorm_sweep;
// its output on an H100 is quoted in docs/ladder/rmsnorm.md. Inputs are pseudo-random.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "kernels/norm/04_block_vec16_regs.cuh"

using namespace flashlab;
using namespace flashlab::kernels;

// kLoad: 0 plain ld.global, 1 ld.global.L1::no_allocate, 2 the same with an L2 evict_first policy.
template <int kLoad, typename T>
__device__ __forceinline__ Vec<T> load_variant(const T* p) {
  int4 r;
  if constexpr (kLoad == 0) {
    r = *reinterpret_cast<const int4*>(p);
  } else if constexpr (kLoad == 1) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) : "memory");
  } else {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(policy) : "memory");
  }
  return *reinterpret_cast<const Vec<T>*>(&r);
}

// The fused op of rung 4 (4 vectors per thread, weight late) with the variants above; kStoreCs:
// evict-first stores (the rung's store_vec) or plain st.global; kOneBarrier: each warp's sum to
// shared memory, one barrier, every thread adds the warps' sums (instead of two barriers).
template <typename T, int kLoad, bool kStoreCs, bool kOneBarrier>
__global__ void __launch_bounds__(kRmsNormRegsMaxThreads) fused_variant_kernel(const __grid_constant__ RmsNormParams p) {
  using V = Vec<T>;
  constexpr int kVpt = kRmsNormVecsPerThread;
  __shared__ float warp_sums[kWarpSize];
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.hidden / V::kN;
  T* x_row = const_cast<T*>(static_cast<const T*>(p.input)) + r * p.input_stride;
  T* res = static_cast<T*>(p.residual) + r * p.residual_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  const T* w = static_cast<const T*>(p.weight);
  const auto store = [](T* q, const V& v) {
    if constexpr (kStoreCs) store_vec(q, v);
    else store_vec_wb(q, v);
  };
  V x[kVpt], rv[kVpt];
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) x[k] = load_variant<kLoad>(x_row + i * V::kN), rv[k] = load_variant<kLoad>(res + i * V::kN);
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) {
      x[k] = add_vec(x[k], rv[k]);
      store(res + i * V::kN, x[k]);
      ss += sum_squares_vec(x[k]);
    }
  }
  float total;
  if constexpr (kOneBarrier) {
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(kFullMask, ss, o);
    if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = ss;
    __syncthreads();
    total = 0.f;
    for (int j = 0; j < static_cast<int>(blockDim.x / kWarpSize); ++j) total += warp_sums[j];
  } else {
    total = block_all_reduce_sum(ss);
  }
  const float inv_rms = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) store(out + i * V::kN, scale_vec<T, false>(x[k], load_vec(w + i * V::kN), inv_rms));
  }
}

template <typename T, int kLoad, bool kStoreCs, bool kOneBarrier>
void run_variant(bench::Harness& h, RmsNormParams p, double copy_tbps) {
  const int threads = static_cast<int>(p.hidden / Vec<T>::kN / kRmsNormVecsPerThread);
  const double ms = h.time_ms(
      [&] { fused_variant_kernel<T, kLoad, kStoreCs, kOneBarrier><<<static_cast<int>(p.rows), threads, 0, h.stream()>>>(p); });
  const double bytes = 4.0 * p.rows * p.hidden * sizeof(T);
  static const char* loads[] = {"ld", "ld.L1::no_allocate", "ld.L1::no_allocate.L2::evict_first"};
  std::printf("fused variant %6lldx%-6lld load=%-34s store=%-4s barriers=%d %8.4f ms %6.1f%% copy\n", (long long)p.rows,
              (long long)p.hidden, loads[kLoad], kStoreCs ? "cs" : "wb", kOneBarrier ? 1 : 2, ms,
              100.0 * bytes / (ms * 1e-3) / 1e12 / copy_tbps);
}

template <typename T, bool kFused, int kVpt, bool kPrefetch, bool kStoreWb = kFused>
void run(bench::Harness& h, const char* dt, RmsNormParams p, double copy_tbps);

void fused_variants(bench::Harness& h, double copy_tbps) {
  using T = __nv_bfloat16;
  const int64_t rows = 16384, hidden = 4096;
  void *x, *r, *w;
  cudaMalloc(&x, rows * hidden * sizeof(T));
  cudaMalloc(&r, rows * hidden * sizeof(T));
  cudaMalloc(&w, hidden * sizeof(T));
  bench::fill_random(x, rows * hidden, 1, 1, h.stream());
  bench::fill_random(r, rows * hidden, 1, 2, h.stream());
  bench::fill_random(w, hidden, 1, 3, h.stream());
  const RmsNormParams p{x, x, r, w, rows, hidden, hidden, hidden, hidden, 1e-6f};
  for (int rep = 0; rep < 2; ++rep) {  // twice: the spread between repeats is the noise floor
    run<T, true, 4, false>(h, "bf16", p, copy_tbps);
    run_variant<T, 0, true, false>(h, p, copy_tbps);
    run_variant<T, 0, false, false>(h, p, copy_tbps);
    run_variant<T, 1, true, false>(h, p, copy_tbps);
    run_variant<T, 2, true, false>(h, p, copy_tbps);
    run_variant<T, 0, true, true>(h, p, copy_tbps);
    run_variant<T, 1, false, true>(h, p, copy_tbps);
    run_variant<T, 1, true, true>(h, p, copy_tbps);
  }
  // rmsnorm (not fused), bf16 16384 x 4096: evict-first (the rung's) against write-back stores.
  const RmsNormParams q{x, r, nullptr, w, rows, hidden, hidden, hidden, hidden, 1e-6f};  // out of place
  for (int rep = 0; rep < 2; ++rep) {
    run<T, false, 4, true, false>(h, "bf16", q, copy_tbps);
    run<T, false, 4, true, true>(h, "bf16", q, copy_tbps);
  }
  cudaFree(x);
  cudaFree(r);
  cudaFree(w);
}

template <typename T, bool kFused, int kVpt, bool kPrefetch, bool kStoreWb>
void run(bench::Harness& h, const char* dt, RmsNormParams p, double copy_tbps) {
  const int64_t nvec = p.hidden / Vec<T>::kN;
  const int64_t per_row = (nvec + kVpt - 1) / kVpt;
  const int threads = static_cast<int>(std::clamp<int64_t>((per_row + 31) / 32 * 32, 32, kRmsNormRegsMaxThreads));
  if (static_cast<int64_t>(threads) * kVpt < nvec) return;  // does not cover the row
  const double ms = h.time_ms([&] {
    rmsnorm_block_vec16_regs_kernel<T, kFused, false, kVpt, kPrefetch, kStoreWb><<<static_cast<int>(p.rows), threads, 0, h.stream()>>>(p);
  });
  const double bytes = (kFused ? 4.0 : 2.0) * p.rows * p.hidden * sizeof(T);
  std::printf("%-17s %s %6lldx%-6lld vpt=%d threads=%4d weight=%-5s store=%s %8.4f ms %6.1f%% copy\n",
              kFused ? "fused_add_rmsnorm" : "rmsnorm", dt, (long long)p.rows, (long long)p.hidden, kVpt, threads,
              kPrefetch ? "early" : "late", kStoreWb ? "wb" : "cs", ms, 100.0 * bytes / (ms * 1e-3) / 1e12 / copy_tbps);
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

int main(int argc, char** argv) {
  bench::Options opt;
  opt.min_reps = 20;
  opt.max_reps = 100;
  bench::Harness h(opt);
  h.measure_peaks();
  const double c = h.copy_TBps();
  fused_variants(h, c);
  if (argc > 1 && std::string(argv[1]) == "--variants-only") return 0;
  for (int64_t hidden : {4096, 8192}) {
    sweep<__nv_bfloat16, false>(h, "bf16", 16384, hidden, c);
    sweep<__nv_bfloat16, true>(h, "bf16", 16384, hidden, c);
  }
  sweep<float, false>(h, "fp32", 16384, 4096, c);
  sweep<float, true>(h, "fp32", 16384, 4096, c);
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
