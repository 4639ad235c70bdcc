// Softmax family on a machine with no GPU: bad input through the public C++ API (each call
// throws flashlab::Error naming the argument and launches nothing), the float64 reference
// against closed forms, and the host side of the online-softmax state (merge, masked rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashlab/softmax.h"
#include "flashlab/validate.h"
#include "tests/common/validation_utils.h"
#include "kernels/common/online_softmax.cuh"
#include "src/reference/softmax.h"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::gpu;
using testing::kGpu;
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(SoftmaxValidation, BadInputs) {
  const auto x = gpu(DType::kBF16, {4, 64}, 1), out = gpu(DType::kBF16, {4, 64}, 2);
  expect_rejected([&] { softmax(gpu(DType::kBF16, {256}, 1), gpu(DType::kBF16, {256}, 2)); },
                  {"softmax: argument 'input'", "expected 2 dims", "got 1 dims"});
  expect_rejected([&] { softmax(x, gpu(DType::kBF16, {4, 32}, 2)); },
                  {"argument 'out'", "expected shape [4, 64] (same as 'input')", "got [4, 32]"});
  expect_rejected([&] { softmax(x, gpu(DType::kF16, {4, 64}, 2)); },
                  {"argument 'out'", "expected dtype bf16 (same as 'input')", "got fp16"});
  expect_rejected([&] { softmax(gpu(DType::kI8, {4, 64}, 1), gpu(DType::kI8, {4, 64}, 2)); },
                  {"argument 'input'", "expected dtype fp32 or fp16 or bf16", "got int8"});
  expect_rejected([&] { softmax(TensorView(x.data, DType::kBF16, {4, 64}, Device{}), out); },
                  {"argument 'input'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { softmax(x, TensorView(out.data, DType::kBF16, {4, 64}, Device{})); },
                  {"argument 'out'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { softmax(gpu(DType::kBF16, {0, 64}, 1), gpu(DType::kBF16, {0, 64}, 2)); },
                  {"argument 'input'", "expected at least one element"});
  expect_rejected([&] { softmax(TensorView(x.data, DType::kBF16, {4, 64}, {32, 1}, kGpu), out); },
                  {"argument 'input'", "expected >= cols row stride (rows must not overlap)",
                   "got row stride 32 for cols 64"});
  expect_rejected([&] { softmax(x, TensorView(out.data, DType::kBF16, {4, 64}, {1, 4}, kGpu)); },
                  {"argument 'out'", "expected unit stride in the last dim"});
  expect_rejected([&] { softmax(x, out, nullptr, 5); }, {"argument 'rung'", "expected 1..4", "got 5"});
  expect_rejected([&] { log_softmax(x, out, nullptr, 0); }, {"log_softmax: argument 'rung'", "expected 1..4", "got 0"});
}

TEST(SoftmaxValidation, InPlaceAndOverlap) {
  const auto x = gpu(DType::kF32, {8, 128}, 1);
  // in place with a different row stride would race between rows
  expect_rejected([&] { softmax(TensorView(x.data, DType::kF32, {8, 128}, {256, 1}, kGpu), x); },
                  {"argument 'out'", "expected the row stride of 'input' (256) when in place", "got row stride 128"});
  // out starting inside input
  const TensorView shifted(static_cast<char*>(x.data) + 64, DType::kF32, {8, 128}, kGpu);
  expect_rejected([&] { log_softmax(x, shifted); },
                  {"log_softmax: argument 'out'", "expected memory disjoint from 'input' or identical to it",
                   "got a partial overlap"});
  expect_rejected([&] { softmax(TensorView(static_cast<char*>(x.data) + 2, DType::kF32, {8, 128}, kGpu),
                                gpu(DType::kF32, {8, 128}, 2)); },
                  {"argument 'input'", "aligned"});
}

// ---- the float64 reference against closed forms.

TEST(SoftmaxReference, ClosedForms) {
  // [0, log 2, log 3] -> [1, 2, 3] / 6; a constant row -> uniform; one element -> 1 / 0.
  const std::vector<double> x = {0.0, std::log(2.0), std::log(3.0), 5.0, 5.0, 5.0};
  const auto y = reference::softmax(x, 2, 3, false);
  const double want[] = {1.0 / 6, 2.0 / 6, 3.0 / 6, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(y[i], want[i], 1e-15) << i;
  const auto ly = reference::softmax(x, 2, 3, true);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(ly[i], std::log(want[i]), 1e-14) << i;
  EXPECT_EQ(reference::softmax({-1e300}, 1, 1, false)[0], 1.0);
  EXPECT_EQ(reference::softmax({1e300}, 1, 1, true)[0], 0.0);
}

TEST(SoftmaxReference, LargeMagnitudeAndMasked) {
  // Without subtracting the max, exp(1000) overflows; with it, [1000, 1000 - log 3] -> [3, 1] / 4.
  const auto y = reference::softmax({1000.0, 1000.0 - std::log(3.0)}, 1, 2, false);
  EXPECT_NEAR(y[0], 0.75, 1e-13);
  EXPECT_NEAR(y[1], 0.25, 1e-13);
  // -inf entries give 0 / -inf; a row of only -inf gives 0s / -infs, never NaN.
  const std::vector<double> x = {-kInf, 0.0, -kInf, -kInf, -kInf, -kInf};
  const auto s = reference::softmax(x, 2, 3, false), l = reference::softmax(x, 2, 3, true);
  const double want_s[] = {0, 1, 0, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s[i], want_s[i]) << i;
  for (int i : {0, 2, 3, 4, 5}) EXPECT_EQ(l[i], -kInf) << i;
  EXPECT_EQ(l[1], 0.0);
}

// ---- OnlineSoftmaxState (host build of kernels/common/online_softmax.cuh).

using kernels::OnlineSoftmaxState;

// float64 (max, sum of exp(x - max)) of v[begin, end).
void exact_state(const std::vector<float>& v, size_t begin, size_t end, double& m, double& s) {
  m = -kInf;
  for (size_t i = begin; i < end; ++i) m = std::max(m, static_cast<double>(v[i]));
  s = 0;
  if (m == -kInf) return;
  for (size_t i = begin; i < end; ++i) s += std::exp(static_cast<double>(v[i]) - m);
}

OnlineSoftmaxState fold(const std::vector<float>& v, size_t begin, size_t end) {
  OnlineSoftmaxState st = kernels::online_softmax_empty();
  for (size_t i = begin; i < end; ++i) {
    const float x[1] = {v[i]};
    kernels::online_softmax_add(st, x);
  }
  return st;
}

TEST(OnlineSoftmax, FoldAndMergeMatchTwoPassForAnySplit) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> dist(-80.f, 80.f);  // exp(80) alone overflows nothing here
  std::vector<float> v(1000);
  for (float& x : v) x = dist(rng);
  double m, s;
  exact_state(v, 0, v.size(), m, s);
  for (size_t split : {size_t{0}, size_t{1}, size_t{500}, size_t{999}, v.size()}) {
    const OnlineSoftmaxState st = kernels::online_softmax_merge(fold(v, 0, split), fold(v, split, v.size()));
    EXPECT_EQ(st.m, static_cast<float>(m)) << "split " << split;  // the max is exact
    EXPECT_NEAR(st.s, s, 1e-5 * s) << "split " << split;
  }
  // Batches of 8 (a 16-byte bf16 vector), one rescale each.
  OnlineSoftmaxState st = kernels::online_softmax_empty();
  for (size_t i = 0; i < v.size(); i += 8) {
    float x[8];
    for (int j = 0; j < 8; ++j) x[j] = v[i + j];
    kernels::online_softmax_add(st, x);
  }
  EXPECT_EQ(st.m, static_cast<float>(m));
  EXPECT_NEAR(st.s, s, 1e-5 * s);
}

TEST(OnlineSoftmax, MaskedStatesNeverMakeNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const OnlineSoftmaxState empty = kernels::online_softmax_empty();
  const OnlineSoftmaxState masked = fold({-inf, -inf, -inf}, 0, 3);
  EXPECT_EQ(masked.m, -inf);
  EXPECT_EQ(masked.s, 0.f);
  const OnlineSoftmaxState both = kernels::online_softmax_merge(masked, empty);
  EXPECT_EQ(both.m, -inf);
  EXPECT_EQ(both.s, 0.f);
  // A masked piece merged with a live one leaves the live one unchanged.
  const OnlineSoftmaxState live{2.f, 3.f};
  for (const OnlineSoftmaxState& st : {kernels::online_softmax_merge(masked, live), kernels::online_softmax_merge(live, masked)}) {
    EXPECT_EQ(st.m, 2.f);
    EXPECT_EQ(st.s, 3.f);
  }
  // Outputs of a fully masked row: 0 and -inf; of a -inf entry in a live row: 0 and -inf.
  EXPECT_EQ(kernels::softmax_from_state<false>(-inf, masked, std::log(masked.s)), 0.f);
  EXPECT_EQ(kernels::softmax_from_state<true>(-inf, masked, std::log(masked.s)), -inf);
  EXPECT_EQ(kernels::softmax_from_state<false>(-inf, live, std::log(live.s)), 0.f);
  EXPECT_EQ(kernels::softmax_from_state<true>(-inf, live, std::log(live.s)), -inf);
  EXPECT_FLOAT_EQ(kernels::softmax_from_state<false>(2.f, live, std::log(live.s)), 1.f / 3.f);
  EXPECT_FLOAT_EQ(kernels::softmax_from_state<true>(2.f, live, std::log(live.s)), -std::log(3.f));
  // NaN in a row propagates (s becomes NaN), as in torch.
  EXPECT_TRUE(std::isnan(fold({1.f, std::nanf(""), 0.f}, 0, 3).s));
}

}  // namespace
}  // namespace flashlab
