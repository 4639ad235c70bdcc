// Host side of the LayerNorm family: validation, then dispatch to a rung.
#include <cmath>

#include "flashlab/layernorm.h"
#include "flashlab/validate.h"
#include "kernels/layernorm/01_two_pass_warp.cuh"
#include "kernels/layernorm/02_welford_warp.cuh"
#include "kernels/layernorm/03_welford_block_vec16_regs.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// Rung 3 needs every row, the weight and the bias to start on a 16-byte boundary.
template <typename T>
bool vec16_ok(const LayerNormParams& p) {
  auto aligned = detail::rows_vec16_aligned<T>;
  return p.hidden % Vec<T>::kN == 0 && aligned(p.input, p.input_stride) && aligned(p.out, p.out_stride) &&
         aligned(p.weight, 0) && aligned(p.bias, 0);  // a null bias counts as aligned
}

template <typename T, bool kBias>
void launch_layernorm(const LayerNormParams& p, cudaStream_t stream, int rung) {
  const int grid_rows = static_cast<int>(p.rows);  // rows <= 2^31 - 1 checked by the caller
  const int warp_grid = static_cast<int>(detail::ceil_div(p.rows, kLayerNormWarpThreads / kWarpSize));
  const int64_t nvec = p.hidden / Vec<T>::kN;
  if (rung == 1) {
    FLASHLAB_LAUNCH((layernorm_two_pass_warp_kernel<T, kBias>), warp_grid, kLayerNormWarpThreads, 0, stream, p);
  } else if (rung == 2 || !vec16_ok<T>(p)) {
    FLASHLAB_LAUNCH((layernorm_welford_warp_kernel<T, kBias>), warp_grid, kLayerNormWarpThreads, 0, stream, p);
  } else if (nvec > static_cast<int64_t>(kLayerNormVecsPerThread) * kLayerNormRegsMaxThreads) {
    FLASHLAB_LAUNCH((layernorm_welford_block_vec16_kernel<T, kBias>), grid_rows, detail::cover_threads(nvec, kLayerNormVecsPerThread), 0,
                    stream, p);
  } else {
    FLASHLAB_LAUNCH((layernorm_welford_block_vec16_regs_kernel<T, kBias>), grid_rows, detail::cover_threads(nvec, kLayerNormVecsPerThread),
                    0, stream, p);
  }
}

}  // namespace

void layernorm(const TensorView& input, const TensorView& weight, const TensorView& bias, const TensorView& out,
               double eps, cudaStream_t stream, int rung) {
  constexpr const char* op = "layernorm";
  const check::Arg I{op, "input", input}, W{op, "weight", weight}, B{op, "bias", bias}, O{op, "out", out};
  const bool has_bias = !(bias.data == nullptr && bias.ndim() == 0);
  check::rung(op, rung, kLayerNormRungs);
  check::row_input(I, "hidden");
  check::row_vector(W, I);
  if (has_bias) check::row_vector(B, I);
  check::rows_like(O, I, "hidden");
  check::no_overlap(O, I);
  check::no_overlap(O, W);
  if (has_bias) check::no_overlap(O, B);
  FLASHLAB_CHECK(std::isfinite(eps) && eps >= 0, op, ": argument 'eps': expected a finite value >= 0, got ", eps);
  detail::DeviceGuard guard(input.device.index);
  const LayerNormParams p{input.data, out.data, weight.data, has_bias ? bias.data : nullptr, input.shape[0],
                          input.shape[1], detail::row_stride(input), detail::row_stride(out), static_cast<float>(eps)};
  DTYPE_SWITCH(input.dtype, T, [&] {
    BOOL_SWITCH(has_bias, kBias, [&] { launch_layernorm<T, kBias>(p, stream, rung); });
  });
}

}  // namespace flashlab
