// Rung 3 — shared-memory tiles: a block stages (32, 32) tiles of A and B on chip and every
// thread reuses them 32 times.
//
// Changes from rung 2: the K loop advances a tile at a time. Each of the 32 x 32 threads loads
// one element of the A tile (kBM, kBK) and one of the B tile (kBK, kBN) into shared memory,
// the block synchronizes, and each thread then runs 32 FMAs of its dot product from shared
// memory. Global traffic drops by the tile width: every A element is fetched once per block
// column instead of once per output column (32x fewer loads from L2 than rung 2).
//
//   for each k tile:  As[r][c] = A[m0 + r, k0 + c]; Bs[r][c] = B[k0 + r, n0 + c]   (0 past M, N, K)
//                     __syncthreads()
//                     acc += sum_kk As[ty][kk] * Bs[kk][tx]
//                     __syncthreads()   (before the next tile overwrites As, Bs)
//
// Shared memory needs no padding or swizzle: a warp is one row ty of threads, so the inner
// loop reads As[ty][kk] at one address (a broadcast) and Bs[kk][tx .. tx+31] at 32 consecutive
// words (32 banks), and the stores are 32 consecutive words too.
// Tails: out-of-range elements are stored as 0, so partial tiles need no special inner loop.
// Limits: 2 shared-memory loads per FMA; the kernel is bound by shared-memory bandwidth and
// load-instruction issue, not by the FMA units.
#pragma once

#include "kernels/gemm/02_coalesced.cuh"
#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

inline constexpr int kGemmSmemTile = 32;  // kBM = kBN = kBK
inline constexpr int kGemmSmemThreads = kGemmSmemTile * kGemmSmemTile;

// kT x kT threads, one output each; kBM = kBN = kBK = kT.
template <int kT>
__global__ void __launch_bounds__(kT * kT) gemm_smem_tiled_kernel(const __grid_constant__ GemmParams p) {
  static_assert(kT == 32, "a warp is one row of threads: the conflict-free access pattern above");
  __shared__ float As[kT][kT];  // (kBM, kBK)
  __shared__ float Bs[kT][kT];  // (kBK, kBN)
  int m0, n0;
  gemm_block_tile<kT, kT>(p, &m0, &n0);
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
  const int m_left = p.M - m0, n_left = p.N - n0;  // rows / columns of this tile inside C
  const bool row_ok = ty < m_left, col_ok = tx < n_left;
  // Row m0 + ty of A and column n0 + tx of B (clamped to stay inside the operands).
  const float* a = static_cast<const float*>(p.a) + (m0 + (row_ok ? ty : 0)) * p.a_row;
  const float* b = static_cast<const float*>(p.b) + n0 + (col_ok ? tx : 0);
  float acc = 0.f;
  const int k_tiles = (p.K - 1) / kT + 1;
  for (int t = 0; t < k_tiles; ++t) {
    const int k0 = t * kT, k_left = p.K - k0;
    As[ty][tx] = row_ok && tx < k_left ? a[k0 + tx] : 0.f;
    Bs[ty][tx] = ty < k_left && col_ok ? b[(k0 + ty) * p.b_row] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kT; ++kk) acc += As[ty][kk] * Bs[kk][tx];
    __syncthreads();
  }
  if (row_ok && col_ok) gemm_store<float>(p, acc, m0 + ty, n0 + tx);
}

}  // namespace flashlab::kernels
