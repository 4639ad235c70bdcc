// Experiment (not a rung; 2026-11-26): softmax of few long rows with the rows pipelined through
// persistent clusters, for issue 3's sampling shape (64 x 128256 bf16, bar: 0.80x a same-size
// copy; softmax rung 4 had measured 0.76-0.81x across runs).
// Outcome (bench/results/experiments/softmax_pipelined_2026-11-26.txt, docs/ladder/softmax.md,
// "Fourth version"): the pipelined kernel lost (--sweep: 0.0214 ms at best against 0.0201); its
// one-buffer control at 64 clusters won 4-5%, and the row_cluster variants below traced that to
// compile-time slots; the library's softmax_rows_cluster_kernel, timed here against the previous
// kernel, is the result (0.0191 against 0.0205 ms).
//
// Why: rung 4 (kernels/softmax/04_long_rows.cuh) gives every row a cluster of 8 blocks and starts
// all 512 blocks at once: the whole grid loads, then merges, then stores, so the DRAM sees a read
// phase and then a write phase, each with its own ramp and tail (docs/ladder/softmax.md: the
// loads and stores of the grid do not overlap; a fixed delay between groups of rows helped at this
// shape only). The paged decode's lesson (docs/ladder/attention.md, "Where a 4k step's time goes")
// was that a per-item start and end with nothing in flight costs ~1 us an item, and that a
// persistent block streaming item after item removes it. Here: C clusters (C < 64) each take rows
// c, c + C, ... ; each block keeps two chunk buffers and issues the next row's copies before it
// merges and stores the current row, so every SM reads row j + 1 while it writes row j.
//
// Kernel (bf16 softmax, fast path, chunk of one row in shared memory, 8 blocks a row as rung 4):
//   prologue: copies of rows 0 and 1 (of this cluster's) into buffers 0 and 1 (a commit group each)
//   row j:    wait for row j's group; fold this thread's vectors (only its own copies: no barrier);
//             block merge; state to block_state[j % 2]; cluster barrier; every warp merges the
//             cluster's 8 states; store row j from buffer j % 2; issue row j + 2's copies into it
//             (each thread rewrites only the slots it read itself).
//   block_state is double-buffered: row j + 2 rewrites slot j % 2 after row j + 1's cluster
//   barrier, which no block passes before its remote reads of row j's states are done.
// Also timed in the same process: rung 4's own kernel (softmax_split_cluster_kernel, 512 blocks),
// and cudaMemcpyAsync of the same bytes (the bar's denominator); outputs checked against a
// float64 reference on 3 rows (the rung's too), poisoned (NaN) before each checked launch.
// L2 flushed by a 256 MiB memset before each repetition, CUDA events, median of 30.
// Build (not a CMake target):
//   nvcc -std=c++17 -O3 -I. -Iinclude -Isrc --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     bench/experiments/softmax_pipelined.cu -o build/exp/softmax_pipelined
// Run: ./softmax_pipelined [--sweep]   (--sweep adds the pipelined kernel over 8..64 clusters)
// Output: per variant, ms, x the copy, max |diff| against the reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/experiments/standalone.h"
#include "kernels/softmax/04_long_rows.cuh"

using namespace flashlab;
using namespace flashlab::kernels;

using T = __nv_bfloat16;
constexpr int kRows = 64, kCols = 128256, kThreads = 256, kCluster = kSoftmaxClusterBlocks;
constexpr int kVecs = kCols / Vec<T>::kN;                        // 16032 16-byte vectors a row
constexpr int kChunkVecs = (kVecs + kCluster - 1) / kCluster;     // 2004 a block
constexpr int kVpt = (kChunkVecs + kThreads - 1) / kThreads;      // 8 vectors a thread
constexpr int kChunkBytes = kChunkVecs * 16;                      // 32064

