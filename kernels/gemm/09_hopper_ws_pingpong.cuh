// Rung 9, pingpong variant: each consumer warpgroup computes whole tiles, and the two consumers
// take turns, so that one's epilogue runs while the other's wgmmas keep the tensor cores busy.
//
// Goal: rung 9 (09_hopper_ws.cuh) reaches 0.87-0.89x of cuBLAS at 4096^3 NN bf16. Nsight Compute
// showed the tensor cores idle while both consumers ran the epilogue in lockstep. This variant
// is built to be measured against it (bench/experiments/gemm_hopper_ablation.cu).
//
// Changes from 09_hopper_ws.cuh (the same TMA boxes, wgmma descriptors, epilogue, CTA pairs
// and tile order; its constants, HopperGemmArgs, hopper_tile_coords and pack2 are reused; the
// stage loads and the epilogue are functions here, inline there: moving rung 9's copies into
// shared functions changed its SASS, register allocation and predication, under nvcc 13.0):
//   - 128 x 128 tiles, each computed by ONE consumer warpgroup: two m64n128k16 wgmma chains per
//     k16 step (tile rows 0-63 and 64-127), 2 x 64 fp32 accumulators per thread (128 registers,
//     like a consumer of the 128 x 256 lockstep kernel).
//   - The CTA's persistent tile sequence alternates between the consumers: consumer 0 takes the
//     CTA's 1st, 3rd, ... tile, consumer 1 the 2nd, 4th, .... The producer fills the ring in tile
//     order, so consumer 1's stages arrive while consumer 0 finishes its main loop, and each
//     consumer's epilogue runs under the other's main loop.
//   - One "full" barrier per stage AND consumer. With one per stage, a consumer whose tile
//     starts while the other still holds the ring would wait on phases whose predecessor may
//     still be in progress; a parity wait passes whenever the current phase has the other
//     parity, so it would pass one phase early and read a stage before its TMA lands. A
//     consumer waits on every phase of its own full barriers in order; one bit per stage
//     tracks their parities.
//   - "empty" barriers count the 4 warps of the ONE consumer that read the stage, in each CTA
//     of the pair (kCluster * 4 arrivals). Both CTAs of a pair walk the same tile count, so a
//     stage use belongs to the same consumer index in both.
//   - kOrdered: named barriers make the main loops strictly alternate: a consumer issues its
//     tile's first wgmma only after the other has issued all of its previous tile's. Without
//     it the two overlap for up to kStages k-blocks (consumer B's first stages are loaded as
//     consumer A releases its last ones) and the tensor cores interleave their wgmmas.
//
// Steps:
//   1. Thread 0 initialises the barriers; the cluster (or block) syncs.
//   2. Producer (thread 0 of warpgroup 0): for the CTA's j-th tile, for each k-block it = j
//      k_blocks + kb: wait empty[it % kStages], arm full[j % 2][it % kStages] with 32 KB, TMA
//      the A box (128 x 64) and B (128 x 64; with pairs this CTA's half, multicast).
//   3. Consumer c: for tiles j = c, c + 2, ...: [kOrdered: wait for the other's hand-over], per
//      k-block wait full[c][s] (own parity bit), 8 wgmmas, commit, keep them in flight and
//      release the previous k-block's stage; [kOrdered: hand over]; drain, release the last
//      stage; epilogue: two 64-row halves through this consumer's 64 x 128 staging tile.
//   4. Cluster sync before exit (the peer may still multicast or arrive remotely).
//
// Shared memory: a stage is A 128 x 64 + B 128 x 64 16-bit values = 16 + 16 = 32 KB;
// 6 stages = 192 KB, plus one 64 x 128 staging tile per consumer (16 KB each, a tile stored in
// two 64-row rounds) = 224 KB, plus 1 KB of alignment slack = 225 KB = 230400 B; with the
// 144 B of static barriers 230544 B <= 227 KB (232448 B). (5 stages and whole 128 x 128
// staging tiles, 32 KB each, take the same 225 KB: not tried.)
// Limits: as rung 9 (16-bit types, sm_90a, 16-byte aligned leading dims), tile width 128 only;
// a CTA with one tile leaves consumer 1 idle (M = 128 decode shapes gain nothing); no stream-K.
#pragma once

