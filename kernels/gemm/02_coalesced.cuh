// Rung 2 — coalesced GEMM: one thread per output, as rung 1, but a warp now walks n.
//
// Changes from rung 1: the 32 threads of a warp take 32 consecutive columns n of one row m of
// C (rung 1 gave them 32 consecutive rows). For row-major B and C that turns each load of
// B[k, n .. n+31] and each store of C[m, n .. n+31] into one 128-byte transaction, and the
// warp's load of A[m, k] into a single broadcast address. Same flops, same dot-product order,
// roughly 32x fewer memory transactions than rung 1.
//
// Blocks are 8 x 32 threads over an 8 x 32 tile of C; the grid is 1-D over tiles (n fastest),
// so any M and N fit (a 2-D grid caps grid.y at 65535 tiles).
// Precondition: A and B row-major with unit column stride (a_col == b_col == 1).
// Limits: every A and B element is still fetched from L1/L2 once per output that needs it, so
// the kernel streams 2 loads per FMA through the cache hierarchy; nothing is reused on chip.
#pragma once

#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

// First row and column of the (kBM, kBN) tile of C that block blockIdx.x of a 1-D grid of
// ceil(M / kBM) * ceil(N / kBN) blocks owns; tiles are numbered with n fastest.
template <int kBM, int kBN>
__device__ __forceinline__ void gemm_block_tile(const GemmParams& p, int* m0, int* n0) {
  const int n_tiles = (p.N - 1) / kBN + 1;
  *m0 = static_cast<int>(blockIdx.x / n_tiles) * kBM;
  *n0 = static_cast<int>(blockIdx.x % n_tiles) * kBN;
}

inline constexpr int kGemmCoalescedTileM = 8;   // rows of C per block
inline constexpr int kGemmCoalescedTileN = 32;  // columns of C per block: one warp per row
inline constexpr int kGemmCoalescedThreads = kGemmCoalescedTileM * kGemmCoalescedTileN;

// kTileM x kTileN threads over a (kTileM, kTileN) tile of C; kTileN = 32: a warp per row.
template <int kTileM, int kTileN>
__global__ void __launch_bounds__(kTileM * kTileN) gemm_coalesced_kernel(const __grid_constant__ GemmParams p) {
  static_assert(kTileN % 32 == 0, "whole warps along n");
  int m0, n0;
  gemm_block_tile<kTileM, kTileN>(p, &m0, &n0);
  const int dm = threadIdx.x / kTileN, dn = threadIdx.x % kTileN;
  if (dm >= p.M - m0 || dn >= p.N - n0) return;  // (compared as offsets: m0 + dm may pass INT_MAX)
  const int m = m0 + dm, n = n0 + dn;
  const float* a = static_cast<const float*>(p.a) + m * p.a_row;  // row m of A: one address per warp
  const float* b = static_cast<const float*>(p.b) + n;            // column n of B: consecutive per warp
  float acc = 0.f;
  for (int k = 0; k < p.K; ++k) acc += a[k] * b[k * p.b_row];
  gemm_store<float>(p, acc, m, n);
}

}  // namespace flashlab::kernels
