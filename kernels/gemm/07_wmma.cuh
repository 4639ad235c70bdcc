// Rung 7 — tensor cores through WMMA (nvcuda::wmma): fp16/bf16 A and B, 16 x 16 x 16 matrix
// products on the tensor cores, fp32 accumulators, one rounding to the output dtype.
//
// Changes from rung 6 (fp32 FMA, warp tiling): the inner product moves from the FP32 pipes to
// the tensor cores. One wmma::mma_sync is a (16, 16) += (16, 16) x (16, 16) product: 8192
// flops per warp instruction, against 64 for a warp-wide FFMA in rung 6. The rest of rung 6
// stays: its pipeline (tile t + 1 loaded into registers while tile t is
// computed, then stored into the other of two shared stages; one barrier per tile) and its
// shape of tiling, now with 16-bit operands:
//   block tile (kBM, kBN, kBK) = (128, 128, 32), 8 warps as 4 (m) x 2 (n), each warp owns a
//   (32, 64) tile of C = 2 x 4 accumulator fragments (64 fp32 registers per thread).
//   per k tile: each thread loads 2 + 2 16-byte chunks of the next A and B tiles (element
//               loads when rows are not 16-byte aligned; 0 past M, N, K), then per 16-wide
//               k step: load_matrix_sync 2 A + 4 B fragments, 8 mma_sync; then stores the
//               chunks into the other stage; __syncthreads().
// Shared rows are padded by 16 bytes (40 and 136 elements) so that consecutive rows start in
// different banks for load_matrix_sync (whose per-lane pattern the API does not specify).
// Epilogue: WMMA accumulators have no documented (row, col) per register, so each warp stores
// one fragment at a time to a (16, 16) fp32 scratch in shared memory and the lanes apply
// alpha / beta / bias there (gemm_store_tile, shared with rung 8).
// Limits: loads still stage through registers and each warp waits for them before its
// stores; only two stages; fragments plus staged chunks take ~175 registers, so one block
// (8 warps) per SM hides latency; padding wastes shared memory and may still leave
// load_matrix_sync conflicts the API gives no way to remove; fragment layouts are opaque, so
// nothing finer than a 16 x 16 tile can be scheduled and the epilogue needs the scratch round
// trip. Rung 8 takes these on with cp.async, mma.sync with ldmatrix, and a swizzled layout.
#pragma once

#include <cstdint>

#include <mma.h>

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

// ---- the epilogue from a shared-memory fp32 tile (rungs 7 and 8) ----

// True when C (and bias) take 16-byte vectors at every 8-aligned column: then a chunk of 8
// outputs inside N is one 16-byte store (and one 16-byte load of C when beta != 0).
template <typename T>
__device__ __forceinline__ bool gemm_c_vec16(const GemmParams& p) {
  static_assert(sizeof(T) == 2, "16-bit outputs: 8 per 16-byte vector");
  const auto bias = reinterpret_cast<uintptr_t>(p.bias);
  return (reinterpret_cast<uintptr_t>(p.c) | bias) % kVecBytes == 0 && p.ldc % Vec<T>::kN == 0;
}

// Writes the (kRows, kCols) fp32 tile `tile` (row stride `ld` floats, 16-byte aligned rows) to
// C[m0 + r, n0 + c] through the epilogue. The kThreads threads numbered `tid` share the tile
// in chunks of 8 consecutive columns: chunk i is row i / (kCols / 8); consecutive threads
// take consecutive chunks, so a warp's stores are contiguous in C.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void gemm_store_tile(const GemmParams& p, const float* tile, int ld, int m0, int n0,
                                                int tid, bool c_vec16) {
  constexpr int kN = Vec<T>::kN;  // 8
  constexpr int kChunksPerRow = kCols / kN;
  static_assert(kCols % kN == 0 && (kRows * kChunksPerRow) % kThreads == 0, "whole chunks, evenly shared");
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(p.bias);
  // Threads 4-7 of each 8 read the chunk's upper half first: 8 lanes 32 bytes apart would
  // otherwise hit 4 bank groups twice.
  const bool swap = (tid >> 2) & 1;
#pragma unroll 4
  for (int it = 0; it < kRows * kChunksPerRow / kThreads; ++it) {
    const int i = it * kThreads + tid;
    const int r = i / kChunksPerRow, cc = (i % kChunksPerRow) * kN;
    const int m = m0 + r, n = n0 + cc;
    if (m >= p.M || n >= p.N) continue;
    const float* src = tile + r * ld + cc;
    const float4 h0 = *reinterpret_cast<const float4*>(src + (swap ? 4 : 0));
    const float4 h1 = *reinterpret_cast<const float4*>(src + (swap ? 0 : 4));
    const float4 lo = swap ? h1 : h0, hi = swap ? h0 : h1;
    const float v[kN] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    if (c_vec16 && n + kN <= p.N) {
      T* dst = c + m * p.ldc + n;
      Vec<T> out, cin, b;
      if (p.beta != 0.f) cin = load_vec(dst);
      if (bias) b = load_vec(bias + n);
#pragma unroll
      for (int j = 0; j < kN; ++j) {  // the order of gemm_epilogue_value
        float x = p.alpha * v[j];
        if (p.beta != 0.f) x += p.beta * to_float(cin.v[j]);
        if (bias) x += to_float(b.v[j]);
        out.v[j] = from_float<T>(x);
      }
      store_vec(dst, out);
    } else {
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (n + j < p.N) gemm_store<T>(p, v[j], m, n + j);
    }
  }
}

