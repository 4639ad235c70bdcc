// Rung 6 — warp tiling and a double-buffered shared-memory pipeline: the FP32 top rung.
//
// Three levels of tiles, each a template parameter (GemmWarpTile):
//   block tile (kBM, kBN), k slice kBK   staged in shared memory, 2 stages
//   warp tile  (kWM, kWN)                a compact part of the block tile per warp
//   thread tile kTM x kTN                kTM / 4 x kTN / 4 blocks of 4 x 4, held in registers
// Within a warp the lanes form a kLanesM x kLanesN grid (kWM / kTM by kWN / kTN, 32 lanes);
// lane (lr, lc) of warp (wm, wn) owns, for i < kTM / 4, j < kTN / 4, r, c < 4:
//   C[m0 + wm * kWM + i * 4 * kLanesM + 4 lr + r,  n0 + wn * kWN + j * 4 * kLanesN + 4 lc + c]
//
// Changes from rung 5:
//  1. Warp tiles. Rung 5 spread a warp over a 16 x 128 strip of C, so per k it read 512 bytes
//     of a Bs row (6 shared-memory wavefronts per 64 FMAs per lane). A 32 x 64 warp tile reads
//     64 bytes of As and 128 bytes of Bs per 16-byte load: 4 wavefronts, one per load. Every
//     quarter-warp's 16-byte reads fall in one 128-byte window of a tile row, so they are
//     conflict-free for any lane grid.
//  2. Two shared-memory stages, filled through registers: at the top of k tile t each thread
//     issues the global loads of tile t + 1 into registers, computes tile t from stage t % 2,
//     then writes the registers (A transposed) into stage (t + 1) % 2. One barrier per tile:
//     the barrier that ends tile t - 1 also guarantees nobody still reads stage (t + 1) % 2.
//     The global latency hides behind kBK * kTM * kTN FMAs per thread, and rung 5's second
//     barrier goes away. (cp.async would transpose A only as one 4-byte copy per element; the
//     register hop keeps the 16-byte global loads.)
//  3. All tile sizes are template parameters; bench/experiments/gemm_fp32_sweep.cu times
//     alternatives at 4096^3, and GemmWarpTilingConfig records the choice.
//
// Shared memory, per stage: As (kBK, kBM + 4) transposed and padded as in rung 5 (the loader
// gives each warp 16 rows x 2 float4 columns, so the +4 pad puts the two halves on disjoint
// banks), Bs (kBK, kBN) unpadded (row-contiguous float4 stores).
// Tails and alignment as rung 5 (zero-filled partial float4s, kVec16 = false for operands
// that are not 16-byte aligned).
// Limits: FP32 FMA throughput (about 67 TFLOP/s on an H100 SXM); the next rungs change the
// arithmetic itself: tensor cores on 16-bit inputs (rungs 7-9).
#pragma once

#include <cstdint>

#include "kernels/common/reduce.cuh"
#include "kernels/gemm/02_coalesced.cuh"
#include "kernels/gemm/05_vec16_transposed_a.cuh"
#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

// Tile shape of the warp-tiled kernel; kMinBlocks is its __launch_bounds__ minimum of resident
// blocks per SM (it caps registers at 65536 / (kMinBlocks * kThreads)).
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int MinBlocks>
struct GemmWarpTile {
  static constexpr int kBM = BM, kBN = BN, kBK = BK;  // block tile and k slice
  static constexpr int kWM = WM, kWN = WN;            // warp tile
  static constexpr int kTM = TM, kTN = TN;            // thread tile
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kWarpsM = kBM / kWM, kWarpsN = kBN / kWN;
  static constexpr int kThreads = kWarpsM * kWarpsN * kWarpSize;
  static constexpr int kLanesM = kWM / kTM, kLanesN = kWN / kTN;       // lane grid of a warp
  static constexpr int kFragM = kTM / 4, kFragN = kTN / 4;             // 4 x 4 blocks per thread
  static constexpr int kFragStepM = 4 * kLanesM, kFragStepN = 4 * kLanesN;  // distance between them
  static constexpr int kAStride = kBM + 4;  // floats per As row: the pad of rung 5
  static constexpr int kALoads = kBM * kBK / 4 / kThreads;  // float4s of the A tile per thread
  static constexpr int kBLoads = kBK * kBN / 4 / kThreads;  // float4s of the B tile per thread
  // Loader passes: one pass of all threads covers kAPairRows rows x 8 columns of the A tile
  // (several 8-column slabs when kAPairRows > kBM) and kBRowsPerPass rows of the B tile (part
  // of a row when kBN / 4 > kThreads).
  static constexpr int kAPairRows = kThreads / 2;
  static constexpr int kAPassesPerSlab = kBM > kAPairRows ? kBM / kAPairRows : 1;
  static constexpr int kASlabsPerPass = kAPairRows > kBM ? kAPairRows / kBM : 1;
  static constexpr int kBRowVecs = kBN / 4;  // float4s in a B tile row
  static constexpr int kBRowsPerPass = kThreads > kBRowVecs ? kThreads / kBRowVecs : 1;
  static constexpr int kBPassesPerRow = kBRowVecs > kThreads ? kBRowVecs / kThreads : 1;
  static constexpr int kStageFloats = kBK * (kAStride + kBN);
  static constexpr int kSmemBytes = 2 * kStageFloats * static_cast<int>(sizeof(float));

