// Rung 4 — softmax of few long rows (vocabulary logits, 64 x 128256): each row split over a
// cluster of kSoftmaxClusterBlocks thread blocks, its chunks staged in shared memory so that
// every block of the grid is resident at once, merged through distributed shared memory.
//
// Changes from rung 3: a row is cut into kSoftmaxClusterBlocks chunks of chunk_vecs vectors,
// one per block of a thread-block cluster (sm_90), so 64 rows become 512 blocks and fill the
// GPU instead of 64 SMs. Steps, per block (rank q of the row's cluster):
//   1. copy its chunk into shared memory with cp.async (no registers held: a 256-thread block
//      issues ~8 16-byte copies per thread, one commit group each), and fold each vector into
//      an OnlineSoftmaxState as soon as it has landed, under the copies still in flight;
//      merge over the block (block_all_merge);
//   2. thread 0 puts the block's state in shared memory; cluster barrier;
//   3. every warp reads the kSoftmaxClusterBlocks states of the cluster from the other blocks'
//      shared memory (map_shared_rank) and merges them (warp_merge: every thread of the row
//      computes the same state, bit for bit, with no block barrier to broadcast it); each
//      thread arrives on the cluster barrier (its remote reads are done) and waits on it only
//      before exit, so the output overlaps the wait;
//   4. every thread scales its vectors from shared memory and stores them.
// Why shared memory: the first version of this rung held the chunk in registers (32 values
// per thread, 512 threads): 76 registers per thread allowed one block per SM, so 512 blocks
// ran in ~4 waves, each paying the load latency, the barriers and the store in series: 36.6%
// of copy at 64 x 128256 bf16. A 32 KB chunk in shared memory lets 6 blocks share an SM and
// the 512 blocks run in one wave with all their loads in flight together.
// Chunks past kSoftmaxSplitMaxSmemBytes (!kInSmem: bf16 rows > ~800k values) are folded as they
// stream by and read a second time to write.
// Same precondition as rung 3. The host sends rows here only when they are few or past one
// block's register budget; otherwise rung 3's kernels are the top rung's.
// 16-bit types take the base-2 fast path of online_softmax.cuh in both phases: the fold is one
// FFMA and one ex2.approx.ftz per value (plus one rescale per vector), the output
// 2^(x log2(e) - offset) with the division by the row's sum folded into the offset. All blocks
// of the grid fold and write at the same time, so this arithmetic is not hidden under other
// blocks' memory traffic: with __expf, a -inf test per value and a multiply by 1/s the bf16
// kernel at 64 x 128256 took 0.0256 ms (H100, results ba20f0c); the fast path 0.0210 ms (e8367a8).
// Limits: the exponent is taken twice per value (the sum, then the output: the fp32 values
// would not fit on chip); the load phase and the store phase of the grid do not overlap.
#pragma once

#include <cmath>
#include <utility>

#include <cooperative_groups.h>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/hd.h"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/softmax/params.h"

