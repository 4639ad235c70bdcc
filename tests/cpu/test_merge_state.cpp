// The merge of attention states: the float64 reference (src/reference/serving.h) against what a
// merge means — attention over a key range split into segments, each segment's (out, lse) merged,
// is attention over the whole range (src/reference/attention.h) — and the validation of
// merge_state / merge_states (include/flashlab/serving.h), which rejects bad arguments before any
// CUDA call, launching nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/serving.h"
#include "src/reference/attention.h"
#include "src/reference/serving.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::gpu;
using testing::gpu_strided;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> uniform(size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> x(n);
  for (double& e : x) e = u(rng);
  return x;
}

// One batch, sq rows, keys [k0, k1) of k, v (sk, nheads_kv = nheads, d): the reference's (out, lse).
reference::AttnRefResult attend(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                                int64_t sq, int64_t k0, int64_t k1, int64_t nheads, int64_t d) {
  reference::AttnRefArgs a;
  a.nheads = a.nheads_kv = nheads, a.headdim = d;
  a.cu_seqlens_q = {0, sq}, a.cu_seqlens_k = {0, k1 - k0};
  a.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto rows = [&](const std::vector<double>& x) {
    return std::vector<double>(x.begin() + k0 * nheads * d, x.begin() + k1 * nheads * d);
  };
  return reference::attention_fwd(q, rows(k), rows(v), a);
}

TEST(MergeStateReference, SegmentsOfAttentionMergeToTheWhole) {
  std::mt19937_64 rng(41);
  const int64_t sq = 5, sk = 37, nheads = 3, d = 8;
  const std::vector<double> q = uniform(sq * nheads * d, rng, -2, 2), k = uniform(sk * nheads * d, rng, -2, 2),
                            v = uniform(sk * nheads * d, rng, -1, 1);
  const reference::AttnRefResult whole = attend(q, k, v, sq, 0, sk, nheads, d);
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 20, 37}, std::vector<int64_t>{0, 1, 9, 30, 37}}) {
    const int64_t n = static_cast<int64_t>(cuts.size()) - 1;
    // States laid out (seq, num_states, nheads, d); the reference's lse is (nheads, total_q).
    std::vector<double> vs(sq * n * nheads * d), ss(sq * n * nheads);
    for (int64_t i = 0; i < n; ++i) {
      const reference::AttnRefResult part = attend(q, k, v, sq, cuts[i], cuts[i + 1], nheads, d);
      for (int64_t t = 0; t < sq; ++t)
        for (int64_t h = 0; h < nheads; ++h) {
          ss[(t * n + i) * nheads + h] = part.lse[h * sq + t];
          for (int64_t c = 0; c < d; ++c) vs[((t * n + i) * nheads + h) * d + c] = part.out[(t * nheads + h) * d + c];
        }
    }
    const reference::MergedStates m = reference::merge_states(vs, ss, sq, n, nheads, d);
    for (int64_t t = 0; t < sq; ++t)
      for (int64_t h = 0; h < nheads; ++h) {
        EXPECT_NEAR(m.s[t * nheads + h], whole.lse[h * sq + t], 1e-12) << n << " segments, row " << t << " head " << h;
        for (int64_t c = 0; c < d; ++c)
          EXPECT_NEAR(m.v[(t * nheads + h) * d + c], whole.out[(t * nheads + h) * d + c], 1e-12) << n << " segments";
      }
  }
}

