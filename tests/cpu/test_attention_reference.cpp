// The float64 attention reference (forward, and the backward against central differences of the
// forward) against closed forms and brute force, and the naive
// same-dtype emulation against the reference: the oracle must be right before any rung is held
// against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "src/reference/attention.h"
#include "tests/common/attention_naive.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using reference::AttnRefArgs;
using reference::AttnRefResult;
constexpr double kInf = std::numeric_limits<double>::infinity();

AttnRefArgs fixed_args(int64_t batch, int64_t sq, int64_t sk, int64_t nheads, int64_t nheads_kv, int64_t d) {
  AttnRefArgs a;
  a.batch = batch, a.nheads = nheads, a.nheads_kv = nheads_kv, a.headdim = d;
  for (int64_t b = 0; b <= batch; ++b) a.cu_seqlens_q.push_back(b * sq), a.cu_seqlens_k.push_back(b * sk);
  a.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return a;
}

std::vector<double> randn(size_t n, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> dist(0.0, sd);
  std::vector<double> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

double dot(const double* x, const double* y, int64_t d) {
  double s = 0;
  for (int64_t c = 0; c < d; ++c) s += x[c] * y[c];
  return s;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
    } else {
      EXPECT_NEAR(got[i], want[i], tol) << what << " [" << i << "]";
    }
  }
}

// (a) One key: softmax over one entry is 1, so out = v and lse = the score.
TEST(AttentionReference, OneKeyGivesVAndScore) {
  std::mt19937_64 rng(1);
  const int64_t sq = 3, H = 4, Hkv = 2, D = 5;
  const AttnRefArgs a = fixed_args(1, sq, 1, H, Hkv, D);
  const auto q = randn(sq * H * D, rng), k = randn(Hkv * D, rng), v = randn(Hkv * D, rng);
  const AttnRefResult r = reference::attention_fwd(q, k, v, a);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      EXPECT_NEAR(r.lse[h * sq + i], a.scale * dot(&q[(i * H + h) * D], &k[hk * D], D), 1e-14);
      for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(r.out[(i * H + h) * D + c], v[hk * D + c], 1e-14);
    }
}

// (b) n identical keys: uniform weights, out = mean of the v's, lse = s + log(n).
TEST(AttentionReference, IdenticalKeysAverageV) {
  std::mt19937_64 rng(2);
  const int64_t sq = 2, sk = 7, D = 8;
  const AttnRefArgs a = fixed_args(1, sq, sk, 1, 1, D);
  const auto q = randn(sq * D, rng), k0 = randn(D, rng), v = randn(sk * D, rng);
  std::vector<double> k;
  for (int64_t j = 0; j < sk; ++j) k.insert(k.end(), k0.begin(), k0.end());
  const AttnRefResult r = reference::attention_fwd(q, k, v, a);
  for (int64_t i = 0; i < sq; ++i) {
    EXPECT_NEAR(r.lse[i], a.scale * dot(&q[i * D], k0.data(), D) + std::log(7.0), 1e-13);
    for (int64_t c = 0; c < D; ++c) {
      double mean = 0;
      for (int64_t j = 0; j < sk; ++j) mean += v[j * D + c] / sk;
      EXPECT_NEAR(r.out[i * D + c], mean, 1e-13);
    }
  }
}

// (c) Causal, sq == sk: row i sees keys 0..i; row 0 is key 0 alone.
TEST(AttentionReference, CausalSquareRowZeroSeesKeyZero) {
  std::mt19937_64 rng(3);
  const int64_t s = 6, D = 4;
  AttnRefArgs a = fixed_args(1, s, s, 1, 1, D);
  a.causal = true;
  const auto q = randn(s * D, rng), k = randn(s * D, rng), v = randn(s * D, rng);
  const AttnRefResult r = reference::attention_fwd(q, k, v, a, /*want_probs=*/true);
  EXPECT_NEAR(r.lse[0], a.scale * dot(&q[0], &k[0], D), 1e-14);
  for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(r.out[c], v[c], 1e-14);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) EXPECT_EQ(r.probs[i * s + j] > 0.0, j <= i) << i << "," << j;
}

