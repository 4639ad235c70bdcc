// Rung 8 — Ampere-class tensor-core GEMM: mma.sync.m16n8k16 in inline PTX, operands brought
// to registers by ldmatrix from an XOR-swizzled shared layout, filled by a multi-stage
// cp.async pipeline. fp16/bf16 in and out, fp32 accumulators, one rounding on output.
//
// Changes from rung 7 (WMMA, two stages filled through registers):
//  1. cp.async pipeline, kStages deep: a tile's copy from global to shared memory bypasses the
//     registers, so no thread waits on a load before storing it, and kStages - 1 tiles are in
//     flight at all times (rung 7: one). Still one barrier per k tile.
//  2. mma.sync.m16n8k16 with explicit fragments. Per warp and 16-wide k step, ldmatrix.x4
//     fetches four 8x8 matrices in one instruction, already in the mma's register layout:
//     for A (row-major, the mma's "row") plainly, for B, which is (K, N) row-major in memory
//     while the mma wants it k-contiguous ("col"), with .trans.
//  3. A swizzled layout instead of padding: a shared row is kBK or kBN elements (8 or 32 chunks
//     of 16 bytes) and chunk c of row r is stored at chunk c ^ (r % 8). The 8 row addresses of
//     one ldmatrix matrix (8 rows, same logical chunk) then fall in 8 different 16-byte bank
//     groups, and so do the 8 chunks of one cp.async phase (8 threads, consecutive chunks of one
//     row): no bank conflicts on either side, no wasted bytes.
//  4. A larger tile: block (kBM, kBN, kBK) = (128, 256, 64), 8 warps as 2 (m) x 4 (n), warp tile
//     (64, 64) = 4 x 8 mma tiles (128 fp32 accumulators per thread). Per k step a warp issues
//     8 ldmatrix.x4 for 32 mma: 4 mma per shared-memory load instruction (rung 7: 8 mma_sync per
//     6 fragment loads, each of several instructions). The fragments of the next k step are
//     loaded while the mma of this one run (two register sets), also across the k-tile edge.
//  5. Grouped rasterization: blocks walk kGroupM tile rows column by column, so the ~132
//     resident blocks cover about 16 x 8 tiles and share their A and B panels in L2.
//  6. The epilogue stages the fp32 tile in shared memory (reused from the pipeline) so each
//     thread writes 8 consecutive outputs as one 16-byte store, coalesced per warp.
// Tails: copies past M, N or K use cp.async's src-size (0..16 bytes read, the rest zero-filled),
// so partial tiles compute on zeros and need no special inner loop. Blocks whose tile crosses
// M or N run their own copy of the main loop with those checks; interior blocks check only K.
// Precondition of the cp.async path (kAsync; the host checks): A, B 16-byte aligned and leading
// dims multiples of 8 elements. Otherwise (!kAsync) the kernel fills the same swizzled tiles
// with element loads and plain stores, on (128, 128, 64) tiles in 2 stages (the loads' registers
// do not fit beside a (64, 64) warp tile, and synchronous loads gain nothing from depth):
// correct, not fast.
// Limits: on Hopper mma.sync is a synchronous, per-warp instruction fed from registers; the
// warps spend issue slots on ldmatrix, address arithmetic and copies, and the accumulators
// cap the tile at what 255 registers hold. Hopper's full tensor rate needs wgmma (operands
// read straight from shared memory, asynchronous, 4 warps per instruction) fed by TMA bulk
// copies — rung 9.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/gemm/07_wmma.cuh"  // gemm_store_tile, gemm_c_vec16

namespace flashlab::kernels {

// ---- rung 8 ----

// kBN 256: the fast configuration (cp.async); kBN 128: the element-load fallback, whose
// copies need registers that a (64, 64) warp tile leaves no room for.
template <int kBN_, int kStages_>
struct GemmMmaSyncTraits {
  static constexpr int kBM = 128, kBN = kBN_, kBK = 64;  // block tile
  static constexpr int kWarpsM = 2, kWarpsN = 4;         // warp grid
  static constexpr int kStages = kStages_;               // shared-memory pipeline depth
  static constexpr int kGroupM = 16;                     // tile rows per rasterization group
  static constexpr int kThreads = kWarpsM * kWarpsN * kWarpSize;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // (64, 64) at kBN 256
  static constexpr int kMmaTilesM = kWarpM / 16, kMmaTilesN = kWarpN / 8;  // 4 x 8 mma tiles per warp at kBN 256
  static constexpr int kKSteps = kBK / 16;                               // mma k steps per k tile
  static constexpr int kElem = 2;                                        // bytes of fp16 / bf16
  static constexpr int kChunksA = kBK * kElem / 16, kChunksB = kBN * kElem / 16;  // 16-byte chunks per row
  static constexpr int kABytes = kBM * kBK * kElem, kBBytes = kBK * kBN * kElem;
  static constexpr int kStageBytes = kABytes + kBBytes;  // 48 KB at kBN 256
  static constexpr int kLdC = kBN + 8;  // fp32 C tile row stride: +8 floats, conflict-free float2 stores
  static constexpr int kCBytes = kBM * kLdC * 4;
  static constexpr int kSmemBytes = kStages * kStageBytes > kCBytes ? kStages * kStageBytes : kCBytes;
  // Copies: octet q of threads (tid / 8) takes rows q + h * kOctets, h < k*RowsPerThread.
  static constexpr int kOctets = kThreads / 8;
  static constexpr int kARowsPerThread = kBM / kOctets, kBRowsPerThread = kBK / kOctets;  // 4, 2

