// Rung 5 — 16-byte loads and a transposed A tile: every global load and every shared-memory
// load of the inner loop moves 4 floats per instruction.
//
// Changes from rung 4 (same (128, 128, 8) block tile, 256 threads, 8 x 8 outputs per thread):
//  1. Global -> shared: each thread loads one float4 of the A tile and one of the B tile per
//     k tile (rung 4: 4 + 4 scalar loads).
//  2. The A tile is stored transposed, As[k][m] (kBK, kBM + 4), so that a thread's A values for
//     one k are contiguous, like its B values in Bs[k][n]: the inner loop reads them with
//     two 16-byte loads each (4 shared loads per 64 FMAs, rung 4: 16).
//  3. A thread's outputs are 2 x 2 blocks of 4 x 4, 64 rows / columns apart:
//       rows m0 + 64 i + 4 ty + (0..3), columns n0 + 64 j + 4 tx + (0..3), i, j < 2
//     A warp (16 tx x 2 ty) reads Bs[kk][64 j + 4 tx ..] as 256 contiguous bytes and As at two
//     16-byte words: no bank conflict. C is written 16 bytes at a time.
//
// Bank conflicts on the transposing store: the A loader gives a warp 16 consecutive rows x 2
// float4 columns (kc = 0, 4), stored as 4 scalar stores As[kc + c][row]. Without padding both
// halves land on the same 16 banks (a 2-way conflict); padding each As row by 4 floats
// (row stride 132 = 4 mod 32 banks) moves the kc = 4 half to the other 16 banks and keeps the
// rows 16-byte aligned for the vector reads. Bs needs no padding (its stores are contiguous).
//
// kVec16 = false is the same kernel with 4 scalar loads per float4: the host picks it when A
// or B does not start on a 16-byte boundary or its leading dim is not a multiple of 4. Tails:
// a float4 that crosses K or N (or lies past M or K) is loaded element by element, zero-filled.
// Limits: one shared-memory buffer, so every k tile pays two block-wide barriers with the
// global loads exposed between them (nothing to compute while they are in flight); and a warp
// covers a 16 x 128 strip of C, so per k it reads 512 bytes of Bs (6 shared-memory wavefronts
// per 64 FMAs, where a squarer warp tile needs 4). Rung 6 fixes both.
#pragma once

#include <cstdint>

#include "kernels/common/vec.cuh"
#include "kernels/gemm/02_coalesced.cuh"
#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

// src[0 .. 3], elements at and past `left` read as 0 (left <= 0: nothing is read). kVec16: one
// 16-byte load when all four are inside (src must then be 16-byte aligned).
template <bool kVec16>
__device__ __forceinline__ float4 load4_zero_fill(const float* src, int left) {
  if (kVec16 && left >= 4) return *reinterpret_cast<const float4*>(src);
  float4 v;
  v.x = left > 0 ? src[0] : 0.f;
  v.y = left > 1 ? src[1] : 0.f;
  v.z = left > 2 ? src[2] : 0.f;
  v.w = left > 3 ? src[3] : 0.f;
  return v;
}

// True when every row of C starts on a 16-byte boundary: gemm_store4 may then write 4 floats at once.
__device__ __forceinline__ bool gemm_c_vec16(const GemmParams& p) {
  return reinterpret_cast<uintptr_t>(p.c) % kVecBytes == 0 && p.ldc % (kVecBytes / sizeof(float)) == 0;
}