// (d) Bottom-right alignment: the diagonal of row i is key i + sk - sq.
TEST(AttentionReference, CausalBottomRightAlignment) {
  std::mt19937_64 rng(4);
  const int64_t D = 3;
  {  // sq > sk: causal, sq = 5, sk = 2: rows 0..2 see nothing, row 3 key 0, row 4 keys 0..1.
    AttnRefArgs a = fixed_args(1, 5, 2, 1, 1, D);
    a.causal = true;
    const auto q = randn(5 * D, rng), k = randn(2 * D, rng), v = randn(2 * D, rng);
    const AttnRefResult r = reference::attention_fwd(q, k, v, a, true);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.lse[i], -kInf) << i;
      for (int64_t c = 0; c < D; ++c) EXPECT_EQ(r.out[i * D + c], 0.0) << i;
      for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(r.probs[i * 2 + j], 0.0);
    }
    EXPECT_NEAR(r.lse[3], a.scale * dot(&q[3 * D], &k[0], D), 1e-14);
    for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(r.out[3 * D + c], v[c], 1e-14);
    EXPECT_GT(r.probs[4 * 2 + 1], 0.0);
    for (double x : r.out) EXPECT_FALSE(std::isnan(x));
  }
  {  // sq < sk: causal, sq = 2, sk = 5: row 0 sees keys 0..3, row 1 all 5.
    AttnRefArgs a = fixed_args(1, 2, 5, 1, 1, D);
    a.causal = true;
    const auto q = randn(2 * D, rng), k = randn(5 * D, rng), v = randn(5 * D, rng);
    const AttnRefResult r = reference::attention_fwd(q, k, v, a, true);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(r.probs[i * 5 + j] > 0.0, j <= i + 3) << i << "," << j;
  }
}

// (e) Sliding window: the mask rule against hand-listed cases, and every row's output against
// an unmasked run over only the keys a brute-force rule keeps.
TEST(AttentionReference, SlidingWindowMatchesBruteForce) {
  using reference::attention_key_visible;
  // sq = sk = 5, window (1, 0): row 2 sees keys 1, 2.
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(attention_key_visible(2, j, 5, 5, false, 1, 0), j == 1 || j == 2) << j;
  // causal overrides window_right: (2, 3) with causal is (2, 0).
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(attention_key_visible(4, j, 5, 5, true, 2, 3), j >= 2 && j <= 4) << j;
  // sq = 2, sk = 6, window (0, 1): row 0's diagonal is key 4; it sees keys 4, 5.
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(attention_key_visible(0, j, 2, 6, false, 0, 1), j >= 4) << j;
  // Unbounded both ways keeps everything, even far off the diagonal.
  EXPECT_TRUE(attention_key_visible(0, 100, 1, 1, false, -1, -1));

  std::mt19937_64 rng(5);
  const int64_t D = 4;
  struct Case { int64_t sq, sk, wl, wr; bool causal; };
  for (const Case& t : {Case{7, 7, 2, 1, false}, Case{4, 9, 3, 0, false}, Case{9, 4, 1, 2, false},
                        Case{6, 6, 0, 0, false}, Case{5, 8, 2, -1, true}, Case{8, 3, -1, 1, false}}) {
    AttnRefArgs a = fixed_args(1, t.sq, t.sk, 1, 1, D);
    a.window_left = t.wl, a.window_right = t.wr, a.causal = t.causal;
    const auto q = randn(t.sq * D, rng), k = randn(t.sk * D, rng), v = randn(t.sk * D, rng);
    const AttnRefResult r = reference::attention_fwd(q, k, v, a);
    for (int64_t i = 0; i < t.sq; ++i) {
      // Brute force: offset of key j from row i's diagonal, within [-wl, wr].
      const int64_t wr = t.causal ? 0 : t.wr;
      std::vector<double> ks, vs;
      for (int64_t j = 0; j < t.sk; ++j) {
        const int64_t off = j - (i + t.sk - t.sq);
        const bool keep = (t.wl == -1 || -off <= t.wl) && (wr == -1 || off <= wr);
        EXPECT_EQ(keep, attention_key_visible(i, j, t.sq, t.sk, t.causal, t.wl, t.wr));
        if (!keep) continue;
        ks.insert(ks.end(), k.begin() + j * D, k.begin() + (j + 1) * D);
        vs.insert(vs.end(), v.begin() + j * D, v.begin() + (j + 1) * D);
      }
      const int64_t n = static_cast<int64_t>(ks.size()) / D;
      const std::vector<double> qi(q.begin() + i * D, q.begin() + (i + 1) * D);
      const AttnRefResult ri = reference::attention_fwd(qi, ks, vs, fixed_args(1, 1, n, 1, 1, D));
      EXPECT_EQ(std::isinf(r.lse[i]), n == 0);
      if (n == 0) {
        EXPECT_EQ(r.lse[i], -kInf);
      } else {
        EXPECT_NEAR(r.lse[i], ri.lse[0], 1e-13);
      }
      for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(r.out[i * D + c], ri.out[c], 1e-13);
    }
  }
}