// Grid: C clusters x 8 blocks; cluster c takes rows c, c + C, ... (C = gridDim.x / 8).
// kBuffers 2: the pipelined kernel; 1: the same persistent loop without the next row in flight.
template <int kBuffers>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    softmax_pipelined_kernel(const T* __restrict__ in, T* __restrict__ out, int rows) {
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* const buf = reinterpret_cast<V*>(smem_raw);  // [kBuffers][kChunkVecs]
  __shared__ OnlineSoftmaxState block_state[2];
  const cg::cluster_group cluster = cg::this_cluster();
  const int clusters = static_cast<int>(gridDim.x) / kCluster, c = static_cast<int>(blockIdx.x) / kCluster;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * kChunkVecs;
  const int n = static_cast<int>(std::min<int64_t>(v0 + kChunkVecs, kVecs) - v0);  // vectors of this chunk
  const int tid = static_cast<int>(threadIdx.x);
  const int my_rows = rows > c ? (rows - 1 - c) / clusters + 1 : 0;
  // This thread's vectors of row j (the j-th of the cluster's) into buffer j % kBuffers, one group.
  const auto issue = [&](int j) {
    if (j < my_rows) {
      const int64_t r = c + static_cast<int64_t>(j) * clusters;
      const T* src = in + r * kCols + v0 * V::kN;
      V* dst = buf + (j % kBuffers) * kChunkVecs;
#pragma unroll
      for (int k = 0; k < kVpt; ++k) {
        const int i = tid + k * kThreads;
        if (i < n) cp_async_16(dst + i, src + static_cast<int64_t>(i) * V::kN);
      }
    }
    cp_async_commit();  // (empty past the last row: the wait counts stay fixed)
  };
#pragma unroll
  for (int j = 0; j < kBuffers; ++j) issue(j);
  for (int j = 0; j < my_rows; ++j) {
    const int64_t r = c + static_cast<int64_t>(j) * clusters;
    V* const chunk = buf + (j % kBuffers) * kChunkVecs;
    cp_async_wait<kBuffers - 1>();  // row j's group (row j + 1's may still be in flight)
    OnlineSoftmaxState st = online_softmax_empty();
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int i = tid + k * kThreads;
      if (i < n) online_softmax_add_vec_exp2<T>(st, load_vec(reinterpret_cast<const T*>(chunk + i)));
    }
    st = block_all_merge(st);
    if (tid == 0) block_state[j % 2] = st;
    cluster.sync();  // every block's state of row j written and visible to the cluster
    {
      const int lane = tid % kWarpSize;
      st = lane < kCluster ? *cluster.map_shared_rank(&block_state[j % 2], lane) : online_softmax_empty();
      st = warp_merge(st);
    }
    const float offset = softmax_exp2_offset(st);
    T* const dst = out + r * kCols + v0 * V::kN;
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int i = tid + k * kThreads;
      if (i < n) {
        const V x = load_vec(reinterpret_cast<const T*>(chunk + i));
        V y;
#pragma unroll
        for (int e = 0; e < V::kN; ++e) y.v[e] = from_float<T>(exp2_approx_ftz(fmaf(to_float(x.v[e]), kLog2e, -offset)));
        store_vec(dst + static_cast<int64_t>(i) * V::kN, y);
      }
    }
    // Row j + kBuffers into this buffer: each thread rewrites only the slots it has just read.
    if (kBuffers == 2) issue(j + 2);
    else issue(j + 1);
  }
  cluster.sync();  // no block exits while another may still read its block_state
}

