// Rung 1 — naive GEMM: one thread per output element, a dot product of length K straight from
// global memory.
//
// Thread (x, y) of the 2D grid computes C[m = x, n = y]. Consecutive threads of a warp take
// consecutive m, so for row-major A they read addresses K elements apart (32 cache lines per
// load instruction) and for row-major C they write them N apart: nothing is coalesced, and
// every A and B element is re-read from memory (or L2) by each of the N (or M) threads that
// need it: 2 * M * N * K loads for 2 * M * N * K flops. Any layout, any dtype, fp32 accumulation:
// it is also the same-dtype baseline the tests measure the other rungs' errors against.
// Limits: uncoalesced accesses; arithmetic intensity of 0.25 flop per byte loaded.
#pragma once

#include "kernels/gemm/epilogue.cuh"

namespace flashlab::kernels {

inline constexpr int kGemmNaiveBlock = 16;  // 16 x 16 threads

// grid.y is capped at 65535 blocks: columns past gridDim.y x 16 are taken by a loop.
template <typename T>
__global__ void gemm_naive_kernel(const __grid_constant__ GemmParams p) {
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= p.M) return;
  const T* a = static_cast<const T*>(p.a) + m * p.a_row;
  for (int64_t n = blockIdx.y * blockDim.y + threadIdx.y; n < p.N; n += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const T* b = static_cast<const T*>(p.b) + n * p.b_col;
    float acc = 0.f;
    for (int k = 0; k < p.K; ++k) acc += to_float(a[k * p.a_col]) * to_float(b[k * p.b_row]);
    gemm_store<T>(p, acc, m, static_cast<int>(n));
  }
}

}  // namespace flashlab::kernels