// (f) GQA equals MHA with each KV head repeated over its group of query heads.
TEST(AttentionReference, GqaEqualsRepeatedKv) {
  std::mt19937_64 rng(6);
  const int64_t b = 2, sq = 5, sk = 6, H = 4, Hkv = 2, D = 8;
  AttnRefArgs a = fixed_args(b, sq, sk, H, Hkv, D);
  a.causal = true;
  a.alibi_slopes = {0.5, 0.25, 0.125, 0.0625};
  const auto q = randn(b * sq * H * D, rng), k = randn(b * sk * Hkv * D, rng), v = randn(b * sk * Hkv * D, rng);
  std::vector<double> k_rep, v_rep;  // (b * sk, H, D)
  for (int64_t row = 0; row < b * sk; ++row)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = (row * Hkv + h / (H / Hkv)) * D;
      k_rep.insert(k_rep.end(), k.begin() + at, k.begin() + at + D);
      v_rep.insert(v_rep.end(), v.begin() + at, v.begin() + at + D);
    }
  AttnRefArgs mha = a;
  mha.nheads_kv = H;
  const AttnRefResult g = reference::attention_fwd(q, k, v, a), m = reference::attention_fwd(q, k_rep, v_rep, mha);
  expect_close(g.out, m.out, 1e-14, "out");
  expect_close(g.lse, m.lse, 1e-14, "lse");
}

