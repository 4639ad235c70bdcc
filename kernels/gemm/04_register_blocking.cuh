// Rung 4 — 2D register blocking: each thread computes an 8 x 8 block of C from values it holds
// in registers, so one shared-memory load feeds 4 FMAs instead of half of one.
//
// Changes from rung 3: the block tile grows to (kBM, kBN) = (128, 128) with a thin K slice
// kBK = 8, and 256 threads each own kTM x kTN = 8 x 8 outputs. Per k of the slice a thread
// loads a column of 8 A values and a row of 8 B values from shared memory into registers and
// forms their outer product: 16 loads for 64 FMAs (rung 3: 128). The intermediate step, 1D
// blocking (a thread owns kTM outputs of one column and reuses each B value kTM times), needs
// kTM + 1 loads for kTM FMAs; blocking both dimensions makes the reuse kTM x kTN / (kTM + kTN).
// The 4x wider block tile also cuts global (L2) traffic 4x: each operand element is loaded
// once per 128 outputs of its row or column instead of once per 32.
//
//   thread (ty, tx) of the 16 x 16 grid owns rows ty + 16 i and columns tx + 16 j, i, j < 8
//   for each k tile:  As (kBM, kBK) <- A, Bs (kBK, kBN) <- B   (4 + 4 elements per thread, 0 past the edges)
//                     for kk < kBK:  a[i] = As[ty + 16 i][kk], b[j] = Bs[kk][tx + 16 j]
//                                    acc[i][j] += a[i] * b[j]
//
// The thread's 8 x 8 outputs are spread 16 apart rather than contiguous: a warp (16 tx x 2 ty)
// then reads Bs[kk][tx + 16 j] at 16 consecutive words and As[. + 16 i][kk] at two words 8
// banks apart, so the tiles need no padding or swizzle (contiguous 8 x 8 blocks would read
// Bs 32 bytes apart per thread: a 4-way bank conflict), and the stores of C stay coalesced.
// Limits: scalar (4-byte) loads everywhere: 8 global loads per thread per tile and 16 shared
// loads per 64 FMAs, which is still a large share of the issue slots; rung 5 moves 16 bytes
// per instruction.
#pragma once

#include "kernels/gemm/02_coalesced.cuh"
#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

inline constexpr int kGemmRegBM = 128, kGemmRegBN = 128, kGemmRegBK = 8;  // block tile
inline constexpr int kGemmRegTM = 8, kGemmRegTN = 8;                          // thread tile
inline constexpr int kGemmRegThreads = (kGemmRegBM / kGemmRegTM) * (kGemmRegBN / kGemmRegTN);  // 256

// Block tile (kBM, kBN), k slice kBK, kTM x kTN outputs per thread: (kBM / kTM) x (kBN / kTN) threads.
template <int kBM, int kBN, int kBK, int kTM, int kTN>
__global__ void __launch_bounds__((kBM / kTM) * (kBN / kTN))
    gemm_register_blocking_kernel(const __grid_constant__ GemmParams p) {
  constexpr int kThreads = (kBM / kTM) * (kBN / kTN);
  constexpr int kRowsT = kBM / kTM, kColsT = kBN / kTN;  // 16 x 16 threads; stride of a thread's outputs
  constexpr int kALoads = kBM * kBK / kThreads, kBLoads = kBK * kBN / kThreads;  // elements per thread per tile
  static_assert(kRowsT * kColsT == kThreads && kBM * kBK % kThreads == 0 && kBK * kBN % kThreads == 0);
  static_assert(kThreads % kBK == 0 && kThreads % kBN == 0, "a thread loads the same column of every A pass, row of B");
  static_assert(kColsT == 16 && kBK == 8, "the conflict-free reads above: a warp is 16 tx x 2 ty, As rows are 8 words");
  __shared__ float As[kBM][kBK];  // (kBM, kBK)
  __shared__ float Bs[kBK][kBN];  // (kBK, kBN)

  int m0, n0;
  gemm_block_tile<kBM, kBN>(p, &m0, &n0);
  const int m_left = p.M - m0, n_left = p.N - n0;
  const int tx = threadIdx.x % kColsT, ty = threadIdx.x / kColsT;
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  // Loader: pass s puts element threadIdx.x + s * kThreads of each tile in place; a warp covers
  // 4 rows x 8 columns of the A tile (32-byte sectors fully used) and 32 columns of a B row.
  const int a_col = threadIdx.x % kBK, b_col = threadIdx.x % kBN;
  const int a_row0 = threadIdx.x / kBK, b_row0 = threadIdx.x / kBN;

  float acc[kTM][kTN] = {};
  const int k_tiles = (p.K - 1) / kBK + 1;
  for (int t = 0; t < k_tiles; ++t) {
    const int k0 = t * kBK, k_left = p.K - k0;
#pragma unroll
    for (int s = 0; s < kALoads; ++s) {
      const int r = a_row0 + s * (kThreads / kBK);
      As[r][a_col] = r < m_left && a_col < k_left ? a[(m0 + r) * p.a_row + k0 + a_col] : 0.f;
    }
#pragma unroll
    for (int s = 0; s < kBLoads; ++s) {
      const int r = b_row0 + s * (kThreads / kBN);
      Bs[r][b_col] = r < k_left && b_col < n_left ? b[(k0 + r) * p.b_row + n0 + b_col] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float ra[kTM], rb[kTN];  // a column of the A tile, a row of the B tile
#pragma unroll
      for (int i = 0; i < kTM; ++i) ra[i] = As[ty + i * kRowsT][kk];
#pragma unroll
      for (int j = 0; j < kTN; ++j) rb[j] = Bs[kk][tx + j * kColsT];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += ra[i] * rb[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int r = ty + i * kRowsT;
    if (r >= m_left) break;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int c = tx + j * kColsT;
      if (c < n_left) gemm_store<float>(p, acc[i][j], m0 + r, n0 + c);
    }
  }
}

}  // namespace flashlab::kernels
