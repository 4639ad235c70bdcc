// Benchmark cases of the GEMM ladder: C = A @ B (alpha 1, beta 0, no bias). Rung 0 is cuBLAS in
// the same run (impl "cublas"), then every flashlab rung that takes the dtype and layout:
//   fp32  cublasSgemm in the default math mode: fp32 FMA (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH,
//         never set here), like rungs 1-6.
//   bf16  cublasGemmEx, bf16 in and out, CUBLAS_COMPUTE_32F (fp32 accumulation), like rungs 1, 7-9
//         and the harness's bf16 GEMM peak.
// cuBLAS is column-major: the row-major C = A B is its column-major C^T = B^T A^T, so B goes first.
// Layouts (shape key "layout"): NN (A (M, K), B (K, N) row-major), NT (B a column-major view of an
// (N, K) weight) and TN (A a column-major view of a (K, M) tensor); rungs 2-8 take NN only.
// Shapes: fp32 2048^3 (every rung) and 4096^3 (rungs 2-6: rung 1, one thread per output from
// global memory, is left at 2048^3, where it already takes most of the case's time); bf16 2048^3
// (rungs 1, 7-9), 4096^3 and 8192^3 (rungs 7-9), the LLM projections M = 128 and 2048 tokens x
// N = 12288 x K = 4096 (rungs 8, 9), NT and TN at 4096^3 (rung 9). --quick halves the squares,
// drops 8192^3 and M = 2048. cuBLAS runs every shape.
// Bytes: (MK + KN + MN) x dtype size, each operand once; FLOPs: 2MNK.
// After each rung its output is compared with cuBLAS's (max |diff| / max |cuBLAS|, printed): a
// swapped operand or a wrong layout would be as fast and wrong. The tests hold the numerics.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/gemm.h"

