// Experiment (not a rung): where the time of softmax rung 4 goes at the sampling shape
// (64 x 128256 bf16), and what the same structure costs without the arithmetic.
// Built as build/*/bench/experiment_softmax_long_rows; its output on an H100 is quoted in
// docs/ladder/softmax.md. Inputs are pseudo-random in [-1, 1].
//
// Variants of rung 4's cluster kernel (runtime cluster size through cudaLaunchKernelEx), all
// with the rung's merges as of this file's commit (warp_merge max-then-sum, every warp merging
// the cluster's states):
//   full      the rung's first algorithm (fold as the copies land, cluster merge, write) with
//             __expf (non-ftz ex2 + range fix-up) and a -inf test per value, times 1/s
//   exp2      the same with the base-2 fast path of kernels/common/online_softmax.cuh
//             (one FFMA + one ex2.approx.ftz per value in both phases): the rung since 2026-11-23
//   nofold    phase 1 takes the max only (no exponent): the cost of the fold's MUFU work
//   noexp     phase 2 writes x * (1/s) (no exponent): the cost of the output's MUFU work
//   copy      cp.async into shared memory, cluster barrier, write back: the structure alone
//   copy_nosync  the same without the cluster barrier
//   (--arrival: whether the fold can run under the loads, outputs checked against exp2)
//   exp2_after    the exp2 fold started only after all copies landed
//   copy_bulk     one cp.async.bulk per piece of blockDim vectors, each on its own mbarrier
//   exp2_bulk     those pieces folded in piece order
//   exp2_ooo      folded in the order they land (polling the mbarriers), one state per piece,
//                 merged in piece order (a result independent of arrival order)
//   exp2_two      after all copies: the thread's max (packed bf16), then one exponent per value
//   exp2_two_poly the same with a quarter of the exponents by exp2_poly3_nonpos
//   (--rung: the rung's own kernel with and without that polynomial share, alternated)
//   (--window: the rung's own kernel with 16 .. 1 copies in flight per thread ahead of its fold)
//   (--stagger, rows started in groups or ramps through a load-phase hook of the rung: this
//    file and the hook at commit aa8960a; results softmax_long_rows_stagger_run*.txt; not kept)
//   (--policy: the rung's kernel under each cluster scheduling policy, and the probe's SM count)
// plus a plain 16-byte grid-stride copy kernel and cudaMemcpyAsync of the same bytes, and an
// empty kernel with the same grid, clusters and shared memory (the launch alone). A probe
// run records per-block timestamps (globaltimer at start/end, clock64 at each phase).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/harness.h"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/softmax/04_long_rows.cuh"
#include "kernels/softmax/params.h"

using namespace flashlab;
using namespace flashlab::kernels;
namespace cg = cooperative_groups;

enum Mode { kFull, kNoFold, kNoExp, kCopy, kCopyNoSync, kEmpty, kExp2, kExp2After, kCopyBulk, kExp2Bulk, kExp2Ooo, kExp2Two, kExp2TwoPoly };
constexpr int kMaxPieces = 8;   // bulk modes: piece k = vectors [k * blockDim, (k + 1) * blockDim) of the chunk

