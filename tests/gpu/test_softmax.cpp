// softmax and log_softmax, every rung, against the float64 reference on fresh random inputs
// with outputs poisoned before each launch: awkward lengths, many and few rows, strided rows,
// in place, every dtype, inputs large enough that exp without the max subtraction overflows,
// -inf entries and fully masked (all -inf) rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "flashlab/softmax.h"
#include "src/reference/softmax.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct Shape {
  int64_t rows, cols, stride;  // stride: elements between rows of input and out
};

// fp32 computation of the same function on the host from the stored inputs (max, then a
// sequential sum of exp(x - max)), rounded once to dt: the "naive" error. Masked rows as the
// library defines them (0 / -inf).
std::vector<double> naive_softmax(DType dt, const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<float>(row[c]));
    float s = 0.f;
    if (m != -INFINITY)
      for (int64_t c = 0; c < cols; ++c) s += std::exp(static_cast<float>(row[c]) - m);
    const float log_s = std::log(s);
    for (int64_t c = 0; c < cols; ++c) {
      const float xc = static_cast<float>(row[c]);
      float y;
      if (s == 0.f) y = log ? -INFINITY : 0.f;
      else y = log ? (xc - m) - log_s : std::exp(xc - m) / s;
      out[r * cols + c] = round_to(dt, y);
    }
  }
  return out;
}

// Infinite reference values must be matched exactly (then are left out of the error: inf - inf
// has no size); max |ref| over the finite ones sets the rounding floor.
void expect_softmax_close(std::vector<double> got, std::vector<double> naive, std::vector<double> ref, DType dt,
                          const ::testing::Message& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0;
  int64_t mismatched = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (got[i] != ref[i] && mismatched++ == 0)
        ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << ref[i];
      got[i] = naive[i] = ref[i] = 0;
    } else {
      max_ref = std::max(max_ref, std::fabs(ref[i]));
    }
  }
  EXPECT_EQ(mismatched, 0) << what << ": infinite outputs that differ from the reference";
  expect_within_tolerance(got, naive, ref, unit_roundoff(dt) * max_ref, what);
}

// Sets element i of t to -inf (values and bytes).
void set_minus_inf(HostTensor& t, int64_t i) {
  store_value(t, static_cast<size_t>(i), -std::numeric_limits<float>::infinity());
}

enum class Fill { kUniform, kLarge, kMasked };

HostTensor make_input(DType dt, Shape s, Fill fill, std::mt19937_64& rng) {
  // kLarge: |x| up to 100, where exp(x) alone overflows fp32 (exp(89) > FLT_MAX).
  HostTensor t = random_tensor(dt, s.rows * s.cols, rng, fill == Fill::kLarge ? -100.0 : -8.0,
                               fill == Fill::kLarge ? 100.0 : 8.0);
  if (fill == Fill::kMasked) {
    // Every third element of every row -inf, and rows 0, 3, 6, ... entirely -inf.
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c)
        if (r % 3 == 0 || c % 3 == 1) set_minus_inf(t, r * s.cols + c);
  }
  return t;
}

const char* fill_name(Fill f) { return f == Fill::kUniform ? "" : f == Fill::kLarge ? " |x|<=100" : " -inf"; }