#include <cstdint>

#include "kernels/gemm/09_hopper_ws.cuh"

namespace flashlab::kernels {

struct HopperPingpongTile {
  static constexpr int kBN = 128;                            // tile columns (wgmma N)
  static constexpr int kABytes = kHopperBM * kHopperBK * 2;  // (128, 64) of A: 16 KB
  static constexpr int kBBytes = kBN * kHopperBK * 2;        // (128, 64) of B: 16 KB
  static constexpr int kCBytes = 64 * kHopperStoreCols * 2;  // (64, 128) staging tile per consumer: 16 KB
  static constexpr int kStages = 6;
  static constexpr int kBarrierBytes = 3 * kStages * 8;      // full[2][kStages], empty[kStages]: static smem
  static constexpr int kSmemBytes = kStages * (kABytes + kBBytes) + 2 * kCBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes == 6 * 32768 + 2 * 16384 + 1024, "6 stages of 32 KB + 2 x 16 KB staging + 1 KB = 225 KB");
  static_assert(kSmemBytes + kBarrierBytes <= 227 * 1024, "over the 227 KB of shared memory a block may have");
  static_assert(kStages <= 32, "one parity bit per stage in a 32-bit word");
};

// Named barriers: 1 and 2 are the consumers' epilogue barriers (128 threads each);
// kPingpongOrderBarrier + c (256 threads) is "consumer c may issue its next tile".
inline constexpr int kPingpongOrderBarrier = 3;

// Producer, one stage: arms `full` for the stage's 32 KB and issues the TMA loads for tile
// (tm, tn) at k = k0 into a_dst (128 x 64 of A) and b_dst (128 x 64 of B): all of B, or with
// kCluster = 2 this CTA's half, multicast into both CTAs (each CTA's `full` at the same offset).
// The same boxes as rung 9's producer (inline in gemm_hopper_ws_kernel: calling this function
// from there changed its SASS).
template <bool kTransA, bool kTransB, int kCluster>
__device__ __forceinline__ void hopper_pingpong_load_stage(const HopperGemmArgs& args, unsigned char* a_dst,
                                                           unsigned char* b_dst, uint64_t* full, int tm, int tn, int k0,
                                                           uint32_t rank) {
  constexpr int kBN = HopperPingpongTile::kBN;
  mbarrier_arrive_expect_tx(full, HopperPingpongTile::kABytes + HopperPingpongTile::kBBytes);
  if constexpr (kTransA) {  // (K, M) in memory: two 64 (m) x 64 (k) boxes
    tma_load_2d(a_dst, &args.a, tm * kHopperBM, k0, full);
    tma_load_2d(a_dst + kHopperAtomBytes, &args.a, tm * kHopperBM + 64, k0, full);
  } else {  // (M, K): one 128 (m) x 64 (k) box
    tma_load_2d(a_dst, &args.a, k0, tm * kHopperBM, full);
  }
  // B: this CTA's share (all of it, or half multicast to both CTAs of the pair).
  constexpr int kShare = kBN / kCluster;
  if constexpr (kTransB) {  // (K, N) in memory: kShare / 64 boxes of 64 (n) x 64 (k)
#pragma unroll
    for (int h = 0; h < kShare / 64; ++h) {
      const int box = static_cast<int>(rank) * (kShare / 64) + h;
      if constexpr (kCluster > 1)
        tma_load_2d_multicast(b_dst + box * kHopperAtomBytes, &args.b, tn * kBN + box * 64, k0, full, 0x3);
      else
        tma_load_2d(b_dst + box * kHopperAtomBytes, &args.b, tn * kBN + box * 64, k0, full);
    }
  } else {  // (N, K): one kShare (n) x 64 (k) box
    const int n0 = static_cast<int>(rank) * kShare;
    if constexpr (kCluster > 1)
      tma_load_2d_multicast(b_dst + n0 * kHopperSwizzleBytes, &args.b, k0, tn * kBN + n0, full, 0x3);
    else
      tma_load_2d(b_dst, &args.b, k0, tn * kBN, full);
  }
}

