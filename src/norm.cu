// Host side of the RMSNorm family: validation, then dispatch to a rung.
#include <algorithm>
#include <cmath>

#include "flashlab/norm.h"
#include "flashlab/validate.h"
#include "kernels/norm/01_naive.cuh"
#include "kernels/norm/02_warp.cuh"
#include "kernels/norm/04_block_vec16_regs.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// The 16-byte vector rungs need every row and the weight to start on a 16-byte boundary.
template <typename T>
bool vec16_ok(const RmsNormParams& p, bool fused) {
  auto aligned = detail::rows_vec16_aligned<T>;
  return p.hidden % Vec<T>::kN == 0 && aligned(p.input, p.input_stride) && aligned(p.out, p.out_stride) &&
         aligned(p.weight, 0) && (!fused || aligned(p.residual, p.residual_stride));
}

template <typename T, bool kFused, bool kGemma>
void launch_rmsnorm(const RmsNormParams& p, cudaStream_t stream, int rung) {
  const int grid_rows = static_cast<int>(p.rows);  // rows <= 2^31 - 1 checked by the caller
  const int64_t nvec = p.hidden / Vec<T>::kN;
  if (rung == 1) {
    if constexpr (!kFused)
      FLASHLAB_LAUNCH((rmsnorm_naive_kernel<T, kGemma>), static_cast<int>(detail::ceil_div(p.rows, kRmsNormNaiveThreads)),
                      kRmsNormNaiveThreads, 0, stream, p);
    return;
  }
  if (rung == 2 || !vec16_ok<T>(p, kFused)) {
    FLASHLAB_LAUNCH((rmsnorm_warp_kernel<T, kFused, kGemma>),
                    static_cast<int>(detail::ceil_div(p.rows, kRmsNormWarpThreads / kWarpSize)), kRmsNormWarpThreads, 0,
                    stream, p);
  } else if (rung == 3 || nvec > static_cast<int64_t>(kRmsNormVecsPerThread) * kRmsNormRegsMaxThreads) {
    FLASHLAB_LAUNCH((rmsnorm_block_vec16_kernel<T, kFused, kGemma>), grid_rows,
                    detail::cover_threads(nvec, kRmsNormVecsPerThread), 0, stream, p);
  } else {
    FLASHLAB_LAUNCH((rmsnorm_block_vec16_regs_kernel<T, kFused, kGemma>), grid_rows,
                    detail::cover_threads(nvec, kRmsNormVecsPerThread), 0, stream, p);
  }
}

void check_common(const char* op, const check::Arg& I, const check::Arg& W, double eps) {
  check::row_input(I, "hidden");
  check::row_vector(W, I);
  FLASHLAB_CHECK(std::isfinite(eps) && eps >= 0, op, ": argument 'eps': expected a finite value >= 0, got ", eps);
}

}  // namespace

void rmsnorm(const TensorView& input, const TensorView& weight, const TensorView& out, double eps, bool gemma,
             cudaStream_t stream, int rung) {
  constexpr const char* op = "rmsnorm";
  const check::Arg I{op, "input", input}, W{op, "weight", weight}, O{op, "out", out};
  check::rung(op, rung, kRmsNormRungs);
  check_common(op, I, W, eps);
  check::rows_like(O, I, "hidden");
  check::no_overlap(O, I);
  check::no_overlap(O, W);
  detail::DeviceGuard guard(input.device.index);
  const RmsNormParams p{input.data, out.data, nullptr, weight.data, input.shape[0], input.shape[1],
                        detail::row_stride(input), detail::row_stride(out), 0, static_cast<float>(eps)};
  DTYPE_SWITCH(input.dtype, T, [&] {
    BOOL_SWITCH(gemma, kGemma, [&] { launch_rmsnorm<T, false, kGemma>(p, stream, rung); });
  });
}

void fused_add_rmsnorm(const TensorView& input, const TensorView& residual, const TensorView& weight, double eps,
                       bool gemma, cudaStream_t stream, int rung) {
  constexpr const char* op = "fused_add_rmsnorm";
  const check::Arg I{op, "input", input}, R{op, "residual", residual}, W{op, "weight", weight};
  FLASHLAB_CHECK(rung >= 2 && rung <= kRmsNormRungs, op, ": argument 'rung': expected 2..", kRmsNormRungs,
                 " (rung 1 has no fused variant), got ", rung);
  check_common(op, I, W, eps);
  check::rows_like(R, I, "hidden");
  if (residual.data == input.data)
    check::fail(R, "memory disjoint from 'input'", "the same memory as 'input'");
  check::no_overlap(R, I);
  check::no_overlap(I, W);
  check::no_overlap(R, W);
  detail::DeviceGuard guard(input.device.index);
  const RmsNormParams p{input.data, input.data, residual.data, weight.data, input.shape[0], input.shape[1],
                        detail::row_stride(input), detail::row_stride(input), detail::row_stride(residual),
                        static_cast<float>(eps)};
  DTYPE_SWITCH(input.dtype, T, [&] {
    BOOL_SWITCH(gemma, kGemma, [&] { launch_rmsnorm<T, true, kGemma>(p, stream, rung); });
  });
}

}  // namespace flashlab