// (g) Varlen equals running each batch on its own (empty key batch included), with per-batch
// ALiBi slopes and probs placed at (batch, head, max_sq, max_sk).
TEST(AttentionReference, VarlenEqualsPerBatch) {
  std::mt19937_64 rng(7);
  const int64_t H = 2, Hkv = 1, D = 6;
  const std::vector<int64_t> lq = {3, 1, 4, 2}, lk = {5, 0, 2, 7};
  AttnRefArgs a;
  a.batch = 4, a.nheads = H, a.nheads_kv = Hkv, a.headdim = D, a.scale = 0.4, a.causal = true, a.window_left = 3;
  a.cu_seqlens_q = {0}, a.cu_seqlens_k = {0};
  for (int b = 0; b < 4; ++b)
    a.cu_seqlens_q.push_back(a.cu_seqlens_q.back() + lq[b]), a.cu_seqlens_k.push_back(a.cu_seqlens_k.back() + lk[b]);
  a.alibi_slopes = randn(4 * H, rng, 0.3);
  const int64_t tq = a.cu_seqlens_q.back(), tk = a.cu_seqlens_k.back(), max_sq = 4, max_sk = 7;
  const auto q = randn(tq * H * D, rng), k = randn(tk * Hkv * D, rng), v = randn(tk * Hkv * D, rng);
  const AttnRefResult r = reference::attention_fwd(q, k, v, a, true);
  ASSERT_EQ(r.probs.size(), static_cast<size_t>(4 * H * max_sq * max_sk));
  for (int64_t b = 0; b < 4; ++b) {
    AttnRefArgs one = a;
    one.batch = 1, one.cu_seqlens_q = {0, lq[b]}, one.cu_seqlens_k = {0, lk[b]};
    one.alibi_slopes = {a.alibi_slopes[b * H], a.alibi_slopes[b * H + 1]};
    const int64_t q0 = a.cu_seqlens_q[b], k0 = a.cu_seqlens_k[b];
    const std::vector<double> qb(q.begin() + q0 * H * D, q.begin() + (q0 + lq[b]) * H * D);
    const std::vector<double> kb(k.begin() + k0 * Hkv * D, k.begin() + (k0 + lk[b]) * Hkv * D);
    const std::vector<double> vb(v.begin() + k0 * Hkv * D, v.begin() + (k0 + lk[b]) * Hkv * D);
    const AttnRefResult rb = reference::attention_fwd(qb, kb, vb, one, true);
    expect_close(std::vector<double>(r.out.begin() + q0 * H * D, r.out.begin() + (q0 + lq[b]) * H * D), rb.out, 1e-14,
                 "out");
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < max_sq; ++i) {
        if (i < lq[b]) {
          const double want = rb.lse[h * lq[b] + i], got = r.lse[h * tq + q0 + i];
          if (std::isinf(want)) {
            EXPECT_EQ(got, want);
          } else {
            EXPECT_NEAR(got, want, 1e-14);
          }
        }
        for (int64_t j = 0; j < max_sk; ++j) {
          const double p = r.probs[((b * H + h) * max_sq + i) * max_sk + j];
          if (i < lq[b] && j < lk[b]) {
            EXPECT_NEAR(p, rb.probs[(h * lq[b] + i) * lk[b] + j], 1e-15);
          } else {
            EXPECT_EQ(p, 0.0) << b << "," << h << "," << i << "," << j;
          }
        }
      }
  }
  for (int64_t h = 0; h < H; ++h) EXPECT_EQ(r.lse[h * tq + a.cu_seqlens_q[1]], -kInf);  // batch 1: no keys
}

// (h) Softcap bounds the scores by softcap, and tends to no softcap as softcap -> inf.
TEST(AttentionReference, SoftcapBoundsScoresAndHasTheRightLimit) {
  std::mt19937_64 rng(8);
  const int64_t sq = 6, D = 4;
  {  // One key: lse is the (capped) score itself.
    AttnRefArgs a = fixed_args(1, sq, 1, 1, 1, D);
    a.scale = 50.0, a.softcap = 2.0;
    const auto q = randn(sq * D, rng), k = randn(D, rng), v = randn(D, rng);
    const AttnRefResult r = reference::attention_fwd(q, k, v, a);
    for (int64_t i = 0; i < sq; ++i) {
      const double raw = a.scale * dot(&q[i * D], k.data(), D);
      EXPECT_LE(std::fabs(r.lse[i]), 2.0) << raw;
      EXPECT_NEAR(r.lse[i], 2.0 * std::tanh(raw / 2.0), 1e-14);
    }
  }
  {
    AttnRefArgs a = fixed_args(1, sq, 9, 1, 1, D);
    a.causal = true;
    const auto q = randn(sq * D, rng), k = randn(9 * D, rng), v = randn(9 * D, rng);
    const AttnRefResult plain = reference::attention_fwd(q, k, v, a);
    a.softcap = 1e6;
    const AttnRefResult capped = reference::attention_fwd(q, k, v, a);
    expect_close(capped.out, plain.out, 1e-9, "out");
    expect_close(capped.lse, plain.lse, 1e-9, "lse");
  }
}

