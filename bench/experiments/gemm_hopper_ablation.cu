// Experiment (not a rung): GEMM rung 9 with and without CTA pairs (clusters of 2 sharing B
// tiles through TMA multicast), and its pingpong variant (kernels/gemm/09_hopper_ws_pingpong.cuh:
// each consumer warpgroup computes whole 128 x 128 tiles, the two take turns; main loops free or
// strictly alternating), against cuBLAS in the same process, bf16, layout NN, at the issue's
// shapes. Built as build/*/bench/experiment_gemm_hopper_ablation; quoted in docs/ladder/gemm.md.
// Timing: the benchmark harness (warm-up, L2 flushed, median of CUDA events).
// Correctness of the pingpong kernels (and rung 9 beside them): one run on C poisoned with NaN
// (0xFF bytes) against cuBLAS's C; max |diff| / max |ref| must stay <= 2^-7, no NaN may remain
// and C's padding columns must stay untouched. First at ragged shapes (M, N, K tails; NN, NT,
// TN), then at each timed shape after its timings. Any failure prints FAIL and the exit status
// is 1. Usage: experiment_gemm_hopper_ablation [out.json | --profile | --alternate | --probe | --epilogue-copy]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "flashlab/error.h"
#include "kernels/gemm/09_hopper_ws.cuh"
#include "kernels/gemm/09_hopper_ws_pingpong.cuh"
#include "src/core/launch.h"
#include "src/core/tensor_map.h"
#include "src/gemm_launch.h"

using namespace flashlab;

