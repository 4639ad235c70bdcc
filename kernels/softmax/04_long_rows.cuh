// Rung 4 — softmax of few long rows (vocabulary logits, 64 x 128256): each row split over a
// cluster of kSoftmaxClusterBlocks thread blocks, merged through distributed shared memory.
//
// Changes from rung 3: a row is cut into kSoftmaxClusterBlocks chunks of chunk_vecs vectors,
// one per block of a thread-block cluster (sm_90), so 64 rows become 512 blocks and fill the
// GPU instead of 64 SMs. Steps, per block (rank q of the row's cluster):
//   1. load its chunk into registers (softmax_split_vpt<T>() vectors per thread, loads first) and
//      fold it into an OnlineSoftmaxState; merge over the block (block_all_merge);
//   2. thread 0 puts the block's state in shared memory; cluster barrier;
//   3. warp 0 reads the kSoftmaxClusterBlocks states of the cluster from the other blocks'
//      shared memory (map_shared_rank) and merges them (warp_merge: every block of the row
//      computes the same, bit for bit); cluster barrier (no block leaves while its shared
//      memory may still be read);
//   4. every thread scales its vectors from registers and stores them.
// The input is read once, with no workspace, no counters and no second launch: the cluster's
// blocks are co-scheduled by the hardware, so waiting on each other cannot deadlock (a
// ticket scheme across independent blocks would need a second pass or a second read instead).
// Chunks too long for the registers (!kInRegs: rows > 131072 elements)
// are folded as they stream by and read a second time to write.
// Same precondition as rung 3. The host sends rows here only when they are few or past one
// block's register budget; otherwise rung 3's kernels are the top rung's.
// Limits: what is left is the launch and two cluster barriers per row; for rows too long for
// the cluster's registers, the second read.
#pragma once

#include <cmath>

#include <cooperative_groups.h>

#include "kernels/common/online_softmax.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/softmax/params.h"

namespace flashlab::kernels {

inline constexpr int kSoftmaxClusterBlocks = 8;      // blocks per row (the portable cluster limit)
// Values per thread held in registers: 8 fp32 / 4 bf16 vectors. A cluster then holds 8 x 512 x 32
// = 131072 values, a 128256 vocabulary row in every dtype. 64 values (8 bf16 vectors) took 107
// registers per thread for bf16 (ptxas sm_90a): 2 blocks of 256 threads per SM instead of 4.
inline constexpr int kSoftmaxSplitValuesPerThread = 32;
inline constexpr int kSoftmaxSplitMinThreads = 128;  // so that short chunks still get 4 warps
inline constexpr int kSoftmaxSplitMaxThreads = 512;
static_assert(kSoftmaxClusterBlocks <= kWarpSize, "warp 0 merges one state per block of the cluster");

// Vectors per thread of the register path (host and device call it).
template <typename T>
constexpr int softmax_split_vpt() {
  static_assert(kSoftmaxSplitValuesPerThread % Vec<T>::kN == 0, "whole vectors");
  return kSoftmaxSplitValuesPerThread / Vec<T>::kN;
}

// Block b works on row b / kSoftmaxClusterBlocks, vectors [q * chunk_vecs, (q + 1) * chunk_vecs)
// of it, q = its rank in the cluster. kInRegs: blockDim.x * softmax_split_vpt<T>() >= chunk_vecs.
template <typename T, bool kLog, bool kInRegs>
__global__ void __cluster_dims__(kSoftmaxClusterBlocks, 1, 1) __launch_bounds__(kSoftmaxSplitMaxThreads, 1)
    softmax_split_cluster_kernel(const __grid_constant__ SoftmaxParams p, const int64_t chunk_vecs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters are sm_90+; the host never launches this kernel below sm_90
#else
  namespace cg = cooperative_groups;
  using V = Vec<T>;
  constexpr int kVpt = softmax_split_vpt<T>();
  __shared__ OnlineSoftmaxState block_state;  // this block's chunk, read by the whole cluster
  __shared__ OnlineSoftmaxState row_state;    // the whole row, for this block's threads
  const cg::cluster_group cluster = cg::this_cluster();
  const int64_t r = blockIdx.x / kSoftmaxClusterBlocks;
  const int64_t nvec = p.cols / V::kN;
  const int64_t v0 = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  const int64_t v1 = v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  T* out = static_cast<T*>(p.out) + r * p.out_stride;

  OnlineSoftmaxState st = online_softmax_empty();
  V x[kInRegs ? kVpt : 1];  // (kVpt,) vectors of the chunk when kInRegs
  if constexpr (kInRegs) {
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int64_t i = v0 + k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < v1) x[k] = load_vec(in + i * V::kN);
    }
#pragma unroll
    for (int k = 0; k < kVpt; ++k)
      if (v0 + k * static_cast<int64_t>(blockDim.x) + threadIdx.x < v1) online_softmax_add_vec(st, x[k]);
  } else {
    for (int64_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) online_softmax_add_vec(st, load_vec(in + i * V::kN));
  }
  st = block_all_merge(st);
  if (threadIdx.x == 0) block_state = st;
  cluster.sync();  // every block's state written and visible to the cluster
  if (threadIdx.x < kWarpSize) {
    OnlineSoftmaxState t = online_softmax_empty();
    if (threadIdx.x < kSoftmaxClusterBlocks) t = *cluster.map_shared_rank(&block_state, threadIdx.x);
    t = warp_merge(t);
    if (threadIdx.x == 0) row_state = t;
  }
  cluster.sync();  // remote reads done before any block exits; row_state visible to the block
  st = row_state;
  const float log_s = logf(st.s);
  if constexpr (kInRegs) {
#pragma unroll
    for (int k = 0; k < kVpt; ++k) {
      const int64_t i = v0 + k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < v1) store_vec(out + i * V::kN, softmax_vec<T, kLog>(x[k], st, log_s));
    }
  } else {
    for (int64_t i = v0 + threadIdx.x; i < v1; i += blockDim.x)
      store_vec(out + i * V::kN, softmax_vec<T, kLog>(load_vec(in + i * V::kN), st, log_s));
  }
#endif
}

}  // namespace flashlab::kernels