// Consumer epilogue: one warpgroup's 64 x kCols accumulator block (wgmma m64nCOLSk16 layout,
// thread t128 of the warpgroup) -> C rows [row0, row0 + 64), columns [col0, col0 + kCols), with
// alpha / beta / bias, through the warpgroup's 64 x 128 staging tile `sc` and TMA stores (its
// bulk groups belong to thread 0 of the warpgroup), or from registers across a ragged N edge.
// bar: the warpgroup's named barrier (128 threads). The same code as rung 9's epilogue with its
// 128-column staging, inline there: calling a shared function from rung 9 changed its SASS. Tried
// again at b8de45c (main loop identical, epilogue blocks reordered) and reverted: 4096^3 (pairs)
// ran at 660 against 697 TF/s before, within this size's spread but not shown harmless (results
// bench/results/experiments/gemm_hopper_ablation_b8de45c_shared_epilogue.*). Rung 9 now stores
// ragged-N tiles two values per store; this copy stores them element by element.
template <typename T, int kCols>
__device__ __forceinline__ void hopper_pingpong_store_rows64(const HopperGemmArgs& args, const float (&acc)[kCols / 2],
                                                             int row0, int col0, unsigned char* sc, int t128, int bar) {
  static_assert(kCols % kHopperStoreCols == 0, "whole 128-column staging rounds");
  const GemmParams& p = args.p;
  const int warp = t128 / 32, lane = t128 % 32;
  // Measured on H100: a TMA store clips columns at N rounded up to 16 bytes, not at N, so a
  // tile that crosses a ragged N edge (N x element size not a multiple of 16) would write
  // into C's padding. Such tiles store from registers, element by element, instead.
  const bool direct = col0 + kCols > p.N && (p.N * static_cast<int>(sizeof(T))) % 16 != 0;
  const bool epilogue_math = p.beta != 0.f || p.bias != nullptr || p.alpha != 1.f;
  if (direct) {
    T* c = static_cast<T*>(p.c);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int m = row0 + warp * 16 + lane / 4 + 8 * i, n = col0 + 8 * j + 2 * (lane % 4);
        if (m >= p.M) continue;
        if (n < p.N) c[m * p.ldc + n] = from_float<T>(epilogue_math ? gemm_epilogue_value<T>(p, acc[4 * j + 2 * i], m, n) : acc[4 * j + 2 * i]);
        if (n + 1 < p.N)
          c[m * p.ldc + n + 1] = from_float<T>(epilogue_math ? gemm_epilogue_value<T>(p, acc[4 * j + 2 * i + 1], m, n + 1)
                                                             : acc[4 * j + 2 * i + 1]);
      }
    }
    return;
  }
  // Through shared memory, 128 columns at a time (one round here: kCols = 128).
#pragma unroll
  for (int h = 0; h < kCols / kHopperStoreCols; ++h) {
    // The previous TMA store must have finished reading the staging tile.
    if (t128 == 0) tma_store_wait_all<true>();
    named_barrier_sync(bar, 128);
#pragma unroll
    for (int jj = 0; jj < kHopperStoreCols / 8; ++jj) {
      const int j = h * (kHopperStoreCols / 8) + jj;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = warp * 16 + lane / 4 + 8 * i;  // row in this consumer's 64
        const int c = 8 * jj + 2 * (lane % 4);       // column in this 128-column part
        float v0 = acc[4 * j + 2 * i], v1 = acc[4 * j + 2 * i + 1];
        const int m = row0 + r, n = col0 + h * kHopperStoreCols + c;
        if (epilogue_math) {
          v0 = m < p.M && n < p.N ? gemm_epilogue_value<T>(p, v0, m, n) : 0.f;
          v1 = m < p.M && n + 1 < p.N ? gemm_epilogue_value<T>(p, v1, m, n + 1) : 0.f;
        }
        // 128B-swizzled staging: 64-column slabs of 64 rows x 128 bytes; the 16-byte chunk
        // index within a row is XORed with row % 8, so the 8 rows a warp writes at once hit
        // 8 different chunks (all 32 banks).
        const int slab = c / 64, chunk = (c % 64) / 8, byte = (c % 8) * 2;
        unsigned char* dst = sc + slab * kHopperAtomBytes + r * kHopperSwizzleBytes + ((chunk ^ (r % 8)) * 16) + byte;
        *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
      }
    }
    fence_proxy_async_smem();  // these writes before the TMA engine reads them
    named_barrier_sync(bar, 128);
    if (t128 == 0) {
      const int n0 = col0 + h * kHopperStoreCols;
#pragma unroll
      for (int slab = 0; slab < kHopperStoreCols / 64; ++slab)
        if (row0 < p.M && n0 + slab * 64 < p.N) tma_store_2d(&args.c, sc + slab * kHopperAtomBytes, n0 + slab * 64, row0);
      tma_store_commit();
    }
  }
}