namespace {

struct Shape {
  int m, n, k;
};

enum class Layout { kNN, kNT, kTN };
const char* layout_name(Layout l) { return l == Layout::kNN ? "NN" : l == Layout::kNT ? "NT" : "TN"; }

double tflops(const Shape& s, double ms) { return 2.0 * s.m * s.n * s.k / (ms * 1e-3) / 1e12; }

// Leading dims padded to 8 elements: 16-byte rows, as TMA needs.
int64_t pad8(int64_t x) { return (x + 7) / 8 * 8; }

// Tensor maps and tile counts as src/gemm_hopper.cu builds them, for tiles of kBN columns; a unit
// is a tile, or with kCluster = 2 a pair of vertically adjacent tiles, as for rung 9.
template <int kBN, bool kTransA, bool kTransB, int kCluster>
kernels::HopperGemmArgs hopper_args(const GemmParams& p, int& units) {
  using namespace kernels;
  const int64_t lda = kTransA ? p.a_col : p.a_row, ldb = kTransB ? p.b_row : p.b_col;
  const auto stride = [](int64_t ld) { return detail::ceil_div(ld * 2, 16) * 16; };
  constexpr DType bf16 = DType::kBF16;
  HopperGemmArgs args{};
  args.a = kTransA ? detail::make_tensor_map_2d(p.a, bf16, p.M, p.K, stride(lda), 64, 64, true)
                   : detail::make_tensor_map_2d(p.a, bf16, p.K, p.M, stride(lda), 64, kHopperBM, true);
  args.b = kTransB ? detail::make_tensor_map_2d(p.b, bf16, p.N, p.K, stride(ldb), 64, 64, true)
                   : detail::make_tensor_map_2d(p.b, bf16, p.K, p.N, stride(ldb), 64, kBN / kCluster, true);
  args.c = detail::make_tensor_map_2d(p.c, bf16, p.N, p.M, stride(p.ldc), 64, 64, true);
  args.p = p;
  args.tiles_m = static_cast<int>(detail::ceil_div(p.M, kHopperBM));
  args.tiles_n = static_cast<int>(detail::ceil_div(p.N, kBN));
  units = static_cast<int>(detail::ceil_div(args.tiles_m, kCluster)) * args.tiles_n;
  return args;
}

// A persistent grid of min(units, resident) CTAs (pairs) of `kernel`.
template <typename Kernel>
void launch_persistent(Kernel kernel, int smem, int cluster, const kernels::HopperGemmArgs& args, int units,
                       cudaStream_t stream) {
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int resident = cluster > 1 ? detail::resident_clusters(reinterpret_cast<const void*>(kernel), cluster,
                                                               kernels::kHopperThreads, smem)
                                   : detail::sm_count();
  const int grid = std::min(units, resident) * cluster;
  FLASHLAB_LAUNCH(kernel, grid, kernels::kHopperThreads, smem, stream, args);
}

// The pingpong kernel's host side (not in the library), 128 x 128 tiles.
template <bool kTransA, bool kTransB, bool kOrdered, int kCluster>
void launch_pingpong(const GemmParams& p, cudaStream_t stream) {
  using namespace kernels;
  int units = 0;
  const HopperGemmArgs args = hopper_args<HopperPingpongTile::kBN, kTransA, kTransB, kCluster>(p, units);
  launch_persistent(gemm_hopper_pingpong_kernel<__nv_bfloat16, kTransA, kTransB, kCluster, kOrdered>,
                    HopperPingpongTile::kSmemBytes, kCluster, args, units, stream);
}

// Rung 9 NN with CTA pairs and 128 x 256 tiles (the library's choice at the square shapes) and
// epilogue variant kEpi (kernels::HopperEpi).
template <int kEpi, bool kProbe = false>
void launch_ws_epi(const GemmParams& p, cudaStream_t stream) {
  using namespace kernels;
  int units = 0;
  const HopperGemmArgs args = hopper_args<256, false, true, 2>(p, units);
  launch_persistent(gemm_hopper_ws_kernel<__nv_bfloat16, 256, false, true, 2, kEpi, kProbe>,
                    HopperTile<256, kEpi>::kSmemBytes, 2, args, units, stream);
}

// NN as the library would run it: CTA pairs when there are two tile rows, else single CTAs.
template <bool kOrdered>
void launch_pingpong_nn(const GemmParams& p, cudaStream_t stream) {
  if (detail::ceil_div(p.M, kernels::kHopperBM) >= 2) launch_pingpong<false, true, kOrdered, 2>(p, stream);
  else launch_pingpong<false, true, kOrdered, 1>(p, stream);
}

// One GEMM's bf16 operands in `layout` (leading dims padded to 16 bytes), A and B pseudo-random,
// C, and cuBLAS's C in c_ref.
struct Operands {
  GemmParams p{};
  void* c_ref = nullptr;
  size_t c_elems = 0;
  Operands(const Shape& s, Layout layout, cudaStream_t stream) {
    p.M = s.m;
    p.N = s.n;
    p.K = s.k;
    p.alpha = 1.f;
    // A: row-major (M, K), or column-major (layout TN) stored as (K, M) rows.
    const bool a_cols = layout == Layout::kTN;
    const int64_t lda = pad8(a_cols ? s.m : s.k), rows_a = a_cols ? s.k : s.m;
    p.a_row = a_cols ? 1 : lda;
    p.a_col = a_cols ? lda : 1;
    // B: row-major (K, N), or (layout NT) an (N, K) weight stored as (N, K) rows.
    const bool b_nk = layout == Layout::kNT;
    const int64_t ldb = pad8(b_nk ? s.k : s.n), rows_b = b_nk ? s.n : s.k;
    p.b_row = b_nk ? 1 : ldb;
    p.b_col = b_nk ? ldb : 1;
    p.ldc = pad8(s.n);
    c_elems = static_cast<size_t>(s.m) * p.ldc;
    void *a, *b;
    FLASHLAB_CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(rows_a) * lda * 2));
    FLASHLAB_CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(rows_b) * ldb * 2));
    FLASHLAB_CUDA_CHECK(cudaMalloc(&p.c, c_elems * 2));
    FLASHLAB_CUDA_CHECK(cudaMalloc(&c_ref, c_elems * 2));
    bench::fill_random(a, rows_a * lda, 1, 1, stream);
    bench::fill_random(b, rows_b * ldb, 1, 2, stream);
    p.a = a;
    p.b = b;
  }
  ~Operands() {
    cudaFree(const_cast<void*>(p.a));
    cudaFree(const_cast<void*>(p.b));
    cudaFree(p.c);
    cudaFree(c_ref);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
};

