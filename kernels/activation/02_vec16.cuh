// Rung 2 — gated activation with 16-byte vectors, one block per (row, column tile), scalar edges.
//
// Changes from rung 1: work is cut into tiles of one row and kActTileCols<T> columns
// (kActThreads threads x kActUnroll vectors x Vec<T>::kN elements: 2048 bf16/fp16 or 1024 fp32
// columns), one block per tile, tiles numbered row-major (the grid strides over them when there
// are more than 2^31 - 1). Within a tile, access k of thread t is vector k * kActThreads + t of
// the tile, so each warp instruction touches 512 contiguous bytes of gate, of up or of out; each
// thread issues its kActUnroll gate and kActUnroll up loads (2 x 2 x 16 = 64 bytes in flight)
// before the first multiply. Output uses streaming stores.
// Edges (the approach of vector add rung 3 and sum rung 5), per row:
//   head | body | tail: head = elements before out's first 16-byte boundary, body = whole
//   16-byte vectors, tail = the rest (< Vec<T>::kN). Tile 0 of the row does head and tail with
//   one scalar element per thread (head + tail < 2 Vec<T>::kN <= kActThreads).
//   The body needs the row's gate, up and out to share one offset modulo 16 bytes. That holds on
//   every row when d and the row stride are multiples of Vec<T>::kN and the pointers are 16-byte
//   aligned (every LLM shape); otherwise it can differ from row to row, and a row without a
//   common split runs the tile's columns with scalar accesses, kN loads in flight per thread.
// Shapes: gate, up (d,) at in + row * in_row_stride (+ d); out (d,) at out + row * d.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/activation/01_scalar.cuh"
#include "kernels/activation/params.h"
#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"

namespace flashlab::kernels {

inline constexpr int kActUnroll = 2;
// Unroll 4 (128 bytes in flight per thread) took 120-124 registers for bf16 (ptxas, sm_90a): 4
// blocks of 128 threads per SM; capping it with __launch_bounds__ min-blocks spilled. Unroll 2
// takes 72 (7 blocks per SM) and still has 57 KB in flight per SM. Chosen by occupancy, not yet
// timed against unroll 4.

// Columns of one tile: every thread's kActUnroll vectors.
template <typename T>
constexpr int64_t act_tile_cols() {
  return static_cast<int64_t>(kActThreads) * kActUnroll * Vec<T>::kN;
}
static_assert(2 * (kVecBytes / 2) <= kActThreads, "head + tail (< 2 vectors of the narrowest T) fit one pass of a block");

// Two 16-bit values as one 32-bit word, with their float2 conversions (one cvt for two).
template <typename T> struct Pack2;
template <> struct Pack2<__half> { using Type = __half2; };
template <> struct Pack2<__nv_bfloat16> { using Type = __nv_bfloat162; };
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
template <typename T2> __device__ __forceinline__ T2 from_float2(float a, float b);
template <> __device__ __forceinline__ __half2 from_float2<__half2>(float a, float b) { return __floats2half2_rn(a, b); }
template <> __device__ __forceinline__ __nv_bfloat162 from_float2<__nv_bfloat162>(float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

// act(g) * u for the Vec<T>::kN lanes of one vector, each in fp32 and rounded once.
template <typename Act, typename T>
__device__ __forceinline__ Vec<T> act_and_mul_vec(const Vec<T>& g, const Vec<T>& u) {
  Vec<T> r;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < Vec<T>::kN; ++j) r.v[j] = act_and_mul_one<Act>(g.v[j], u.v[j]);
  } else {
    using T2 = typename Pack2<T>::Type;
    const auto* g2 = reinterpret_cast<const T2*>(g.v);
    const auto* u2 = reinterpret_cast<const T2*>(u.v);
    auto* r2 = reinterpret_cast<T2*>(r.v);
#pragma unroll
    for (int j = 0; j < Vec<T>::kN / 2; ++j) {
      const float2 fg = to_float2(g2[j]), fu = to_float2(u2[j]);
      r2[j] = from_float2<T2>(Act::apply(fg.x) * fu.x, Act::apply(fg.y) * fu.y);
    }
  }
  return r;
}