TEST(MergeStateReference, EmptySegmentsAndOrder) {
  // A -inf state changes nothing; all -inf gives V = 0, S = -inf; the order of states does not matter.
  const int64_t nheads = 1, d = 2;
  const std::vector<double> v = {1, 2, 5, 7, 3, -1};  // 3 states of one query
  const reference::MergedStates all = reference::merge_states(v, {0.5, -kInf, 1.5}, 1, 3, nheads, d);
  const reference::MergedStates two = reference::merge_states({1, 2, 3, -1}, {0.5, 1.5}, 1, 2, nheads, d);
  EXPECT_DOUBLE_EQ(all.s[0], two.s[0]);
  EXPECT_DOUBLE_EQ(all.v[0], two.v[0]);
  EXPECT_DOUBLE_EQ(all.v[1], two.v[1]);
  const reference::MergedStates swapped = reference::merge_states({3, -1, 1, 2}, {1.5, 0.5}, 1, 2, nheads, d);
  EXPECT_NEAR(swapped.v[0], two.v[0], 1e-15);
  EXPECT_NEAR(swapped.s[0], two.s[0], 1e-15);
  // Closed form: S = log(e^0.5 + e^1.5), V = (v_a e^0.5 + v_b e^1.5) / (e^0.5 + e^1.5).
  const double ea = std::exp(0.5), eb = std::exp(1.5);
  EXPECT_NEAR(two.s[0], std::log(ea + eb), 1e-15);
  EXPECT_NEAR(two.v[0], (1 * ea + 3 * eb) / (ea + eb), 1e-15);
  const reference::MergedStates none = reference::merge_states({1, 2, 3, 4}, {-kInf, -kInf}, 1, 2, nheads, d);
  EXPECT_EQ(none.s[0], -kInf);
  EXPECT_EQ(none.v[0], 0.0);
  EXPECT_EQ(none.v[1], 0.0);
  // Large s (no overflow: the max is subtracted). S = 1000 + log 2 is rounded to an ulp of 1000
  // (1.1e-13), which e^(s - S) passes on to the weights: hence 1e-12.
  const reference::MergedStates big = reference::merge_states({1, 0, 0, 1}, {1000, 1000}, 1, 2, nheads, d);
  EXPECT_NEAR(big.s[0], 1000 + std::log(2.0), 1e-12);
  EXPECT_NEAR(big.v[0], 0.5, 1e-12);
  EXPECT_THROW(reference::merge_states({1, 2}, {0, 0}, 1, 2, nheads, d), std::invalid_argument);
}

// ---- validation

enum Slot { kVa = 1, kSa, kVb, kSb, kVo, kSo };
constexpr DType kBf = DType::kBF16;

struct Pair {
  TensorView v_a = gpu(kBf, {7, 4, 64}, kVa), s_a = gpu(DType::kF32, {7, 4}, kSa), v_b = gpu(kBf, {7, 4, 64}, kVb),
             s_b = gpu(DType::kF32, {7, 4}, kSb), v_out = gpu(kBf, {7, 4, 64}, kVo), s_out = gpu(DType::kF32, {7, 4}, kSo);
};

void expect_pair_rejected(const Pair& p, const std::vector<std::string>& pieces) {
  testing::expect_rejected([&] { merge_state(p.v_a, p.s_a, p.v_b, p.s_b, p.v_out, p.s_out); }, pieces);
}

TEST(MergeStateValidation, MergeState) {
  {
    Pair p;
    p.v_b = gpu(kBf, {7, 4, 32}, kVb);
    expect_pair_rejected(p, {"merge_state: argument 'v_b'", "expected shape [7, 4, 64] (same as 'v_a')", "got [7, 4, 32]"});
  }
  {
    Pair p;
    p.v_out = gpu(DType::kF16, {7, 4, 64}, kVo);
    expect_pair_rejected(p, {"merge_state: argument 'v_out'", "expected dtype bf16", "got fp16"});
  }
  {
    Pair p;
    p.v_a = gpu(kBf, {7, 4, 12}, kVa), p.v_b = gpu(kBf, {7, 4, 12}, kVb), p.v_out = gpu(kBf, {7, 4, 12}, kVo);
    expect_pair_rejected(p, {"merge_state: argument 'v_a'", "a positive multiple of 8 (16-byte vectors)", "got 12"});
  }
  {
    Pair p;
    p.s_b = gpu(kBf, {7, 4}, kSb);
    expect_pair_rejected(p, {"merge_state: argument 's_b'", "expected dtype fp32", "got bf16"});
  }
  {
    Pair p;
    p.s_out = gpu(DType::kF32, {4, 7}, kSo);
    expect_pair_rejected(p, {"merge_state: argument 's_out'", "expected shape [7, 4]", "got [4, 7]"});
  }
  {
    Pair p;
    p.v_a = gpu_strided(kBf, {7, 4, 64}, {512, 128, 1}, kVa);
    expect_pair_rejected(p, {"merge_state: argument 'v_a'", "contiguous"});
  }
  {
    Pair p;
    p.v_a = gpu(kBf, {7, 4, 64}, kVa, 8);
    expect_pair_rejected(p, {"merge_state: argument 'v_a'", "aligned"});
  }
  {
    Pair p;
    p.v_out = gpu(kBf, {7, 4, 64}, kVa, 128);  // inside v_a, not identical to it
    expect_pair_rejected(p, {"merge_state: argument 'v_out'", "memory disjoint from 'v_a' or identical to it"});
  }
  {
    Pair p;
    p.s_out = p.v_a;  // shaped as v: its own check names it first
    expect_pair_rejected(p, {"merge_state: argument 's_out'"});
  }
  {
    Pair p;
    p.v_a = TensorView(testing::fake(0, kVa), kBf, {7, 4, 64}, testing::kCpu);
    expect_pair_rejected(p, {"merge_state: argument 'v_a'", "CUDA"});
  }
}