// (i) ALiBi: slope 0 is no ALiBi; a 2-key case by hand.
TEST(AttentionReference, AlibiClosedForms) {
  std::mt19937_64 rng(9);
  {
    AttnRefArgs a = fixed_args(1, 5, 7, 2, 2, 4);
    a.window_left = 2;
    const auto q = randn(5 * 2 * 4, rng), k = randn(7 * 2 * 4, rng), v = randn(7 * 2 * 4, rng);
    const AttnRefResult plain = reference::attention_fwd(q, k, v, a);
    a.alibi_slopes = {0.0, 0.0};
    const AttnRefResult zero = reference::attention_fwd(q, k, v, a);
    EXPECT_EQ(zero.out, plain.out);
    EXPECT_EQ(zero.lse, plain.lse);
  }
  {  // sq = 1, sk = 2, equal raw scores 0: key 0 is 1 from the diagonal, key 1 on it. With
     // slope ln 3: weights 1/3 : 1 -> 1/4, 3/4; out = 4/4 + 3*8/4 = 7; lse = log(4/3).
    AttnRefArgs a = fixed_args(1, 1, 2, 1, 1, 1);
    a.alibi_slopes = {std::log(3.0)};
    const AttnRefResult r = reference::attention_fwd({1.0}, {0.0, 0.0}, {4.0, 8.0}, a, true);
    EXPECT_NEAR(r.probs[0], 0.25, 1e-15);
    EXPECT_NEAR(r.probs[1], 0.75, 1e-15);
    EXPECT_NEAR(r.out[0], 7.0, 1e-14);
    EXPECT_NEAR(r.lse[0], std::log(4.0 / 3.0), 1e-15);
  }
}

// (j) probs: rows sum to 1 where any key is visible (0 otherwise), and out = probs @ v.
TEST(AttentionReference, ProbsSumToOneAndGiveOut) {
  std::mt19937_64 rng(10);
  const int64_t b = 2, sq = 7, sk = 4, H = 2, D = 5;
  AttnRefArgs a = fixed_args(b, sq, sk, H, H, D);
  a.causal = true, a.window_left = 1, a.softcap = 3.0;
  const auto q = randn(b * sq * H * D, rng), k = randn(b * sk * H * D, rng), v = randn(b * sk * H * D, rng);
  const AttnRefResult r = reference::attention_fwd(q, k, v, a, true);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        const double* p = &r.probs[((bb * H + h) * sq + i) * sk];
        const double lse = r.lse[h * (b * sq) + bb * sq + i];
        double sum = 0;
        for (int64_t j = 0; j < sk; ++j) sum += p[j];
        EXPECT_NEAR(sum, std::isinf(lse) ? 0.0 : 1.0, 1e-14) << bb << "," << h << "," << i;
        for (int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < sk; ++j) o += p[j] * v[((bb * sk + j) * H + h) * D + c];
          EXPECT_NEAR(r.out[((bb * sq + i) * H + h) * D + c], o, 1e-14);
        }
      }
}

TEST(AttentionReference, RejectsInconsistentSizes) {
  AttnRefArgs a = fixed_args(1, 2, 3, 2, 1, 4);
  const std::vector<double> q(2 * 2 * 4), k(3 * 4), v(3 * 4);
  EXPECT_NO_THROW(reference::attention_fwd(q, k, v, a));
  EXPECT_THROW(reference::attention_fwd(std::vector<double>(5), k, v, a), std::invalid_argument);
  EXPECT_THROW(reference::attention_fwd(q, k, std::vector<double>(11), a), std::invalid_argument);
  AttnRefArgs bad = a;
  bad.nheads = 3, bad.nheads_kv = 2;
  EXPECT_THROW(reference::attention_fwd(q, k, v, bad), std::invalid_argument);
  bad = a, bad.cu_seqlens_q = {0, 2, 1};
  EXPECT_THROW(reference::attention_fwd(q, k, v, bad), std::invalid_argument);
  bad = a, bad.cu_seqlens_k = {1, 3};
  EXPECT_THROW(reference::attention_fwd(q, k, v, bad), std::invalid_argument);
  bad = a, bad.alibi_slopes = {0.1, 0.2, 0.3};
  EXPECT_THROW(reference::attention_fwd(q, k, v, bad), std::invalid_argument);
  bad = a, bad.softcap = -1.0;
  EXPECT_THROW(reference::attention_fwd(q, k, v, bad), std::invalid_argument);
}