  static_assert(kStages >= 2, "at least double buffering");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "whole m16 tiles and ldmatrix.x4.trans n16 pairs");
  static_assert(kKSteps % 2 == 0, "two fragment register sets alternate across k tiles");
  static_assert(kChunksA % 8 == 0 && kChunksB % 8 == 0, "swizzle groups of 8 chunks per row");
  static_assert(kBM % kOctets == 0 && kBK % kOctets == 0 && kOctets % 8 == 0,
                "copies: whole rows per thread, row % 8 (the swizzle) fixed per thread");
  static_assert(kLdC % 4 == 0 && (kBM * kBN / 8) % kThreads == 0, "16-byte C tile rows, whole store chunks");
};

// Tile of block b with grouped rasterization: groups of kGroupM tile rows, column-major inside a
// group (the last group may be shorter).
template <int kBM, int kBN, int kGroupM>
__device__ __forceinline__ void gemm_grouped_tile(const GemmParams& p, int* m0, int* n0) {
  const int tiles_m = (p.M - 1) / kBM + 1, tiles_n = (p.N - 1) / kBN + 1;  // M, N >= 1; no overflow near 2^31
  const int per_group = kGroupM * tiles_n;
  const int b = blockIdx.x, group = b / per_group, first_m = group * kGroupM;
  const int rows = tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  const int in_group = b - group * per_group;
  *m0 = (first_m + in_group % rows) * kBM;
  *n0 = (in_group / rows) * kBN;
}

