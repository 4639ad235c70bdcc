// RoPE family: bad input through the public C++ API on a machine with no GPU (each call throws
// flashlab::Error naming the argument and launches nothing), and closed-form checks of the
// float64 reference and of the inverse frequencies the kernels use.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "flashlab/rope.h"
#include "flashlab/validate.h"
#include "kernels/rope/params.h"
#include "src/reference/rope.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::gpu;
using testing::gpu_strided;
using testing::kGpu;

struct Args {
  TensorView q = gpu(DType::kBF16, {7, 32, 128}, 1), k = gpu(DType::kBF16, {7, 8, 128}, 2),
             qo = gpu(DType::kBF16, {7, 32, 128}, 3), ko = gpu(DType::kBF16, {7, 8, 128}, 4),
             pos = gpu(DType::kI32, {7}, 5);
};

TEST(RopeValidation, BadTensors) {
  Args a;
  const RopeOptions o;
  expect_rejected([&] { apply_rope_pos_ids(a.q, gpu(DType::kBF16, {7, 8, 64}, 2), a.qo, a.ko, a.pos, o); },
                  {"apply_rope_pos_ids", "argument 'k'", "expected head_dim 128 (same as 'q')", "got 64"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, gpu(DType::kBF16, {6, 8, 128}, 2), a.qo, a.ko, a.pos, o); },
                  {"argument 'k'", "expected nnz 7 (same as 'q')", "got 6"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, gpu(DType::kF16, {7, 8, 128}, 2), a.qo, a.ko, a.pos, o); },
                  {"argument 'k'", "expected dtype bf16 (same as 'q')", "got fp16"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.qo, a.ko, gpu(DType::kF32, {7}, 5), o); },
                  {"argument 'pos_ids'", "expected dtype int32 or int64", "got fp32"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.qo, a.ko, gpu(DType::kI64, {8}, 5), o); },
                  {"argument 'pos_ids'", "expected shape [7]", "got [8]"});
  expect_rejected([&] { apply_rope_pos_ids(gpu(DType::kI8, {7, 32, 128}, 1), a.k, a.qo, a.ko, a.pos, o); },
                  {"argument 'q'", "expected dtype fp32 or fp16 or bf16", "got int8"});
  expect_rejected([&] { apply_rope_pos_ids(gpu(DType::kBF16, {7, 4096}, 1), a.k, a.qo, a.ko, a.pos, o); },
                  {"argument 'q'", "expected 3 dims", "got 2 dims"});
  expect_rejected([&] { apply_rope_pos_ids(TensorView(a.q.data, DType::kBF16, {7, 32, 128}, Device{}), a.k, a.qo, a.ko,
                                           a.pos, o); },
                  {"argument 'q'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, gpu(DType::kBF16, {7, 32, 64}, 3), a.ko, a.pos, o); },
                  {"argument 'q_out'", "expected shape [7, 32, 128] (same as 'q')", "got [7, 32, 64]"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.qo, a.qo, a.pos, o); },
                  {"argument 'k_out'", "expected shape [7, 8, 128] (same as 'k')"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.k, a.ko, a.pos, o); },
                  {"argument 'q_out'", "expected shape [7, 32, 128] (same as 'q')"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.qo, gpu(DType::kBF16, {7, 8, 128}, 1), a.pos, o); },
                  {"argument 'k_out'", "expected memory disjoint from 'q'"});
  // Heads that overlap each other in an output: head stride 64 < head_dim 128.
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, gpu_strided(DType::kBF16, {7, 32, 128}, {4096, 64, 1}, 3), a.ko,
                                           a.pos, o); },
                  {"argument 'q_out'", "expected token and head strides that keep every head disjoint",
                   "got strides [4096, 64, 1]"});
  // In place with other strides than the input.
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, gpu_strided(DType::kBF16, {7, 32, 128}, {8192, 128, 1}, 1), a.ko,
                                           a.pos, o); },
                  {"argument 'q_out'", "(in place)"});
  expect_rejected([&] { apply_rope_pos_ids(a.q, a.k, a.qo, a.ko, a.pos, o, nullptr, 3); },
                  {"argument 'rung'", "expected 1..2", "got 3"});
  expect_rejected([&] { apply_rope_pos_ids(gpu(DType::kBF16, {0, 32, 128}, 1), gpu(DType::kBF16, {0, 8, 128}, 2),
                                           gpu(DType::kBF16, {0, 32, 128}, 3), gpu(DType::kBF16, {0, 8, 128}, 4),
                                           gpu(DType::kI32, {0}, 5), o); },
                  {"argument 'q'", "expected at least one element"});
  expect_rejected([&] { apply_rope_pos_ids(gpu_strided(DType::kBF16, {7, 32, 128}, {4096, 128, 2}, 1), a.k, a.qo, a.ko,
                                           a.pos, o); },
                  {"argument 'q'", "expected unit stride in the last dim"});
}