TEST(MergeStateValidation, MergeStates) {
  const TensorView v = gpu(kBf, {7, 3, 4, 64}, kVa), s = gpu(DType::kF32, {7, 3, 4}, kSa),
                   v_out = gpu(kBf, {7, 4, 64}, kVo), s_out = gpu(DType::kF32, {7, 4}, kSo);
  const auto rejected = [](const TensorView& a, const TensorView& b, const TensorView& c, const TensorView& d,
                           const std::vector<std::string>& pieces) {
    testing::expect_rejected([&] { merge_states(a, b, c, d); }, pieces);
  };
  rejected(gpu(kBf, {7, 0, 4, 64}, kVa), s, v_out, s_out, {"merge_states: argument 'v'", "expected 1 .. 2^31 - 1 states"});
  rejected(v, gpu(DType::kF32, {7, 4}, kSa), v_out, s_out, {"merge_states: argument 's'", "expected shape [7, 3, 4]"});
  rejected(v, s, gpu(kBf, {7, 3, 64}, kVo), s_out, {"merge_states: argument 'v_out'", "expected shape [7, 4, 64]"});
  rejected(v, s, gpu(kBf, {7, 4, 64}, kVa), s_out, {"merge_states: argument 'v_out'"});  // overlaps v
  rejected(v, s, v_out, gpu(DType::kF32, {7, 4}, kSa), {"merge_states: argument 's_out'"});  // is s
  rejected(gpu(kBf, {7, 3, 4}, kVa), s, v_out, s_out, {"merge_states: argument 'v'", "expected 4 dims"});
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Valid calls pass every host check: on a machine without a GPU the first CUDA call then fails.
TEST(MergeStateValidation, ValidCallsPassTheHostChecks) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: the fake pointers would reach it";
  const auto passes = [](const std::function<void()>& fn) {
    const int64_t launches = check::launch_count();
    try {
      fn();
      ADD_FAILURE() << "expected a CUDA error on a machine without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA error"), std::string::npos) << e.what();
    }
    EXPECT_EQ(check::launch_count(), launches);
  };
  const Pair p;
  passes([&] { merge_state(p.v_a, p.s_a, p.v_b, p.s_b, p.v_out, p.s_out); });
  passes([&] { merge_state(p.v_a, p.s_a, p.v_b, p.s_b, p.v_a, p.s_a); });  // in place
  for (DType dt : {DType::kF32, DType::kF16})
    passes([&] {
      merge_state(gpu(dt, {3, 2, 16}, kVa), p.s_a.dtype == DType::kF32 ? gpu(DType::kF32, {3, 2}, kSa) : p.s_a,
                  gpu(dt, {3, 2, 16}, kVb), gpu(DType::kF32, {3, 2}, kSb), gpu(dt, {3, 2, 16}, kVo),
                  gpu(DType::kF32, {3, 2}, kSo));
    });
  passes([&] {
    merge_states(gpu(kBf, {7, 3, 4, 64}, kVa), gpu(DType::kF32, {7, 3, 4}, kSa), gpu(kBf, {7, 4, 64}, kVo),
                 gpu(DType::kF32, {7, 4}, kSo));
  });
}

}  // namespace
}  // namespace flashlab
