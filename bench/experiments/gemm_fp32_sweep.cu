// Experiment (not a rung): tile shapes of GEMM rung 6 (warp tiling, kernels/gemm/06_warp_tiling.cuh)
// at M = N = K = 4096 in fp32, against cuBLAS SGEMM (fp32 FMA, no TF32) in the same run. Each
// shape is (kBM, kBN, kBK) block tile, (kWM, kWN) warp tile, kTM x kTN thread tile, threads
// (derived: one warp per warp tile) and the __launch_bounds__ minimum of blocks per SM.
// Timing: bench::Harness (3 warm-ups, L2 flushed by a 256 MiB memset before every repetition,
// CUDA events, median of 20-50). Each shape's output is compared with cuBLAS's, and each shape
// also runs once at an awkward size on the scalar-load path (kVec16 = false). Prints a table;
// writes JSON to argv[1] when given. Built as build/*/bench/experiment_gemm_fp32_sweep; the
// choice it supports is GemmWarpTilingConfig. Inputs are pseudo-random in [-1, 1].
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "flashlab/error.h"
#include "kernels/gemm/06_warp_tiling.cuh"

using namespace flashlab;
using namespace flashlab::kernels;

namespace {

#define CUBLAS_OK(call) FLASHLAB_CHECK((call) == CUBLAS_STATUS_SUCCESS, "cuBLAS error from " #call)

struct Problem {
  int m, n, k;
  float *a, *b, *c, *c_ref;  // row-major, leading dims k, n, n
};

struct Result {
  std::string tile;
  int threads = 0, min_blocks = 0, regs = 0, spill_bytes = 0, smem_bytes = 0, blocks_per_sm = 0;
  double ms = 0, tflops = 0, vs_cublas = 0, max_err = 0, awkward_err = 0;
};

GemmParams params(const Problem& pr, float* c) {
  GemmParams p{};
  p.a = pr.a;
  p.b = pr.b;
  p.c = c;
  p.M = pr.m;
  p.N = pr.n;
  p.K = pr.k;
  p.a_row = pr.k;
  p.a_col = 1;
  p.b_row = pr.n;
  p.b_col = 1;
  p.ldc = pr.n;
  p.alpha = 1.f;
  p.beta = 0.f;
  return p;
}

// Row-major C = A @ B is column-major C^T = B^T A^T.
void cublas_gemm(cublasHandle_t h, const Problem& pr, float* c) {
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_OK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, pr.n, pr.m, pr.k, &alpha, pr.b, pr.n, pr.a, pr.k, &beta, c, pr.n));
}

// Largest |x - y| over n elements, relative to the largest |y|.
double max_rel_diff(const float* x, const float* y, size_t n) {
  std::vector<float> hx(n), hy(n);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(hx.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
  double d = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(static_cast<double>(hx[i]) - hy[i]);
    d = std::isnan(e) ? INFINITY : std::max(d, e);
    scale = std::max(scale, std::fabs(static_cast<double>(hy[i])));
  }
  return d / std::max(scale, 1e-30);
}

template <typename Cfg, bool kVec16>
void launch(const GemmParams& p, cudaStream_t s) {
  const int64_t tiles = static_cast<int64_t>((p.M + Cfg::kBM - 1) / Cfg::kBM) * ((p.N + Cfg::kBN - 1) / Cfg::kBN);
  gemm_warp_tiling_kernel<Cfg, kVec16><<<static_cast<int>(tiles), Cfg::kThreads, Cfg::kSmemBytes, s>>>(p);
}

template <typename Cfg>
Result run(bench::Harness& h, const Problem& big, const Problem& odd, double cublas_ms) {
  Result r;
  char name[96];
  std::snprintf(name, sizeof name, "%dx%dx%d w%dx%d t%dx%d", Cfg::kBM, Cfg::kBN, Cfg::kBK, Cfg::kWM, Cfg::kWN, Cfg::kTM,
                Cfg::kTN);
  r.tile = name;
  r.threads = Cfg::kThreads;
  r.min_blocks = Cfg::kMinBlocks;
  r.smem_bytes = Cfg::kSmemBytes;
  for (auto kernel : {gemm_warp_tiling_kernel<Cfg, true>, gemm_warp_tiling_kernel<Cfg, false>})
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  cudaFuncAttributes attr{};
  FLASHLAB_CUDA_CHECK(cudaFuncGetAttributes(&attr, gemm_warp_tiling_kernel<Cfg, true>));
  r.regs = attr.numRegs;
  r.spill_bytes = static_cast<int>(attr.localSizeBytes);
  FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, gemm_warp_tiling_kernel<Cfg, true>,
                                                                    Cfg::kThreads, Cfg::kSmemBytes));
  const GemmParams p = params(big, big.c);
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(big.c, 0xff, sizeof(float) * big.m * big.n, h.stream()));  // NaN
  r.ms = h.time_ms([&] { launch<Cfg, true>(p, h.stream()); });
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
  r.tflops = 2.0 * big.m * big.n * static_cast<double>(big.k) / (r.ms * 1e-3) / 1e12;
  r.vs_cublas = cublas_ms / r.ms;
  r.max_err = max_rel_diff(big.c, big.c_ref, static_cast<size_t>(big.m) * big.n);
  const GemmParams q = params(odd, odd.c);
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(odd.c, 0xff, sizeof(float) * odd.m * odd.n, h.stream()));
  launch<Cfg, false>(q, h.stream());
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
  r.awkward_err = max_rel_diff(odd.c, odd.c_ref, static_cast<size_t>(odd.m) * odd.n);
  std::printf("%-24s %7d %5d %5d %6d %8.1f %6d %9.3f %8.1f %7.1f%% %9.1e %9.1e\n", r.tile.c_str(), r.threads, r.min_blocks,
              r.regs, r.spill_bytes, r.smem_bytes / 1024.0, r.blocks_per_sm, r.ms, r.tflops, 100.0 * r.vs_cublas,
              r.max_err, r.awkward_err);
  std::fflush(stdout);
  return r;
}

