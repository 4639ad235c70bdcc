// Rung 9 — Hopper GEMM: TMA loads completing on mbarriers, wgmma from shared memory,
// producer/consumer warp specialization, a persistent tile scheduler, TMA-store epilogue.
//
// Changes from rung 8 (mma.sync + ldmatrix + cp.async):
//   - TMA: one thread of a producer warpgroup copies whole 2-D boxes (A: 128 x 64, B: BN x 64)
//     from global memory into 128B-swizzled shared memory; the copy engine computes the
//     addresses, zero-fills the K, M and N tails, and signals the bytes on the stage's "full"
//     mbarrier. No thread spends registers or instructions on address arithmetic for loads.
//   - wgmma: a consumer warpgroup (4 warps) issues m64nBNk16 directly on the shared-memory
//     tiles through 64-bit descriptors (no ldmatrix, no register fragments of A or B), and
//     keeps a 64 x BN fp32 accumulator (BN / 2 registers per thread). Two consumer warpgroups
//     split the 128 rows of the tile; while one waits, the other's wgmma keeps the tensor
//     cores busy. Both operands may be K-major or MN-major (the transpose bits of wgmma), so
//     the layouts NN, NT and TN run the same kernel with different tensor maps.
//   - Warp specialization: warpgroup 0 only issues TMA, so it gives registers away
//     (setmaxnreg.dec to 40); the two consumers take them (setmaxnreg.inc to 232) for the
//     accumulators. A ring of kStages buffers with "full" (TMA -> consumers) and "empty"
//     (consumers -> producer) mbarriers decouples them: the producer runs ahead by up to
//     kStages k-blocks, across tile boundaries.
//   - Persistent: one CTA per SM loops over output tiles in a grouped order (kGroupM tile
//     rows at a time, column by column) so that concurrently running CTAs share A rows and B
//     columns in L2; the producer prefetches the next tile while consumers run the epilogue.
//   - Epilogue: alpha / beta / bias in fp32 from the accumulator registers, rounded to 16 bits,
//     written 128 columns at a time to a 128B-swizzled staging tile in shared memory
//     (conflict-free), then TMA-stored (clipped at the M edge by the copy engine; tiles across
//     a ragged N edge store from registers).
// A consumer keeps one k-block of wgmmas in flight while it waits for the next stage, and
// releases a stage once the wgmmas that read it have completed.
// Limits: no pingpong between consumers (they run in lockstep, epilogues included; the variant
// in 09_hopper_ws_pingpong.cuh gives each consumer whole tiles); no split-K or stream-K for
// shapes with fewer tiles than SMs.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "kernels/common/dtype.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/gemm/epilogue.cuh"
#include "kernels/gemm/params.h"