// Non-blocking test of an mbarrier phase (the bulk modes poll their pieces in any order).
__device__ __forceinline__ bool mbarrier_test(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return ok != 0;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

constexpr int kStamps = 8;  // per block: gt start, clk start, clk fold, clk cluster sync, clk merged, clk out, gt end, smid

template <typename T, int kMode>
__global__ void __launch_bounds__(kMode >= kExp2Ooo ? 256 : 512, kMode >= kExp2Ooo ? 5 : 1) probe_kernel(const __grid_constant__ SoftmaxParams p, int64_t chunk_vecs,
                                                    unsigned long long* stamps) {
  using V = Vec<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* chunk = reinterpret_cast<V*>(smem_raw);
  __shared__ OnlineSoftmaxState block_state;
  unsigned long long st0 = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0;
  if (stamps != nullptr && threadIdx.x == 0) {
    st0 = global_ns();
    c0 = clock64();
  }
  if constexpr (kMode != kEmpty) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int nc = static_cast<int>(cluster.num_blocks());
  const int64_t r = blockIdx.x / nc;
  const int64_t nvec = p.cols / V::kN;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  const int64_t n = (v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec) - v0;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride + v0 * V::kN;
  T* out = static_cast<T*>(p.out) + r * p.out_stride + v0 * V::kN;
  const int nk = n > threadIdx.x ? static_cast<int>((n - 1 - threadIdx.x) / blockDim.x + 1) : 0;
  OnlineSoftmaxState st = online_softmax_empty();
  constexpr bool kBulk = kMode == kCopyBulk || kMode == kExp2Bulk || kMode == kExp2Ooo;
  __shared__ uint64_t bars[kMaxPieces];
  const int npieces = n > 0 ? static_cast<int>((n + blockDim.x - 1) / blockDim.x) : 0;  // <= kMaxPieces
  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      for (int k = 0; k < npieces; ++k) mbarrier_init(&bars[k], 1);
      fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < npieces; ++k) {
        const int64_t first = static_cast<int64_t>(k) * blockDim.x;
        const uint32_t bytes = static_cast<uint32_t>((n - first < blockDim.x ? n - first : blockDim.x) * sizeof(V));
        mbarrier_arrive_expect_tx(&bars[k], bytes);
        bulk_load(chunk + first, in + first * V::kN, bytes, &bars[k]);
      }
    }
  } else {
    for (int k = 0; k < nk; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      cp_async_16(&chunk[i], in + i * V::kN);
      cp_async_commit();
    }
  }
  if constexpr (kMode == kCopy || kMode == kCopyNoSync || kMode == kCopyBulk) {
    if constexpr (kBulk) {
      for (int k = 0; k < npieces; ++k) mbarrier_wait(&bars[k], 0);
    } else {
      cp_async_wait<0>();
    }
    if (stamps != nullptr && threadIdx.x == 0) c1 = clock64();
    if constexpr (kMode != kCopyNoSync) cluster.sync();
    if (stamps != nullptr && threadIdx.x == 0) c2 = c3 = clock64();
    for (int k = 0; k < nk; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      store_vec(out + i * V::kN, load_vec(reinterpret_cast<const T*>(chunk + i)));
    }
    if (stamps != nullptr && threadIdx.x == 0) c4 = clock64();
  } else {
    if constexpr (kMode == kExp2Ooo) {
      // Pieces folded in the order they land (each into its own state, no rescale), the states
      // merged in piece order afterwards: the result does not depend on the arrival order.
      float pm[kMaxPieces], ps[kMaxPieces];
#pragma unroll
      for (int k = 0; k < kMaxPieces; ++k) pm[k] = -INFINITY, ps[k] = 0.f;
      uint32_t pending = (1u << npieces) - 1;
      while (pending != 0) {
#pragma unroll
        for (int k = 0; k < kMaxPieces; ++k) {
          if (((pending >> k) & 1u) != 0 && mbarrier_test(&bars[k], 0)) {
            pending &= ~(1u << k);
            if (k < nk) {
              OnlineSoftmaxState one = online_softmax_empty();
              online_softmax_add_vec_exp2(one, load_vec(reinterpret_cast<const T*>(chunk + threadIdx.x + k * blockDim.x)));
              pm[k] = one.m, ps[k] = one.s;
            }
          }
        }
      }
      float m = -INFINITY;
#pragma unroll
      for (int k = 0; k < kMaxPieces; ++k) m = fmaxf(m, pm[k]);
      const float off = m == -INFINITY ? 0.f : m * kLog2e;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kMaxPieces; ++k) s += ps[k] * exp2_approx_ftz(fmaf(pm[k], kLog2e, -off));
      st = {m, s};
    } else if constexpr (kMode == kExp2Two || kMode == kExp2TwoPoly) {
      // All copies landed first (the in-order fold ran after them anyway), then the thread's
      // max by packed bf16 compares, then one exponent per value against it (no rescale).
      cp_async_wait<0>();
      __nv_bfloat162 m2 = __float2bfloat162_rn(-INFINITY);
      for (int k = 0; k < nk; ++k) {
        const uint4 u = *reinterpret_cast<const uint4*>(chunk + threadIdx.x + k * blockDim.x);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
        m2 = __hmax2(m2, __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3])));
      }
      const float m = fmaxf(__low2float(m2), __high2float(m2));
      const float off = m == -INFINITY ? 0.f : m * kLog2e;
      float s0 = 0.f, s1 = 0.f;
      for (int k = 0; k < nk; ++k) {
        const V v = load_vec(reinterpret_cast<const T*>(chunk + threadIdx.x + k * blockDim.x));
#pragma unroll
        for (int j = 0; j < V::kN; ++j) {
          const float t = fmaf(to_float(v.v[j]), kLog2e, -off);
          if (kMode == kExp2TwoPoly && j % 4 == 3) s1 += exp2_poly3_nonpos(t);
          else s0 += exp2_approx_ftz(t);
        }
      }
      st = {m, s0 + s1};
    } else {
    if constexpr (kMode == kExp2After) cp_async_wait<0>();
    for (int k = 0; k < nk; ++k) {
      if constexpr (kMode == kExp2Bulk) {
        mbarrier_wait(&bars[k], 0);
      } else if constexpr (kMode != kExp2After) {
        cp_async_wait_at_most(nk - 1 - k);
      }
      const V v = load_vec(reinterpret_cast<const T*>(chunk + threadIdx.x + static_cast<int64_t>(k) * blockDim.x));
      if constexpr (kMode == kNoFold) {
#pragma unroll
        for (int j = 0; j < V::kN; ++j) st.m = fmaxf(st.m, to_float(v.v[j]));
        st.s += V::kN;
      } else if constexpr (kMode == kExp2 || kMode == kExp2After || kMode == kExp2Bulk) {
        online_softmax_add_vec_exp2(st, v);
      } else {
        online_softmax_add_vec(st, v);
      }
    }
    }
    st = block_all_merge(st);
    if (stamps != nullptr && threadIdx.x == 0) c1 = clock64();
    if (threadIdx.x == 0) block_state = st;
    cluster.sync();
    if (stamps != nullptr && threadIdx.x == 0) c2 = clock64();
    {  // as the rung: every warp merges the cluster's states, no block barrier
      const int lane = threadIdx.x % kWarpSize;
      st = lane < nc ? *cluster.map_shared_rank(&block_state, lane) : online_softmax_empty();
      st = warp_merge(st);
    }
    if (stamps != nullptr && threadIdx.x == 0) c3 = clock64();
    auto arrived = cluster.barrier_arrive();
    const float inv_s = st.s == 0.f ? 0.f : 1.f / st.s;
    const float offset = softmax_exp2_offset(st);
    for (int k = 0; k < nk; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      const V x = load_vec(reinterpret_cast<const T*>(chunk + i));
      V y;
#pragma unroll
      for (int j = 0; j < V::kN; ++j) {
        if constexpr (kMode == kExp2 || kMode == kExp2After || kMode == kExp2Bulk || kMode == kExp2Ooo ||
                      kMode == kExp2Two || kMode == kExp2TwoPoly) {
          y.v[j] = from_float<T>(exp2_approx_ftz(fmaf(to_float(x.v[j]), kLog2e, -offset)));
        } else {
          const float e = kMode == kNoExp ? to_float(x.v[j]) - st.m : exp_below<true>(to_float(x.v[j]), st.m);
          y.v[j] = from_float<T>(e * inv_s);
        }
      }
      store_vec(out + i * V::kN, y);
    }
    if (stamps != nullptr && threadIdx.x == 0) c4 = clock64();
    cluster.barrier_wait(std::move(arrived));
  }
  }  // kMode != kEmpty
  if (stamps != nullptr && threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long* s = stamps + static_cast<int64_t>(blockIdx.x) * kStamps;
    s[0] = st0, s[1] = c0, s[2] = c1, s[3] = c2, s[4] = c3, s[5] = c4, s[6] = global_ns(), s[7] = smid;
  }
}