// cuBLAS into c: row-major C = A B is column-major C^T = B^T A^T; an operand whose k stride is
// 1 (K-major) enters transposed.
void cublas_gemm(cublasHandle_t handle, const GemmParams& p, void* c) {
  const float one = 1.f, zero = 0.f;
  const bool b_n = p.b_col == 1, a_n = p.a_col == 1;
  cublasGemmEx(handle, b_n ? CUBLAS_OP_N : CUBLAS_OP_T, a_n ? CUBLAS_OP_N : CUBLAS_OP_T, p.N, p.M, p.K, &one, p.b,
               CUDA_R_16BF, static_cast<int>(b_n ? p.b_row : p.b_col), p.a, CUDA_R_16BF,
               static_cast<int>(a_n ? p.a_row : p.a_col), &zero, c, CUDA_R_16BF, static_cast<int>(p.ldc),
               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Check {
  double rel = 0;       // max |C - C_ref| / max |C_ref| over the M x N values
  int64_t nan = 0;      // NaN / inf values left in the M x N values
  int64_t padding = 0;  // padding values (columns N..ldc) no longer the poison
  bool ok() const { return rel <= 1.0 / 128 && nan == 0 && padding == 0; }
};

// Runs `launch` once on C poisoned with NaN and compares C with o.c_ref (cuBLAS's result).
Check check_once(const Operands& o, const std::function<void()>& launch, cudaStream_t stream) {
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(o.p.c, 0xFF, o.c_elems * 2, stream));
  launch();
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> c(o.c_elems), ref(o.c_elems);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(c.data(), o.p.c, o.c_elems * 2, cudaMemcpyDeviceToHost));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(ref.data(), o.c_ref, o.c_elems * 2, cudaMemcpyDeviceToHost));
  Check r;
  double max_diff = 0, max_ref = 0;
  for (int64_t m = 0; m < o.p.M; ++m) {
    for (int64_t n = 0; n < o.p.ldc; ++n) {
      const size_t i = static_cast<size_t>(m * o.p.ldc + n);
      if (n >= o.p.N) {
        r.padding += c[i] != 0xFFFF;
        continue;
      }
      const float v = bf16_bits_to_float(c[i]), want = bf16_bits_to_float(ref[i]);
      if (!std::isfinite(v)) {
        ++r.nan;
        continue;
      }
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(v) - want));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want)));
    }
  }
  r.rel = max_ref > 0 ? max_diff / max_ref : max_diff;
  return r;
}