// C[m, n .. n+3] through the shared epilogue for the `cols` of them inside C (cols may be <= 0
// or > 4). One 16-byte store when all four are inside and c_vec16 (n must be a multiple of 4).
__device__ __forceinline__ void gemm_store4(const GemmParams& p, const float* acc, int m, int n, int cols, bool c_vec16) {
  if (c_vec16 && cols >= 4) {
    Vec<float> v;
#pragma unroll
    for (int c = 0; c < 4; ++c) v.v[c] = gemm_epilogue_value<float>(p, acc[c], m, n + c);
    store_vec(static_cast<float*>(p.c) + m * p.ldc + n, v);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (c < cols) gemm_store<float>(p, acc[c], m, n + c);
}

inline constexpr int kGemmVecBM = 128, kGemmVecBN = 128, kGemmVecBK = 8;  // block tile
inline constexpr int kGemmVecThreads = 256;                                  // 16 x 16, 8 x 8 outputs each
inline constexpr int kGemmVecAPad = 4;  // floats added to each As row: conflict-free transposing stores

template <bool kVec16>
__global__ void __launch_bounds__(kGemmVecThreads) gemm_vec16_transposed_a_kernel(const __grid_constant__ GemmParams p) {
  constexpr int kBM = kGemmVecBM, kBN = kGemmVecBN, kBK = kGemmVecBK, kThreads = kGemmVecThreads;
  constexpr int kHalfM = kBM / 2, kHalfN = kBN / 2;  // the 2 x 2 blocks of a thread are this far apart
  constexpr int kColsT = kHalfN / 4;                 // 16 threads across n, 16 across m
  static_assert(kBM * kBK / 4 == kThreads && kBK * kBN / 4 == kThreads, "one float4 of A and of B per thread");
  static_assert((kHalfM / 4) * kColsT == kThreads, "16 x 16 threads, 2 x 2 blocks of 4 x 4 outputs each");
  static_assert(kBK == 8, "the A loader gives a warp 16 rows x both float4 columns of the slice");
  static_assert((kBM + kGemmVecAPad) % 32 == 4, "As row stride 4 banks past a multiple of 32");
  __shared__ alignas(16) float As[kBK][kBM + kGemmVecAPad];  // (kBK, kBM): A tile transposed, rows padded
  __shared__ alignas(16) float Bs[kBK][kBN];                  // (kBK, kBN)

  int m0, n0;
  gemm_block_tile<kBM, kBN>(p, &m0, &n0);
  const int m_left = p.M - m0, n_left = p.N - n0;
  const int tx = threadIdx.x % kColsT, ty = threadIdx.x / kColsT;
  // Loader: A float4 (a_r, a_kc .. +3), B float4 (b_k, b_nc .. +3) of the tiles.
  const int a_r = threadIdx.x / (kBK / 4), a_kc = threadIdx.x % (kBK / 4) * 4;
  const int b_k = threadIdx.x / (kBN / 4), b_nc = threadIdx.x % (kBN / 4) * 4;
  const bool a_row_ok = a_r < m_left;
  const float* a = static_cast<const float*>(p.a) + (m0 + (a_row_ok ? a_r : 0)) * p.a_row + a_kc;
  const float* b = static_cast<const float*>(p.b) + n0 + b_nc;

  float acc[8][8] = {};  // (i * 4 + r, j * 4 + c)
  const int k_tiles = (p.K - 1) / kBK + 1;
  for (int t = 0; t < k_tiles; ++t) {
    const int k0 = t * kBK, k_left = p.K - k0;
    const float4 av = load4_zero_fill<kVec16>(a + k0, a_row_ok ? k_left - a_kc : 0);
    const float4 bv = load4_zero_fill<kVec16>(b + (b_k < k_left ? (k0 + b_k) * p.b_row : 0),
                                              b_k < k_left ? n_left - b_nc : 0);
    As[a_kc + 0][a_r] = av.x;
    As[a_kc + 1][a_r] = av.y;
    As[a_kc + 2][a_r] = av.z;
    As[a_kc + 3][a_r] = av.w;
    *reinterpret_cast<float4*>(&Bs[b_k][b_nc]) = bv;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float4 a4[2], b4[2];  // A rows 64 i + 4 ty .. +3, B columns 64 j + 4 tx .. +3
#pragma unroll
      for (int i = 0; i < 2; ++i) a4[i] = *reinterpret_cast<const float4*>(&As[kk][i * kHalfM + ty * 4]);
#pragma unroll
      for (int j = 0; j < 2; ++j) b4[j] = *reinterpret_cast<const float4*>(&Bs[kk][j * kHalfN + tx * 4]);
      const float* ra = reinterpret_cast<const float*>(a4);
      const float* rb = reinterpret_cast<const float*>(b4);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += ra[i] * rb[j];
    }
    __syncthreads();
  }

  const bool c_vec16 = gemm_c_vec16(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = i / 4 * kHalfM + ty * 4 + i % 4;
    if (r >= m_left) continue;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = j * kHalfN + tx * 4;
      if (c < n_left) gemm_store4(p, &acc[i][j * 4], m0 + r, n0 + c, n_left - c, c_vec16);
    }
  }
}

}  // namespace flashlab::kernels
