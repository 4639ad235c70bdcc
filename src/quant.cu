// Host side of the quantize family: validation, then dispatch to a rung.
#include <algorithm>
#include <type_traits>

#include "flashlab/quant.h"
#include "flashlab/validate.h"
#include "kernels/quant/01_scalar.cuh"
#include "kernels/quant/02_vec16_regs.cuh"
#include "kernels/quant/dequantize.cuh"
#include "kernels/quant/per_tensor_absmax.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// e4m3 / int8 storage dtype -> QuantFormat as a compile-time constant for fn.
template <typename Fn>
void format_switch(DType dt, Fn&& fn) {
  if (dt == DType::kE4M3) fn(std::integral_constant<QuantFormat, QuantFormat::kE4M3>{});
  else fn(std::integral_constant<QuantFormat, QuantFormat::kI8>{});
}

// Rung 2 needs whole 16-byte input vectors per row and q rows aligned to one packed word.
template <typename T>
bool vec16_ok(const QuantParams& p) {
  constexpr int kN = Vec<T>::kN;
  return p.cols % kN == 0 && detail::rows_aligned(p.input, p.input_stride * static_cast<int64_t>(sizeof(T)), kVecBytes) &&
         detail::rows_aligned(p.q, p.q_stride, kN);
}

// Threads for one row of rung 2: enough that kQuantVecsPerThread vectors each cover it, whole
// warps, 32..kQuantRegsMaxThreads.
int regs_threads(int64_t nvec) {
  const int64_t t = detail::ceil_div(detail::ceil_div(nvec, kQuantVecsPerThread), kWarpSize) * kWarpSize;
  return static_cast<int>(std::clamp<int64_t>(t, kWarpSize, kQuantRegsMaxThreads));
}

// Blocks of a grid-stride kernel over `tiles` tiles: at most one resident wave (and `cap`).
template <typename Kernel>
int tile_grid(Kernel kernel, int threads, int64_t tiles, int64_t cap) {
  const int64_t resident = detail::resident_blocks(reinterpret_cast<const void*>(kernel), threads);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({tiles, resident, cap})));
}

// scales[0] = max(absmax(input), tiny) / qmax: one launch (grid-wide, ticket counter).
template <typename T, QuantFormat F, bool kVec>
void launch_absmax_scale(const QuantParams& p, cudaStream_t stream) {
  constexpr int64_t kTile = kAbsmaxTileCols<T, kVec>;
  const int64_t tiles = p.rows * detail::ceil_div(p.cols, kTile);
  const int grid = tile_grid(absmax_scale_kernel<T, F, kVec>, kAbsmaxThreads, tiles, kAbsmaxMaxBlocks);
  const AbsmaxScaleParams a{
      p.input, p.rows, p.cols, p.input_stride, p.scales,
      static_cast<float*>(detail::workspace(stream, kAbsmaxMaxBlocks * sizeof(float))),
      static_cast<unsigned*>(detail::workspace(stream, sizeof(unsigned), detail::Workspace::kCounters))};
  FLASHLAB_LAUNCH((absmax_scale_kernel<T, F, kVec>), grid, kAbsmaxThreads, 0, stream, a);
}

template <typename T, QuantFormat F, bool kPerTensor>
void launch_quantize(const QuantParams& p, cudaStream_t stream, int rung) {
  const int grid_rows = static_cast<int>(p.rows);  // rows <= 2^31 - 1 checked by the caller
  const int64_t nvec = p.cols / Vec<T>::kN;
  const bool regs = rung >= 2 && vec16_ok<T>(p) && nvec <= static_cast<int64_t>(kQuantVecsPerThread) * kQuantRegsMaxThreads;
  if constexpr (kPerTensor) {
    const bool vec_in = rung >= 2 && p.cols % Vec<T>::kN == 0 &&
                        detail::rows_aligned(p.input, p.input_stride * static_cast<int64_t>(sizeof(T)), kVecBytes);
    if (vec_in) launch_absmax_scale<T, F, true>(p, stream);
    else launch_absmax_scale<T, F, false>(p, stream);
  }
  if (regs)
    FLASHLAB_LAUNCH((quantize_vec16_regs_kernel<T, F, kPerTensor>), grid_rows, regs_threads(nvec), 0, stream, p);
  else
    FLASHLAB_LAUNCH((quantize_scalar_kernel<T, F, kPerTensor>), grid_rows, kQuantScalarThreads, 0, stream, p);
}