// kAsync: the cp.async path (16-byte aligned rows of A and B); else element loads.
template <typename T, class Tr, bool kAsync>
__global__ void __launch_bounds__(Tr::kThreads, 1) gemm_mma_sync_kernel(const __grid_constant__ GemmParams p) {
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kBK = Tr::kBK, kStages = Tr::kStages;
  static_assert(sizeof(T) == Tr::kElem, "16-bit operands");
  // kStages x [A (kBM, kBK) swizzled | B (kBK, kBN) swizzled]; after the main loop: C (kBM, kLdC) fp32.
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  int m0, n0;
  gemm_grouped_tile<kBM, kBN, Tr::kGroupM>(p, &m0, &n0);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int wm = warp % Tr::kWarpsM, wn = warp / Tr::kWarpsM;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);

  // ---- copy roles ----
  // Eight consecutive threads copy one 128-byte group (8 chunks) of a row, thread c of them
  // chunk c, into swizzled chunk c ^ (row % 8) of the group. Octet q = tid / 8 takes rows q,
  // q + kOctets, ... of each tile and every group of those rows, so row % 8 = q % 8 is fixed
  // per thread and a thread follows few rows: 4 of A (1 group each), 2 of B (4 groups each).
  // A warp's copy is then 4 rows x 128 contiguous bytes, and 8 threads store 8 distinct
  // 16-byte bank groups.
  const int q = tid / 8, c = tid % 8;
  const uint32_t a_dst = swizzle_chunk_offset<Tr::kChunksA>(q, c);                 // + h * kOctets rows
  const uint32_t b_dst = Tr::kABytes + swizzle_chunk_offset<Tr::kChunksB>(q, c);  // + h * kOctets rows + g * 128 bytes
  // Row pointers are recomputed per tile from these two and the strides (kernel parameters):
  // few live registers beside the 192 of accumulators and fragments.
  const T* a_base = a + (m0 + q) * p.a_row + c * 8;  // (m0 + q, c * 8)
  const T* b_base = b + q * p.b_row + n0 + c * 8;    // (q, n0 + c * 8)

  // 16 bytes (bytes <= 16 of them from src, the rest 0) into shared memory at smem + dst.
  // Sources with bytes == 0 are still kept inside the operand.
  auto copy16 = [&](uint32_t dst, const T* src, int bytes) {
    if constexpr (kAsync) {
      cp_async_16(smem + dst, src, bytes);
    } else {
      const auto* e = reinterpret_cast<const uint16_t*>(src);
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = 4 * j < bytes ? e[2 * j] : 0u, hi = 4 * j + 2 < bytes ? e[2 * j + 1] : 0u;
        w[j] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(smem + dst) = make_uint4(w[0], w[1], w[2], w[3]);
      asm volatile("" ::: "memory");  // one chunk's loads in flight at a time: few registers
    }
  };
  // Bytes of the 8-element chunk starting at index `at` of a dim of `size` elements.
  auto chunk_bytes = [](int size, int at) {
    const int left = size - at;
    return (left >= 8 ? 8 : left > 0 ? left : 0) * Tr::kElem;
  };
  // k tile kt of A and B into pipeline stage `stage`. Chunks cut by M, N or K copy fewer bytes
  // (zero-filled past them) and keep their source address inside the operand.
  // kEdge: the block's tile crosses row M or column N; else only K is checked (the last tile).
  auto load_tile = [&](auto edge, int stage, int kt) {
    constexpr bool kEdge = decltype(edge)::value;
    const int k0 = kt * kBK;
    const uint32_t st = stage * Tr::kStageBytes;
    const int a_bytes = chunk_bytes(p.K, k0 + c * 8);
    if constexpr (!kEdge) {
      const T* a_src = a_base + (a_bytes > 0 ? k0 : -c * 8);  // column k0 + c * 8, or 0
#pragma unroll
      for (int h = 0; h < Tr::kARowsPerThread; ++h)
        copy16(st + a_dst + h * Tr::kOctets * kBK * Tr::kElem, a_src + h * Tr::kOctets * p.a_row, a_bytes);
#pragma unroll
      for (int h = 0; h < Tr::kBRowsPerThread; ++h) {
        const int k = k0 + q + h * Tr::kOctets;
        const bool k_ok = k < p.K;
        const T* row = b_base + ((k_ok ? k : 0) - q) * p.b_row;  // row k, or 0
#pragma unroll
        for (int g = 0; g < Tr::kChunksB / 8; ++g)
          copy16(st + b_dst + h * Tr::kOctets * kBN * Tr::kElem + g * 128, row + g * 64, k_ok ? 16 : 0);
      }
    } else {
      const int a_col = a_bytes > 0 ? k0 + c * 8 : 0;
#pragma unroll
      for (int h = 0; h < Tr::kARowsPerThread; ++h) {
        const int m = m0 + q + h * Tr::kOctets;
        const bool m_ok = m < p.M;
        copy16(st + a_dst + h * Tr::kOctets * kBK * Tr::kElem, a + (m_ok ? m : 0) * p.a_row + a_col,
               m_ok ? a_bytes : 0);
      }
#pragma unroll
      for (int h = 0; h < Tr::kBRowsPerThread; ++h) {
        const int k = k0 + q + h * Tr::kOctets;
        const bool k_ok = k < p.K;
        const T* row = b + (k_ok ? k : 0) * p.b_row;
#pragma unroll
        for (int g = 0; g < Tr::kChunksB / 8; ++g) {
          const int n = n0 + g * 64 + c * 8;
          const int bytes = chunk_bytes(p.N, n);
          copy16(st + b_dst + h * Tr::kOctets * kBN * Tr::kElem + g * 128, row + (bytes > 0 ? n : 0),
                 k_ok ? bytes : 0);
        }
      }
    }
  };

  // ---- fragment roles: ldmatrix row addresses of this lane ----
  // Lane l points at row l % 16 of a 16-row block and at its 16-byte chunk l / 16: matrices
  // 0..3 are (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1).
  // For A (rows m, chunks k) that is a[0..3] of the mma; for B (rows k, chunks n), transposed,
  // it is b[0..1] of n tile 2j and b[0..1] of n tile 2j + 1. Logical chunk c0 + 2s + l / 16
  // (c0: the warp's first chunk, a multiple of a power of 2 above 2s) is stored at chunk
  // (c0 + l / 16) ^ (row % 8) ^ 2s: the lane's byte offset for s = 0, XORed with 32 s.
  const int lrow = lane % 16, lchunk = lane / 16;
  constexpr int kWarpChunksN = Tr::kWarpN * Tr::kElem / 16;  // chunks of a B row per warp: a power of 2
  static_assert((kWarpChunksN & (kWarpChunksN - 1)) == 0, "warp chunk offsets disjoint from 2s bits");
  const uint32_t a_lane = swizzle_chunk_offset<Tr::kChunksA>(wm * Tr::kWarpM + lrow, lchunk);  // ^ 32 kk, + 16 i rows
  const uint32_t b_lane = swizzle_chunk_offset<Tr::kChunksB>(lrow, wn * kWarpChunksN + lchunk);  // ^ 32 j, + 16 kk rows

  using FragA = uint32_t[Tr::kMmaTilesM][4];  // (4 m tiles) x a[0..3]
  using FragB = uint32_t[Tr::kMmaTilesN][2];  // (8 n tiles) x b[0..1] at kBN 256
  auto load_frags = [&](FragA& fa, FragB& fb, int stage, int kk) {
    const uint32_t st = smem_u32 + stage * Tr::kStageBytes;
#pragma unroll
    for (int i = 0; i < Tr::kMmaTilesM; ++i)
      ldmatrix_x4(fa[i], st + (a_lane ^ (32 * kk)) + i * 16 * kBK * Tr::kElem);
#pragma unroll
    for (int j = 0; j < Tr::kMmaTilesN / 2; ++j) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, st + Tr::kABytes + (b_lane ^ (32 * j)) + kk * 16 * kBN * Tr::kElem);
      fb[2 * j][0] = r[0];
      fb[2 * j][1] = r[1];
      fb[2 * j + 1][0] = r[2];
      fb[2 * j + 1][1] = r[3];
    }
  };

  // ---- main loop ----
  float acc[Tr::kMmaTilesM][Tr::kMmaTilesN][4];  // (kWarpM, kWarpN) per warp, mma D layout