namespace flashlab::kernels {

inline constexpr int kHopperBM = 128;        // rows of a tile: 64 per consumer warpgroup
inline constexpr int kHopperBK = 64;         // k per stage: one 128-byte swizzle row of 16-bit values
inline constexpr int kHopperThreads = 384;   // producer warpgroup + 2 consumer warpgroups
inline constexpr int kHopperGroupM = 8;      // tile rows per rasterization group
inline constexpr int kHopperSwizzleBytes = 128;
inline constexpr int kHopperAtomBytes = 64 * kHopperSwizzleBytes;  // a 64 x 64 16-bit box: 8 KB
inline constexpr int kHopperStoreCols = 128;  // columns of C staged (and TMA-stored) at a time
#ifndef FLASHLAB_HOPPER_MMA_IN_FLIGHT
#define FLASHLAB_HOPPER_MMA_IN_FLIGHT 1
#endif
// k-blocks of wgmmas a consumer leaves in flight when it goes to wait for the next stage (0 or
// 1); FLASHLAB_HOPPER_MMA_IN_FLIGHT overrides it for the ablation.
inline constexpr int kHopperMmaInFlight = FLASHLAB_HOPPER_MMA_IN_FLIGHT;
static_assert(kHopperMmaInFlight == 0 || kHopperMmaInFlight == 1, "0 or 1 k-block of wgmmas in flight");

// How a consumer stores its 64 x BN part of the tile. The library uses kHopperEpiStaged; the
// others are measured by bench/experiments/gemm_hopper_ablation.cu:
//   kHopperEpiStaged       kHopperStoreCols columns at a time through a staging tile and TMA
//                          stores; the alpha / beta / bias test taken once per round, outside the
//                          write loop
//   kHopperEpiStagedWhole  the whole 64 x BN through one staging tile (no wait between parts; one
//                          pipeline stage fewer fits)
//   kHopperEpiRegisters    from the accumulator registers, two values per 4-byte store (no shared
//                          memory, no barrier)
//   kHopperEpiStagedCopy   the staging tile as kHopperEpiStaged, copied out by the consumer's own
//                          threads (16-byte shared loads and global stores) instead of a TMA store
//   kHopperEpiStagedTestPerValue  kHopperEpiStaged with the alpha / beta / bias test inside the
//                          write loop, per pair of values (the library until 2026-11-26: a branch
//                          and a convergence barrier around every staging store; 0.93x cuBLAS at
//                          4096^3 against 0.99x hoisted, same process)
enum HopperEpi : int {
  kHopperEpiStaged = 0, kHopperEpiStagedWhole = 1, kHopperEpiRegisters = 2, kHopperEpiStagedCopy = 3,
  kHopperEpiStagedTestPerValue = 4
};

template <int kBN, int kEpi = kHopperEpiStaged>
struct HopperTile {
  static_assert(kBN == 128 || kBN == 256, "wgmma N of 128 or 256");
  static constexpr int kABytes = kHopperBM * kHopperBK * 2;
  static constexpr int kBBytes = kBN * kHopperBK * 2;
  static constexpr int kStoreCols = kEpi == kHopperEpiStagedWhole ? kBN : kHopperStoreCols;
  static constexpr int kCBytes = kEpi == kHopperEpiRegisters ? 0 : 64 * kStoreCols * 2;  // one consumer's staging tile
  // As many stages as fit next to the staging tiles (at most 6): BN 256: 4, BN 128: 6.
  static constexpr int kStages = (227 * 1024 - 1024 - 2 * kCBytes) / (kABytes + kBBytes) < 6
                                     ? (227 * 1024 - 1024 - 2 * kCBytes) / (kABytes + kBBytes)
                                     : 6;
  static constexpr int kSmemBytes = kStages * (kABytes + kBBytes) + 2 * kCBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "over the 227 KB of dynamic shared memory a block may have");
};

enum HopperProbe : int {
  kProbeTotal, kProbeFullWait, kProbeDrain, kProbeEpilogue,
  kProbeEpiWait,   // in the epilogue: each round's wait for the staging tile to be free (+ barrier)
  kProbeEpiWrite,  // in the epilogue: each round's writes of the staging tile (+ barrier)
  kProbeEmptyWait, kProbeSlots
};
static __device__ long long hopper_probe[1024][kProbeSlots];  // per TU; the experiment's own copy

struct HopperGemmArgs {
  CUtensorMap a, b, c;  // 64-byte aligned by type
  GemmParams p;
  int tiles_m, tiles_n;
};

// Tile t of the grouped order -> (tile row, tile column).
__device__ __forceinline__ void hopper_tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = kHopperGroupM * tiles_n;
  const int first_m = t / per_group * kHopperGroupM;
  const int rows = tiles_m - first_m < kHopperGroupM ? tiles_m - first_m : kHopperGroupM;
  const int r = t % per_group;
  tm = first_m + r % rows;
  tn = r / rows;
}

