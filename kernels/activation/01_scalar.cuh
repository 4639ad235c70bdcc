// Rung 1 — gated activation, one thread per output element, grid-stride, scalar loads.
//
// out[r, i] = act(x[r, i]) * x[r, d + i] for a (rows, 2d) input x with any row stride and a
// contiguous (rows, d) output: the first half of each input row is the gate, the second half the
// up projection (FlashInfer's silu_and_mul / gelu_and_mul / gelu_tanh_and_mul). Every element is
// read as T, computed in fp32 and rounded once to T.
// The three activations are functors (SiluAct, GeluAct, GeluTanhAct below) passed as a template
// parameter, so every rung is written once and compiled once per activation.
// Steps: output element i = r * d + c is handled by a thread that strides by the whole grid; the
// thread splits i into (r, c) with one division up front and then advances (r, c) by the
// stride's own (rows, cols) step, so the loop has no 64-bit division. Each access is one element
// (4 or 2 bytes), and the gate and up reads of a warp are two separate 128-byte (fp32) or 64-byte
// (bf16) runs. What limits it next: bytes per memory instruction, as in vector add rung 1.
#pragma once

#include "kernels/activation/params.h"
#include "kernels/common/dtype.cuh"

namespace flashlab::kernels {

inline constexpr int kActThreads = 128;

// silu(x) = x * sigmoid(x) = x / (1 + e^-x). __expf is ex2.approx(x * log2 e): a few ulps
// (relative error grows like |x| 2^-24), far inside the test tolerance; for x < -88 it gives
// inf and x / inf = -0, the right limit.
struct SiluAct {
  __device__ __forceinline__ static float apply(float x) { return x / (1.f + __expf(-x)); }
};

// Exact GELU: x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)). erff: at most 2 ulps (CUDA math docs).
struct GeluAct {
  static constexpr float kRsqrt2 = 0.70710678118654752f;
  __device__ __forceinline__ static float apply(float x) { return 0.5f * x * (1.f + erff(x * kRsqrt2)); }
};

// GELU, tanh approximation: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). tanhf: at most
// 2 ulps; tanh saturates to +-1, so large |x| gives x or 0 with no overflow.
struct GeluTanhAct {
  static constexpr float kSqrt2OverPi = 0.79788456080286536f;
  static constexpr float kCubic = 0.044715f;
  __device__ __forceinline__ static float apply(float x) {
    const float inner = kSqrt2OverPi * x * fmaf(kCubic * x, x, 1.f);
    return 0.5f * x * (1.f + tanhf(inner));
  }
};

// act(gate) * up in fp32, rounded once to T.
template <typename Act, typename T>
__device__ __forceinline__ T act_and_mul_one(T gate, T up) {
  return from_float<T>(Act::apply(to_float(gate)) * to_float(up));
}

template <typename T, typename Act>
__global__ void __launch_bounds__(kActThreads) act_and_mul_scalar_kernel(const __grid_constant__ ActMulParams p) {
  const T* in = static_cast<const T*>(p.in);  // (rows, in_row_stride)
  T* out = static_cast<T*>(p.out);            // (rows, d)
  const int64_t n = p.rows * p.d;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t row = i / p.d, col = i - row * p.d;
  const int64_t step_rows = stride / p.d, step_cols = stride - step_rows * p.d;
  for (; i < n; i += stride) {
    const T* gate = in + row * p.in_row_stride;  // (d,) then up: (d,) right after it
    out[i] = act_and_mul_one<Act>(gate[col], gate[p.d + col]);
    row += step_rows;
    col += step_cols;
    if (col >= p.d) {
      col -= p.d;
      ++row;
    }
  }
}

}  // namespace flashlab::kernels