  static_assert(kBM % kWM == 0 && kBN % kWN == 0, "warp tiles cover the block tile");
  static_assert(kWM % kTM == 0 && kWN % kTN == 0 && kLanesM * kLanesN == kWarpSize, "32 lanes cover a warp tile");
  static_assert(kTM % 4 == 0 && kTN % 4 == 0, "thread tiles are made of 4 x 4 blocks");
  static_assert(kBK % 8 == 0, "the A loader pairs float4 columns");
  static_assert(kBM % 32 == 0 && kAStride % 32 == 4, "As rows 4 banks past a multiple of 32");
  static_assert(kThreads <= 1024, "at most 1024 threads per block");
  static_assert(kALoads >= 1 && kALoads * 4 * kThreads == kBM * kBK, "the threads split the A tile evenly");
  static_assert(kBLoads >= 1 && kBLoads * 4 * kThreads == kBK * kBN, "the threads split the B tile evenly");
  static_assert(kAPairRows % kBM == 0 || kBM % kAPairRows == 0, "A loader passes tile the A tile regularly");
  static_assert(kThreads % kBRowVecs == 0 || kBRowVecs % kThreads == 0, "B loader passes tile the B tile regularly");
};

// The library's rung 6, chosen by bench/experiments/gemm_fp32_sweep.cu (H100, 4096^3, commit
// 67be473, docs/ladder/gemm.md has the table): 128 x 256 x 16, 8 warps of 64 x 64,
// 8 x 16 outputs per thread, 1 block per SM at 246 registers, 48.5 KiB shared memory: 3.003 ms,
// 87.9% of cuBLAS SGEMM, against 3.181 ms (83.0%) for the first choice, the common SIMT shape
// 128 x 128 x 8 with 8 x 8 per thread at 2 blocks per SM. More outputs per thread (16 FMAs per
// shared-memory value loaded instead of 8) pay for the lower occupancy.
using GemmWarpTilingConfig = GemmWarpTile<128, 256, 16, 64, 64, 8, 16, 1>;