template <typename T, QuantFormat F>
void launch_dequantize(const DequantParams& p, cudaStream_t stream) {
  const bool vec = p.cols % kDequantVecCodes == 0 && detail::rows_aligned(p.q, p.q_stride, kDequantVecCodes) &&
                   detail::rows_aligned(p.out, p.out_stride * static_cast<int64_t>(sizeof(T)), kVecBytes);
  auto launch = [&](auto kernel, int64_t tile_cols) {
    const int64_t tiles = p.rows * detail::ceil_div(p.cols, tile_cols);
    FLASHLAB_LAUNCH(kernel, tile_grid(kernel, kDequantThreads, tiles, tiles), kDequantThreads, 0, stream, p);
  };
  if (vec) launch(dequantize_kernel<T, F, true>, static_cast<int64_t>(kDequantThreads) * kDequantVecCodes);
  else launch(dequantize_kernel<T, F, false>, kDequantThreads);
}

// A [rows, cols] tensor with unit column stride and rows that do not overlap.
void check_rows(const check::Arg& a) {
  check::ndim(a, 2);
  check::nonempty(a);
  check::last_dim_contiguous(a);
  check::rows_disjoint(a, "cols");
}

void check_scales(const check::Arg& s, const check::Arg& ref) {
  check::cuda(s);
  check::same_device(s, ref);
  check::dtype_in(s, {DType::kF32});
  check::contiguous(s);
  check::aligned(s, sizeof(float));
}

}  // namespace

void quantize(const TensorView& input, const TensorView& out, const TensorView& scales, QuantScheme scheme,
              cudaStream_t stream, int rung) {
  constexpr const char* op = "quantize";
  const check::Arg I{op, "input", input}, O{op, "out", out}, S{op, "scales", scales};
  check::rung(op, rung, kQuantRungs);
  FLASHLAB_CHECK(scheme == QuantScheme::kPerToken || scheme == QuantScheme::kPerTensor, op,
                 ": argument 'scheme': expected per_token or per_tensor, got ", static_cast<int>(scheme));
  check::cuda(I);
  check::dtype_in(I, {DType::kF32, DType::kF16, DType::kBF16});
  check_rows(I);
  FLASHLAB_CHECK(input.shape[0] <= 0x7fffffff, op, ": argument 'input': expected at most 2^31 - 1 rows, got ",
                 input.shape[0]);
  check::aligned(I, dtype_size(input.dtype));
  check::cuda(O);
  check::same_device(O, I);
  check::dtype_in(O, {DType::kE4M3, DType::kI8});
  check::shape_eq(O, I);
  check_rows(O);
  check::no_overlap(O, I);
  if (out.data == input.data) check::fail(O, "memory disjoint from 'input'", "the same memory as 'input'");
  check_scales(S, I);
  if (scheme == QuantScheme::kPerToken) check::shape(S, {input.shape[0]});
  else check::shape(S, {1});
  check::no_overlap(S, I);
  check::no_overlap(S, O);
  detail::DeviceGuard guard(input.device.index);
  const QuantParams p{input.data, out.data, scales.ptr<float>(), input.shape[0], input.shape[1],
                      detail::row_stride(input), detail::row_stride(out)};
  DTYPE_SWITCH(input.dtype, T, [&] {
    format_switch(out.dtype, [&](auto fmt) {
      BOOL_SWITCH(scheme == QuantScheme::kPerTensor, kPerTensor,
                  [&] { launch_quantize<T, decltype(fmt)::value, kPerTensor>(p, stream, rung); });
    });
  });
}

void dequantize(const TensorView& q, const TensorView& scales, const TensorView& out, cudaStream_t stream) {
  constexpr const char* op = "dequantize";
  const check::Arg Q{op, "q", q}, S{op, "scales", scales}, O{op, "out", out};
  check::cuda(Q);
  check::dtype_in(Q, {DType::kE4M3, DType::kI8});
  check_rows(Q);
  check_scales(S, Q);
  const int64_t rows = q.shape[0];
  if (scales.shape != std::vector<int64_t>{rows} && scales.shape != std::vector<int64_t>{1})
    check::fail(S, detail::concat("shape [", rows, "] (per token) or [1] (per tensor)"), shape_str(scales.shape));
  check::cuda(O);
  check::same_device(O, Q);
  check::dtype_in(O, {DType::kF32, DType::kF16, DType::kBF16});
  check::shape_eq(O, Q);
  check_rows(O);
  check::aligned(O, dtype_size(out.dtype));
  check::no_overlap(O, Q);
  check::no_overlap(O, S);
  if (out.data == q.data) check::fail(O, "memory disjoint from 'q'", "the same memory as 'q'");
  detail::DeviceGuard guard(q.device.index);
  const DequantParams p{q.data, scales.ptr<const float>(), out.data, rows, q.shape[1], detail::row_stride(q),
                        detail::row_stride(out), scales.shape[0] == 1};
  DTYPE_SWITCH(out.dtype, T, [&] {
    format_switch(q.dtype, [&](auto fmt) { launch_dequantize<T, decltype(fmt)::value>(p, stream); });
  });
}

}  // namespace flashlab