// ---- rung 7 ----

inline constexpr int kGemmWmmaBM = 128;
inline constexpr int kGemmWmmaBN = 128;
inline constexpr int kGemmWmmaBK = 32;
inline constexpr int kGemmWmmaWarpsM = 4;
inline constexpr int kGemmWmmaWarpsN = 2;
inline constexpr int kGemmWmmaThreads = kGemmWmmaWarpsM * kGemmWmmaWarpsN * kWarpSize;
inline constexpr int kGemmWmmaPad = 8;  // elements (16 bytes) after each shared row

// Block b of the 1-D grid computes the (kGemmWmmaBM, kGemmWmmaBN) tile
// (b % tiles_m, b / tiles_m): consecutive blocks share a column panel of B.
// kVec16: every row of A and B starts on a 16-byte boundary (the host checks).
// One block per SM: capping registers at 128 for two spilled (fragments + staged chunks).
template <typename T, bool kVec16>
__global__ void __launch_bounds__(kGemmWmmaThreads, 1) gemm_wmma_kernel(const __grid_constant__ GemmParams p) {
  namespace wmma = nvcuda::wmma;
  constexpr int kBM = kGemmWmmaBM, kBN = kGemmWmmaBN, kBK = kGemmWmmaBK, kWM = 16;  // WMMA shape 16x16x16
  constexpr int kWarpM = kBM / kGemmWmmaWarpsM, kWarpN = kBN / kGemmWmmaWarpsN;     // (32, 64) per warp
  constexpr int kFragsM = kWarpM / kWM, kFragsN = kWarpN / kWM;                      // 2 x 4 fragments
  constexpr int kLdA = kBK + kGemmWmmaPad, kLdB = kBN + kGemmWmmaPad;                // 40, 136 elements
  constexpr int kLdS = kWM + 4;  // scratch row stride in floats (a multiple of 4: 16-byte rows)
  constexpr int kN = Vec<T>::kN;
  constexpr int kAChunks = kBM * kBK / kN / kGemmWmmaThreads;  // 16-byte chunks per thread and tile: 2
  constexpr int kBChunks = kBK * kBN / kN / kGemmWmmaThreads;  // 2
  static_assert(kBM % (kGemmWmmaWarpsM * kWM) == 0 && kBN % (kGemmWmmaWarpsN * kWM) == 0 && kBK % kWM == 0,
                "whole WMMA fragments per warp");
  static_assert(kAChunks * kN * kGemmWmmaThreads == kBM * kBK && kBChunks * kN * kGemmWmmaThreads == kBK * kBN,
                "tiles load in whole 16-byte chunks per thread");
  static_assert((kLdA * sizeof(T)) % 16 == 0 && (kLdB * sizeof(T)) % 16 == 0 && kLdA % 8 == 0 && kLdB % 8 == 0,
                "16-byte rows; WMMA wants ldm % 8 == 0 for 16-bit types");
  __shared__ alignas(128) T As[2][kBM][kLdA];  // 2 stages of (kBM, kBK) + pad
  __shared__ alignas(128) T Bs[2][kBK][kLdB];  // 2 stages of (kBK, kBN) + pad
  static_assert(sizeof(As) >= sizeof(float) * kGemmWmmaThreads / kWarpSize * kWM * kLdS, "epilogue scratch fits in As");

  const int tiles_m = (p.M - 1) / kBM + 1;
  const int m0 = static_cast<int>(blockIdx.x % tiles_m) * kBM, n0 = static_cast<int>(blockIdx.x / tiles_m) * kBN;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int wm = warp % kGemmWmmaWarpsM, wn = warp / kGemmWmmaWarpsM;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);

  // One 16-byte chunk (8 elements along a row) of an operand: a vector load when the chunk lies
  // inside the row and rows are aligned, else element loads; 0 past the end of the row (`left`
  // elements remain in it) or for a row outside the operand.
  auto load_chunk = [](const T* src, int64_t left) {
    if (kVec16 && left >= kN) return load_vec(src);
    Vec<T> v;
#pragma unroll
    for (int j = 0; j < kN; ++j) v.v[j] = j < left ? src[j] : from_float<T>(0.f);
    return v;
  };
  // Thread tid's chunks of a tile: chunk it * kThreads + tid, row-major over the tile's chunks.
  Vec<T> ra[kAChunks], rb[kBChunks];  // the next tile, staged in registers
  auto load_tile = [&](int k0) {
#pragma unroll
    for (int it = 0; it < kAChunks; ++it) {
      const int i = it * kGemmWmmaThreads + tid, r = i / (kBK / kN), c = (i % (kBK / kN)) * kN;
      const int m = m0 + r, k = k0 + c;
      ra[it] = load_chunk(a + m * p.a_row + k, m < p.M ? p.K - k : 0);
    }
#pragma unroll
    for (int it = 0; it < kBChunks; ++it) {
      const int i = it * kGemmWmmaThreads + tid, r = i / (kBN / kN), c = (i % (kBN / kN)) * kN;
      const int k = k0 + r, n = n0 + c;
      rb[it] = load_chunk(b + k * p.b_row + n, k < p.K ? p.N - n : 0);
    }
  };
  auto store_tile = [&](int stage) {
#pragma unroll
    for (int it = 0; it < kAChunks; ++it) {
      const int i = it * kGemmWmmaThreads + tid;
      *reinterpret_cast<Vec<T>*>(&As[stage][i / (kBK / kN)][(i % (kBK / kN)) * kN]) = ra[it];
    }
#pragma unroll
    for (int it = 0; it < kBChunks; ++it) {
      const int i = it * kGemmWmmaThreads + tid;
      *reinterpret_cast<Vec<T>*>(&Bs[stage][i / (kBN / kN)][(i % (kBN / kN)) * kN]) = rb[it];
    }
  };

  wmma::fragment<wmma::accumulator, kWM, kWM, kWM, float> acc[kFragsM][kFragsN];
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  // Rung 6's pipeline: tile t + 1 travels global -> registers while tile t is computed, then
  // lands in the other stage; the barrier ending tile t - 1 already freed that stage.
  const int k_tiles = (p.K - 1) / kBK + 1;
  load_tile(0);
  store_tile(0);
  __syncthreads();
  for (int t = 0; t < k_tiles; ++t) {
    const int cur = t % 2;
    if (t + 1 < k_tiles) load_tile((t + 1) * kBK);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += kWM) {
      wmma::fragment<wmma::matrix_a, kWM, kWM, kWM, T, wmma::row_major> fa[kFragsM];
      wmma::fragment<wmma::matrix_b, kWM, kWM, kWM, T, wmma::row_major> fb[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) wmma::load_matrix_sync(fa[i], &As[cur][wm * kWarpM + i * kWM][kk], kLdA);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(fb[j], &Bs[cur][kk][wn * kWarpN + j * kWM], kLdB);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    if (t + 1 < k_tiles) store_tile(cur ^ 1);
    __syncthreads();
  }

  // The last barrier above ended every read of As: each warp takes (16, kLdS) floats of it.
  const bool c_vec16 = gemm_c_vec16<T>(p);
  float* s = reinterpret_cast<float*>(&As[0][0][0]) + warp * kWM * kLdS;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
      wmma::store_matrix_sync(s, acc[i][j], kLdS, wmma::mem_row_major);
      __syncwarp();
      gemm_store_tile<T, kWM, kWM, kWarpSize>(p, s, kLdS, m0 + wm * kWarpM + i * kWM, n0 + wn * kWarpN + j * kWM,
                                              lane, c_vec16);
      __syncwarp();  // the next fragment overwrites the scratch
    }
}

}  // namespace flashlab::kernels
