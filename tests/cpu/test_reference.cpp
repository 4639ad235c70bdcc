// The float64 references against closed forms and brute force: the oracle must be right
// before any kernel is held against it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "src/reference/reference.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

TEST(Reference, SumOfIntegersIsExact) {
  std::vector<double> x(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  EXPECT_EQ(reference::sum(x), 100000.0 * 100001.0 / 2.0);
}

TEST(Reference, SumSurvivesCancellation) {
  // Plain double summation returns 0 here; the compensated sum keeps the 2.
  EXPECT_EQ(reference::sum({1e16, 1.0, -1e16, 1.0}), 2.0);
  EXPECT_EQ(reference::sum({1.0, 1e100, 1.0, -1e100}), 2.0);
}

TEST(Reference, RowSumMatchesPerRowSum) {
  std::mt19937_64 rng(7);
  const auto t = testing::random_tensor(DType::kF32, 5 * 13, rng);
  const auto rows = reference::row_sum(t.values, 5, 13);
  ASSERT_EQ(rows.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    double s = 0;
    for (int c = 0; c < 13; ++c) s += t.values[r * 13 + c];
    EXPECT_NEAR(rows[r], s, 1e-12);
  }
}

TEST(Reference, VectorAdd) {
  const auto out = reference::vector_add({1.5, -2.0, 1e300}, {0.25, 2.0, 1e300});
  EXPECT_EQ(out, (std::vector<double>{1.75, 0.0, 2e300}));
}

TEST(Reference, PipelinePolyClosedForms) {
  // p(0) = 1/2; p(x) = sum_k (-x)^k / (k+2) checked term by term with pow at a few points.
  EXPECT_DOUBLE_EQ(reference::pipeline_poly(0.0), 0.5);
  for (double x : {-1.0, -0.3, 0.7, 1.0}) {
    double direct = 0;
    for (int k = 0; k <= 64; ++k) direct += std::pow(-x, k) / (k + 2);
    EXPECT_NEAR(reference::pipeline_poly(x), direct, 1e-13) << x;
  }
  // f averages p over x * j / 32, j = 1..32.
  double mean = 0;
  for (int j = 1; j <= 32; ++j) mean += reference::pipeline_poly(0.5 * j / 32);
  EXPECT_NEAR(reference::pipeline_f(0.5), mean / 32, 1e-15);
  EXPECT_DOUBLE_EQ(reference::pipeline_f(0.0), 0.5);
}

TEST(TestUtils, Bf16RoundTripAndRounding) {
  EXPECT_EQ(testing::bf16_bits_to_f32(testing::f32_to_bf16_bits(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(testing::round_to(DType::kBF16, 1.0 + std::ldexp(1.0, -8)), 1.0);
  EXPECT_EQ(testing::round_to(DType::kBF16, 1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
  EXPECT_TRUE(std::isnan(testing::bf16_bits_to_f32(0xffff)));  // the poison pattern is NaN
}

TEST(TestUtils, ToleranceCatchesNaNAndLargeErrors) {
  const std::vector<double> ref{1.0, 2.0}, naive{1.0, 2.0 + 1e-7};
  EXPECT_TRUE(std::isinf(testing::max_abs_err({1.0, NAN}, ref)));
  EXPECT_DOUBLE_EQ(testing::max_abs_err({1.5, 2.0}, ref), 0.5);
  EXPECT_NEAR(testing::max_abs_err(naive, ref), 1e-7, 1e-12);
}

}  // namespace
}  // namespace flashlab