TEST(RopeValidation, BadOptions) {
  Args a;
  auto with = [&](auto edit) {
    RopeOptions o;
    edit(o);
    return [&a, o] { apply_rope_pos_ids(a.q, a.k, a.qo, a.ko, a.pos, o); };
  };
  expect_rejected(with([](RopeOptions& o) { o.rotary_dim = 63; }),
                  {"argument 'rotary_dim'", "expected an even value in 2..head_dim (128)", "got 63"});
  expect_rejected(with([](RopeOptions& o) { o.rotary_dim = 130; }), {"argument 'rotary_dim'", "got 130"});
  expect_rejected(with([](RopeOptions& o) { o.rotary_dim = -2; }), {"argument 'rotary_dim'", "got -2"});
  expect_rejected(with([](RopeOptions& o) { o.rope_theta = -1e4f; }),
                  {"argument 'rope_theta'", "expected a finite value > 0", "got -10000"});
  expect_rejected(with([](RopeOptions& o) { o.rope_theta = NAN; }), {"argument 'rope_theta'", "got nan"});
  expect_rejected(with([](RopeOptions& o) { o.rope_scale = 0.f; }), {"argument 'rope_scale'", "got 0"});
  expect_rejected(with([](RopeOptions& o) { o.llama31 = true; o.rope_scale = 8.f; }),
                  {"argument 'rope_scale'", "expected 1 with llama31", "got 8"});
  expect_rejected(with([](RopeOptions& o) { o.llama31 = true; o.high_freq_factor = 1.f; }),
                  {"argument 'high_freq_factor'", "expected a finite value > low_freq_factor (1)", "got 1"});
  expect_rejected(with([](RopeOptions& o) { o.llama31 = true; o.llama31_factor = -8.f; }),
                  {"argument 'llama31_factor'", "got -8"});
  expect_rejected(with([](RopeOptions& o) { o.llama31 = true; o.old_context_len = 0; }),
                  {"argument 'old_context_len'", "expected a value > 0", "got 0"});
}

TEST(RopeValidation, CosSinCache) {
  Args a;
  expect_rejected([&] { apply_rope_with_cos_sin_cache(a.q, a.k, a.qo, a.ko, a.pos, gpu(DType::kBF16, {4096, 128}, 6), false); },
                  {"apply_rope_with_cos_sin_cache", "argument 'cos_sin_cache'", "expected dtype fp32", "got bf16"});
  expect_rejected([&] { apply_rope_with_cos_sin_cache(a.q, a.k, a.qo, a.ko, a.pos, gpu(DType::kF32, {4096, 127}, 6), false); },
                  {"argument 'cos_sin_cache'", "expected an even rotary_dim (second dim) <= head_dim (128)", "got 127"});
  expect_rejected([&] { apply_rope_with_cos_sin_cache(a.q, a.k, a.qo, a.ko, a.pos, gpu(DType::kF32, {4096, 256}, 6), false); },
                  {"argument 'cos_sin_cache'", "got 256"});
  expect_rejected([&] { apply_rope_with_cos_sin_cache(a.q, a.k, a.qo, a.ko, a.pos, gpu(DType::kF32, {128}, 6), false); },
                  {"argument 'cos_sin_cache'", "expected 2 dims"});
  expect_rejected([&] { apply_rope_with_cos_sin_cache(a.q, a.k, a.qo, a.ko, gpu(DType::kI64, {3}, 5),
                                                      gpu(DType::kF32, {4096, 128}, 6), false); },
                  {"argument 'pos_ids'", "expected shape [7]", "got [3]"});
  expect_rejected([&] { split_heads(gpu(DType::kBF16, {7, 4000}, 1), 128, "apply_rope_with_cos_sin_cache", "query"); },
                  {"argument 'query'", "expected a last dim that is a positive multiple of head_size (128)",
                   "got [7, 4000]"});
  const TensorView v = split_heads(gpu_strided(DType::kBF16, {7, 4096}, {6144, 1}, 1), 128, "op", "query");
  EXPECT_EQ(v.shape, (std::vector<int64_t>{7, 32, 128}));
  EXPECT_EQ(v.strides, (std::vector<int64_t>{6144, 128, 1}));
}