// (k) The naive same-dtype emulation is near the reference, at the dtype's rounding level, but
// not equal to it; fully masked rows stay 0 / -inf.
TEST(AttentionNaive, CloseToReferenceAtDtypeRounding) {
  std::mt19937_64 rng(11);
  const int64_t b = 2, sq = 40, sk = 33, H = 4, Hkv = 2, D = 64;
  AttnRefArgs a = fixed_args(b, sq, sk, H, Hkv, D);
  a.causal = true, a.softcap = 10.0, a.alibi_slopes = {0.25, 0.125, 0.0625, 0.03125};
  double err_bf16 = 0, err_f16 = 0;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const auto q = testing::random_tensor(dt, b * sq * H * D, rng, -2, 2).values;
    const auto k = testing::random_tensor(dt, b * sk * Hkv * D, rng, -2, 2).values;
    const auto v = testing::random_tensor(dt, b * sk * Hkv * D, rng).values;
    const AttnRefResult ref = reference::attention_fwd(q, k, v, a);
    const AttnRefResult nv = testing::attention_fwd_naive(q, k, v, a, dt);
    ASSERT_EQ(nv.out.size(), ref.out.size());
    ASSERT_EQ(nv.lse.size(), ref.lse.size());
    double err = 0, err_lse = 0;
    for (size_t i = 0; i < ref.out.size(); ++i) {
      ASSERT_FALSE(std::isnan(nv.out[i]));
      EXPECT_EQ(nv.out[i], testing::round_to(dt, nv.out[i]));  // out is a dt value
      err = std::max(err, std::fabs(nv.out[i] - ref.out[i]));
    }
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      ASSERT_EQ(std::isinf(nv.lse[i]), std::isinf(ref.lse[i])) << i;  // rows 0..6 of each batch: masked
      if (!std::isinf(ref.lse[i])) err_lse = std::max(err_lse, std::fabs(nv.lse[i] - ref.lse[i]));
    }
    const double u = testing::unit_roundoff(dt);
    EXPECT_GT(err, 0.0) << dtype_name(dt);
    EXPECT_LE(err, 4 * u) << dtype_name(dt);  // |out| <= 1 (a convex mix of v's in [-1, 1])
    EXPECT_GT(err, u / 16) << dtype_name(dt);
    EXPECT_LE(err_lse, 10.0 * 4 * u) << dtype_name(dt);  // |s| <= softcap = 10 before ALiBi
    (dt == DType::kBF16 ? err_bf16 : err_f16) = err;
  }
  EXPECT_LT(err_f16, err_bf16);
}

// ---- attention_bwd: the gradients of L = sum(dout * out), against central differences of the
// forward (float64: step 1e-5, truncation and rounding far below the 1e-7 tolerance).

struct GradCase {
  AttnRefArgs args;
  const char* what;
};

void expect_gradients_match_differences(const GradCase& gc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const AttnRefArgs& a = gc.args;
  const int64_t tq = a.cu_seqlens_q[a.batch], tk = a.cu_seqlens_k[a.batch];
  auto q = randn(tq * a.nheads * a.headdim, rng), k = randn(tk * a.nheads_kv * a.headdim, rng),
       v = randn(tk * a.nheads_kv * a.headdim, rng);
  const auto dout = randn(q.size(), rng);
  const reference::AttnBwdRefResult g = reference::attention_bwd(q, k, v, dout, a);
  ASSERT_EQ(g.dq.size(), q.size());
  ASSERT_EQ(g.dk.size(), k.size());
  ASSERT_EQ(g.dv.size(), v.size());
  const auto loss = [&] {
    const AttnRefResult r = reference::attention_fwd(q, k, v, a);
    double l = 0;
    for (size_t i = 0; i < r.out.size(); ++i) l += dout[i] * r.out[i];
    return l;
  };
  constexpr double kStep = 1e-5;
  double largest = 0;
  for (auto [x, grad, name] : {std::tuple{&q, &g.dq, "dq"}, std::tuple{&k, &g.dk, "dk"}, std::tuple{&v, &g.dv, "dv"}}) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double keep = (*x)[i];
      (*x)[i] = keep + kStep;
      const double up = loss();
      (*x)[i] = keep - kStep;
      const double down = loss();
      (*x)[i] = keep;
      const double fd = (up - down) / (2 * kStep);
      EXPECT_NEAR((*grad)[i], fd, 1e-7 * (1 + std::fabs(fd))) << gc.what << " " << name << "[" << i << "]";
      largest = std::max(largest, std::fabs(fd));
    }
  }
  EXPECT_GT(largest, 1e-3) << gc.what << ": the case has no gradient to check";
}

