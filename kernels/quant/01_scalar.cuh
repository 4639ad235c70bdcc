// Rung 1 — dynamic quantization, per token: one block per row, scalar loads, two walks.
//
// Goal: x (rows, cols) fp32/fp16/bf16 -> q (rows, cols) e4m3 or int8 + fp32 scales.
//   scale[r] = max(absmax_c |x[r, c]|, kQuantTinyAbsmax) / qmax       (qmax 448 e4m3, 127 int8)
//   q[r, c]  = round(x[r, c] / scale[r])  — an IEEE fp32 division (__fdiv_rn), chosen over
//              x * (1 / scale) so that q is the correctly rounded quotient, as torch's
//              `x.float() / s` computes it; then e4m3: round to nearest even with saturation to
//              +-448 (cvt.rn.satfinite); int8: clamp to +-127, round half to even (cvt.rni).
// Steps: (1) the block's threads walk row r (coalesced, one element per access) taking the
// running max of |x|; (2) block_all_reduce_max; thread 0 writes scale[r]; (3) a second walk
// re-reads the row (from L1/L2), divides and stores one byte per element.
// Per tensor (kPerTensor): the scale was computed by absmax_scale_kernel beforehand
// (per_tensor_absmax.cuh) and is read from scales[0]; only walk (3) runs.
// Limits: 2-4 byte loads and 1-byte stores: few bytes in flight per instruction; the second
// walk re-reads the row.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "kernels/common/dtype.cuh"
#include "kernels/common/reduce.cuh"
#include "kernels/quant/params.h"

namespace flashlab::kernels {

enum class QuantFormat { kE4M3, kI8 };

template <QuantFormat F>
inline constexpr float kQmax = F == QuantFormat::kE4M3 ? kE4M3Max : kInt8Max;

// One value (already divided by the scale) -> its 8-bit code.
template <QuantFormat F>
__device__ __forceinline__ uint8_t quantize_one(float v) {
  if constexpr (F == QuantFormat::kE4M3) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  } else {
    return static_cast<uint8_t>(__float2int_rn(fminf(fmaxf(v, -kInt8Max), kInt8Max)));
  }
}

template <QuantFormat F>
__device__ __forceinline__ float quant_scale(float absmax) {
  return __fdiv_rn(fmaxf(absmax, kQuantTinyAbsmax), kQmax<F>);
}

inline constexpr int kQuantScalarThreads = 256;

template <typename T, QuantFormat F, bool kPerTensor>
__global__ void __launch_bounds__(kQuantScalarThreads) quantize_scalar_kernel(const __grid_constant__ QuantParams p) {
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.input) + r * p.input_stride;  // (cols,)
  uint8_t* q = static_cast<uint8_t*>(p.q) + r * p.q_stride;          // (cols,)
  float scale;
  if constexpr (kPerTensor) {
    scale = p.scales[0];
  } else {
    float amax = 0.f;
    for (int64_t c = threadIdx.x; c < p.cols; c += kQuantScalarThreads) amax = fmaxf(amax, fabsf(to_float(x[c])));
    scale = quant_scale<F>(block_all_reduce_max(amax));
    if (threadIdx.x == 0) p.scales[r] = scale;
  }
  for (int64_t c = threadIdx.x; c < p.cols; c += kQuantScalarThreads)
    q[c] = quantize_one<F>(__fdiv_rn(to_float(x[c]), scale));
}

}  // namespace flashlab::kernels