// One row a cluster (the 1-buffer, 64-cluster case above, which ran 4% faster than rung 4 in the
// first run, 2026-11-26): which of its differences from rung 4's kernel matters? Each flag puts
// back one of the rung's choices.
enum : int {
  kRuntimeStore = 1,  // store loop over a run-time count (the rung: for i < n, i += blockDim.x)
  kPerVecFold = 2,    // one commit group per vector, each folded as it lands (the rung)
  kSplitBarrier = 4,  // cluster barrier arrive after the merge, wait before exit (the rung)
};
template <int kFlags>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    softmax_row_cluster_kernel(const T* __restrict__ in, T* __restrict__ out) {
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* const chunk = reinterpret_cast<V*>(smem_raw);
  __shared__ OnlineSoftmaxState block_state;
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t r = blockIdx.x / kCluster;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * kChunkVecs;
  const int n = static_cast<int>(std::min<int64_t>(v0 + kChunkVecs, kVecs) - v0);
  const int tid = static_cast<int>(threadIdx.x);
  const T* src = in + r * kCols + v0 * V::kN;
  T* const dst = out + r * kCols + v0 * V::kN;
  OnlineSoftmaxState st = online_softmax_empty();
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int i = tid + k * kThreads;
    if (i < n) cp_async_16(chunk + i, src + static_cast<int64_t>(i) * V::kN);
    if (kFlags & kPerVecFold) cp_async_commit();
  }
  if (kFlags & kPerVecFold) {
    static_for<kVpt>([&](auto k) {
      cp_async_wait<kVpt - 1 - k>();
      const int i = tid + k * kThreads;
      if (i < n) online_softmax_add_vec_exp2<T>(st, load_vec(reinterpret_cast<const T*>(chunk + i)));
    });
  } else {
    cp_async_commit();
    cp_async_wait<0>();
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int i = tid + k * kThreads;
      if (i < n) online_softmax_add_vec_exp2<T>(st, load_vec(reinterpret_cast<const T*>(chunk + i)));
    }
  }
  st = block_all_merge(st);
  if (tid == 0) block_state = st;
  cluster.sync();
  {
    const int lane = tid % kWarpSize;
    st = lane < kCluster ? *cluster.map_shared_rank(&block_state, lane) : online_softmax_empty();
    st = warp_merge(st);
  }
  [[maybe_unused]] auto arrived = [&] {
    if constexpr (kFlags & kSplitBarrier) return cluster.barrier_arrive();
    else return 0;
  }();
  const float offset = softmax_exp2_offset(st);
  const auto store = [&](int i) {
    const V x = load_vec(reinterpret_cast<const T*>(chunk + i));
    V y;
#pragma unroll
    for (int e = 0; e < V::kN; ++e) y.v[e] = from_float<T>(exp2_approx_ftz(fmaf(to_float(x.v[e]), kLog2e, -offset)));
    store_vec(dst + static_cast<int64_t>(i) * V::kN, y);
  };
  if (kFlags & kRuntimeStore) {
    for (int i = tid; i < n; i += static_cast<int>(blockDim.x)) store(i);
  } else {
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int i = tid + k * kThreads;
      if (i < n) store(i);
    }
  }
  if constexpr (kFlags & kSplitBarrier) cluster.barrier_wait(std::move(arrived));
  else cluster.sync();  // no block exits while another may still read its block_state
}

__global__ void fill_kernel(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 4096.f - 8.f);  // [-8, 8)
  }
}