template <typename T>
__global__ void copy_kernel(const Vec<T>* in, Vec<T>* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_vec(reinterpret_cast<T*>(out + i), in[i]);
}

// --policy: the cluster scheduling policy of every launch through launch() below.
static cudaClusterSchedulingPolicy g_policy = cudaClusterSchedulingPolicyDefault;

template <int kMode>
cudaError_t launch(const SoftmaxParams& p, int cluster, int threads, cudaStream_t s, unsigned long long* stamps) {
  using T = __nv_bfloat16;
  const int64_t nvec = p.cols / Vec<T>::kN;
  const int64_t chunk = (nvec + cluster - 1) / cluster;
  const size_t smem = chunk * sizeof(Vec<T>);
  auto kernel = probe_kernel<T, kMode>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  if (cluster > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.rows * cluster));
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
  attr[1].val.clusterSchedulingPolicyPreference = g_policy;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, p, chunk, stamps);
}

const char* mode_name(int m) {
  static const char* names[] = {"full", "nofold", "noexp", "copy", "copy_nosync", "empty", "exp2",
                                "exp2_after", "copy_bulk", "exp2_bulk", "exp2_ooo", "exp2_two", "exp2_two_poly"};
  return names[m];
}

template <int kMode>
void time_variant(bench::Harness& h, const SoftmaxParams& p, int cluster, int threads, double bytes) {
  int max_clusters = 0;
  {
    using T = __nv_bfloat16;
    const int64_t chunk = (p.cols / Vec<T>::kN + cluster - 1) / cluster;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(p.rows * cluster));
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = chunk * sizeof(Vec<T>);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    auto kernel = probe_kernel<T, kMode>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    if (cluster > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &cfg);
  }
  const cudaError_t e = launch<kMode>(p, cluster, threads, h.stream(), nullptr);
  if (e != cudaSuccess) {
    std::printf("%-12s cluster=%2d threads=%3d launch failed: %s\n", mode_name(kMode), cluster, threads,
                cudaGetErrorString(e));
    cudaGetLastError();
    return;
  }
  const double ms = h.time_ms([&] { launch<kMode>(p, cluster, threads, h.stream(), nullptr); });
  std::printf("%-12s cluster=%2d threads=%3d resident_clusters=%4d (need %4lld) %8.4f ms %6.1f%% copy peak\n",
              mode_name(kMode), cluster, threads, max_clusters, (long long)p.rows, ms,
              100.0 * bytes / (ms * 1e-3) / 1e12 / h.copy_TBps());
}