// kTransA: A is MN-major (column-major A, layout TN); kTransB: B is MN-major (row-major B:
// layouts NN and TN). Otherwise the operand is K-major.
// kCluster = 2: CTAs in pairs (a thread-block cluster) on vertically adjacent tiles, which need
// the same B tile: each CTA loads half of it and multicasts it into both CTAs' shared memory.
// kEpi: the epilogue variant (HopperEpi).
// kProbe (bench/experiments/gemm_hopper_ablation.cu --probe only): clock64() cycles per CTA in
// hopper_probe[blockIdx.x]: {kernel, consumer 0 waiting for full stages, draining its last
// wgmmas, in the epilogue, the producer waiting for empty stages}.
template <typename T, int kBN, bool kTransA, bool kTransB, int kCluster, int kEpi = kHopperEpiStaged,
          bool kProbe = false>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kHopperThreads, 1)
    gemm_hopper_ws_kernel(const __grid_constant__ HopperGemmArgs args) {
  static_assert(kCluster == 1 || kCluster == 2, "single CTAs or pairs");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  using Tile = HopperTile<kBN, kEpi>;
  [[maybe_unused]] const long long probe_start = kProbe ? clock64() : 0;
  [[maybe_unused]] long long probe[kProbeSlots] = {};
  constexpr int kStoreCols = Tile::kStoreCols;
  constexpr int kStages = Tile::kStages;
  constexpr int kAcc = kBN / 2;  // fp32 accumulators per consumer thread
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[kStages], empty[kStages];
  // The 128B swizzle pattern repeats every 1024 bytes: tiles start on a 1024-byte boundary.
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sa = smem;                                   // (kStages, 128 x 64)
  unsigned char* sb = sa + kStages * Tile::kABytes;           // (kStages, BN x 64)
  unsigned char* sc = sb + kStages * Tile::kBBytes;           // (2 consumers, 64 x 128)
  const GemmParams& p = args.p;
  const int wg = threadIdx.x / 128;
  const int k_blocks = (p.K - 1) / kHopperBK + 1;  // K >= 1; no overflow near 2^31
  // Work units: tiles, or with kCluster = 2 pairs of tiles (tile rows 2q and 2q + 1, one per
  // CTA of the pair; a pair past M's last tile row computes zeros and stores nothing).
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
      mbarrier_init(&full[s], 1);                 // the producer's arrive + the TMA bytes
      mbarrier_init(&empty[s], kCluster * 2 * 4); // one arrive per consumer warp of the cluster
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
      for (int u = first_unit; u < units; u += unit_step) {
        int tm, tn;
        tile_of(u, tm, tn);
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const int s = it % kStages;
          // Both CTAs' consumers have released stage s (the peer writes half of B into it).
          [[maybe_unused]] const long long t0 = kProbe ? clock64() : 0;
          mbarrier_wait(&empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
          if constexpr (kProbe) probe[kProbeEmptyWait] += clock64() - t0;
          mbarrier_arrive_expect_tx(&full[s], Tile::kABytes + Tile::kBBytes);
          unsigned char* a_dst = sa + s * Tile::kABytes;
          unsigned char* b_dst = sb + s * Tile::kBBytes;
          const int k0 = kb * kHopperBK;
          if constexpr (kTransA) {  // (K, M) in memory: two 64 (m) x 64 (k) boxes
            tma_load_2d(a_dst, &args.a, tm * kHopperBM, k0, &full[s]);
            tma_load_2d(a_dst + kHopperAtomBytes, &args.a, tm * kHopperBM + 64, k0, &full[s]);
          } else {  // (M, K): one 128 (m) x 64 (k) box
            tma_load_2d(a_dst, &args.a, k0, tm * kHopperBM, &full[s]);
          }
          // B: this CTA's share (all of it, or half multicast to both CTAs of the pair).
          constexpr int kShare = kBN / kCluster;
          if constexpr (kTransB) {  // (K, N) in memory: kShare / 64 boxes of 64 (n) x 64 (k)
#pragma unroll
            for (int h = 0; h < kShare / 64; ++h) {
              const int box = static_cast<int>(rank) * (kShare / 64) + h;
              if constexpr (kCluster > 1)
                tma_load_2d_multicast(b_dst + box * kHopperAtomBytes, &args.b, tn * kBN + box * 64, k0, &full[s], 0x3);
              else
                tma_load_2d(b_dst + box * kHopperAtomBytes, &args.b, tn * kBN + box * 64, k0, &full[s]);
            }
          } else {  // (N, K): one kShare (n) x 64 (k) box
            const int n0 = static_cast<int>(rank) * kShare;
            if constexpr (kCluster > 1)
              tma_load_2d_multicast(b_dst + n0 * kHopperSwizzleBytes, &args.b, k0, tn * kBN + n0, &full[s], 0x3);
            else
              tma_load_2d(b_dst, &args.b, k0, tn * kBN, &full[s]);
          }
        }
      }
      if constexpr (kProbe) hopper_probe[blockIdx.x][kProbeEmptyWait] = probe[kProbeEmptyWait];
    }
  } else {
    // Consumers: warpgroup cw = 0, 1 computes rows [64 cw, 64 cw + 64) of each tile.
    setmaxnreg_inc<232>();
    const int cw = wg - 1;
    const int t128 = threadIdx.x - 128 * wg;  // thread in the warpgroup
    const int warp = t128 / 32, lane = t128 % 32;
    unsigned char* my_sc = sc + cw * Tile::kCBytes;
    float acc[kAcc];
    // This warp is done reading stage s: tell both producers of the pair (each writes into it).
    const auto release = [&](int s) {
      mbarrier_arrive(&empty[s]);
      if constexpr (kCluster > 1) mbarrier_arrive_cluster(&empty[s], rank ^ 1);
    };
    int it = 0;
    [[maybe_unused]] bool epi_open = false;  // kProbe: an epilogue's time is still running
    for (int u = first_unit; u < units; u += unit_step) {
      if constexpr (kProbe) {
        if (epi_open) probe[kProbeEpilogue] += clock64();
        epi_open = false;
      }
      int tm, tn;
      tile_of(u, tm, tn);
      [[maybe_unused]] int prev = -1;  // stage whose wgmmas are still in flight (kHopperMmaInFlight = 1)
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        [[maybe_unused]] const long long t0 = kProbe ? clock64() : 0;
        mbarrier_wait(&full[s], (it / kStages) & 1);
        if constexpr (kProbe) probe[kProbeFullWait] += clock64() - t0;
        const uint32_t a_base = smem_u32(sa + s * Tile::kABytes) + cw * kHopperAtomBytes;  // this consumer's 64 rows
        const uint32_t b_base = smem_u32(sb + s * Tile::kBBytes);
        wgmma_fence_operands(acc);
        wgmma_fence();
#pragma unroll
        for (int k16 = 0; k16 < kHopperBK / 16; ++k16) {
          // K-major: the next 16 k are 32 bytes further along each 128-byte row; MN-major: 16
          // rows of 128 bytes further.
          const uint64_t da = kTransA ? wgmma_desc_sw128(a_base + k16 * 16 * kHopperSwizzleBytes, kHopperAtomBytes, 1024)
                                      : wgmma_desc_sw128(a_base + k16 * 32, 16, 1024);
          const uint64_t db = kTransB ? wgmma_desc_sw128(b_base + k16 * 16 * kHopperSwizzleBytes, kHopperAtomBytes, 1024)
                                      : wgmma_desc_sw128(b_base + k16 * 32, 16, 1024);
          Wgmma<T, kBN>::template mma<kTransA ? 1 : 0, kTransB ? 1 : 0>(acc, da, db, kb > 0 || k16 > 0 ? 1 : 0);
        }
        wgmma_commit();
        if constexpr (kHopperMmaInFlight == 1) {
          // Keep this k-block's wgmmas in flight; the previous one's are done: release its stage.
          wgmma_wait<1>();
          wgmma_fence_operands(acc);
          if (prev >= 0 && lane == 0) release(prev);
          prev = s;
        } else {
          // Wait for this k-block's wgmmas and release its stage at once: the producer gets the
          // buffer one k-block earlier; the tensor cores stay fed by the other consumer.
          wgmma_wait<0>();
          wgmma_fence_operands(acc);
          if (lane == 0) release(s);
        }
      }
      [[maybe_unused]] const long long t_drain = kProbe ? clock64() : 0;
      if constexpr (kHopperMmaInFlight == 1) {
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
        if (lane == 0) release(prev);
      }
      [[maybe_unused]] const long long t_epi = kProbe ? clock64() : 0;
      if constexpr (kProbe) probe[kProbeDrain] += t_epi - t_drain;
      // (kProbe: the epilogue's time ends at the top of the next tile, or after the last.)
      if constexpr (kProbe) {
        probe[kProbeEpilogue] -= t_epi;
        epi_open = true;
      }

      // Epilogue.
      const int row0 = tm * kHopperBM + cw * 64;
      const int col0 = tn * kBN;
      // Measured on H100: a TMA store clips columns at N rounded up to 16 bytes, not at N, so a
      // tile that crosses a ragged N edge (N x element size not a multiple of 16) would write
      // into C's padding. Such tiles store from registers instead.
      const bool direct = kEpi == kHopperEpiRegisters || (col0 + kBN > p.N && (p.N * static_cast<int>(sizeof(T))) % 16 != 0);
      const bool epilogue_math = p.beta != 0.f || p.bias != nullptr || p.alpha != 1.f;
      if (direct) {
        // Each thread holds pairs of adjacent columns: one 4-byte store per pair (n is even and
        // C's rows are 16-byte aligned), element by element only at the N edge.
        T* c = static_cast<T*>(p.c);
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int m = row0 + warp * 16 + lane / 4 + 8 * i, n = col0 + 8 * j + 2 * (lane % 4);
            if (m >= p.M) continue;
            float v0 = acc[4 * j + 2 * i], v1 = acc[4 * j + 2 * i + 1];
            if (epilogue_math) {
              if (n < p.N) v0 = gemm_epilogue_value<T>(p, v0, m, n);
              if (n + 1 < p.N) v1 = gemm_epilogue_value<T>(p, v1, m, n + 1);
            }
            T* dst = c + static_cast<int64_t>(m) * p.ldc + n;
            if (n + 1 < p.N) {
              *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
            } else if (n < p.N) {
              *dst = from_float<T>(v0);
            }
          }
        }
        continue;
      }
      if constexpr (kEpi != kHopperEpiRegisters) {
        // Through shared memory, kStoreCols columns at a time (the library's 128: a 16 KB staging
        // tile per consumer leaves room for one more pipeline stage than a whole 64 x 256 one).
#pragma unroll
        for (int h = 0; h < kBN / kStoreCols; ++h) {
          // The previous TMA store (or this warpgroup's copy-out) must have finished reading the
          // staging tile.
          [[maybe_unused]] const long long t_wait = kProbe ? clock64() : 0;
          if (kEpi != kHopperEpiStagedCopy && t128 == 0) tma_store_wait_all<true>();
          named_barrier_sync(1 + cw, 128);
          [[maybe_unused]] const long long t_write = kProbe ? clock64() : 0;
          if constexpr (kProbe) probe[kProbeEpiWait] += t_write - t_wait;
          // math: alpha / beta / bias applied (a run-time choice), taken once per round outside
          // the loop: tested per pair of values (kHopperEpiStagedTestPerValue) it compiles to a
          // branch with its own convergence barrier around every store, ~65 instructions apart
          // instead of 1-3, and the staging writes took 7.7% of a CTA's cycles instead of 1.5%.
          const auto write_part = [&](auto math) {
#pragma unroll
            for (int jj = 0; jj < kStoreCols / 8; ++jj) {
              const int j = h * (kStoreCols / 8) + jj;
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const int r = warp * 16 + lane / 4 + 8 * i;  // row in this consumer's 64
                const int c = 8 * jj + 2 * (lane % 4);       // column in this 128-column part
                float v0 = acc[4 * j + 2 * i], v1 = acc[4 * j + 2 * i + 1];
                const int m = row0 + r, n = col0 + h * kStoreCols + c;
                if (decltype(math)::value || (kEpi == kHopperEpiStagedTestPerValue && epilogue_math)) {
                  v0 = m < p.M && n < p.N ? gemm_epilogue_value<T>(p, v0, m, n) : 0.f;
                  v1 = m < p.M && n + 1 < p.N ? gemm_epilogue_value<T>(p, v1, m, n + 1) : 0.f;
                }
                // 128B-swizzled staging: 64-column slabs of 64 rows x 128 bytes; the 16-byte chunk
                // index within a row is XORed with row % 8, so the 8 rows a warp writes at once
                // hit 8 different chunks (all 32 banks).
                const int slab = c / 64, chunk = (c % 64) / 8, byte = (c % 8) * 2;
                unsigned char* dst = my_sc + slab * kHopperAtomBytes + r * kHopperSwizzleBytes + ((chunk ^ (r % 8)) * 16) + byte;
                *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
              }
            }
          };
          if (kEpi != kHopperEpiStagedTestPerValue && epilogue_math) write_part(std::true_type{});
          else write_part(std::false_type{});
          if constexpr (kEpi == kHopperEpiStagedCopy) {
            // Every thread copies 16-byte chunks out: thread t takes chunks t, t + 128, ... of
            // the 64 rows x kStoreCols columns (a row is kStoreCols / 8 chunks; consecutive
            // threads take consecutive chunks of a row: coalesced stores, and the 8 chunks of a
            // slab row that a quarter-warp reads lie in 8 different 16-byte bank groups).
            named_barrier_sync(1 + cw, 128);  // the staging tile is written
            if constexpr (kProbe) probe[kProbeEpiWrite] += clock64() - t_write;
            constexpr int kRowChunks = kStoreCols / 8;
            T* c = static_cast<T*>(p.c);
#pragma unroll
            for (int q = 0; q < 64 * kRowChunks / 128; ++q) {
              const int idx = t128 + 128 * q, r = idx / kRowChunks, cc = idx % kRowChunks;
              const int slab = cc / 8, chunk = cc % 8;
              const uint4 v = *reinterpret_cast<const uint4*>(my_sc + slab * kHopperAtomBytes + r * kHopperSwizzleBytes +
                                                              ((chunk ^ (r % 8)) * 16));
              const int m = row0 + r, n = col0 + h * kStoreCols + cc * 8;
              // N is a multiple of 8 here (ragged rows took the direct path): a chunk is all in or out.
              if (m < p.M && n < p.N) *reinterpret_cast<uint4*>(c + static_cast<int64_t>(m) * p.ldc + n) = v;
            }
            // (the next round's barrier at the top orders these reads before its writes)
            continue;
          }
          fence_proxy_async_smem();  // these writes before the TMA engine reads them
          named_barrier_sync(1 + cw, 128);
          if constexpr (kProbe) probe[kProbeEpiWrite] += clock64() - t_write;
          if (t128 == 0) {
            const int n0 = col0 + h * kStoreCols;
#pragma unroll
            for (int slab = 0; slab < kStoreCols / 64; ++slab)
              if (row0 < p.M && n0 + slab * 64 < p.N) tma_store_2d(&args.c, my_sc + slab * kHopperAtomBytes, n0 + slab * 64, row0);
            tma_store_commit();
          }
        }
      }
    }
    if constexpr (kProbe) {
      if (epi_open) probe[kProbeEpilogue] += clock64();
      if (cw == 0 && t128 == 0) {
        probe[kProbeTotal] = clock64() - probe_start;
        for (int i = 0; i < kProbeEmptyWait; ++i) hopper_probe[blockIdx.x][i] = probe[i];
      }
    }
    if (t128 == 0) tma_store_wait_all<false>();
  }  // consumers
  // No CTA of a pair exits while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync_all();
#endif
}

}  // namespace flashlab::kernels
