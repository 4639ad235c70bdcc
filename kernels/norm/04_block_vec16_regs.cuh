// Rung 4 — RMSNorm with the row held in registers: one read of the input (top rung).
//
// Changes from rung 3: each thread loads its kRmsNormVecsPerThread vectors of the row once,
// all loads issued before the first use, keeps them in registers across the block reduction,
// and scales them from there: the input
// (and, fused, the residual) crosses the memory system exactly once, and the store of the
// output follows the reduction without a second load. The block size is picked per hidden
// size so that threads x kRmsNormVecsPerThread x Vec<T>::kN covers the row (hidden 4096 bf16:
// 128 threads; fp32: 256). Rows longer than kRmsNormVecsPerThread x kRmsNormRegsMaxThreads
// vectors take rung 3.
// Same precondition as rung 3.
// Limits: at the bandwidth roofline for LLM hidden sizes; what is left is the launch and the
// block-wide barrier per row, which matter only for few or very short rows.
#pragma once

#include "kernels/common/reduce.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/vec_math.cuh"
#include "kernels/norm/03_block_vec16.cuh"
#include "kernels/norm/params.h"

namespace flashlab::kernels {

inline constexpr int kRmsNormVecsPerThread = 4;
// At most 512 threads (128 registers each): at 1024 threads the 64-register cap spilled the
// bf16 kernels (72 bytes, ptxas sm_90a). Covers hidden <= 16384 (bf16) / 8192 (fp32).
inline constexpr int kRmsNormRegsMaxThreads = 512;

// kVpt: vectors of the row per thread; kPrefetchWeight: load the weight with the row (before
// the reduction) or after it. Template parameters so that bench/experiments/rmsnorm_sweep.cu can
// measure the alternatives; the host uses the defaults, the best measured (H100, 16384 rows,
// bf16): 4 vectors per thread; weight early for rmsnorm (hidden 4096: 0.0954 ms vs 0.0965
// late), late for the fused op, whose third register array otherwise costs occupancy
// (hidden 8192: 0.3639 ms vs 0.4095 early).
template <typename T, bool kFused, bool kGemma, int kVpt = kRmsNormVecsPerThread, bool kPrefetchWeight = !kFused,
          bool kStoreWb = kFused>
__global__ void __launch_bounds__(kRmsNormRegsMaxThreads) rmsnorm_block_vec16_regs_kernel(const __grid_constant__ RmsNormParams p) {
  using V = Vec<T>;
  const int64_t r = blockIdx.x;
  const int64_t nvec = p.hidden / V::kN;
  const T* in = static_cast<const T*>(p.input) + r * p.input_stride;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + r * p.out_stride;
  T* res = kFused ? static_cast<T*>(p.residual) + r * p.residual_stride : nullptr;
  // Every load of the row (input, residual, weight) is issued before the first use.
  V x[kVpt], wv[kVpt], rv[kVpt];
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) {
      x[k] = load_vec(in + i * V::kN);
      if constexpr (kFused) rv[k] = load_vec(res + i * V::kN);
      if constexpr (kPrefetchWeight) wv[k] = load_vec(w + i * V::kN);
    }
  }
  // kStoreWb: plain write-back stores instead of evict-first ones; the fused op's default: 1.1%
  // faster at 16384 x 4096 bf16 (bench/experiments/rmsnorm_sweep.cu; rmsnorm keeps store_vec).
  const auto store = [](T* q, const V& v) {
    if constexpr (kStoreWb) store_vec_wb(q, v);
    else store_vec(q, v);
  };
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) {
      if constexpr (kFused) {
        x[k] = add_vec(x[k], rv[k]);
        store(res + i * V::kN, x[k]);
      }
      ss += sum_squares_vec(x[k]);
    }
  }
  const float inv_rms = rsqrt_rn(block_all_reduce_sum(ss) / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    const int64_t i = k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < nvec) {
      if constexpr (!kPrefetchWeight) wv[k] = load_vec(w + i * V::kN);
      store(out + i * V::kN, scale_vec<T, kGemma>(x[k], wv[k], inv_rms));
    }
  }
}

}  // namespace flashlab::kernels