// Every rung of one op on one input; reference and naive computed once.
void check_rungs(DType dt, Shape s, bool log, Fill fill, bool in_place, std::mt19937_64& rng) {
  const HostTensor x = make_input(dt, s, fill, rng);
  const auto ref = reference::softmax(x.values, s.rows, s.cols, log);
  const auto naive = naive_softmax(dt, x.values, s.rows, s.cols, log);
  const size_t bytes = static_cast<size_t>(s.rows * s.stride) * dtype_size(dt);
  DeviceBuffer dx(bytes), dout(bytes);
  const Device gpu{DeviceType::kCUDA, 0};
  for (int rung = 1; rung <= kSoftmaxRungs; ++rung) {
    upload_rows(dx, x, s.rows, s.cols, s.stride);
    dout.poison();
    TensorView xv(dx.ptr, dt, {s.rows, s.cols}, {s.stride, 1}, gpu);
    TensorView ov(in_place ? dx.ptr : dout.ptr, dt, {s.rows, s.cols}, {s.stride, 1}, gpu);
    if (log) log_softmax(xv, ov, nullptr, rung);
    else softmax(xv, ov, nullptr, rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    expect_softmax_close(download_rows(in_place ? dx : dout, dt, s.rows, s.cols, s.stride), naive, ref, dt,
                         ::testing::Message() << (log ? "log_softmax " : "softmax ") << dtype_name(dt) << " "
                                              << s.rows << "x" << s.cols << " stride " << s.stride << " rung "
                                              << rung << fill_name(fill) << (in_place ? " in-place" : ""));
  }
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (int64_t rows : {1, 7, 99})
    for (int64_t cols : {1, 111, 500, 512, 1024, 4097, 8192, 128256}) v.push_back({rows, cols, cols});
  // many rows: warp per row, and block per row past the cluster threshold of rung 4
  v.insert(v.end(), {{16384, 1, 1}, {16384, 111, 111}, {16384, 512, 512}, {300, 2048, 2048}});
  // past the cluster's registers (rung 4 reads twice) and past one block's (rung 3)
  v.insert(v.end(), {{2, 300000, 300000}, {3, 40000, 40000}});
  // vocabulary rows, more of them than rung 4's resident clusters (~99 at bf16's 32 KB chunks
  // on an H100): some clusters take two rows
  v.push_back({150, 128256, 128256});
  // strided rows: 16-byte aligned, and an odd stride (rung 2 path)
  v.insert(v.end(), {{33, 4096, 4104}, {5, 128256, 128320}, {33, 1024, 1031}, {9, 100, 123}});
  return v;
}

TEST(Softmax, AllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (DType dt : kDtypes)
    for (const Shape& s : shapes()) check_rungs(dt, s, /*log=*/false, Fill::kUniform, false, rng);
}

TEST(LogSoftmax, AllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(32);
  for (DType dt : kDtypes)
    for (const Shape& s : shapes()) check_rungs(dt, s, /*log=*/true, Fill::kUniform, false, rng);
}

// Large magnitudes, -inf entries and all -inf rows, in place: each op, every dtype, the shapes
// of every kernel (warp, block, cluster in and out of registers, rung 2 fallback).
TEST(Softmax, LargeMaskedInPlace) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(33);
  const Shape special[] = {{7, 1, 1},         {7, 111, 111},   {16, 1024, 1024}, {300, 4096, 4096},
                           {7, 128256, 128256}, {3, 40000, 40000}, {2, 300000, 300000}, {33, 1024, 1031}};
  for (DType dt : kDtypes)
    for (const Shape& s : special)
      for (bool log : {false, true}) {
        check_rungs(dt, s, log, Fill::kLarge, false, rng);
        check_rungs(dt, s, log, Fill::kMasked, false, rng);
        check_rungs(dt, s, log, Fill::kUniform, /*in_place=*/true, rng);
        check_rungs(dt, s, log, Fill::kMasked, /*in_place=*/true, rng);
      }
}

// Rung 4's persistent clusters taking two to three rows each (300 rows of 40000 against ~130
// resident clusters of 10-20 KB chunks on an H100): the chunk buffer and the two state slots
// reused across rows, masked rows among them, in place; small enough for compute-sanitizer.
TEST(Softmax, PersistentClustersSeveralRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(35);
  for (DType dt : kDtypes)
    for (bool log : {false, true}) {
      check_rungs(dt, {300, 40000, 40000}, log, Fill::kLarge, false, rng);
      check_rungs(dt, {300, 40000, 40000}, log, Fill::kMasked, /*in_place=*/true, rng);
    }
}