namespace flashlab::bench {

namespace {

const char* const kGemmRungNames[] = {"",           "naive",       "coalesced", "smem_tiled", "register_blocking",
                                      "vec16_transposed_a", "warp_tiling", "wmma",      "mma_sync",   "hopper_ws"};
static_assert(sizeof(kGemmRungNames) / sizeof(kGemmRungNames[0]) == kGemmRungs + 1, "one name per rung");
constexpr int kHopperRung = 9;  // sm_90 only

#define GEMM_CUBLAS_OK(call)                                                                              \
  do {                                                                                                    \
    const cublasStatus_t st_ = (call);                                                                    \
    FLASHLAB_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error ", static_cast<int>(st_), " from " #call); \
  } while (0)

enum class Layout { kNN, kNT, kTN };

struct GemmCase {
  int64_t m, n, k;
  Layout layout;
  std::vector<int> rungs;  // flashlab rungs measured here; cuBLAS always
};

const char* layout_name(Layout l) { return l == Layout::kNN ? "NN" : l == Layout::kNT ? "NT" : "TN"; }

std::vector<GemmCase> gemm_cases(DType dt, bool quick) {
  const Layout NN = Layout::kNN, NT = Layout::kNT, TN = Layout::kTN;
  if (dt == DType::kF32) {
    const int64_t s = quick ? 1024 : 2048;
    return {{s, s, s, NN, {1, 2, 3, 4, 5, 6}}, {2 * s, 2 * s, 2 * s, NN, {2, 3, 4, 5, 6}}};
  }
  const int64_t s = quick ? 1024 : 2048;
  std::vector<GemmCase> cases = {{s, s, s, NN, {1, 7, 8, 9}}, {2 * s, 2 * s, 2 * s, NN, {7, 8, 9}}};
  if (!quick) cases.push_back({8192, 8192, 8192, NN, {7, 8, 9}});
  cases.push_back({128, 12288, 4096, NN, {8, 9}});
  if (!quick) cases.push_back({2048, 12288, 4096, NN, {8, 9}});
  cases.push_back({2 * s, 2 * s, 2 * s, NT, {9}});
  cases.push_back({2 * s, 2 * s, 2 * s, TN, {9}});
  return cases;
}

// Row-major C = A B through column-major cuBLAS: C^T (N x M, ld N) = op(B) op(A). Row-major B
// (K, N) read column-major is B^T (ld N); a column-major B (stored (N, K)) read column-major is B
// (ld K), transposed by the op. Same for A with M.
void cublas_gemm(cublasHandle_t handle, DType dt, const GemmCase& g, const void* a, const void* b, void* c) {
  const bool a_col = g.layout == Layout::kTN, b_col = g.layout == Layout::kNT;
  const cublasOperation_t op_b = b_col ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = a_col ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int ldb = b_col ? k : n, lda = a_col ? m : k;
  const float alpha = 1.f, beta = 0.f;
  if (dt == DType::kF32) {
    GEMM_CUBLAS_OK(cublasSgemm(handle, op_b, op_a, n, m, k, &alpha, static_cast<const float*>(b), ldb,
                               static_cast<const float*>(a), lda, &beta, static_cast<float*>(c), n));
  } else {
    GEMM_CUBLAS_OK(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &beta,
                                c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// out[0] = max |x - y| (infinity where either is NaN), out[1] = max |y|, as float bits (finite
// non-negative floats order like their bits).
template <typename T>
__global__ void max_abs_diff_kernel(const T* x, const T* y, int64_t n, unsigned* out) {
  float d = 0.f, m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = as_float(x[i]), b = as_float(y[i]), e = fabsf(a - b);
    d = e == e ? fmaxf(d, e) : INFINITY;
    m = fmaxf(m, fabsf(b));
  }
  atomicMax(out, __float_as_uint(d));
  atomicMax(out + 1, __float_as_uint(m));
}

int cc_major() {
  int dev = 0, major = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
}

}  // namespace

double relative_difference(const void* got, const void* want, int64_t n, DType dt, cudaStream_t s) {
  DeviceMem out(2 * sizeof(unsigned));
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(out.p, 0, 2 * sizeof(unsigned), s));
  if (dt == DType::kF32)
    max_abs_diff_kernel<<<1024, 256, 0, s>>>(static_cast<const float*>(got), static_cast<const float*>(want), n,
                                             static_cast<unsigned*>(out.p));
  else
    max_abs_diff_kernel<<<1024, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(got),
                                             static_cast<const __nv_bfloat16*>(want), n, static_cast<unsigned*>(out.p));
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  float host[2];
  FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(host, out.p, sizeof host, cudaMemcpyDeviceToHost, s));
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  return host[1] > 0 ? host[0] / host[1] : host[0];
}

void bench_gemm(Harness& h, DType dt) {
  const int es = dtype_size(dt);
  const int cc = cc_major();
  // Agreement with cuBLAS: a few output units (bf16: 2^-8) of the largest value; fp32 sums of
  // 4096 products in another order differ by far less than 1e-4.
  const double agree = dt == DType::kF32 ? 1e-4 : 2e-2;
  cublasHandle_t handle;
  GEMM_CUBLAS_OK(cublasCreate(&handle));
  GEMM_CUBLAS_OK(cublasSetStream(handle, h.stream()));
  GEMM_CUBLAS_OK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  for (const GemmCase& g : gemm_cases(dt, h.options().quick)) {
    const int64_t m = g.m, n = g.n, k = g.k;
    DeviceMem a(static_cast<size_t>(m * k) * es), b(static_cast<size_t>(k * n) * es), c(static_cast<size_t>(m * n) * es),
        c_cublas(static_cast<size_t>(m * n) * es);
    fill_random(a.p, m * k, dt == DType::kBF16, 61, h.stream());
    fill_random(b.p, k * n, dt == DType::kBF16, 62, h.stream());
    const Device gpu{DeviceType::kCUDA, 0};
    // NT: B stored (N, K); TN: A stored (K, M); both viewed (K, N) / (M, K) through strides.
    const TensorView av = g.layout == Layout::kTN ? TensorView(a.p, dt, {m, k}, {1, m}, gpu) : view(a.p, dt, {m, k});
    const TensorView bv = g.layout == Layout::kNT ? TensorView(b.p, dt, {k, n}, {1, k}, gpu) : view(b.p, dt, {k, n});
    const TensorView cv = view(c.p, dt, {m, n});
    auto row = [&](const char* impl, const char* rung_name, int rung, double ms) {
      Row r;
      r.op = "gemm";
      r.impl = impl;
      r.rung_name = rung_name;
      r.dtype = dtype_name(dt);
      r.rung = rung;
      r.shape = {{"m", m}, {"n", n}, {"k", k}};
      r.shape_text = {{"layout", layout_name(g.layout)}};
      r.ms = ms;
      r.bytes = static_cast<double>(m * k + k * n + m * n) * es;
      r.flops = 2.0 * m * n * k;
      return r;
    };

    h.add(row("cublas", "", 0, h.time_ms([&] { cublas_gemm(handle, dt, g, a.p, b.p, c_cublas.p); })));
    for (int rung : g.rungs) {
      if (rung == kHopperRung && cc < 9) {
        std::printf("gemm rung %d: skipped (needs sm_90, this device is sm_%d0)\n", rung, cc);
        continue;
      }
      double ms = 0;
      try {
        ms = h.time_ms([&] { gemm(av, bv, cv, h.stream(), rung); });
      } catch (const Error& e) {
        // A rung the library refuses (say, not built into this tree yet) is reported and skipped;
        // after a CUDA error the context is unusable, so that ends the run.
        if (std::string(e.what()).rfind("CUDA error", 0) == 0) throw;
        std::fprintf(stderr, "gemm %s rung %d: skipped: %s\n", dtype_name(dt), rung, e.what());
        continue;
      }
      h.add(row("flashlab", kGemmRungNames[rung], rung, ms));
      const double diff = relative_difference(c.p, c_cublas.p, m * n, dt, h.stream());
      std::printf("  rung %d vs cuBLAS: max |diff| / max |cuBLAS| = %.2e%s\n", rung, diff,
                  diff <= agree ? "" : "  MISMATCH");
    }
  }
  cublasDestroy(handle);
}

}  // namespace flashlab::bench