// q, k and v split from one fused qkv buffer [nnz, (32 + 8 + 8) * 128]: q and k interleave by
// token without sharing an element, so in place on both is accepted (it then reaches the device,
// which this machine lacks: any error but a validation one).
TEST(RopeValidation, FusedQkvViewsInPlaceAreNotOverlaps) {
  const int64_t row = 48 * 128;
  const TensorView q = gpu_strided(DType::kBF16, {7, 32, 128}, {row, 128, 1}, 1);
  const TensorView k(static_cast<char*>(q.data) + 32 * 128 * 2, DType::kBF16, {7, 8, 128}, {row, 128, 1}, kGpu);
  try {
    apply_rope_pos_ids(q, k, q, k, gpu(DType::kI64, {7}, 5), RopeOptions{});
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("argument"), std::string::npos) << e.what();
  }
  // Shifted by one head, k's rows run into the next token's q: rejected.
  const TensorView k_bad(static_cast<char*>(q.data) + 31 * 128 * 2, DType::kBF16, {7, 8, 128}, {row, 128, 1}, kGpu);
  expect_rejected([&] { apply_rope_pos_ids(q, k_bad, q, k_bad, gpu(DType::kI64, {7}, 5), RopeOptions{}); },
                  {"argument 'q_out'", "expected memory disjoint from 'k' or identical to it", "got a partial overlap"});
}

// ---- reference closed forms

std::vector<double> random_values(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<double> inv_freqs(const reference::RopeFreqRef& f, int rd) {
  std::vector<double> v(rd / 2);
  for (int i = 0; i < rd / 2; ++i) v[i] = reference::rope_inv_freq(f, i, rd);
  return v;
}

TEST(RopeReference, PositionZeroIsIdentityAndInverseRotationRestores) {
  std::mt19937_64 rng(41);
  const int64_t nnz = 3, heads = 2, hd = 64;
  const auto x = random_values(nnz * heads * hd, rng);
  for (bool interleave : {false, true})
    for (int rd : {64, 32}) {
      const auto f = inv_freqs({}, rd);
      EXPECT_EQ(reference::rope(x, {0, 0, 0}, nnz, heads, hd, rd, interleave, f), x);
      const std::vector<int64_t> pos{1, 1000, 999999}, neg{-1, -1000, -999999};
      const auto back = reference::rope(reference::rope(x, pos, nnz, heads, hd, rd, interleave, f), neg, nnz, heads, hd,
                                        rd, interleave, f);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-12);
      // Rotations add: pos a then pos b equals pos a + b.
      const auto ab = reference::rope(reference::rope(x, {3, 5, 7}, nnz, heads, hd, rd, interleave, f), {10, 20, 30},
                                      nnz, heads, hd, rd, interleave, f);
      const auto sum = reference::rope(x, {13, 25, 37}, nnz, heads, hd, rd, interleave, f);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(ab[i], sum[i], 1e-12);
    }
}