TEST(AttentionReferenceBackward, GradientsMatchCentralDifferences) {
  std::vector<GradCase> cases;
  cases.push_back({fixed_args(2, 5, 7, 4, 2, 3), "GQA 4/2"});
  {
    AttnRefArgs a = fixed_args(1, 9, 4, 2, 1, 3);  // sq > sk, causal: the first 5 rows see no key
    a.causal = true, a.window_left = 2;
    cases.push_back({a, "causal + window, fully masked rows"});
  }
  {
    AttnRefArgs a = fixed_args(2, 4, 6, 2, 2, 4);
    a.softcap = 0.7, a.alibi_slopes = {0.1, 0.3, 0.2, 0.05}, a.window_right = 1;
    cases.push_back({a, "softcap + ALiBi (batch, nheads) + right window"});
  }
  {
    AttnRefArgs a = fixed_args(3, 1, 1, 2, 1, 3);
    a.cu_seqlens_q = {0, 3, 3, 8}, a.cu_seqlens_k = {0, 0, 4, 9};  // batch 0 sees no key, batch 1 has no rows
    a.causal = true, a.alibi_slopes = {0.2, 0.4};
    cases.push_back({a, "varlen with empty sequences"});
  }
  {
    AttnRefArgs a = fixed_args(2, 5, 6, 2, 1, 3);  // dropout: a fixed keep mask, p = 0.3
    a.causal = true, a.dropout_p = 0.3;
    std::mt19937_64 rng(5);
    for (int64_t n = 0; n < 2 * 2 * 5 * 6; ++n) a.dropout_keep.push_back(rng() % 10 < 7 ? 1 : 0);
    cases.push_back({a, "dropout mask + causal + MQA"});
  }
  uint64_t seed = 100;
  for (const GradCase& gc : cases) expect_gradients_match_differences(gc, seed++);
}

// Dropout in the forward: every entry kept with p = 0.5 doubles the output (z = 2) and leaves the
// lse; every entry dropped gives 0. A mask of the wrong size is refused.
TEST(AttentionReference, DropoutWeights) {
  std::mt19937_64 rng(9);
  AttnRefArgs a = fixed_args(1, 3, 4, 2, 2, 5);
  const auto q = randn(3 * 2 * 5, rng), k = randn(4 * 2 * 5, rng), v = randn(4 * 2 * 5, rng);
  const AttnRefResult base = reference::attention_fwd(q, k, v, a);
  a.dropout_p = 0.5;
  a.dropout_keep.assign(1 * 2 * 3 * 4, 1);
  const AttnRefResult kept = reference::attention_fwd(q, k, v, a);
  std::vector<double> twice(base.out);
  for (double& x : twice) x *= 2;
  expect_close(kept.out, twice, 1e-12, "all kept, p = 0.5");
  expect_close(kept.lse, base.lse, 0.0, "lse");
  a.dropout_keep.assign(a.dropout_keep.size(), 0);
  expect_close(reference::attention_fwd(q, k, v, a).out, std::vector<double>(base.out.size(), 0.0), 0.0, "all dropped");
  a.dropout_keep.pop_back();
  EXPECT_THROW(reference::attention_fwd(q, k, v, a), std::invalid_argument);
}

// One key: out_i = v for every row, whatever q and k, so dq = dk = 0 and dv = sum_i dout_i.
TEST(AttentionReferenceBackward, OneKeyClosedForm) {
  std::mt19937_64 rng(7);
  const int64_t sq = 4, H = 2, D = 3;
  const AttnRefArgs a = fixed_args(1, sq, 1, H, 1, D);
  const auto q = randn(sq * H * D, rng), k = randn(D, rng), v = randn(D, rng), dout = randn(sq * H * D, rng);
  const reference::AttnBwdRefResult g = reference::attention_bwd(q, k, v, dout, a);
  std::vector<double> dv(D, 0.0);
  for (int64_t i = 0; i < sq * H; ++i)
    for (int64_t c = 0; c < D; ++c) dv[c] += dout[i * D + c];
  expect_close(g.dq, std::vector<double>(q.size(), 0.0), 1e-12, "dq");
  expect_close(g.dk, std::vector<double>(D, 0.0), 1e-12, "dk");
  expect_close(g.dv, dv, 1e-12, "dv");
}

