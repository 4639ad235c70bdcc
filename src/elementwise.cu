// Host side of the elementwise family: validation, then dispatch to a rung.
#include <algorithm>

#include "flashlab/elementwise.h"
#include "flashlab/validate.h"
#include "kernels/elementwise/03_vec16_tail.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

// Grid-stride kernels need only as many blocks as fit on the device at once (one wave),
// fewer when n is small.
template <typename Kernel>
int grid_for(Kernel kernel, int64_t items_per_block_trip, int64_t n) {
  const int64_t want = std::max<int64_t>(1, detail::ceil_div(n, items_per_block_trip));
  return static_cast<int>(std::min<int64_t>(
      want, detail::resident_blocks(reinterpret_cast<const void*>(kernel), kernels::kVectorAddThreads)));
}

template <typename T>
void launch_vector_add(const VectorAddParams& p, cudaStream_t stream, int rung) {
  using namespace kernels;
  auto launch = [&](auto kernel, int64_t elems_per_block_trip) {
    FLASHLAB_LAUNCH(kernel, grid_for(kernel, elems_per_block_trip, p.n), kVectorAddThreads, 0, stream, p);
  };
  constexpr int64_t kVecTrip = static_cast<int64_t>(kVectorAddThreads) * kVectorAddUnroll * Vec<T>::kN;
  if (rung == 1 || (rung == 3 && !vector_add_same_alignment<T>(p)))
    launch(vector_add_grid_stride_kernel<T>, kVectorAddThreads);
  else if (rung == 2)
    launch(vector_add_vec16_kernel<T>, kVecTrip);
  else
    launch(vector_add_vec16_tail_kernel<T>, kVecTrip);
}

}  // namespace

void vector_add(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream,
                int rung) {
  constexpr const char* op = "vector_add";
  const check::Arg A{op, "a", a}, B{op, "b", b}, O{op, "out", out};
  check::rung(op, rung, kVectorAddRungs);
  for (const auto& arg : {A, B, O}) {
    check::cuda(arg);
    check::contiguous(arg);
  }
  check::same_device(B, A);
  check::same_device(O, A);
  check::dtype_in(A, {DType::kF32, DType::kBF16});
  check::dtype_eq(B, A);
  check::dtype_eq(O, A);
  check::shape_eq(B, A);
  check::shape_eq(O, A);
  check::nonempty(A);
  for (const auto& arg : {A, B, O}) check::aligned(arg, dtype_size(arg.t.dtype));
  check::no_overlap(O, A);
  check::no_overlap(O, B);
  const int64_t n = a.numel();
  if (rung == 2) {
    for (const auto& arg : {A, B, O}) check::aligned(arg, kernels::kVecBytes);
    const int64_t vec = kernels::kVecBytes / dtype_size(a.dtype);
    FLASHLAB_CHECK(n % vec == 0, op, ": argument 'a': expected numel a multiple of ", vec,
                   " for rung 2 (whole 16-byte vectors; rung 3 takes any length), got ", n);
  }

  detail::DeviceGuard guard(a.device.index);
  const VectorAddParams p{a.data, b.data, out.data, n};
  DTYPE_SWITCH(a.dtype, T, [&] { launch_vector_add<T>(p, stream, rung); });
}

}  // namespace flashlab