int main(int argc, char** argv) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  FlushedTimer time(st);
  const size_t elems = size_t(kRows) * kCols;
  T *in, *out, *copy_dst;
  CK(cudaMalloc(&in, elems * 2));
  CK(cudaMalloc(&out, elems * 2));
  CK(cudaMalloc(&copy_dst, elems * 2));
  fill_kernel<<<1024, 256>>>(in, elems, 7u);
  std::vector<T> h_in(elems);
  CK(cudaMemcpy(h_in.data(), in, elems * 2, cudaMemcpyDeviceToHost));
  // float64 reference of rows 0, 37, 63.
  const int check_rows[] = {0, 37, 63};
  std::vector<std::vector<double>> ref;
  for (int r : check_rows) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < kCols; ++i) m = std::max(m, double(__bfloat162float(h_in[size_t(r) * kCols + i])));
    for (int i = 0; i < kCols; ++i) s += std::exp(double(__bfloat162float(h_in[size_t(r) * kCols + i])) - m);
    std::vector<double> row(kCols);
    for (int i = 0; i < kCols; ++i) row[i] = std::exp(double(__bfloat162float(h_in[size_t(r) * kCols + i])) - m) / s;
    ref.push_back(std::move(row));
  }
  std::vector<T> h_out(elems);
  const auto check = [&](const std::function<void()>& fn) {
    CK(cudaMemsetAsync(out, 0xff, elems * 2, st));  // NaN
    fn();
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    CK(cudaMemcpy(h_out.data(), out, elems * 2, cudaMemcpyDeviceToHost));
    double worst = 0;  // relative to the row's largest output
    for (size_t k = 0; k < ref.size(); ++k) {
      const double top = *std::max_element(ref[k].begin(), ref[k].end());
      for (int i = 0; i < kCols; ++i) {
        const double got = __bfloat162float(h_out[size_t(check_rows[k]) * kCols + i]);
        const double d = std::fabs(got - ref[k][i]) / top;
        worst = std::isnan(got) ? INFINITY : std::max(worst, d);
      }
    }
    return worst;
  };
  const double gb = 2.0 * elems * 2 / 1e9;  // read + write
  const double copy_ms = time([&] { CK(cudaMemcpyAsync(copy_dst, in, elems * 2, cudaMemcpyDeviceToDevice, st)); });
  std::printf("copy (cudaMemcpyAsync of the same bytes)  %8.4f ms  %7.1f GB/s\n", copy_ms, gb / copy_ms * 1e3);

  // Rung 4's kernel as the library launches it at this shape (512 blocks, the chunk in smem).
  {
    const auto k = softmax_split_cluster_kernel<T, false, true>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kChunkBytes));
    SoftmaxParams p{in, out, kRows, kCols, kCols, kCols};
    const auto run = [&] { k<<<kRows * kCluster, kSoftmaxSplitThreads, kChunkBytes, st>>>(p, int64_t(kChunkVecs)); };
    const double err = check(run);
    const double ms = time(run);
    std::printf("rung 4 (512 blocks)                       %8.4f ms  %7.1f GB/s  %.3fx copy  max rel diff %.3g\n", ms,
                gb / ms * 1e3, copy_ms / ms, err);
  }
  const auto variant = [&](auto kernel, int buffers, int clusters) {
    const int smem = buffers * kChunkBytes;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    const auto run = [&] { kernel<<<clusters * kCluster, kThreads, smem, st>>>(in, out, kRows); };
    const double err = check(run);
    const double ms = time(run);
    std::printf("pipelined, %d buffer(s), %2d clusters (%d blocks an SM fit)  %8.4f ms  %7.1f GB/s  %.3fx copy  max rel diff %.3g\n",
                buffers, clusters, per_sm, ms, gb / ms * 1e3, copy_ms / ms, err);
  };
  if (argc > 1 && std::string(argv[1]) == "--sweep") {  // the first run's sweep (2026-11-26)
    for (int round = 0; round < 2; ++round) {
      for (int clusters : {8, 16, 22, 32, 44})  // 44 x 8 = 352 blocks: 3 an SM at 64 KB would fit 396
        variant(softmax_pipelined_kernel<2>, 2, clusters);
      for (int clusters : {16, 32, 64}) variant(softmax_pipelined_kernel<1>, 1, clusters);
    }
  }
  const auto flagged = [&](auto kernel, const char* name) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kChunkBytes));
    const auto run = [&] { kernel<<<kRows * kCluster, kThreads, kChunkBytes, st>>>(in, out); };
    const double err = check(run);
    const double ms = time(run);
    std::printf("row a cluster, %-34s %8.4f ms  %7.1f GB/s  %.3fx copy  max rel diff %.3g\n", name, ms, gb / ms * 1e3,
                copy_ms / ms, err);
  };
  const auto rung = [&](auto kernel, const char* name) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kChunkBytes));
    SoftmaxParams p{in, out, kRows, kCols, kCols, kCols};
    const auto run = [&] { kernel<<<kRows * kCluster, kSoftmaxSplitThreads, kChunkBytes, st>>>(p, int64_t(kChunkVecs)); };
    const double err = check(run);
    const double ms = time(run);
    std::printf("%-48s %8.4f ms  %7.1f GB/s  %.3fx copy  max rel diff %.3g\n", name, ms, gb / ms * 1e3, copy_ms / ms, err);
  };
  for (int round = 0; round < 3; ++round) {
    flagged(softmax_row_cluster_kernel<0>, "(the experiment's choices)");
    flagged(softmax_row_cluster_kernel<kPerVecFold>, "+ fold per vector as it lands");
    flagged(softmax_row_cluster_kernel<kRuntimeStore | kPerVecFold | kSplitBarrier>, "+ all three (rung 4's)");
    variant(softmax_pipelined_kernel<1>, 1, kRows);
    rung(softmax_split_cluster_kernel<T, false, true>, "rung 4, softmax_split_cluster_kernel (before)");
    rung(softmax_rows_cluster_kernel<T, false, kVpt>, "rung 4, softmax_rows_cluster_kernel (after)");
    const double c2 = time([&] { CK(cudaMemcpyAsync(copy_dst, in, elems * 2, cudaMemcpyDeviceToDevice, st)); });
    std::printf("copy again                                       %8.4f ms\n", c2);
  }
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