// A NaN or +inf input makes its whole row NaN (as in torch), in every rung and kernel shape,
// and leaves the other rows exact: rows 1 (one NaN) and 2 (one +inf) of 4 rows, or of 300 rows
// for the many-rows kernels.
TEST(Softmax, NonFiniteInputPoisonsOnlyItsRow) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(35);
  const Shape special[] = {{4, 111, 111}, {4, 1024, 1024}, {300, 1024, 1024}, {300, 4096, 4096},
                           {4, 128256, 128256}, {4, 300000, 300000}, {4, 4097, 4097}};
  const Device gpu{DeviceType::kCUDA, 0};
  for (DType dt : kDtypes)
    for (const Shape& s : special)
      for (bool log : {false, true}) {
        HostTensor x = make_input(dt, s, Fill::kUniform, rng);
        store_value(x, static_cast<size_t>(1 * s.cols + s.cols / 2), std::numeric_limits<float>::quiet_NaN());
        store_value(x, static_cast<size_t>(2 * s.cols + s.cols - 1), std::numeric_limits<float>::infinity());
        const auto ref = reference::softmax(x.values, s.rows, s.cols, log);
        const auto naive = naive_softmax(dt, x.values, s.rows, s.cols, log);
        const size_t bytes = static_cast<size_t>(s.rows * s.cols) * dtype_size(dt);
        DeviceBuffer dx(bytes), dout(bytes);
        upload_rows(dx, x, s.rows, s.cols, s.cols);
        for (int rung = 1; rung <= kSoftmaxRungs; ++rung) {
          dout.poison();
          const TensorView xv(dx.ptr, dt, {s.rows, s.cols}, {s.cols, 1}, gpu);
          const TensorView ov(dout.ptr, dt, {s.rows, s.cols}, {s.cols, 1}, gpu);
          if (log) log_softmax(xv, ov, nullptr, rung);
          else softmax(xv, ov, nullptr, rung);
          FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = download_rows(dout, dt, s.rows, s.cols, s.cols);
          const ::testing::Message what = ::testing::Message() << (log ? "log_softmax " : "softmax ") << dtype_name(dt)
                                                               << " " << s.rows << "x" << s.cols << " rung " << rung;
          int64_t not_nan = 0;
          for (int64_t i = s.cols; i < 3 * s.cols; ++i) not_nan += std::isnan(got[i]) ? 0 : 1;
          EXPECT_EQ(not_nan, 0) << what << ": outputs of the NaN / +inf rows that are not NaN";
          // The other rows (0 and 3..): exact within the usual rule.
          std::vector<double> g, n, r;
          for (int64_t i = 0; i < s.rows * s.cols; ++i)
            if (i < s.cols || i >= 3 * s.cols) g.push_back(got[i]), n.push_back(naive[i]), r.push_back(ref[i]);
          expect_softmax_close(g, n, r, dt, what);
        }
      }
}

// The top rung against rung 1 (a simpler trusted kernel): outputs agree within a few units in
// the last place of the output dtype, plus the fp32 summation-order difference of the row sums
// (rung 1 adds ~500 values per thread sequentially at 128256 columns).
TEST(Softmax, TopRungMatchesThreePass) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(34);
  for (DType dt : kDtypes)
    for (const Shape s : {Shape{64, 128256, 128256}, Shape{16384, 256, 256}}) {
      const HostTensor x = make_input(dt, s, Fill::kUniform, rng);
      const size_t bytes = static_cast<size_t>(s.rows * s.stride) * dtype_size(dt);
      DeviceBuffer dx(bytes), d1(bytes), d4(bytes);
      upload_rows(dx, x, s.rows, s.cols, s.stride);
      d1.poison();
      d4.poison();
      const TensorView xv = device_view(dx.ptr, dt, {s.rows, s.cols});
      softmax(xv, device_view(d1.ptr, dt, {s.rows, s.cols}), nullptr, 1);
      softmax(xv, device_view(d4.ptr, dt, {s.rows, s.cols}), nullptr, kSoftmaxRungs);
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      const auto y1 = download_rows(d1, dt, s.rows, s.cols, s.stride);
      const auto y4 = download_rows(d4, dt, s.rows, s.cols, s.stride);
      double worst = 0, max_y = 0;
      for (size_t i = 0; i < y1.size(); ++i) {
        ASSERT_FALSE(std::isnan(y4[i])) << i;
        worst = std::max(worst, std::fabs(y1[i] - y4[i]));
        max_y = std::max(max_y, std::fabs(y1[i]));
      }
      EXPECT_LE(worst, (4 * unit_roundoff(dt) + std::ldexp(1.0, -16)) * max_y) << dtype_name(dt) << " " << s.rows << "x" << s.cols;
    }
}

}  // namespace
}  // namespace flashlab
