// The per-tensor scale: absmax over the whole (rows, cols) tensor in one launch, then
// scale = max(absmax, kQuantTinyAbsmax) / qmax written to scales[0] (not a rung: both rungs'
// per-tensor paths run it before their quantize kernel, which reads scales[0]).
//
// The tensor is cut into tiles of one row x (kAbsmaxThreads x kN) columns; block b takes tiles
// b, b + gridDim.x, ... (so one long row and many short rows both spread over the grid), each
// thread keeps a running max, and the block combines them with block_all_reduce_max. Then the
// one-pass grid reduction of kernels/reduce/06_one_pass.cuh: partial to the workspace, fence,
// ticket; the block that draws the last ticket takes the max of the partials, writes the scale
// and resets the counter. max is exact and order-free, so the scale does not depend on the grid.
// kVec: 16-byte vector loads (cols a multiple of Vec<T>::kN, rows 16-byte aligned), else scalar.
// Limits: a second launch (the quantize kernel) re-reads the whole input; for tensors that fit
// in L2 that re-read is cheap, for larger ones it is half the traffic.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/quant/01_scalar.cuh"
#include "kernels/quant/02_vec16_regs.cuh"
#include "kernels/quant/params.h"

namespace flashlab::kernels {

inline constexpr int kAbsmaxThreads = 256;
inline constexpr int kAbsmaxMaxBlocks = 1024;  // the last block reduces at most 4 partials per thread

template <typename T, bool kVec>
inline constexpr int64_t kAbsmaxTileCols = static_cast<int64_t>(kAbsmaxThreads) * (kVec ? Vec<T>::kN : 1);

template <typename T, QuantFormat F, bool kVec>
__global__ void __launch_bounds__(kAbsmaxThreads) absmax_scale_kernel(const __grid_constant__ AbsmaxScaleParams p) {
  constexpr int64_t kTile = kAbsmaxTileCols<T, kVec>;
  __shared__ bool is_last;
  const int64_t tiles_per_row = (p.cols + kTile - 1) / kTile;
  const int64_t tiles = p.rows * tiles_per_row;
  float amax = 0.f;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r = t / tiles_per_row;
    const T* row = static_cast<const T*>(p.input) + r * p.input_stride;  // (cols,)
    if constexpr (kVec) {
      const int64_t c = (t - r * tiles_per_row) * kTile + static_cast<int64_t>(threadIdx.x) * Vec<T>::kN;
      if (c < p.cols) amax = fmaxf(amax, absmax_vec(load_vec(row + c)));
    } else {
      const int64_t c = (t - r * tiles_per_row) * kTile + threadIdx.x;
      if (c < p.cols) amax = fmaxf(amax, fabsf(to_float(row[c])));
    }
  }
  const float block_max = block_all_reduce_max(amax);
  if (threadIdx.x == 0) {
    p.partials[blockIdx.x] = block_max;
    __threadfence();  // partial visible to the last block before the ticket is taken
    is_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // acquire side: see every other block's partial
  float m = 0.f;
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kAbsmaxThreads) m = fmaxf(m, __ldcg(p.partials + i));
  const float total = block_all_reduce_max(m);
  if (threadIdx.x == 0) {
    *p.scale = quant_scale<F>(total);
    *p.counter = 0u;
  }
}

}  // namespace flashlab::kernels
