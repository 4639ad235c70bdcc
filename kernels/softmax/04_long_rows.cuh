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
// Two kernels: softmax_rows_cluster_kernel (end of this file) for chunks of up to 16 vectors per
// thread (bf16 rows up to 262144 values, the vocabulary sizes), with persistent clusters and
// compile-time slots; softmax_split_cluster_kernel for longer rows, whose chunks take a run-time
// loop, and past kSoftmaxSplitMaxSmemBytes (!kInSmem: bf16 rows > ~800k values) are folded as
// they stream by and read a second time to write.
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
inline constexpr int kSoftmaxSplitCopyAhead = kSoftmaxSplitUnrolledVpt;  // see kAhead below
inline constexpr int kSoftmaxRowsVpt[] = {4, 8, 16};  // softmax_rows_cluster_kernel's slots per thread
static_assert(kSoftmaxClusterBlocks <= kWarpSize, "a warp merges one state per block of the cluster");

// The row's state from each block's: merged over the block, published in `slot` (this block's
// shared memory), a cluster barrier, then every warp reads the cluster's states (lane q: block
// q's) and merges them, so every thread of the row holds the same state, bit for bit, without a
// block barrier to broadcast it. The caller must not rewrite `slot` before every block of the
// cluster has passed a later cluster barrier (their remote reads are done by then).
__device__ __forceinline__ OnlineSoftmaxState cluster_all_merge(OnlineSoftmaxState st, OnlineSoftmaxState* slot,
                                                                const cooperative_groups::cluster_group& cluster) {
  st = block_all_merge(st);
  if (threadIdx.x == 0) *slot = st;
  cluster.sync();  // every block's state written and visible to the cluster
  const int lane = threadIdx.x % kWarpSize;
  st = lane < kSoftmaxClusterBlocks ? *cluster.map_shared_rank(slot, lane) : online_softmax_empty();
  return warp_merge(st);
}

// One output vector of the split kernels, given the row's state. 16-bit softmax:
// 2^(x log2(e) - offset), the division by the row's sum folded into the offset (one FFMA and
// one MUFU.EX2 per value); otherwise softmax_vec.
template <typename T, bool kLog>
struct SplitOutput {
  OnlineSoftmaxState st;
  float log_s, offset;
  __device__ __forceinline__ explicit SplitOutput(OnlineSoftmaxState row)
      : st(row), log_s(logf(row.s)), offset(softmax_exp2_offset(row)) {}
  __device__ __forceinline__ Vec<T> operator()(const Vec<T>& x) const {
    if constexpr (kSoftmaxFastMath<T> && !kLog) {
      Vec<T> y;
#pragma unroll
      for (int j = 0; j < Vec<T>::kN; ++j) y.v[j] = from_float<T>(exp2_approx_ftz(fmaf(to_float(x.v[j]), kLog2e, -offset)));
      return y;
    } else {
      return softmax_vec<T, kLog>(x, st, log_s);
    }
  }
};