// kTransA, kTransB, kCluster as for gemm_hopper_ws_kernel; kOrdered: strictly alternating main
// loops (see the file comment). Launch with kHopperThreads threads, HopperPingpongTile::kSmemBytes
// of dynamic shared memory, tile_n counted in 128-column tiles.
template <typename T, bool kTransA, bool kTransB, int kCluster, bool kOrdered>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kHopperThreads, 1)
    gemm_hopper_pingpong_kernel(const __grid_constant__ HopperGemmArgs args) {
  static_assert(kCluster == 1 || kCluster == 2, "single CTAs or pairs");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  using Tile = HopperPingpongTile;
  constexpr int kBN = Tile::kBN;
  constexpr int kStages = Tile::kStages;
  extern __shared__ unsigned char smem_raw[];
  // full[c][s]: stage s loaded for consumer c; empty[s]: stage s released by its consumer (both CTAs).
  __shared__ uint64_t full[2][kStages], empty[kStages];
  // The 128B swizzle pattern repeats every 1024 bytes: tiles start on a 1024-byte boundary.
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sa = smem;                          // (kStages, 128 x 64)
  unsigned char* sb = sa + kStages * Tile::kABytes;  // (kStages, 128 x 64)
  unsigned char* sc = sb + kStages * Tile::kBBytes;  // (2 consumers, 64 x 128)
  const GemmParams& p = args.p;
  const int wg = threadIdx.x / 128;
  const int k_blocks = (p.K - 1) / kHopperBK + 1;  // K >= 1; no overflow near 2^31
  // Work units as in rung 9: tiles, or with kCluster = 2 pairs of tiles (tile rows 2q, 2q + 1).
  const int unit_rows = (args.tiles_m + kCluster - 1) / kCluster;
  const int units = unit_rows * args.tiles_n;
  const uint32_t rank = kCluster > 1 ? cluster_cta_rank() : 0;
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  const auto tile_of = [&](int u, int& tm, int& tn) {
    hopper_tile_coords(u, unit_rows, args.tiles_n, tm, tn);
    tm = tm * kCluster + static_cast<int>(rank);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[0][s], 1);           // the producer's arrive + the TMA bytes
      mbarrier_init(&full[1][s], 1);
      mbarrier_init(&empty[s], kCluster * 4);  // one arrive per warp of one consumer, per CTA
    }
    fence_barrier_init();
  }
  if constexpr (kCluster > 1) cluster_sync_all();  // the peer's barriers exist before any use
  else __syncthreads();

  if (wg == 0) {  // producer
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&args.a);
      prefetch_tensor_map(&args.b);
      int it = 0;  // k-blocks issued by this CTA, over all its tiles
      for (int u = first_unit, j = 0; u < units; u += unit_step, ++j) {
        int tm, tn;
        tile_of(u, tm, tn);
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const int s = it % kStages;
          // Both CTAs' consumers have released stage s (the peer writes half of B into it).
          mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
          hopper_pingpong_load_stage<kTransA, kTransB, kCluster>(args, sa + s * Tile::kABytes, sb + s * Tile::kBBytes,
                                                                 &full[j % 2][s], tm, tn, kb * kHopperBK, rank);
        }
      }
    }
  } else {
    // Consumers: warpgroup cw = 0, 1 computes the CTA's tiles j = cw, cw + 2, ..., all 128 rows.
    setmaxnreg_inc<232>();
    const int cw = wg - 1;
    const int t128 = threadIdx.x - 128 * wg;  // thread in the warpgroup
    const int lane = t128 % 32;
    unsigned char* my_sc = sc + cw * Tile::kCBytes;
    float acc[2][kBN / 2];  // (tile rows 0-63 | 64-127, 64 fp32 per thread)
    // This warp is done reading stage s: tell both producers of the pair (each writes into it).
    const auto release = [&](int s) {
      mbarrier_arrive(&empty[s]);
      if constexpr (kCluster > 1) mbarrier_arrive_cluster(&empty[s], rank ^ 1);
    };
    uint32_t parity = 0;  // bit s: parity of the phase of full[cw][s] this consumer waits for next
    for (int u = first_unit + cw * unit_step, j = cw; u < units; u += 2 * unit_step, j += 2) {
      int tm, tn;
      tile_of(u, tm, tn);
      // The other consumer has issued all of tile j - 1's wgmmas.
      if constexpr (kOrdered)
        if (j > 0) named_barrier_sync(kPingpongOrderBarrier + cw, 256);
      int prev = -1;  // stage whose wgmmas are still in flight
      for (int kb = 0, it = j * k_blocks; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        mbarrier_wait(&full[cw][s], (parity >> s) & 1);
        parity ^= 1u << s;
        const uint32_t a_base = smem_u32(sa + s * Tile::kABytes);
        const uint32_t b_base = smem_u32(sb + s * Tile::kBBytes);
        wgmma_fence_operands(acc[0]);
        wgmma_fence_operands(acc[1]);
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < kHopperBK / 16; ++k16) {
          // K-major: the next 16 k are 32 bytes further along each 128-byte row; MN-major: 16
          // rows of 128 bytes further.
          const uint64_t db = kTransB ? wgmma_desc_sw128(b_base + k16 * 16 * kHopperSwizzleBytes, kHopperAtomBytes, 1024)
                                      : wgmma_desc_sw128(b_base + k16 * 32, 16, 1024);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t a_h = a_base + h * kHopperAtomBytes;  // tile rows [64 h, 64 h + 64)
            const uint64_t da = kTransA ? wgmma_desc_sw128(a_h + k16 * 16 * kHopperSwizzleBytes, kHopperAtomBytes, 1024)
                                        : wgmma_desc_sw128(a_h + k16 * 32, 16, 1024);
            Wgmma<T, kBN>::template mma<kTransA ? 1 : 0, kTransB ? 1 : 0>(acc[h], da, db, kb > 0 || k16 > 0 ? 1 : 0);
          }
        }
        wgmma_commit();
        // Keep this k-block's wgmmas in flight; the previous one's are done: release its stage.
        wgmma_wait<1>();
        wgmma_fence_operands(acc[0]);
        wgmma_fence_operands(acc[1]);
        if (prev >= 0 && lane == 0) release(prev);
        prev = s;
      }
      // Hand the tensor cores to the other consumer if it has a next tile (balanced: it waits
      // before each of its tiles but its first).
      if constexpr (kOrdered)
        if (u + unit_step < units) named_barrier_arrive(kPingpongOrderBarrier + (cw ^ 1), 256);
      wgmma_wait<0>();
      wgmma_fence_operands(acc[0]);
      wgmma_fence_operands(acc[1]);
      if (lane == 0) release(prev);

      // Epilogue: the two 64-row halves in turn through this consumer's staging tile (each
      // round waits until the previous round's TMA store has read it).
#pragma unroll
      for (int h = 0; h < 2; ++h)
        hopper_pingpong_store_rows64<T, kBN>(args, acc[h], tm * kHopperBM + 64 * h, tn * kBN, my_sc, t128, 1 + cw);
    }
    if (t128 == 0) tma_store_wait_all<false>();
  }  // consumers
  // No CTA of a pair exits while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync_all();
#endif
}

}  // namespace flashlab::kernels