TEST(AttentionReferenceBackward, RejectsAMisshapedDout) {
  const AttnRefArgs a = fixed_args(1, 2, 2, 1, 1, 2);
  const std::vector<double> x(4, 1.0);
  EXPECT_THROW(reference::attention_bwd(x, x, x, std::vector<double>(3, 1.0), a), std::invalid_argument);
}

// The naive same-dtype backward is near the reference at the dtype's rounding level (it is the
// yardstick of the backward rungs' tolerance, so it must be neither exact nor far off).
TEST(AttentionNaiveBackward, CloseToReferenceAtDtypeRounding) {
  std::mt19937_64 rng(12);
  const int64_t b = 2, sq = 24, sk = 31, H = 4, Hkv = 2, D = 32;
  AttnRefArgs plain = fixed_args(b, sq, sk, H, Hkv, D);
  plain.causal = true, plain.softcap = 10.0, plain.alibi_slopes = {0.25, 0.125, 0.0625, 0.03125};
  AttnRefArgs drop = plain;  // and with dropout (p = 0.25) in forward and backward
  drop.dropout_p = 0.25;
  for (int64_t n = 0; n < b * H * sq * sk; ++n) drop.dropout_keep.push_back(rng() % 4 != 0 ? 1 : 0);
  for (const AttnRefArgs* args : {&plain, &drop})
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const AttnRefArgs& a = *args;
    const auto q = testing::random_tensor(dt, b * sq * H * D, rng, -2, 2).values;
    const auto k = testing::random_tensor(dt, b * sk * Hkv * D, rng, -2, 2).values;
    const auto v = testing::random_tensor(dt, b * sk * Hkv * D, rng).values;
    const auto dout = testing::random_tensor(dt, b * sq * H * D, rng).values;
    const reference::AttnBwdRefResult ref = reference::attention_bwd(q, k, v, dout, a);
    const reference::AttnBwdRefResult nv = testing::attention_bwd_naive(q, k, v, dout, a, dt);
    {  // the forward of the same computation, with dropout when asked: |out| <= 1 / (1 - p)
      const AttnRefResult fr = reference::attention_fwd(q, k, v, a), fn = testing::attention_fwd_naive(q, k, v, a, dt);
      EXPECT_LE(testing::max_abs_err(fn.out, fr.out), 8 * testing::unit_roundoff(dt) / (1 - a.dropout_p))
          << dtype_name(dt) << " out";
    }
    const double u = testing::unit_roundoff(dt);
    for (auto [got, want, name] : {std::tuple{&nv.dq, &ref.dq, "dq"}, std::tuple{&nv.dk, &ref.dk, "dk"},
                                   std::tuple{&nv.dv, &ref.dv, "dv"}}) {
      ASSERT_EQ(got->size(), want->size()) << name;
      double err = 0, scale = 0;
      for (size_t i = 0; i < want->size(); ++i) {
        ASSERT_FALSE(std::isnan((*got)[i])) << name;
        EXPECT_EQ((*got)[i], testing::round_to(dt, (*got)[i])) << name;  // a dt value
        err = std::max(err, std::fabs((*got)[i] - (*want)[i]));
        scale = std::max(scale, std::fabs((*want)[i]));
      }
      // Measured 1.5-2.4 u max|ref| (bf16 and fp16): a few roundings deep.
      EXPECT_GT(err, u * scale / 16) << dtype_name(dt) << " " << name;
      EXPECT_LE(err, 8 * u * scale) << dtype_name(dt) << " " << name;
    }
  }
}

}  // namespace
}  // namespace flashlab