// The kernel for rows past softmax_rows_cluster_kernel's slots (the host sends it chunks of more
// than 16 vectors per thread only; its unrolled path and the kPolyShare / kAhead switches serve
// bench/experiments/softmax_long_rows.cu, whose measurements docs/ladder/softmax.md cites).
// Block b works on row b / kSoftmaxClusterBlocks, vectors [q * chunk_vecs, (q + 1) * chunk_vecs)
// of it, q = its rank in the cluster. kInSmem: dynamic shared memory of chunk_vecs vectors.
// kPolyShare: a quarter of the fold's exponents on the FMA pipe (online_softmax_add_exp2); an
// experiment, off (bench/experiments/softmax_long_rows.cu --rung: 2% slower).
// kAhead: copies a thread keeps in flight ahead of the vector it folds (unrolled path);
// kSoftmaxSplitUnrolledVpt issues them all before the first fold.
template <typename T, bool kLog, bool kInSmem, bool kPolyShare = false, int kAhead = kSoftmaxSplitCopyAhead>
__global__ void __cluster_dims__(kSoftmaxClusterBlocks, 1, 1) __launch_bounds__(kSoftmaxSplitThreads)
    softmax_split_cluster_kernel(const __grid_constant__ SoftmaxParams p, const int64_t chunk_vecs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90+; the host never launches this kernel below sm_90
#else
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  constexpr bool kFast = kSoftmaxFastMath<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* chunk = reinterpret_cast<V*>(smem_raw);  // (chunk_vecs,) when kInSmem
  __shared__ OnlineSoftmaxState block_state;  // this block's chunk, read by the whole cluster
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t r = blockIdx.x / kSoftmaxClusterBlocks;
  const int64_t nvec = p.cols / V::kN;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  const int64_t n = (v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec) - v0;  // vectors of this chunk (may be <= 0)
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride + v0 * V::kN;
  T* out = static_cast<T*>(p.out) + r * p.out_stride + v0 * V::kN;
  // One 16-byte shared-memory load per vector (LDS.128): copying chunk[i] as a Vec<T> compiled
  // to 8 two-byte loads for 16-bit T.
  const auto smem_vec = [&](int64_t i) -> V { return load_vec(reinterpret_cast<const T*>(chunk + i)); };
  const auto value = [&](int64_t i) -> V { return kInSmem ? smem_vec(i) : load_vec(in + i * V::kN); };
  const auto fold = [](OnlineSoftmaxState& st, const V& v) {
    if constexpr (kFast) online_softmax_add_vec_exp2<T, kPolyShare>(st, v);
    else online_softmax_add_vec(st, v);
  };

  OnlineSoftmaxState st = online_softmax_empty();
  if constexpr (kInSmem) {
    // One commit group per vector of this thread (vectors i = threadIdx.x + k * blockDim.x),
    // then each is folded into the state as soon as it lands, while later ones are still in
    // flight. A thread reads only the vectors it copied itself, so no barrier is needed.
    const int nk = n > threadIdx.x ? static_cast<int>((n - 1 - threadIdx.x) / blockDim.x + 1) : 0;
    const int64_t i0 = threadIdx.x;
    if (n <= static_cast<int64_t>(kSoftmaxSplitUnrolledVpt) * blockDim.x) {
      // Up to kSoftmaxSplitUnrolledVpt vectors per thread (bf16 rows up to 262144 values):
      // always that many commit groups (the extra ones empty, complete at once), so that the
      // wait before vector k is a compile-time count in a fully unrolled loop, not a run-time
      // switch over eight cp.async.wait_group instructions.
      static_assert(kAhead >= 1 && kAhead <= kSoftmaxSplitUnrolledVpt, "copies in flight per thread");
      const auto issue = [&](int k) {
        if (k < nk) cp_async_16(&chunk[i0 + k * blockDim.x], in + (i0 + k * blockDim.x) * V::kN);
        cp_async_commit();
      };
#pragma unroll
      for (int k = 0; k < kAhead; ++k) issue(k);
      static_for<kSoftmaxSplitUnrolledVpt>([&](auto k) {
        if constexpr (k + kAhead < kSoftmaxSplitUnrolledVpt) issue(k + kAhead);
        // Groups committed after vector k's: min(kAhead, kSoftmaxSplitUnrolledVpt - 1 - k).
        constexpr int kNewer = k + kAhead < kSoftmaxSplitUnrolledVpt ? kAhead : kSoftmaxSplitUnrolledVpt - 1 - k;
        cp_async_wait<kNewer>();  // vector k has landed
        if (k < nk) fold(st, smem_vec(i0 + k * blockDim.x));
      });
    } else {
      for (int k = 0; k < nk; ++k) {
        cp_async_16(&chunk[i0 + static_cast<int64_t>(k) * blockDim.x], in + (i0 + static_cast<int64_t>(k) * blockDim.x) * V::kN);
        cp_async_commit();
      }
      for (int k = 0; k < nk; ++k) {
        cp_async_wait_at_most(nk - 1 - k);  // vector k has landed
        fold(st, smem_vec(i0 + static_cast<int64_t>(k) * blockDim.x));
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) fold(st, load_vec(in + i * V::kN));
  }
  st = cluster_all_merge(st, &block_state, cluster);
  // This thread's remote reads are done; the block may not exit before the others' are
  // (barrier_wait at the end), so the output overlaps the wait.
  auto arrived = cluster.barrier_arrive();
  const SplitOutput<T, kLog> output(st);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store_vec(out + i * V::kN, output(value(i)));
  cluster.barrier_wait(std::move(arrived));
#endif
}

// The rung's kernel for chunks of up to kVpt vectors per thread (kVpt one of kSoftmaxRowsVpt;
// bf16 rows up to 8 blocks x 256 threads x 16 x 8 = 262144 values): persistent clusters, slots
// at compile-time offsets. Changes from softmax_split_cluster_kernel, each measured at
// 64 x 128256 bf16 in one process (bench/experiments/softmax_pipelined.cu, H100, 2026-11-26):
//   - each slot k < kVpt of a thread (vector threadIdx.x + k * 256, guarded by i < n) is a
//     compile-time offset in all three loops (copy, fold, output), one commit group per slot,
//     each folded as it lands; the previous kernel's run-time count of slots and its store
//     loop of one STG per iteration took 0.0204-0.0207 ms, this one 0.0191.
//   - the grid is min(rows, resident clusters) clusters; cluster c takes rows c, c + C, ...
//     (C = gridDim.x / kSoftmaxClusterBlocks), one after another in the same chunk buffer. At
//     up to C rows this is the previous grid (a row a cluster); past it, no later waves of
//     blocks that each start with nothing in flight. The block's state for the cluster
//     alternates between two slots: row j + 2 cannot overwrite a state that another block is
//     still reading, since that block has passed row j + 1's cluster barrier first.
// A thread reads from shared memory only the slots it copied itself, so neither the copies nor
// the reuse of the buffer for the next row need a block barrier (its last reads of a slot have
// returned, their values consumed by its stores, before it issues the next row's copy there).
template <typename T, bool kLog, int kVpt>
__global__ void __cluster_dims__(kSoftmaxClusterBlocks, 1, 1) __launch_bounds__(kSoftmaxSplitThreads)
    softmax_rows_cluster_kernel(const __grid_constant__ SoftmaxParams p, const int64_t chunk_vecs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90+; the host never launches this kernel below sm_90
#else
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  constexpr int kThreads = kSoftmaxSplitThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  V* const chunk = reinterpret_cast<V*>(smem_raw);  // (chunk_vecs,), chunk_vecs <= kVpt * kThreads
  __shared__ OnlineSoftmaxState block_state[2];
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t clusters = gridDim.x / kSoftmaxClusterBlocks;
  const int64_t nvec = p.cols / V::kN;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  const int n = static_cast<int>((v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec) - v0);  // may be <= 0
  const int tid = static_cast<int>(threadIdx.x);
  const auto smem_vec = [&](int i) -> V { return load_vec(reinterpret_cast<const T*>(chunk + i)); };
  int slot = 0;
  for (int64_t r = blockIdx.x / kSoftmaxClusterBlocks; r < p.rows; r += clusters, slot ^= 1) {
    const T* in = static_cast<const T*>(p.input) + r * p.input_stride + v0 * V::kN;
    T* out = static_cast<T*>(p.out) + r * p.out_stride + v0 * V::kN;
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {  // always kVpt groups (some empty): compile-time wait counts
      const int i = tid + k * kThreads;
      if (i < n) cp_async_16(chunk + i, in + static_cast<int64_t>(i) * V::kN);
      cp_async_commit();
    }
    OnlineSoftmaxState st = online_softmax_empty();
    static_for<kVpt>([&](auto k) {
      cp_async_wait<kVpt - 1 - k>();  // slot k has landed
      const int i = tid + k * kThreads;
      if (i < n) {
        if constexpr (kSoftmaxFastMath<T>) online_softmax_add_vec_exp2<T>(st, smem_vec(i));
        else online_softmax_add_vec(st, smem_vec(i));
      }
    });
    const SplitOutput<T, kLog> output(cluster_all_merge(st, &block_state[slot], cluster));
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int i = tid + k * kThreads;
      if (i < n) store_vec(out + static_cast<int64_t>(i) * V::kN, output(smem_vec(i)));
    }
  }
  cluster.sync();  // no block exits while another may still read its block_state
#endif
}

}  // namespace flashlab::kernels