TEST(RopeReference, PairsAreTwoByTwoRotationsAndTailIsUnchanged) {
  const int64_t hd = 8;
  const int rd = 4;
  std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<double> f{0.5, 0.25};  // pos 2: angles 1 and 0.5
  const auto neox = reference::rope(x, {2}, 1, 1, hd, rd, false, f);
  // NeoX pairs (0, 2) angle 1, (1, 3) angle 0.5
  EXPECT_NEAR(neox[0], 1 * std::cos(1.0) - 3 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(neox[2], 3 * std::cos(1.0) + 1 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(neox[1], 2 * std::cos(0.5) - 4 * std::sin(0.5), 1e-15);
  EXPECT_NEAR(neox[3], 4 * std::cos(0.5) + 2 * std::sin(0.5), 1e-15);
  const auto gptj = reference::rope(x, {2}, 1, 1, hd, rd, true, f);
  // GPT-J pairs (0, 1) angle 1, (2, 3) angle 0.5
  EXPECT_NEAR(gptj[0], 1 * std::cos(1.0) - 2 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(gptj[1], 2 * std::cos(1.0) + 1 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(gptj[3], 4 * std::cos(0.5) + 3 * std::sin(0.5), 1e-15);
  for (int64_t d = rd; d < hd; ++d) EXPECT_EQ(neox[d], x[d]) << d;
  for (int64_t d = rd; d < hd; ++d) EXPECT_EQ(gptj[d], x[d]) << d;
  // Rotations keep each pair's length.
  EXPECT_NEAR(std::hypot(gptj[2], gptj[3]), std::hypot(3.0, 4.0), 1e-14);
}

TEST(RopeReference, CacheOfTheSameAnglesGivesTheSameResult) {
  std::mt19937_64 rng(42);
  const int64_t nnz = 4, heads = 3, hd = 32;
  const int rd = 16;
  const auto x = random_values(nnz * heads * hd, rng);
  const auto f = inv_freqs({}, rd);
  std::vector<double> cache(100 * rd);
  for (int p = 0; p < 100; ++p)
    for (int i = 0; i < rd / 2; ++i) {
      cache[p * rd + i] = std::cos(p * f[i]);
      cache[p * rd + rd / 2 + i] = std::sin(p * f[i]);
    }
  const std::vector<int64_t> pos{0, 5, 99, 42};
  for (bool interleave : {false, true})
    EXPECT_EQ(reference::rope_cos_sin_cache(x, pos, nnz, heads, hd, interleave, cache, rd),
              reference::rope(x, pos, nnz, heads, hd, rd, interleave, f));
}

TEST(RopeReference, InverseFrequencies) {
  reference::RopeFreqRef plain;
  plain.theta = 1e4;
  plain.scale = 2.0;
  EXPECT_DOUBLE_EQ(reference::rope_inv_freq(plain, 0, 128), 0.5);
  EXPECT_NEAR(reference::rope_inv_freq(plain, 32, 128), 0.5 / 100.0, 1e-15);  // theta^(-1/2) / 2
  // Llama 3.1 (theta 5e5, factor 8, low 1, high 4, old 8192): wavelengths below 2048 keep their
  // frequency, above 8192 are divided by 8, and the band between is continuous at both edges.
  reference::RopeFreqRef l31;
  l31.theta = 5e5;
  l31.llama31 = true;
  const double kPi = 3.14159265358979323846;
  const int rd = 128;
  int kept = 0, divided = 0, between = 0;
  for (int i = 0; i < rd / 2; ++i) {
    const double base = std::pow(5e5, -2.0 * i / rd), wavelen = 2 * kPi / base;
    const double got = reference::rope_inv_freq(l31, i, rd);
    if (wavelen < 2048) {
      EXPECT_DOUBLE_EQ(got, base) << i;
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(got, base / 8) << i;
      ++divided;
    } else {
      EXPECT_GT(got, base / 8) << i;
      EXPECT_LT(got, base) << i;
      ++between;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(between, 0);
  // The interpolation meets both bands at their edges: s = 0 at wavelength old/low, 1 at old/high.
  auto at_wavelen = [&](double w) {
    reference::RopeFreqRef f = l31;
    f.theta = w / (2 * kPi);  // pair 1 of rotary_dim 2: base = 1 / theta, wavelength w
    return std::pair<double, double>(reference::rope_inv_freq(f, 1, 2), 2 * kPi / w);
  };
  for (double w : {2048.0, 8192.0}) {
    const auto [got, base] = at_wavelen(w);
    EXPECT_NEAR(got, w == 2048.0 ? base : base / 8, 1e-15) << w;
  }
}

// The kernels' inv_freq (kernels/rope/params.h: the smooth clamp form FlashInfer uses) agrees
// with the reference's piecewise form, and its fp32 value is the reference rounded once.
TEST(RopeReference, KernelInverseFrequenciesMatchTheReference) {
  for (bool llama31 : {false, true})
    for (int rd : {64, 128, 256}) {
      reference::RopeFreqRef r;
      r.theta = llama31 ? 5e5 : 1e4;
      r.scale = llama31 ? 1.0 : 4.0;
      r.llama31 = llama31;
      const RopeFreq k{r.theta, r.scale, llama31, 8.0, 1.0, 4.0, 8192.0};
      for (int i = 0; i < rd / 2; ++i) {
        const double ref = reference::rope_inv_freq(r, i, rd);
        EXPECT_NEAR(rope_inv_freq_f64(k, i, rd), ref, 1e-15 * ref) << "rd " << rd << " i " << i;
        EXPECT_EQ(rope_inv_freq(k, i, rd), static_cast<float>(ref)) << "rd " << rd << " i " << i;
      }
    }
}

}  // namespace
}  // namespace flashlab