#pragma unroll
  for (int i = 0; i < Tr::kMmaTilesM; ++i)
#pragma unroll
    for (int j = 0; j < Tr::kMmaTilesN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  const int k_tiles = (p.K - 1) / kBK + 1;
  // One copy of the loop per kind of block (a uniform branch outside it), so that the checks of
  // edge blocks cost interior blocks no issue slots.
  auto main_loop = [&](auto edge) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_tile(edge, s, s);
      if constexpr (kAsync) cp_async_commit();  // one group per tile slot, empty or not
    }
    if constexpr (kAsync) cp_async_wait<kStages - 2>();  // tile 0 has landed (this thread's part)
    __syncthreads();                                     // ... and everyone's
    FragA fa[2];
    FragB fb[2];
    load_frags(fa[0], fb[0], 0, 0);
    int read_stage = 0, write_stage = kStages - 1;
    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        if (kk == Tr::kKSteps - 1) {
          // Tile kt + 1 must have landed (wait) and be visible to all (barrier) before its first
          // fragments load below. Past this barrier no warp reads tile kt's stage again (its
          // last fragments are in registers), so the next iteration may refill it.
          if constexpr (kAsync) cp_async_wait<kStages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
        }
        load_frags(fa[(kk + 1) % 2], fb[(kk + 1) % 2], read_stage, (kk + 1) % Tr::kKSteps);
        if (kk == 0) {
          // Refill the stage read in iteration kt - 1 (every warp passed the barrier after it).
          if (kt + kStages - 1 < k_tiles) load_tile(edge, write_stage, kt + kStages - 1);
          if constexpr (kAsync) cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int i = 0; i < Tr::kMmaTilesM; ++i)
#pragma unroll
          for (int jj = 0; jj < Tr::kMmaTilesN; ++jj) {
            const int j = i % 2 ? Tr::kMmaTilesN - 1 - jj : jj;  // serpentine: B fragment reused across i
            mma_m16n8k16<T>(acc[i][j], fa[kk % 2][i], fb[kk % 2][j]);
          }
      }
    }
  };
  if (p.M - m0 >= kBM && p.N - n0 >= kBN)
    main_loop(std::false_type{});
  else
    main_loop(std::true_type{});

  // ---- epilogue: accumulators -> fp32 C tile in shared memory -> alpha / beta / bias -> C ----
  if constexpr (kAsync) cp_async_wait<0>();
  __syncthreads();  // every warp is past its last ldmatrix: the pipeline's bytes become the C tile
  float* ctile = reinterpret_cast<float*>(smem);  // (kBM, kLdC)
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < Tr::kMmaTilesM; ++i)
#pragma unroll
    for (int j = 0; j < Tr::kMmaTilesN; ++j) {
      float* d = ctile + (wm * Tr::kWarpM + i * 16 + g) * Tr::kLdC + wn * Tr::kWarpN + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(d) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(d + 8 * Tr::kLdC) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  __syncthreads();
  gemm_store_tile<T, kBM, kBN, Tr::kThreads>(p, ctile, Tr::kLdC, m0, n0, tid, gemm_c_vec16<T>(p));
}

}  // namespace flashlab::kernels