template <int kMode>
void probe(const SoftmaxParams& p, int cluster, int threads, void* flush, size_t flush_bytes, int sm_count) {
  const int64_t blocks = p.rows * cluster;
  unsigned long long* d = nullptr;
  cudaMalloc(&d, blocks * kStamps * sizeof(unsigned long long));
  std::vector<unsigned long long> s(blocks * kStamps);
  for (int rep = 0; rep < 3; ++rep) {  // the last of 3 (warm code), each after an L2 flush
    cudaMemset(flush, rep, flush_bytes);
    cudaDeviceSynchronize();
    launch<kMode>(p, cluster, threads, nullptr, d);
    cudaDeviceSynchronize();
  }
  cudaMemcpy(s.data(), d, s.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
  cudaFree(d);
  unsigned long long g0 = ~0ull, g1 = 0;
  for (int64_t b = 0; b < blocks; ++b) g0 = std::min(g0, s[b * kStamps]), g1 = std::max(g1, s[b * kStamps + 6]);
  auto pct = [&](auto f) {
    std::vector<double> v(blocks);
    for (int64_t b = 0; b < blocks; ++b) v[b] = f(&s[b * kStamps]);
    std::sort(v.begin(), v.end());
    std::printf("min %8.0f  p50 %8.0f  p90 %8.0f  max %8.0f\n", v[0], v[blocks / 2], v[blocks * 9 / 10], v[blocks - 1]);
  };
  std::vector<int> per_sm(sm_count, 0);
  for (int64_t b = 0; b < blocks; ++b) per_sm[s[b * kStamps + 7] % sm_count]++;
  const int sms_used = static_cast<int>(std::count_if(per_sm.begin(), per_sm.end(), [](int c) { return c > 0; }));
  std::printf("probe %s cluster=%d threads=%d: first start -> last end %.2f us; SMs used %d, blocks/SM max %d\n",
              mode_name(kMode), cluster, threads, (g1 - g0) * 1e-3, sms_used, *std::max_element(per_sm.begin(), per_sm.end()));
  std::printf("  start offset ns    "), pct([&](const unsigned long long* x) { return double(x[0] - g0); });
  std::printf("  load+fold cycles   "), pct([](const unsigned long long* x) { return double(x[2] - x[1]); });
  std::printf("  cluster sync cyc   "), pct([](const unsigned long long* x) { return double(x[3] - x[2]); });
  std::printf("  row merge cycles   "), pct([](const unsigned long long* x) { return double(x[4] - x[3]); });
  std::printf("  output cycles      "), pct([](const unsigned long long* x) { return double(x[5] - x[4]); });
  std::printf("  end offset ns      "), pct([&](const unsigned long long* x) { return double(x[6] - g0); });
}

int main(int argc, char** argv) {
  const bool once = argc > 1 && std::string(argv[1]) == "--once";  // one launch of exp2 (for ncu)
  bench::Options opt;
  opt.min_reps = 50;
  opt.max_reps = 300;
  bench::Harness h(opt);
  int sm_count = 0;
  cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
  using T = __nv_bfloat16;
  const int64_t rows = 64, cols = 128256;
  void *x, *y;
  cudaMalloc(&x, rows * cols * sizeof(T));
  cudaMalloc(&y, rows * cols * sizeof(T));
  bench::fill_random(x, rows * cols, 1, 1, h.stream());
  const SoftmaxParams p{x, y, rows, cols, cols, cols};
  const double bytes = 2.0 * rows * cols * sizeof(T);
  if (once) {
    launch<kExp2>(p, 8, 256, h.stream(), nullptr);
    cudaDeviceSynchronize();
    std::printf("one launch of exp2: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  h.measure_peaks();
  if (argc > 1 && std::string(argv[1]) == "--rung") {
    // The rung's own kernel with and without the polynomial share of the fold's exponents
    // (kPolyShare), alternated in one process, after a check that both give the same outputs
    // to within a bf16 ulp.
    const int64_t chunk = (cols / Vec<T>::kN + kSoftmaxClusterBlocks - 1) / kSoftmaxClusterBlocks;
    const size_t smem = chunk * sizeof(Vec<T>);
    auto run_rung = [&](auto kernel, bool log) {
      (void)log;
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSplitMaxSmemBytes);
      kernel<<<static_cast<unsigned>(rows * kSoftmaxClusterBlocks), kSoftmaxSplitThreads, smem, h.stream()>>>(p, chunk);
    };
    auto with_poly = softmax_split_cluster_kernel<T, false, true, true>;
    auto without = softmax_split_cluster_kernel<T, false, true, false>;
    std::vector<uint16_t> a(rows * cols), b(rows * cols);
    for (int which = 0; which < 2; ++which) {
      cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T), h.stream());
      run_rung(which == 0 ? without : with_poly, false);
      cudaMemcpyAsync((which == 0 ? a : b).data(), y, a.size() * 2, cudaMemcpyDeviceToHost, h.stream());
      cudaStreamSynchronize(h.stream());
    }
    int64_t diff = 0, maxulp = 0, nan = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      nan += (a[i] & 0x7fff) > 0x7f80 || (b[i] & 0x7fff) > 0x7f80;
      if (a[i] != b[i]) ++diff, maxulp = std::max<int64_t>(maxulp, std::abs(int64_t(a[i]) - int64_t(b[i])));
    }
    std::printf("rung with vs without the polynomial share: %lld of %zu outputs differ, max %lld ulp, %lld NaN (%s)\n",
                (long long)diff, a.size(), (long long)maxulp, (long long)nan, cudaGetErrorString(cudaGetLastError()));
    for (int rep = 0; rep < 4; ++rep) {
      const double copy_ms =
          h.time_ms([&] { cudaMemcpyAsync(y, x, rows * cols * sizeof(T), cudaMemcpyDeviceToDevice, h.stream()); });
      const double ms0 = h.time_ms([&] { run_rung(without, false); });
      const double ms1 = h.time_ms([&] { run_rung(with_poly, false); });
      std::printf("rep %d: cudaMemcpyAsync %.4f ms | rung, MUFU only %.4f ms (%.3fx copy) | rung, poly share %.4f ms (%.3fx copy)\n",
                  rep, copy_ms, ms0, copy_ms / ms0, ms1, copy_ms / ms1);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--window") {
    // The rung's own kernel with kAhead copies in flight per thread ahead of the fold (16: all
    // issued before the first fold, the rung until this experiment), alternated in one process
    // after a check that every window gives the same outputs bit for bit (the fold order is
    // the same).
    const int64_t chunk = (cols / Vec<T>::kN + kSoftmaxClusterBlocks - 1) / kSoftmaxClusterBlocks;
    const size_t smem = chunk * sizeof(Vec<T>);
    auto run_rung = [&](auto kernel) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSplitMaxSmemBytes);
      kernel<<<static_cast<unsigned>(rows * kSoftmaxClusterBlocks), kSoftmaxSplitThreads, smem, h.stream()>>>(p, chunk);
    };
    const auto kernels = std::make_tuple(softmax_split_cluster_kernel<T, false, true, false, 16>,
                                         softmax_split_cluster_kernel<T, false, true, false, 8>,
                                         softmax_split_cluster_kernel<T, false, true, false, 6>,
                                         softmax_split_cluster_kernel<T, false, true, false, 4>,
                                         softmax_split_cluster_kernel<T, false, true, false, 3>,
                                         softmax_split_cluster_kernel<T, false, true, false, 2>,
                                         softmax_split_cluster_kernel<T, false, true, false, 1>);
    const int windows[] = {16, 8, 6, 4, 3, 2, 1};
    std::vector<uint16_t> ref(rows * cols), got(rows * cols);
    int idx = 0;
    std::apply([&](auto... kernel) {
      ([&] {
        cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T), h.stream());
        run_rung(kernel);
        cudaMemcpyAsync((idx == 0 ? ref : got).data(), y, ref.size() * 2, cudaMemcpyDeviceToHost, h.stream());
        cudaStreamSynchronize(h.stream());
        int64_t diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) diff += ref[i] != got[i] || (ref[i] & 0x7fff) > 0x7f80;
        if (idx > 0)
          std::printf("window %2d vs 16: %lld of %zu outputs differ or NaN (%s)\n", windows[idx], (long long)diff,
                      ref.size(), cudaGetErrorString(cudaGetLastError()));
        ++idx;
      }(), ...);
    }, kernels);
    for (int rep = 0; rep < 4; ++rep) {
      const double copy_ms =
          h.time_ms([&] { cudaMemcpyAsync(y, x, rows * cols * sizeof(T), cudaMemcpyDeviceToDevice, h.stream()); });
      std::printf("rep %d: cudaMemcpyAsync %.4f ms |", rep, copy_ms);
      idx = 0;
      std::apply([&](auto... kernel) {
        ([&] {
          const double ms = h.time_ms([&] { run_rung(kernel); });
          std::printf(" w%d %.4f (%.3fx)", windows[idx++], ms, copy_ms / ms);
        }(), ...);
      }, kernels);
      std::printf("\n");
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--policy") {
    // The cluster scheduling policy (default, spread, load balancing): the rung's kernel through
    // cudaLaunchKernelEx with each, and the probe's SM count (blocks per SM) under each.
    const int64_t chunk = (cols / Vec<T>::kN + kSoftmaxClusterBlocks - 1) / kSoftmaxClusterBlocks;
    const size_t smem = chunk * sizeof(Vec<T>);
    auto rung = softmax_split_cluster_kernel<T, false, true>;
    cudaFuncSetAttribute(rung, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSplitMaxSmemBytes);
    const cudaClusterSchedulingPolicy policies[] = {cudaClusterSchedulingPolicyDefault, cudaClusterSchedulingPolicySpread,
                                                    cudaClusterSchedulingPolicyLoadBalancing};
    const char* names[] = {"default", "spread", "load_balancing"};
    auto run_rung = [&](cudaClusterSchedulingPolicy pol) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(rows * kSoftmaxClusterBlocks));
      cfg.blockDim = dim3(kSoftmaxSplitThreads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = h.stream();
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      attr[0].val.clusterSchedulingPolicyPreference = pol;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      return cudaLaunchKernelEx(&cfg, rung, p, chunk);
    };
    std::vector<uint16_t> ref(rows * cols), got(rows * cols);
    for (int i = 0; i < 3; ++i) {
      cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T), h.stream());
      const cudaError_t e = run_rung(policies[i]);
      cudaMemcpyAsync((i == 0 ? ref : got).data(), y, ref.size() * 2, cudaMemcpyDeviceToHost, h.stream());
      cudaStreamSynchronize(h.stream());
      int64_t diff = 0;
      for (size_t j = 0; j < ref.size(); ++j) diff += ref[j] != got[j] || (ref[j] & 0x7fff) > 0x7f80;
      std::printf("%-15s launch %s; %lld outputs differ from the default's or NaN\n", names[i], cudaGetErrorString(e),
                  (long long)(i == 0 ? 0 : diff));
    }
    for (int rep = 0; rep < 3; ++rep) {
      const double copy_ms =
          h.time_ms([&] { cudaMemcpyAsync(y, x, rows * cols * sizeof(T), cudaMemcpyDeviceToDevice, h.stream()); });
      std::printf("rep %d: cudaMemcpyAsync %.4f ms |", rep, copy_ms);
      for (int i = 0; i < 3; ++i) {
        const double ms = h.time_ms([&] { run_rung(policies[i]); });
        std::printf(" %s %.4f (%.3fx)", names[i], ms, copy_ms / ms);
      }
      std::printf("\n");
    }
    void* flush = nullptr;
    const size_t flush_bytes = 256u << 20;
    cudaMalloc(&flush, flush_bytes);
    for (int i = 0; i < 3; ++i) {
      g_policy = policies[i];
      std::printf("policy %s: ", names[i]);
      probe<kExp2>(p, 8, 256, flush, flush_bytes, sm_count);
    }
    std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--arrival") {
    // Whether the fold can run under the loads: the rung's in-order fold (exp2), the same fold
    // after all copies landed (exp2_after), and bulk copies (one per piece of blockDim vectors,
    // each on its own mbarrier) folded in piece order (exp2_bulk) or in landing order (exp2_ooo).
    auto check = [&](const char* name, auto launcher) {
      std::vector<uint16_t> ref(rows * cols), got(rows * cols);
      cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T), h.stream());
      launch<kExp2>(p, 8, 256, h.stream(), nullptr);
      cudaMemcpyAsync(ref.data(), y, ref.size() * 2, cudaMemcpyDeviceToHost, h.stream());
      cudaMemsetAsync(y, 0xff, rows * cols * sizeof(T), h.stream());
      launcher();
      cudaMemcpyAsync(got.data(), y, got.size() * 2, cudaMemcpyDeviceToHost, h.stream());
      cudaStreamSynchronize(h.stream());
      int64_t diff = 0, maxulp = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        if (ref[i] != got[i]) ++diff, maxulp = std::max<int64_t>(maxulp, std::abs(int64_t(ref[i]) - int64_t(got[i])));
      std::printf("check %-12s vs exp2: %lld of %zu outputs differ, max %lld bf16 ulp (%s)\n", name, (long long)diff,
                  ref.size(), (long long)maxulp, cudaGetErrorString(cudaGetLastError()));
    };
    check("exp2_after", [&] { launch<kExp2After>(p, 8, 256, h.stream(), nullptr); });
    check("copy_bulk", [&] { launch<kCopyBulk>(p, 8, 256, h.stream(), nullptr); });
    check("exp2_bulk", [&] { launch<kExp2Bulk>(p, 8, 256, h.stream(), nullptr); });
    check("exp2_ooo", [&] { launch<kExp2Ooo>(p, 8, 256, h.stream(), nullptr); });
    check("exp2_two", [&] { launch<kExp2Two>(p, 8, 256, h.stream(), nullptr); });
    check("exp2_two_poly", [&] { launch<kExp2TwoPoly>(p, 8, 256, h.stream(), nullptr); });
    const double copy_ms =
        h.time_ms([&] { cudaMemcpyAsync(y, x, rows * cols * sizeof(T), cudaMemcpyDeviceToDevice, h.stream()); });
    std::printf("%-40s %8.4f ms\n", "cudaMemcpyAsync", copy_ms);
    for (int rep = 0; rep < 2; ++rep) {
      time_variant<kExp2>(h, p, 8, 256, bytes);
      time_variant<kExp2After>(h, p, 8, 256, bytes);
      time_variant<kCopy>(h, p, 8, 256, bytes);
      time_variant<kCopyBulk>(h, p, 8, 256, bytes);
      time_variant<kExp2Bulk>(h, p, 8, 256, bytes);
      time_variant<kExp2Ooo>(h, p, 8, 256, bytes);
      time_variant<kExp2Two>(h, p, 8, 256, bytes);
      time_variant<kExp2TwoPoly>(h, p, 8, 256, bytes);
    }
    void* flush = nullptr;
    const size_t flush_bytes = 256u << 20;
    cudaMalloc(&flush, flush_bytes);
    probe<kExp2>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kExp2After>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kCopy>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kCopyBulk>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kExp2Bulk>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kExp2Ooo>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kExp2Two>(p, 8, 256, flush, flush_bytes, sm_count);
    probe<kExp2TwoPoly>(p, 8, 256, flush, flush_bytes, sm_count);
    std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }

  const int64_t nvec = rows * cols / Vec<T>::kN;
  double ms = h.time_ms([&] { cudaMemcpyAsync(y, x, rows * cols * sizeof(T), cudaMemcpyDeviceToDevice, h.stream()); });
  std::printf("%-40s %8.4f ms %6.1f%% copy peak\n", "cudaMemcpyAsync", ms, 100.0 * bytes / (ms * 1e-3) / 1e12 / h.copy_TBps());
  for (int per_sm : {2, 4, 8, 16}) {
    ms = h.time_ms([&] {
      copy_kernel<T><<<sm_count * per_sm, 256, 0, h.stream()>>>(static_cast<const Vec<T>*>(x), static_cast<Vec<T>*>(y), nvec);
    });
    std::printf("copy_kernel blocks/SM=%-2d threads=256          %8.4f ms %6.1f%% copy peak\n", per_sm, ms,
                100.0 * bytes / (ms * 1e-3) / 1e12 / h.copy_TBps());
  }
  for (int cluster : {4, 8, 16})
    for (int threads : {128, 256, 512}) {
      time_variant<kFull>(h, p, cluster, threads, bytes);
      time_variant<kExp2>(h, p, cluster, threads, bytes);
      if (threads == 256) {
        time_variant<kNoFold>(h, p, cluster, threads, bytes);
        time_variant<kNoExp>(h, p, cluster, threads, bytes);
        time_variant<kCopy>(h, p, cluster, threads, bytes);
        time_variant<kCopyNoSync>(h, p, cluster, threads, bytes);
        time_variant<kEmpty>(h, p, cluster, threads, bytes);
      }
    }
  void* flush = nullptr;
  const size_t flush_bytes = 256u << 20;
  cudaMalloc(&flush, flush_bytes);
  probe<kFull>(p, 8, 256, flush, flush_bytes, sm_count);
  probe<kExp2>(p, 8, 256, flush, flush_bytes, sm_count);
  probe<kCopy>(p, 8, 256, flush, flush_bytes, sm_count);
  probe<kFull>(p, 16, 256, flush, flush_bytes, sm_count);
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
