// Sum (every rung) and row-wise sum against the float64 reference, on fresh random inputs with
// outputs poisoned before each launch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashlab/reduce.h"
#include "src/reference/reference.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

double run_sum(const HostTensor& x, int64_t off, int rung, DeviceBuffer& dx, DeviceBuffer& dout) {
  const int es = dtype_size(x.dtype);
  const auto n = static_cast<int64_t>(x.values.size());
  dout.poison();
  upload(dx.at(off * es), x.bytes);
  sum(device_view(dx.at(off * es), x.dtype, {n}), device_view(dout.ptr, DType::kF32, {1}), nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return decode(DType::kF32, download(dout.ptr, 4))[0];
}

// Sum of |x|: scales the rounding floor (cancellation makes |ref| a poor scale).
double abs_sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += std::fabs(v);
  return s;
}

const int64_t kSumSizes[] = {1, 2, 7, 31, 33, 111, 256, 257, 500, 4097, 65537, (1 << 20) + 5, (1 << 24) + 3};

TEST(Sum, RungsTwoToSixAllSizes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t n : kSumSizes) {
      const auto x = random_tensor(dt, n, rng);
      DeviceBuffer dx(static_cast<size_t>(n + 16) * dtype_size(dt)), dout(4);
      const double ref = reference::sum(x.values);
      const double naive = naive_sum_f32(x.values, 0, x.values.size());
      for (int rung = 2; rung <= kSumRungs; ++rung)
        for (int64_t off : {0, 3}) {
          const double got = run_sum(x, off, rung, dx, dout);
          expect_within_tolerance({got}, {naive}, {ref}, 4 * unit_roundoff(DType::kF32) * abs_sum(x.values),
                                  ::testing::Message() << "sum " << dtype_name(dt) << " n=" << n << " rung=" << rung
                                                       << " offset=" << off);
        }
    }
}

TEST(Sum, AtomicRungOnExactlyRepresentableSums) {
  // Rung 1 adds in whatever order the atomics arrive, so its rounding error varies between
  // runs. On small integers every partial sum is exact in fp32 and any order must give the
  // exact result; on random data it must stay inside the worst-case bound of sequential fp32
  // summation, (n - 1) u sum|x| (Higham).
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t n : {1, 100, 4097, 1 << 20}) {
    HostTensor x{DType::kF32, std::vector<double>(n), std::vector<uint8_t>(n * 4)};
    for (int64_t i = 0; i < n; ++i) {
      const float f = static_cast<float>(small(rng));
      x.values[i] = f;
      std::memcpy(x.bytes.data() + 4 * i, &f, 4);
    }
    DeviceBuffer dx(n * 4), dout(4);
    EXPECT_EQ(run_sum(x, 0, 1, dx, dout), reference::sum(x.values)) << "n=" << n;
  }
  for (int64_t n : {7, 65537}) {
    const auto x = random_tensor(DType::kF32, n, rng);
    DeviceBuffer dx(n * 4), dout(4);
    const double bound = (n - 1) * unit_roundoff(DType::kF32) * abs_sum(x.values) * 1.01;
    EXPECT_LE(std::fabs(run_sum(x, 0, 1, dx, dout) - reference::sum(x.values)), bound) << "n=" << n;
  }
}

TEST(Sum, DeterministicForFixedConfiguration) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  const int64_t n = (1 << 22) + 17;
  const auto x = random_tensor(DType::kF32, n, rng);
  DeviceBuffer dx((n + 16) * 4), dout(4);
  for (int rung = 2; rung <= kSumRungs; ++rung) {
    const double first = run_sum(x, 1, rung, dx, dout);
    for (int rep = 0; rep < 5; ++rep) EXPECT_EQ(run_sum(x, 1, rung, dx, dout), first) << "rung " << rung;
  }
}

void check_row_sum(DType dt, int64_t rows, int64_t cols, int64_t row_stride, std::mt19937_64& rng) {
  const int es = dtype_size(dt);
  // A (rows, row_stride) buffer of which the first cols of each row are the input.
  const auto full = random_tensor(dt, rows * row_stride, rng);
  std::vector<double> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = full.values[r * row_stride + c];
  DeviceBuffer dx(full.bytes.size()), dout(rows * 4);
  upload(dx.ptr, full.bytes);
  dout.poison();
  TensorView xv(dx.ptr, dt, {rows, cols}, {row_stride, 1}, Device{DeviceType::kCUDA, 0});
  row_sum(xv, device_view(dout.ptr, DType::kF32, {rows}));
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = decode(DType::kF32, download(dout.ptr, rows * 4));
  const auto ref = reference::row_sum(x, rows, cols);
  std::vector<double> naive(rows);
  double floor = 0;
  for (int64_t r = 0; r < rows; ++r) {
    naive[r] = naive_sum_f32(x, r * cols, (r + 1) * cols);
    double a = 0;
    for (int64_t c = 0; c < cols; ++c) a += std::fabs(x[r * cols + c]);
    floor = std::max(floor, 4 * unit_roundoff(DType::kF32) * a);
  }
  (void)es;
  expect_within_tolerance(got, naive, ref, floor,
                          ::testing::Message() << "row_sum " << dtype_name(dt) << " " << rows << "x" << cols
                                               << " stride " << row_stride);
}

TEST(RowSum, AwkwardShapesAndStrides) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(6);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {1, 4097}, {7, 111}, {99, 500}, {1000, 1024}, {10, 1025}, {16, 4096}, {16, 4097},
             {3, 128256}, {4096, 64}})
      check_row_sum(dt, rows, cols, cols, rng);
    check_row_sum(dt, 33, 100, 103, rng);  // odd row stride: rows start off 16-byte boundaries
    // Rows split over several blocks (few long rows), incl. chunks past the end of the row.
    check_row_sum(dt, 2, 8193, 8193, rng);
    check_row_sum(dt, 7, 100000, 100003, rng);
    check_row_sum(dt, 1, (1 << 22) + 1, (1 << 22) + 1, rng);
    check_row_sum(dt, 5, 4096, 5000, rng);
  }
  check_row_sum(DType::kF32, 20000, 256, 256, rng);  // more rows than the grid
}

}  // namespace
}  // namespace flashlab
