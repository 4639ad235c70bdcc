// Experiment (not a rung): GEMM rung 9 with and without CTA pairs (clusters of 2 sharing B
// tiles through TMA multicast), against cuBLAS in the same process, bf16, layout NN, at the
// issue's shapes. Built as build/*/bench/experiment_gemm_hopper_ablation; quoted in
// docs/ladder/gemm.md. Timing: the benchmark harness (warm-up, L2 flushed, median of CUDA
// events). Usage: experiment_gemm_hopper_ablation [out.json]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "flashlab/error.h"
#include "kernels/gemm/09_hopper_ws.cuh"
#include "src/core/launch.h"
#include "src/gemm_launch.h"

using namespace flashlab;

namespace {

struct Shape {
  int m, n, k;
};

double tflops(const Shape& s, double ms) { return 2.0 * s.m * s.n * s.k / (ms * 1e-3) / 1e12; }

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  opt.min_reps = 20;
  bench::Harness h(opt);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(handle, h.stream());
  {  // how many CTA pairs of the NN 128 x 256 kernel fit at once (the persistent grid's size)
    const auto kernel = kernels::gemm_hopper_ws_kernel<__nv_bfloat16, 256, false, true, 2>;
    constexpr int smem = kernels::HopperTile<256>::kSmemBytes;
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int pairs = detail::resident_clusters(reinterpret_cast<const void*>(kernel), 2, kernels::kHopperThreads, smem);
    std::printf("resident CTA pairs (1 CTA per SM, %d KB shared memory): %d on %d SMs\n", smem / 1024, pairs,
                detail::sm_count());
  }
  const std::vector<Shape> shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}, {2048, 12288, 4096}, {128, 12288, 4096}};
  std::string json = "[";
  std::printf("%-20s %12s %12s %12s %9s %9s\n", "M x N x K (NN bf16)", "cuBLAS", "single CTAs", "CTA pairs", "single/cB",
              "pairs/cB");
  for (const Shape& s : shapes) {
    void *a, *b, *c;
    FLASHLAB_CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(s.m) * s.k * 2));
    FLASHLAB_CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(s.k) * s.n * 2));
    FLASHLAB_CUDA_CHECK(cudaMalloc(&c, static_cast<size_t>(s.m) * s.n * 2));
    bench::fill_random(a, static_cast<int64_t>(s.m) * s.k, 1, 1, h.stream());
    bench::fill_random(b, static_cast<int64_t>(s.k) * s.n, 1, 2, h.stream());
    GemmParams p{};
    p.a = a;
    p.b = b;
    p.c = c;
    p.M = s.m;
    p.N = s.n;
    p.K = s.k;
    p.a_row = s.k;
    p.a_col = 1;
    p.b_row = s.n;
    p.b_col = 1;
    p.ldc = s.n;
    p.alpha = 1.f;
    const float one = 1.f, zero = 0.f;
    // Row-major C = A B is column-major C^T = B^T A^T.
    const double cublas_ms = h.time_ms([&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &one, b, CUDA_R_16BF, s.n, a, CUDA_R_16BF, s.k, &zero,
                   c, CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    const double single_ms = h.time_ms([&] { detail::launch_gemm_hopper(p, DType::kBF16, h.stream(), false); });
    const double pairs_ms = h.time_ms([&] { detail::launch_gemm_hopper(p, DType::kBF16, h.stream(), true); });
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
    char name[64];
    std::snprintf(name, sizeof(name), "%dx%dx%d", s.m, s.n, s.k);
    std::printf("%-20s %7.1f TF/s %7.1f TF/s %7.1f TF/s %8.3fx %8.3fx\n", name, tflops(s, cublas_ms), tflops(s, single_ms),
                tflops(s, pairs_ms), cublas_ms / single_ms, cublas_ms / pairs_ms);
    char row[256];
    std::snprintf(row, sizeof(row),
                  "%s{\"shape\": \"%s\", \"cublas_ms\": %.5f, \"single_ms\": %.5f, \"pairs_ms\": %.5f}", json.size() > 1 ? ", " : "",
                  name, cublas_ms, single_ms, pairs_ms);
    json += row;
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  json += "]";
  cudaDeviceProp prop{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* commit = std::getenv("FLASHLAB_COMMIT");
  json = std::string("{\"device\": \"") + prop.name + "\", \"commit\": \"" + (commit ? commit : "unknown") +
         "\", \"rows\": " + json + "}\n";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  cublasDestroy(handle);
  return 0;
}
