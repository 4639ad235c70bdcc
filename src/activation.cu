// Host side of the gated-activation family: validation, then dispatch to a rung.
#include <algorithm>
#include <vector>

#include "flashlab/activation.h"
#include "flashlab/validate.h"
#include "kernels/activation/02_vec16.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// Row stride of `t` seen as (rows, last dim): its leading dims must flatten into one evenly
// spaced run of rows (size-1 dims have no stride to honour). A single row gets the last dim.
int64_t flattened_row_stride(const check::Arg& a) {
  const TensorView& t = a.t;
  int64_t row_stride = t.shape.back(), expect = 0;
  bool first = true;
  for (int i = t.ndim() - 2; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (first) {
      row_stride = t.strides[i];
      first = false;
    } else if (t.strides[i] != expect) {
      check::fail(a, "leading dims that flatten to one row stride",
                  detail::concat("strides ", shape_str(t.strides), " for shape ", shape_str(t.shape)));
    }
    expect = t.strides[i] * t.shape[i];
  }
  return row_stride;
}

// Rung 1: as many blocks as fit on the device at once (grid-stride, persistent).
template <typename Kernel>
int resident_grid(Kernel kernel, int64_t n) {
  const int64_t want = std::max<int64_t>(1, detail::ceil_div(n, kActThreads));
  return static_cast<int>(std::min<int64_t>(
      want, detail::resident_blocks(reinterpret_cast<const void*>(kernel), kActThreads)));
}

template <typename T, typename Act>
void launch_act_and_mul(const ActMulParams& p, cudaStream_t stream, int rung) {
  if (rung == 1) {
    FLASHLAB_LAUNCH((act_and_mul_scalar_kernel<T, Act>), resident_grid(act_and_mul_scalar_kernel<T, Act>, p.rows * p.d),
                    kActThreads, 0, stream, p);
    return;
  }
  // One block per (row, column tile), like vector add's one block per tile; past 2^31 - 1
  // tiles the kernel strides.
  constexpr int64_t kMaxGrid = 0x7fffffff;
  const int64_t tiles = p.rows * detail::ceil_div(p.d, act_tile_cols<T>());
  FLASHLAB_LAUNCH((act_and_mul_vec16_kernel<T, Act>), static_cast<int>(std::min(tiles, kMaxGrid)), kActThreads, 0,
                  stream, p);
}

void act_and_mul(const char* op, Activation act, const TensorView& input, const TensorView& out,
                 cudaStream_t stream, int rung) {
  const check::Arg I{op, "input", input}, O{op, "out", out};
  check::rung(op, rung, kActivationRungs);
  check::cuda(I);
  check::cuda(O);
  check::same_device(O, I);
  check::dtype_in(I, {DType::kF32, DType::kF16, DType::kBF16});
  check::dtype_eq(O, I);
  if (input.ndim() < 1) check::fail(I, "at least 1 dim ([..., 2d])", "a 0-dim tensor");
  check::nonempty(I);
  const int64_t two_d = input.shape.back();
  if (two_d % 2 != 0)
    check::fail(I, "an even last dim ([..., 2d]: gate then up)", detail::concat("shape ", shape_str(input.shape)));
  check::last_dim_contiguous(I);
  const int64_t row_stride = flattened_row_stride(I);
  const int64_t d = two_d / 2, rows = input.numel() / two_d;
  if (rows > 1 && row_stride < two_d)
    check::fail(I, ">= 2d row stride (rows must not overlap)",
                detail::concat("row stride ", row_stride, " for last dim ", two_d));
  std::vector<int64_t> out_shape = input.shape;
  out_shape.back() = d;
  if (out.shape != out_shape)
    check::fail(O, detail::concat("shape ", shape_str(out_shape), " ('input' with the last dim halved)"),
                shape_str(out.shape));
  check::contiguous(O);
  check::aligned(I, dtype_size(input.dtype));
  check::aligned(O, dtype_size(out.dtype));
  if (out.data == input.data)  // check::no_overlap lets identical pointers through (in place)
    check::fail(O, "memory disjoint from 'input' (no in-place form: out is half as wide)", "the same data pointer");
  check::no_overlap(O, I);

  detail::DeviceGuard guard(input.device.index);
  const ActMulParams p{input.data, out.data, rows, d, rows > 1 ? row_stride : two_d};
  DTYPE_SWITCH(input.dtype, T, [&] {
    switch (act) {
      case Activation::kSilu: return launch_act_and_mul<T, SiluAct>(p, stream, rung);
      case Activation::kGelu: return launch_act_and_mul<T, GeluAct>(p, stream, rung);
      case Activation::kGeluTanh: return launch_act_and_mul<T, GeluTanhAct>(p, stream, rung);
    }
  });
}

}  // namespace

void silu_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  act_and_mul("silu_and_mul", Activation::kSilu, input, out, stream, rung);
}

void gelu_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  act_and_mul("gelu_and_mul", Activation::kGelu, input, out, stream, rung);
}

void gelu_tanh_and_mul(const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  act_and_mul("gelu_tanh_and_mul", Activation::kGeluTanh, input, out, stream, rung);
}

}  // namespace flashlab
