// LayerNorm family on a machine with no GPU: bad input through the public C++ API (each call
// throws flashlab::Error naming the argument and launches nothing), and the Welford primitive
// of kernels/common/welford.cuh (host side) against two-pass float64 statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashlab/layernorm.h"
#include "flashlab/validate.h"
#include "tests/common/validation_utils.h"
#include "kernels/common/welford.cuh"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::gpu;
using testing::kGpu;

TEST(LayerNormValidation, BadInputs) {
  const auto x = gpu(DType::kBF16, {4, 64}, 1), out = gpu(DType::kBF16, {4, 64}, 2);
  const auto w = gpu(DType::kBF16, {64}, 3), b = gpu(DType::kBF16, {64}, 4);
  expect_rejected([&] { layernorm(x, gpu(DType::kBF16, {63}, 3), b, out, 1e-5); },
                  {"layernorm", "argument 'weight'", "expected shape [64]", "got [63]"});
  expect_rejected([&] { layernorm(x, w, gpu(DType::kBF16, {65}, 4), out, 1e-5); },
                  {"argument 'bias'", "expected shape [64]", "got [65]"});
  expect_rejected([&] { layernorm(x, w, gpu(DType::kF16, {64}, 4), out, 1e-5); },
                  {"argument 'bias'", "expected dtype bf16 (same as 'input')", "got fp16"});
  expect_rejected([&] { layernorm(x, w, TensorView(nullptr, DType::kBF16, {64}, kGpu), out, 1e-5); },
                  {"argument 'bias'", "expected a non-null data pointer", "got null"});
  expect_rejected([&] { layernorm(x, w, TensorView(b.data, DType::kBF16, {64}, Device{}), out, 1e-5); },
                  {"argument 'bias'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { layernorm(x, w, TensorView(b.data, DType::kBF16, {64}, {2}, kGpu), out, 1e-5); },
                  {"argument 'bias'", "expected a contiguous tensor"});
  expect_rejected([&] { layernorm(x, gpu(DType::kF32, {64}, 3), b, out, 1e-5); },
                  {"argument 'weight'", "expected dtype bf16 (same as 'input')", "got fp32"});
  expect_rejected([&] { layernorm(x, w, b, out, -1e-5); },
                  {"argument 'eps'", "expected a finite value >= 0", "got -1e-05"});
  expect_rejected([&] { layernorm(x, w, TensorView{}, out, INFINITY); }, {"argument 'eps'", "got inf"});
  expect_rejected([&] { layernorm(gpu(DType::kBF16, {256}, 1), gpu(DType::kBF16, {256}, 3), b, gpu(DType::kBF16, {256}, 2), 1e-5); },
                  {"argument 'input'", "expected 2 dims", "got 1 dims"});
  expect_rejected([&] { layernorm(x, w, b, gpu(DType::kBF16, {4, 32}, 2), 1e-5); },
                  {"argument 'out'", "expected shape [4, 64] (same as 'input')", "got [4, 32]"});
  expect_rejected([&] { layernorm(x, w, b, gpu(DType::kF32, {4, 64}, 2), 1e-5); },
                  {"argument 'out'", "expected dtype bf16 (same as 'input')", "got fp32"});
  expect_rejected([&] { layernorm(gpu(DType::kI8, {4, 64}, 1), gpu(DType::kI8, {64}, 3), TensorView{}, gpu(DType::kI8, {4, 64}, 2), 1e-5); },
                  {"argument 'input'", "expected dtype fp32 or fp16 or bf16", "got int8"});
  expect_rejected([&] { layernorm(TensorView(x.data, DType::kBF16, {4, 64}, Device{}), w, b, out, 1e-5); },
                  {"argument 'input'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { layernorm(gpu(DType::kBF16, {0, 64}, 1), w, b, gpu(DType::kBF16, {0, 64}, 2), 1e-5); },
                  {"argument 'input'", "expected at least one element"});
  expect_rejected([&] { layernorm(TensorView(x.data, DType::kBF16, {4, 64}, {32, 1}, kGpu), w, b, out, 1e-5); },
                  {"argument 'input'", "row stride", "got row stride 32 for hidden 64"});
  expect_rejected([&] { layernorm(x, w, b, TensorView(out.data, DType::kBF16, {4, 64}, {64, 2}, kGpu), 1e-5); },
                  {"argument 'out'", "expected unit stride in the last dim"});
  expect_rejected([&] { layernorm(x, w, b, TensorView(static_cast<char*>(x.data) + 64, DType::kBF16, {4, 64}, kGpu), 1e-5); },
                  {"argument 'out'", "expected memory disjoint from 'input' or identical to it", "got a partial overlap"});
  expect_rejected([&] { layernorm(x, w, b, out, 1e-5, nullptr, 4); }, {"argument 'rung'", "expected 1..3", "got 4"});
  expect_rejected([&] { layernorm(x, w, b, out, 1e-5, nullptr, 0); }, {"argument 'rung'", "expected 1..3", "got 0"});
}

// ---- Welford primitive (host side) against two-pass float64 statistics.

using kernels::WelfordState;

struct Stats {
  double count, mean, m2;
};

Stats two_pass(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  const double n = static_cast<double>(end - begin), mean = s / n;
  double m2 = 0;
  for (size_t i = begin; i < end; ++i) m2 += (v[i] - mean) * (v[i] - mean);
  return {n, mean, m2};
}

WelfordState accumulate(const std::vector<float>& v, size_t begin, size_t end) {
  WelfordState s{};
  for (size_t i = begin; i < end; ++i) s = kernels::welford_update(s, v[i]);
  return s;
}

// Relative error bounds for fp32 state arithmetic over up to ~10^6 values: the mean to a few
// ulps of |mean| + std, m2 to ~1e-4 relative (Welford's error grows like n * u at worst).
void expect_close(const WelfordState& got, const Stats& ref, const std::string& what) {
  EXPECT_EQ(got.count, static_cast<float>(ref.count)) << what;
  const double sd = std::sqrt(ref.m2 / ref.count);
  EXPECT_NEAR(got.mean, ref.mean, 1e-5 * (std::fabs(ref.mean) + sd) + 1e-30) << what;
  EXPECT_NEAR(got.m2, ref.m2, 1e-4 * ref.m2 + 1e-30) << what;
}

std::vector<float> random_values(size_t n, double mean, double sd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(rng));
  return v;
}

TEST(Welford, UpdateMatchesTwoPassWithLargeOffset) {
  // mean 1000, std 1: sum(x^2)/n - mean^2 in fp32 loses every digit of the variance here.
  const auto v = random_values(4096, 1000.0, 1.0, 1);
  const auto s = accumulate(v, 0, v.size());
  expect_close(s, two_pass(v, 0, v.size()), "update, offset 1000");
  EXPECT_NEAR(kernels::welford_variance(s), two_pass(v, 0, v.size()).m2 / 4096.0, 1e-3);
}

TEST(Welford, CombineMatchesTwoPassForAnySplit) {
  const auto v = random_values(10000, 3.0, 2.0, 2);
  for (size_t split : {size_t{1}, size_t{2}, size_t{17}, size_t{5000}, size_t{9999}}) {
    const auto c = kernels::welford_combine(accumulate(v, 0, split), accumulate(v, split, v.size()));
    expect_close(c, two_pass(v, 0, v.size()), "split at " + std::to_string(split));
  }
}

// A state holding exact statistics, rounded to fp32: per-value fp32 updates over 10^6 values
// would test the update's own drift (d / n falls below half an ulp of the mean), not combine.
WelfordState exact_state(const Stats& s) {
  return {static_cast<float>(s.count), static_cast<float>(s.mean), static_cast<float>(s.m2)};
}

TEST(Welford, CombineVeryDifferentCountsAndOffsets) {
  // 10^6 values around 1000 merged with a single value far away, in both orders.
  auto v = random_values(1000000, 1000.0, 1.0, 3);
  v.push_back(1010.f);
  const auto big = exact_state(two_pass(v, 0, 1000000)), one = accumulate(v, 1000000, 1000001);
  const Stats ref = two_pass(v, 0, v.size());
  expect_close(kernels::welford_combine(big, one), ref, "big + one");
  expect_close(kernels::welford_combine(one, big), ref, "one + big");
  // 3 values around -50 merged with 10^5 around 1000: the merge term d^2 * na * nb / n dominates m2.
  auto u = random_values(3, -50.0, 0.5, 4);
  u.insert(u.end(), v.begin(), v.begin() + 100000);
  const auto three = accumulate(u, 0, 3), many = exact_state(two_pass(u, 3, u.size()));
  expect_close(kernels::welford_combine(three, many), two_pass(u, 0, u.size()), "three + many");
  expect_close(kernels::welford_combine(many, three), two_pass(u, 0, u.size()), "many + three");
}

TEST(Welford, EmptyStateIsTheIdentity) {
  const auto v = random_values(37, 5.0, 1.0, 5);
  const auto s = accumulate(v, 0, v.size());
  const WelfordState empty{};
  for (const auto& c : {kernels::welford_combine(s, empty), kernels::welford_combine(empty, s)}) {
    EXPECT_EQ(c.count, s.count);
    EXPECT_EQ(c.mean, s.mean);
    EXPECT_EQ(c.m2, s.m2);
  }
  const auto e = kernels::welford_combine(empty, empty);
  EXPECT_EQ(e.count, 0.f);
  EXPECT_EQ(e.m2, 0.f);
  EXPECT_EQ(kernels::welford_variance(e), 0.f);
}

TEST(Welford, TreeOfCombinesLikeTheBlockReduction) {
  // 1024 states (a block's threads) of 8 values each, merged pairwise as the shuffles do.
  const auto v = random_values(8192, 1000.0, 1.0, 6);
  std::vector<WelfordState> states;
  for (size_t t = 0; t < 1024; ++t) states.push_back(accumulate(v, 8 * t, 8 * t + 8));
  for (size_t width = states.size(); width > 1; width /= 2)
    for (size_t i = 0; i < width / 2; ++i) states[i] = kernels::welford_combine(states[i], states[i + width / 2]);
  expect_close(states[0], two_pass(v, 0, v.size()), "tree of 1024 states");
}

}  // namespace
}  // namespace flashlab