template <typename Cfg, bool kVec16>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_warp_tiling_kernel(const __grid_constant__ GemmParams p) {
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK, kThreads = Cfg::kThreads;
  constexpr int kALoads = Cfg::kALoads, kBLoads = Cfg::kBLoads, kAStride = Cfg::kAStride;
  constexpr int kFragM = Cfg::kFragM, kFragN = Cfg::kFragN;
  extern __shared__ float4 smem_f4[];
  float* const smem = reinterpret_cast<float*>(smem_f4);  // 2 stages of [As (kBK, kAStride), Bs (kBK, kBN)]

  int m0, n0;
  gemm_block_tile<kBM, kBN>(p, &m0, &n0);
  const int m_left = p.M - m0, n_left = p.N - n0;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int wm0 = warp / Cfg::kWarpsN * Cfg::kWM, wn0 = warp % Cfg::kWarpsN * Cfg::kWN;
  const int lr = lane / Cfg::kLanesN, lc = lane % Cfg::kLanesN;

  // Loader. A float4 f = tid + s * kThreads of the tile is row (f / 2) % kBM, columns
  // 4 * (2 * (f / 2 / kBM) + f % 2) .. +3: a warp takes 16 rows x 2 float4s (whole 32-byte
  // sectors). B float4 f is row f / (kBN / 4), columns 4 * (f % (kBN / 4)) .. +3. A thread's
  // pass s is its pass 0 moved by a compile-time number of rows and columns, so one pointer per
  // operand serves every pass.
  auto a_pass_row = [](int s) { return s % Cfg::kAPassesPerSlab * Cfg::kAPairRows; };
  auto a_pass_col = [](int s) { return s / Cfg::kAPassesPerSlab * 8 * Cfg::kASlabsPerPass; };
  auto b_pass_row = [](int s) { return s / Cfg::kBPassesPerRow * Cfg::kBRowsPerPass; };
  auto b_pass_col = [](int s) { return s % Cfg::kBPassesPerRow * 4 * kThreads; };
  const int a_row = tid / 2 % kBM, a_kc = 4 * (2 * (tid / 2 / kBM) + tid % 2);
  const int b_k = tid / Cfg::kBRowVecs, b_nc = 4 * (tid % Cfg::kBRowVecs);
  // Pass 0's element of the next tile to load (row clamped into the operand: rows past M or K
  // are never read); both advance one k slice per load.
  const float* a_src = static_cast<const float*>(p.a) + (m0 + (a_row < m_left ? a_row : 0)) * p.a_row + a_kc;
  const float* b_src = static_cast<const float*>(p.b) + (b_k < p.K ? b_k : 0) * p.b_row + n0 + b_nc;
  const int64_t b_tile_step = kBK * p.b_row;
  int k_left = p.K;  // columns of A (rows of B) from the next tile to load to the end of K

  float4 a_stage[kALoads], b_stage[kBLoads];  // the next tile, on its way to shared memory
  auto load_next_tile = [&] {
#pragma unroll
    for (int s = 0; s < kALoads; ++s) {
      const int left = a_row + a_pass_row(s) < m_left ? k_left - a_kc - a_pass_col(s) : 0;
      a_stage[s] = load4_zero_fill<kVec16>(a_src + a_pass_row(s) * p.a_row + a_pass_col(s), left);
    }
#pragma unroll
    for (int s = 0; s < kBLoads; ++s) {
      const int left = b_k + b_pass_row(s) < k_left ? n_left - b_nc - b_pass_col(s) : 0;
      b_stage[s] = load4_zero_fill<kVec16>(b_src + b_pass_row(s) * p.b_row + b_pass_col(s), left);
    }
    a_src += kBK;
    b_src += b_tile_step;
    k_left -= kBK;
  };
  auto store_tile = [&](float* stage) {
    float* As = stage + a_kc * kAStride + a_row;       // (kBK, kAStride) at pass 0's element
    float* Bs = stage + kBK * kAStride + b_k * kBN + b_nc;  // (kBK, kBN) at pass 0's element
#pragma unroll
    for (int s = 0; s < kALoads; ++s) {
      float* dst = As + a_pass_col(s) * kAStride + a_pass_row(s);
      dst[0 * kAStride] = a_stage[s].x;
      dst[1 * kAStride] = a_stage[s].y;
      dst[2 * kAStride] = a_stage[s].z;
      dst[3 * kAStride] = a_stage[s].w;
    }
#pragma unroll
    for (int s = 0; s < kBLoads; ++s)
      *reinterpret_cast<float4*>(Bs + b_pass_row(s) * kBN + b_pass_col(s)) = b_stage[s];
  };

  float acc[Cfg::kTM][Cfg::kTN] = {};  // (i * 4 + r, j * 4 + c)
  const int k_tiles = (p.K - 1) / kBK + 1;
  load_next_tile();
  store_tile(smem);
  __syncthreads();
  for (int t = 0; t < k_tiles; ++t) {
    const bool has_next = t + 1 < k_tiles;
    if (has_next) load_next_tile();
    const float* As = smem + (t % 2) * Cfg::kStageFloats + wm0 + 4 * lr;
    const float* Bs = smem + (t % 2) * Cfg::kStageFloats + kBK * kAStride + wn0 + 4 * lc;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float4 a4[kFragM], b4[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
        a4[i] = *reinterpret_cast<const float4*>(As + kk * kAStride + i * Cfg::kFragStepM);
#pragma unroll
      for (int j = 0; j < kFragN; ++j) b4[j] = *reinterpret_cast<const float4*>(Bs + kk * kBN + j * Cfg::kFragStepN);
      const float* ra = reinterpret_cast<const float*>(a4);
      const float* rb = reinterpret_cast<const float*>(b4);
#pragma unroll
      for (int i = 0; i < Cfg::kTM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kTN; ++j) acc[i][j] += ra[i] * rb[j];
    }
    if (has_next) store_tile(smem + (t + 1) % 2 * Cfg::kStageFloats);
    __syncthreads();
  }

  const bool c_vec16 = gemm_c_vec16(p);
#pragma unroll
  for (int i = 0; i < Cfg::kTM; ++i) {
    const int r = wm0 + i / 4 * Cfg::kFragStepM + 4 * lr + i % 4;
    if (r >= m_left) continue;
#pragma unroll
    for (int j = 0; j < kFragN; ++j) {
      const int c = wn0 + j * Cfg::kFragStepN + 4 * lc;
      if (c < n_left) gemm_store4(p, &acc[i][j * 4], m0 + r, n0 + c, n_left - c, c_vec16);
    }
  }
}

}  // namespace flashlab::kernels