namespace flashlab::kernels {

inline constexpr int kSoftmaxClusterBlocks = 8;  // blocks per row (the portable cluster limit)
inline constexpr int kSoftmaxSplitThreads = 256;
inline constexpr int kSoftmaxSplitMaxSmemBytes = 200 * 1024;  // one chunk of the shared-memory path
inline constexpr int kSoftmaxSplitUnrolledVpt = 16;  // vectors per thread of the unrolled copy/fold loop
inline constexpr int kSoftmaxSplitTwoRowsMin = 32;   // rows from which the host puts two rows on a cluster
static_assert(kSoftmaxClusterBlocks <= kWarpSize, "a warp merges one state per block of the cluster");

// Cluster c (blocks b with b / kSoftmaxClusterBlocks = c) works on rows c * kRows .. c * kRows +
// kRows - 1 (rows past p.rows are skipped); block b on vectors [q * chunk_vecs, (q + 1) *
// chunk_vecs) of each, q = its rank in the cluster. kInSmem: dynamic shared memory of kRows x
// chunk_vecs vectors. kRows = 2 (shared memory only, chunks of at most
// kSoftmaxSplitUnrolledVpt / 2 vectors per thread): all copies of both rows are issued at once,
// and the first row's merge and output run while the second row's copies are still landing.
template <typename T, bool kLog, bool kInSmem, int kRows = 1>
__global__ void __cluster_dims__(kSoftmaxClusterBlocks, 1, 1) __launch_bounds__(kSoftmaxSplitThreads)
    softmax_split_cluster_kernel(const __grid_constant__ SoftmaxParams p, const int64_t chunk_vecs) {
  static_assert(kRows == 1 || (kRows == 2 && kInSmem), "two rows per cluster from shared memory only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90+; the host never launches this kernel below sm_90
#else
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  constexpr bool kFast = kSoftmaxFastMath<T>;
  constexpr int kVpt = kSoftmaxSplitUnrolledVpt / kRows;  // vectors per thread and row, unrolled path
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* chunks = reinterpret_cast<V*>(smem_raw);    // (kRows, chunk_vecs) when kInSmem
  __shared__ OnlineSoftmaxState block_state[kRows];  // this block's chunk of each row, read by the whole cluster
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t row0 = blockIdx.x / kSoftmaxClusterBlocks * kRows;
  const int64_t nvec = p.cols / V::kN;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  const int64_t n = (v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec) - v0;  // vectors of this chunk (may be <= 0)
  const int64_t i0 = threadIdx.x;
  const int nk = n > i0 ? static_cast<int>((n - 1 - i0) / blockDim.x + 1) : 0;  // this thread's vectors of a row
  const auto in_row = [&](int j) { return static_cast<const T*>(p.input) + (row0 + j) * p.input_stride + v0 * V::kN; };
  const auto out_row = [&](int j) { return static_cast<T*>(p.out) + (row0 + j) * p.out_stride + v0 * V::kN; };
  const auto live = [&](int j) { return row0 + j < p.rows; };
  // One 16-byte shared-memory load per vector (LDS.128): copying a Vec<T> as a struct compiled
  // to 8 two-byte loads for 16-bit T.
  const auto smem_vec = [&](int j, int64_t i) -> V { return load_vec(reinterpret_cast<const T*>(chunks + j * chunk_vecs + i)); };
  const auto fold = [](OnlineSoftmaxState& st, const V& v) {
    if constexpr (kFast) online_softmax_add_vec_exp2(st, v);
    else online_softmax_add_vec(st, v);
  };

  // Row j of this cluster (a compile-time index), once this thread's state of its chunk is
  // folded: merge over the block, then over the cluster, then write the chunk. After the last
  // row's remote reads each thread arrives on the cluster barrier, and waits on it only after
  // its output (no block may exit while another still reads its shared memory; earlier rows'
  // reads come before the last row's in every thread).
  const auto finish_row = [&](auto j, OnlineSoftmaxState st) {
    st = block_all_merge(st);
    if (threadIdx.x == 0) block_state[j] = st;
    cluster.sync();  // every block's state of row j written and visible to the cluster
    // Every warp reads the cluster's states (lane q: block q's) and merges them: the same row
    // state in every thread, bit for bit, without a block barrier to broadcast it.
    const int lane = threadIdx.x % kWarpSize;
    st = lane < kSoftmaxClusterBlocks ? *cluster.map_shared_rank(&block_state[j], lane) : online_softmax_empty();
    st = warp_merge(st);
    const auto write = [&] {
      if (!live(j)) return;
      const auto value = [&](int64_t i) -> V { return kInSmem ? smem_vec(j, i) : load_vec(in_row(j) + i * V::kN); };
      T* out = out_row(j);
      if constexpr (kFast && !kLog) {
        // 16-bit softmax: 2^(x log2(e) - offset), the division by the row's sum folded into
        // the offset: one FFMA and one MUFU.EX2 per value.
        const float offset = softmax_exp2_offset(st);
        for (int64_t i = i0; i < n; i += blockDim.x) {
          const V x = value(i);
          V y;
#pragma unroll
          for (int e = 0; e < V::kN; ++e) y.v[e] = from_float<T>(exp2_approx_ftz(fmaf(to_float(x.v[e]), kLog2e, -offset)));
          store_vec(out + i * V::kN, y);
        }
      } else {
        const float log_s = logf(st.s);
        for (int64_t i = i0; i < n; i += blockDim.x) store_vec(out + i * V::kN, softmax_vec<T, kLog>(value(i), st, log_s));
      }
    };
    if constexpr (decltype(j)::value == kRows - 1) {
      auto arrived = cluster.barrier_arrive();
      write();
      cluster.barrier_wait(std::move(arrived));
    } else {
      write();
    }
  };

  if (kInSmem && nk <= kVpt) {
    // Up to kVpt vectors per thread and row (bf16 rows up to 262144 values with kRows = 1):
    // exactly kVpt commit groups per row (the extra ones empty, complete at once), so that the
    // wait before each vector is a compile-time count in a fully unrolled loop, not a run-time
    // switch over cp.async.wait_group instructions. Each vector is folded into the state as
    // soon as it has landed, under the copies still in flight; a thread reads only the vectors
    // it copied itself, so no barrier is needed for the chunk.
    static_for<kRows>([&](auto j) {
#pragma unroll
      for (int k = 0; k < kVpt; ++k) {
        if (k < nk && live(j)) cp_async_16(&chunks[j * chunk_vecs + i0 + k * blockDim.x], in_row(j) + (i0 + k * blockDim.x) * V::kN);
        cp_async_commit();
      }
    });
    static_for<kRows>([&](auto j) {
      OnlineSoftmaxState st = online_softmax_empty();
      static_for<kVpt>([&](auto k) {
        cp_async_wait<(kRows - 1 - j) * kVpt + kVpt - 1 - k>();  // vector k of row j has landed
        if (k < nk && live(j)) fold(st, smem_vec(j, i0 + k * blockDim.x));
      });
      finish_row(j, st);
    });
  } else if constexpr (kRows == 1) {
    OnlineSoftmaxState st = online_softmax_empty();
    if constexpr (kInSmem) {
      for (int k = 0; k < nk; ++k) {
        cp_async_16(&chunks[i0 + static_cast<int64_t>(k) * blockDim.x], in_row(0) + (i0 + static_cast<int64_t>(k) * blockDim.x) * V::kN);
        cp_async_commit();
      }
      for (int k = 0; k < nk; ++k) {
        cp_async_wait_at_most(nk - 1 - k);  // vector k has landed
        fold(st, smem_vec(0, i0 + static_cast<int64_t>(k) * blockDim.x));
      }
    } else {
      for (int64_t i = i0; i < n; i += blockDim.x) fold(st, load_vec(in_row(0) + i * V::kN));
    }
    finish_row(std::integral_constant<int, 0>{}, st);
  } else {
    __trap();  // kRows = 2 with more than kVpt vectors per thread: the host never launches that
  }
#endif
}

}  // namespace flashlab::kernels
