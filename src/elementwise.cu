// Host side of the elementwise family: validation, then dispatch to a rung.
#include "flashlab/elementwise.h"
#include "flashlab/validate.h"
#include "kernels/elementwise/03_vec16_tail.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

// Grid-stride kernels need only enough blocks to fill the machine: kBlocksPerSm resident
// 256-thread blocks per SM, fewer when n is small.
constexpr int kBlocksPerSm = 8;

int grid_for(int64_t items_per_block_trip, int64_t n) {
  const int64_t want = detail::ceil_div(n, items_per_block_trip);
  const int64_t cap = static_cast<int64_t>(detail::sm_count()) * kBlocksPerSm;
  return static_cast<int>(want < cap ? (want > 0 ? want : 1) : cap);
}

template <typename T>
void launch_vector_add(const VectorAddParams& p, cudaStream_t stream, int rung) {
  using namespace kernels;
  constexpr int64_t kVecTrip = static_cast<int64_t>(kVectorAddThreads) * kVectorAddUnroll * Vec<T>::kN;
  const bool vec_ok = vector_add_same_alignment<T>(p);
  if (rung == 1 || (rung == 3 && !vec_ok)) {
    FLASHLAB_LAUNCH(vector_add_grid_stride_kernel<T>, grid_for(kVectorAddThreads, p.n), kVectorAddThreads, 0,
                    stream, p);
  } else if (rung == 2) {
    FLASHLAB_LAUNCH(vector_add_vec16_kernel<T>, grid_for(kVecTrip, p.n), kVectorAddThreads, 0, stream, p);
  } else {
    FLASHLAB_LAUNCH(vector_add_vec16_tail_kernel<T>, grid_for(kVecTrip, p.n), kVectorAddThreads, 0, stream, p);
  }
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