// Prints one check and appends it to the JSON list; false on failure.
bool report(const char* shape, const char* layout, const char* kernel, const Check& r, std::string& json) {
  const bool ok = r.ok();
  std::printf("  %-16s %s %-22s max|diff|/max|ref| %.3e  NaN %lld  padding written %lld  %s\n", shape, layout, kernel,
              r.rel, static_cast<long long>(r.nan), static_cast<long long>(r.padding), ok ? "ok" : "FAIL");
  if (!ok)
    std::fprintf(stderr, "FAIL: %s %s %s: max|diff|/max|ref| %.3e (limit 2^-7), %lld NaN, %lld padding values written\n",
                 shape, layout, kernel, r.rel, static_cast<long long>(r.nan), static_cast<long long>(r.padding));
  char row[320];
  std::snprintf(row, sizeof(row),
                "%s{\"shape\": \"%s\", \"layout\": \"%s\", \"kernel\": \"%s\", \"rel_err\": %.4e, \"nan\": %lld, "
                "\"padding_written\": %lld, \"ok\": %s}",
                json.size() > 1 ? ", " : "", shape, layout, kernel, r.rel, static_cast<long long>(r.nan),
                static_cast<long long>(r.padding), ok ? "true" : "false");
  json += row;
  return ok;
}

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
  {  // the same for the pingpong kernel
    const auto kernel = kernels::gemm_hopper_pingpong_kernel<__nv_bfloat16, false, true, 2, false>;
    constexpr int smem = kernels::HopperPingpongTile::kSmemBytes;
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int pairs = detail::resident_clusters(reinterpret_cast<const void*>(kernel), 2, kernels::kHopperThreads, smem);
    std::printf("pingpong: resident CTA pairs (%d KB shared memory): %d\n", smem / 1024, pairs);
  }
  if (argc > 1 && std::string(argv[1]) == "--profile") {
    // For Nsight Compute: 4096^3 NN, cuBLAS then rung 9 (pairs), three launches each, nothing else
    // (ncu -k regex:... --launch-skip 2 --launch-count 1 picks the third of each).
    Operands o({4096, 4096, 4096}, Layout::kNN, h.stream());
    for (int i = 0; i < 3; ++i) cublas_gemm(handle, o.p, o.p.c);
    for (int i = 0; i < 3; ++i) detail::launch_gemm_hopper(o.p, DType::kBF16, h.stream(), true);
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--probe") {
    // Where a CTA's time goes (rung 9's kernel, NN, 128 x 256 tiles, CTA pairs, with kProbe):
    // clock64() around consumer 0's waits for full stages, its final wgmma drain per tile and its
    // epilogues, and around the producer's waits for empty stages; averaged over the CTAs of one
    // launch after warm-up. The probe kernel is timed beside the plain one (its own cost).
    const auto probe_one = [&](const Shape& s, auto epi, const char* epi_name) {
      constexpr int kEpi = decltype(epi)::value;
      Operands o(s, Layout::kNN, h.stream());
      const double plain_ms = h.time_ms([&] { launch_ws_epi<kEpi>(o.p, h.stream()); });
      const double probe_ms = h.time_ms([&] { launch_ws_epi<kEpi, true>(o.p, h.stream()); });
      static long long zero[1024][kernels::kProbeSlots];
      FLASHLAB_CUDA_CHECK(cudaMemcpyToSymbol(kernels::hopper_probe, zero, sizeof(zero)));
      launch_ws_epi<kEpi, true>(o.p, h.stream());
      FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
      static long long got[1024][kernels::kProbeSlots];
      FLASHLAB_CUDA_CHECK(cudaMemcpyFromSymbol(got, kernels::hopper_probe, sizeof(got)));
      double sum[kernels::kProbeSlots] = {};
      int ctas = 0;
      for (int b = 0; b < 1024; ++b) {
        if (got[b][kernels::kProbeTotal] <= 0) continue;
        ++ctas;
        for (int i = 0; i < kernels::kProbeSlots; ++i) sum[i] += static_cast<double>(got[b][i]);
      }
      const double total = sum[kernels::kProbeTotal];
      std::printf("%dx%dx%d NN, %s: plain %.1f TF/s, probe %.1f TF/s; %d CTAs, %.0f cycles each: full-stage waits "
                  "%.1f%%, drain %.1f%%, epilogue %.1f%% (staging free: %.1f%%, staging writes: %.1f%%), producer "
                  "empty-stage waits %.1f%%\n",
                  s.m, s.n, s.k, epi_name, tflops(s, plain_ms), tflops(s, probe_ms), ctas, total / std::max(ctas, 1),
                  100 * sum[kernels::kProbeFullWait] / total, 100 * sum[kernels::kProbeDrain] / total,
                  100 * sum[kernels::kProbeEpilogue] / total, 100 * sum[kernels::kProbeEpiWait] / total,
                  100 * sum[kernels::kProbeEpiWrite] / total, 100 * sum[kernels::kProbeEmptyWait] / total);
    };
    for (const Shape& s : {Shape{4096, 4096, 4096}, Shape{8192, 8192, 8192}, Shape{2048, 12288, 4096}}) {
      probe_one(s, std::integral_constant<int, kernels::kHopperEpiStaged>{}, "library (TMA store, math test hoisted)");
      probe_one(s, std::integral_constant<int, kernels::kHopperEpiStagedCopy>{}, "copy-out");
      probe_one(s, std::integral_constant<int, kernels::kHopperEpiStagedTestPerValue>{}, "math test per value");
    }
    cublasDestroy(handle);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--epilogue-copy") {
    // The staged epilogue copied out by the consumers (16-byte loads and stores), and with the
    // alpha / beta / bias test per value, against the rung's (TMA store, test hoisted),
    // alternating with cuBLAS as --alternate, checked after the timings.
    for (const Shape& s : {Shape{4096, 4096, 4096}, Shape{8192, 8192, 8192}, Shape{2048, 12288, 4096}}) {
      Operands o(s, Layout::kNN, h.stream());
      std::printf("%dx%dx%d NN (TF/s cuBLAS / library / copy-out / test per value):", s.m, s.n, s.k);
      std::vector<double> r_tma, r_copy, r_pv;
      for (int round = 0; round < 6; ++round) {
        const double cb = h.time_ms([&] { cublas_gemm(handle, o.p, o.p.c); });
        const double tma = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiStaged>(o.p, h.stream()); });
        const double cp = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiStagedCopy>(o.p, h.stream()); });
        const double pv = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiStagedTestPerValue>(o.p, h.stream()); });
        r_tma.push_back(cb / tma);
        r_copy.push_back(cb / cp);
        r_pv.push_back(cb / pv);
        std::printf(" %.0f/%.0f/%.0f/%.0f", tflops(s, cb), tflops(s, tma), tflops(s, cp), tflops(s, pv));
      }
      std::sort(r_tma.begin(), r_tma.end());
      std::sort(r_copy.begin(), r_copy.end());
      std::sort(r_pv.begin(), r_pv.end());
      cublas_gemm(handle, o.p, o.c_ref);
      const Check c = check_once(o, [&] { launch_ws_epi<kernels::kHopperEpiStagedCopy>(o.p, h.stream()); }, h.stream());
      const Check c2 = check_once(o, [&] { launch_ws_epi<kernels::kHopperEpiStagedTestPerValue>(o.p, h.stream()); }, h.stream());
      std::printf("  median x cuBLAS: library %.3f, copy-out %.3f, test per value %.3f; rel err copy-out %.2e %s, "
                  "test per value %.2e %s\n",
                  0.5 * (r_tma[2] + r_tma[3]), 0.5 * (r_copy[2] + r_copy[3]), 0.5 * (r_pv[2] + r_pv[3]), c.rel,
                  c.ok() ? "ok" : "FAIL", c2.rel, c2.ok() ? "ok" : "FAIL");
    }
    cublasDestroy(handle);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--alternate") {
    // Does the ratio to cuBLAS depend on when each is timed? (The benchmark times cuBLAS first,
    // then rungs 7 and 8 for seconds, then rung 9.) Per shape, 8 rounds of cuBLAS and rung 9 as
    // the library launches it, the order swapped every round, each a median of the harness.
    const std::vector<std::pair<Shape, Layout>> cases = {
        {{4096, 4096, 4096}, Layout::kNN}, {{4096, 4096, 4096}, Layout::kNT}, {{4096, 4096, 4096}, Layout::kTN},
        {{8192, 8192, 8192}, Layout::kNN}, {{2048, 12288, 4096}, Layout::kNN}, {{128, 12288, 4096}, Layout::kNN}};
    for (const auto& [s, layout] : cases) {
      Operands o(s, layout, h.stream());
      std::vector<double> ratios;
      std::printf("%dx%dx%d %s:", s.m, s.n, s.k, layout_name(layout));
      for (int round = 0; round < 8; ++round) {
        const auto time_cublas = [&] { return h.time_ms([&] { cublas_gemm(handle, o.p, o.p.c); }); };
        const auto time_rung = [&] { return h.time_ms([&] { detail::launch_gemm_hopper(o.p, DType::kBF16, h.stream()); }); };
        double cb, r9;
        if (round % 2 == 0) {
          cb = time_cublas();
          r9 = time_rung();
        } else {
          r9 = time_rung();
          cb = time_cublas();
        }
        ratios.push_back(cb / r9);
        std::printf(" %.1f/%.1f", tflops(s, r9), tflops(s, cb));
      }
      std::vector<double> sorted = ratios;
      std::sort(sorted.begin(), sorted.end());
      std::printf("  (TF/s rung 9 / cuBLAS per round) ratio min %.3f median %.3f max %.3f\n", sorted.front(),
                  0.5 * (sorted[3] + sorted[4]), sorted.back());
    }
    cublasDestroy(handle);
    return 0;
  }
  bool all_ok = true;
  std::string checks = "[";

  // Correctness at ragged shapes first (quick; a hang or a wrong result shows before the timings).
  std::printf("correctness (C poisoned with NaN, against cuBLAS; limit 2^-7):\n");
  // Tails in M, N (ragged 16-byte rows: stores from registers) and K; one tile row (single CTAs
  // for NN); an odd count of tile rows (a pair's second CTA idle); several tiles per CTA with 16
  // k-blocks and with 2 (fewer than the stages: the ring holds both consumers' tiles at once).
  const std::vector<Shape> ragged = {{1000, 1000, 1000}, {129, 257, 77},    {77, 520, 333},
                                     {300, 1000, 40},    {2500, 3001, 1000}, {4000, 4000, 100}};
  for (const Shape& s : ragged) {
    char name[64];
    std::snprintf(name, sizeof(name), "%dx%dx%d", s.m, s.n, s.k);
    for (Layout layout : {Layout::kNN, Layout::kNT, Layout::kTN}) {
      Operands o(s, layout, h.stream());
      cublas_gemm(handle, o.p, o.c_ref);
      const GemmParams& p = o.p;
      const auto run = [&](const char* kernel, const std::function<void()>& launch) {
        all_ok &= report(name, layout_name(layout), kernel, check_once(o, launch, h.stream()), checks);
      };
      run("rung 9 (pairs)", [&] { detail::launch_gemm_hopper(p, DType::kBF16, h.stream(), true); });
      if (layout == Layout::kNN) {
        run("epilogue whole staging", [&] { launch_ws_epi<kernels::kHopperEpiStagedWhole>(p, h.stream()); });
        run("epilogue registers", [&] { launch_ws_epi<kernels::kHopperEpiRegisters>(p, h.stream()); });
        run("epilogue staged, copied out", [&] { launch_ws_epi<kernels::kHopperEpiStagedCopy>(p, h.stream()); });
        run("epilogue staged, math test per value", [&] { launch_ws_epi<kernels::kHopperEpiStagedTestPerValue>(p, h.stream()); });
        run("pingpong", [&] { launch_pingpong_nn<false>(p, h.stream()); });
        run("pingpong ordered", [&] { launch_pingpong_nn<true>(p, h.stream()); });
      } else if (layout == Layout::kNT) {  // pairs even for one tile row (the second CTA stores nothing)
        run("pingpong ordered (pairs)", [&] { launch_pingpong<false, false, true, 2>(p, h.stream()); });
      } else {
        run("pingpong ordered (pairs)", [&] { launch_pingpong<true, true, true, 2>(p, h.stream()); });
      }
    }
  }

  const std::vector<Shape> shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}, {2048, 12288, 4096}, {128, 12288, 4096}};
  std::string json = "[";
  // Epilogue variants of rung 9 (NN, 128 x 256 tiles, CTA pairs), each checked after its timing.
  std::printf("%-20s %12s %12s %12s %12s %9s %9s %9s\n", "M x N x K (NN bf16)", "cuBLAS", "staged 128",
              "staged whole", "registers", "st128/cB", "whole/cB", "regs/cB");
  std::string epi_json = "[";
  for (const Shape& s : shapes) {
    if (s.m < 2 * kernels::kHopperBM) continue;  // pairs need two tile rows
    Operands o(s, Layout::kNN, h.stream());
    const GemmParams& p = o.p;
    const double cublas_ms = h.time_ms([&] { cublas_gemm(handle, p, p.c); });
    const double staged_ms = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiStaged>(p, h.stream()); });
    const double whole_ms = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiStagedWhole>(p, h.stream()); });
    const double regs_ms = h.time_ms([&] { launch_ws_epi<kernels::kHopperEpiRegisters>(p, h.stream()); });
    char name[64];
    std::snprintf(name, sizeof(name), "%dx%dx%d", s.m, s.n, s.k);
    std::printf("%-20s %7.1f TF/s %7.1f TF/s %7.1f TF/s %7.1f TF/s %8.3fx %8.3fx %8.3fx\n", name, tflops(s, cublas_ms),
                tflops(s, staged_ms), tflops(s, whole_ms), tflops(s, regs_ms), cublas_ms / staged_ms,
                cublas_ms / whole_ms, cublas_ms / regs_ms);
    cublas_gemm(handle, p, o.c_ref);
    all_ok &= report(name, "NN", "epilogue whole staging",
                     check_once(o, [&] { launch_ws_epi<kernels::kHopperEpiStagedWhole>(p, h.stream()); }, h.stream()), checks);
    all_ok &= report(name, "NN", "epilogue registers",
                     check_once(o, [&] { launch_ws_epi<kernels::kHopperEpiRegisters>(p, h.stream()); }, h.stream()), checks);
    char row[256];
    std::snprintf(row, sizeof(row),
                  "%s{\"shape\": \"%s\", \"cublas_ms\": %.5f, \"staged128_ms\": %.5f, \"staged_whole_ms\": %.5f, "
                  "\"registers_ms\": %.5f}",
                  epi_json.size() > 1 ? ", " : "", name, cublas_ms, staged_ms, whole_ms, regs_ms);
    epi_json += row;
  }
  epi_json += "]";
  std::printf("%-20s %12s %12s %12s %12s %12s %9s %9s %9s %9s\n", "M x N x K (NN bf16)", "cuBLAS", "single CTAs",
              "CTA pairs", "pingpong", "pp ordered", "single/cB", "pairs/cB", "pp/cB", "ppo/cB");
  for (const Shape& s : shapes) {
    Operands o(s, Layout::kNN, h.stream());
    const GemmParams& p = o.p;
    const double cublas_ms = h.time_ms([&] { cublas_gemm(handle, p, p.c); });
    const double single_ms = h.time_ms([&] { detail::launch_gemm_hopper(p, DType::kBF16, h.stream(), false); });
    const double pairs_ms = h.time_ms([&] { detail::launch_gemm_hopper(p, DType::kBF16, h.stream(), true); });
    // Pingpong: CTA pairs (single CTAs at M = 128, one tile row, as the library's "pairs" column).
    const double pp_ms = h.time_ms([&] { launch_pingpong_nn<false>(p, h.stream()); });
    const double ppo_ms = h.time_ms([&] { launch_pingpong_nn<true>(p, h.stream()); });
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
    char name[64];
    std::snprintf(name, sizeof(name), "%dx%dx%d", s.m, s.n, s.k);
    std::printf("%-20s %7.1f TF/s %7.1f TF/s %7.1f TF/s %7.1f TF/s %7.1f TF/s %8.3fx %8.3fx %8.3fx %8.3fx\n", name,
                tflops(s, cublas_ms), tflops(s, single_ms), tflops(s, pairs_ms), tflops(s, pp_ms), tflops(s, ppo_ms),
                cublas_ms / single_ms, cublas_ms / pairs_ms, cublas_ms / pp_ms, cublas_ms / ppo_ms);
    cublas_gemm(handle, p, o.c_ref);
    const Check pp = check_once(o, [&] { launch_pingpong_nn<false>(p, h.stream()); }, h.stream());
    const Check ppo = check_once(o, [&] { launch_pingpong_nn<true>(p, h.stream()); }, h.stream());
    all_ok &= report(name, "NN", "pingpong", pp, checks);
    all_ok &= report(name, "NN", "pingpong ordered", ppo, checks);
    char row[512];
    std::snprintf(row, sizeof(row),
                  "%s{\"shape\": \"%s\", \"cublas_ms\": %.5f, \"single_ms\": %.5f, \"pairs_ms\": %.5f, "
                  "\"pingpong_ms\": %.5f, \"pingpong_ordered_ms\": %.5f, \"pingpong_rel_err\": %.4e, "
                  "\"pingpong_ordered_rel_err\": %.4e, \"pingpong_ok\": %s}",
                  json.size() > 1 ? ", " : "", name, cublas_ms, single_ms, pairs_ms, pp_ms, ppo_ms, pp.rel, ppo.rel,
                  pp.ok() && ppo.ok() ? "true" : "false");
    json += row;
  }
  json += "]";
  checks += "]";
  cudaDeviceProp prop{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* commit = std::getenv("FLASHLAB_COMMIT");
  json = std::string("{\"device\": \"") + prop.name + "\", \"commit\": \"" + (commit ? commit : "unknown") +
         "\", \"rows\": " + json + ", \"epilogue_rows\": " + epi_json + ", \"checks\": " + checks + ", \"all_ok\": " + (all_ok ? "true" : "false") + "}\n";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  cublasDestroy(handle);
  if (!all_ok) {
    std::fprintf(stderr, "FAIL: a pingpong (or rung 9) result differs from cuBLAS; see the lines marked FAIL above\n");
    return 1;
  }
  return 0;
}