Problem make_problem(int m, int n, int k, uint64_t seed, cudaStream_t s) {
  Problem pr{m, n, k, nullptr, nullptr, nullptr, nullptr};
  FLASHLAB_CUDA_CHECK(cudaMalloc(&pr.a, sizeof(float) * m * k));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&pr.b, sizeof(float) * k * n));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&pr.c, sizeof(float) * m * n));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&pr.c_ref, sizeof(float) * m * n));
  bench::fill_random(pr.a, static_cast<int64_t>(m) * k, 0, seed, s);
  bench::fill_random(pr.b, static_cast<int64_t>(k) * n, 0, seed + 1, s);
  return pr;
}

void free_problem(Problem& pr) {
  cudaFree(pr.a);
  cudaFree(pr.b);
  cudaFree(pr.c);
  cudaFree(pr.c_ref);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  opt.min_reps = 20;
  opt.max_reps = 50;
  bench::Harness h(opt);
  constexpr int kSize = 4096;
  Problem big = make_problem(kSize, kSize, kSize, 1, h.stream());
  Problem odd = make_problem(1001, 1003, 517, 7, h.stream());  // K = 517: rows not 16-byte aligned

  cublasHandle_t handle;
  CUBLAS_OK(cublasCreate(&handle));
  CUBLAS_OK(cublasSetStream(handle, h.stream()));
  CUBLAS_OK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // fp32 FMA: no TF32 tensor cores
  cublas_gemm(handle, odd, odd.c_ref);
  cublas_gemm(handle, big, big.c_ref);
  const double cublas_ms = h.time_ms([&] { cublas_gemm(handle, big, big.c); });
  const double cublas_tflops = 2.0 * kSize * kSize * static_cast<double>(kSize) / (cublas_ms * 1e-3) / 1e12;

  cudaDeviceProp prop{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, fp32 GEMM %dx%dx%d NN; cuBLAS SGEMM %.3f ms %.1f TFLOP/s\n", prop.name, kSize, kSize, kSize,
              cublas_ms, cublas_tflops);
  std::printf("%-24s %7s %5s %5s %6s %8s %6s %9s %8s %8s %9s %9s\n", "tile (BMxBNxBK w t)", "threads", "minB", "regs",
              "spill", "smem KiB", "blk/SM", "ms", "TFLOP/s", "cuBLAS", "rel err", "awkward");
  std::vector<Result> rows;
  // The library's choice first (GemmWarpTilingConfig), then alternatives.
  rows.push_back(run<GemmWarpTilingConfig>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 128, 8, 64, 32, 8, 8, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 128, 16, 32, 64, 8, 8, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 128, 16, 64, 32, 8, 8, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 256, 8, 64, 64, 8, 16, 1>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<256, 128, 8, 64, 64, 16, 8, 1>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 128, 8, 32, 64, 8, 8, 2>>(h, big, odd, cublas_ms));  // the first choice
  rows.push_back(run<GemmWarpTile<128, 128, 8, 64, 64, 8, 16, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 128, 16, 64, 64, 8, 16, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<128, 64, 16, 64, 32, 8, 8, 4>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<64, 128, 16, 32, 32, 4, 8, 2>>(h, big, odd, cublas_ms));
  rows.push_back(run<GemmWarpTile<64, 64, 16, 32, 32, 4, 8, 4>>(h, big, odd, cublas_ms));
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));

  if (argc > 1) {
    std::ofstream f(argv[1]);
    FLASHLAB_CHECK(f.good(), "cannot write ", argv[1]);
    f << "{\n  \"device\": \"" << prop.name << "\",\n  \"op\": \"gemm\", \"dtype\": \"fp32\", \"shape\": {\"m\": " << kSize
      << ", \"n\": " << kSize << ", \"k\": " << kSize << ", \"layout\": \"NN\"},\n"
      << "  \"cublas\": {\"ms\": " << cublas_ms << ", \"TFLOPs\": " << cublas_tflops << "},\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Result& r = rows[i];
      f << "    {\"tile\": \"" << r.tile << "\", \"threads\": " << r.threads << ", \"min_blocks\": " << r.min_blocks
        << ", \"regs\": " << r.regs << ", \"spill_bytes\": " << r.spill_bytes << ", \"smem_bytes\": " << r.smem_bytes
        << ", \"blocks_per_sm\": " << r.blocks_per_sm << ", \"ms\": " << r.ms << ", \"TFLOPs\": " << r.tflops
        << ", \"vs_cublas\": " << r.vs_cublas << ", \"max_rel_err\": " << r.max_err
        << ", \"awkward_rel_err\": " << r.awkward_err << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", argv[1]);
  }
  cublasDestroy(handle);
  free_problem(big);
  free_problem(odd);
}