template <typename T>
__device__ __forceinline__ bool same_offset16(const T* a, const T* b, const T* c) {
  const auto m = reinterpret_cast<uintptr_t>(a) % kVecBytes;
  return reinterpret_cast<uintptr_t>(b) % kVecBytes == m && reinterpret_cast<uintptr_t>(c) % kVecBytes == m;
}

// Columns [chunk * tile, (chunk + 1) * tile) of one row with scalar accesses: a row whose gate,
// up and out sit at different offsets modulo 16 bytes. kN loads of each half in flight per thread.
template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul_tile_scalar(const T* gate, const T* up, T* out, int64_t d, int64_t chunk) {
  constexpr int kN = Vec<T>::kN;
  const int64_t c0 = chunk * act_tile_cols<T>() + threadIdx.x;
#pragma unroll 1
  for (int j0 = 0; j0 < kActUnroll * kN; j0 += kN) {
    T g[kN], u[kN];  // (kN,) elements kActThreads apart
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j0 + j) * kActThreads;
      if (c < d) {
        g[j] = gate[c];
        u[j] = up[c];
      }
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j0 + j) * kActThreads;
      if (c < d) out[c] = act_and_mul_one<Act>(g[j], u[j]);
    }
  }
}

// Tile `chunk` of one row: body vectors [chunk * kTileVecs, (chunk + 1) * kTileVecs), and for
// chunk 0 the row's scalar head and tail.
template <typename T, typename Act>
__device__ __forceinline__ void act_and_mul_tile(const T* gate, const T* up, T* out, int64_t d, int64_t chunk) {
  using V = Vec<T>;
  constexpr int kU = kActUnroll;
  constexpr int64_t kTileVecs = static_cast<int64_t>(kActThreads) * kU;
  if (!same_offset16(gate, up, out)) return act_and_mul_tile_scalar<T, Act>(gate, up, out, d, chunk);
  const int64_t head = vec_head(out, d);
  const int64_t nvec = (d - head) / V::kN;
  const int64_t body_end = head + nvec * V::kN;
  if (chunk == 0 && threadIdx.x < head + (d - body_end)) {
    const int64_t c = threadIdx.x < head ? threadIdx.x : body_end + (threadIdx.x - head);
    out[c] = act_and_mul_one<Act>(gate[c], up[c]);
  }
  const T* g = gate + head;  // (nvec * kN,) 16-byte aligned, likewise u and o
  const T* u = up + head;
  T* o = out + head;
  const int64_t v0 = chunk * kTileVecs + threadIdx.x;
  V vg[kU], vu[kU];  // (kU,) vectors kActThreads apart
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t v = v0 + k * kActThreads;
    if (v < nvec) {
      vg[k] = load_vec(g + v * V::kN);
      vu[k] = load_vec(u + v * V::kN);
    }
  }
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t v = v0 + k * kActThreads;
    if (v < nvec) store_vec(o + v * V::kN, act_and_mul_vec<Act>(vg[k], vu[k]));
  }
}

template <typename T, typename Act>
__global__ void __launch_bounds__(kActThreads) act_and_mul_vec16_kernel(const __grid_constant__ ActMulParams p) {
  const T* in = static_cast<const T*>(p.in);  // (rows, in_row_stride)
  T* out = static_cast<T*>(p.out);            // (rows, d)
  const int64_t tiles_per_row = (p.d + act_tile_cols<T>() - 1) / act_tile_cols<T>();
  const int64_t tiles = p.rows * tiles_per_row;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = tiles_per_row == 1 ? t : t / tiles_per_row;
    const T* gate = in + row * p.in_row_stride;
    act_and_mul_tile<T, Act>(gate, gate + p.d, out + row * p.d, p.d, t - row * tiles_per_row);
  }
}

}  // namespace flashlab::kernels
