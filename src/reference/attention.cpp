#include "src/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashlab::reference {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("reference::attention_fwd: " + what);
}

// Checks cu_seqlens (batch + 1, starts at 0, non-decreasing); returns the longest length.
int64_t check_cu_seqlens(const std::vector<int64_t>& cu, int64_t batch, const char* name) {
  check(static_cast<int64_t>(cu.size()) == batch + 1, std::string(name) + " must have batch + 1 entries");
  check(cu[0] == 0, std::string(name) + "[0] must be 0");
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    check(cu[b + 1] >= cu[b], std::string(name) + " must be non-decreasing");
    longest = std::max(longest, cu[b + 1] - cu[b]);
  }
  return longest;
}

}  // namespace

bool attention_key_visible(int64_t i, int64_t j, int64_t sq, int64_t sk, bool causal, int64_t window_left,
                           int64_t window_right) {
  if (causal) window_right = 0;
  const int64_t d = i + sk - sq;  // the key on row i's diagonal
  if (window_left >= 0 && j < d - window_left) return false;
  if (window_right >= 0 && j > d + window_right) return false;
  return true;
}

namespace {

// Every argument check shared by attention_fwd and attention_bwd; returns (max_sq, max_sk).
std::pair<int64_t, int64_t> check_args(const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v, const AttnRefArgs& a) {
  check(a.batch >= 1 && a.nheads >= 1 && a.nheads_kv >= 1 && a.headdim >= 1,
        "batch, nheads, nheads_kv, headdim must be >= 1");
  check(a.nheads % a.nheads_kv == 0, "nheads must be a multiple of nheads_kv");
  const int64_t max_sq = check_cu_seqlens(a.cu_seqlens_q, a.batch, "cu_seqlens_q");
  const int64_t max_sk = check_cu_seqlens(a.cu_seqlens_k, a.batch, "cu_seqlens_k");
  const int64_t total_q = a.cu_seqlens_q[a.batch], total_k = a.cu_seqlens_k[a.batch];
  const int64_t H = a.nheads, Hkv = a.nheads_kv, D = a.headdim;
  check(static_cast<int64_t>(q.size()) == total_q * H * D, "q must hold total_q * nheads * headdim values");
  check(static_cast<int64_t>(k.size()) == total_k * Hkv * D, "k must hold total_k * nheads_kv * headdim values");
  check(static_cast<int64_t>(v.size()) == total_k * Hkv * D, "v must hold total_k * nheads_kv * headdim values");
  check(std::isfinite(a.scale), "scale must be finite");
  check(std::isfinite(a.softcap) && a.softcap >= 0.0, "softcap must be finite and >= 0");
  check(a.window_left >= -1 && a.window_right >= -1, "window_left / window_right must be >= -1");
  const int64_t n_slopes = static_cast<int64_t>(a.alibi_slopes.size());
  check(n_slopes == 0 || n_slopes == H || n_slopes == a.batch * H,
        "alibi_slopes must be empty, (nheads) or (batch * nheads)");
  check(a.dropout_p >= 0.0 && a.dropout_p < 1.0, "dropout_p must be in [0, 1)");
  check(a.dropout_keep.empty() || static_cast<int64_t>(a.dropout_keep.size()) == a.batch * H * max_sq * max_sk,
        "dropout_keep must be empty or (batch, nheads, max_sq, max_sk)");
  return {max_sq, max_sk};
}

// ALiBi slope of (batch b, head h): 0 without slopes.
double alibi_slope(const AttnRefArgs& a, int64_t b, int64_t h) {
  const size_t n = a.alibi_slopes.size();
  return n == 0 ? 0.0 : static_cast<int64_t>(n) == a.nheads ? a.alibi_slopes[h] : a.alibi_slopes[b * a.nheads + h];
}

// The dropout weight z of (batch b, head h, row i, key j): keep / (1 - p), or 1 without dropout.
double dropout_weight(const AttnRefArgs& a, int64_t max_sq, int64_t max_sk, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (a.dropout_keep.empty()) return 1.0;
  return a.dropout_keep[((b * a.nheads + h) * max_sq + i) * max_sk + j] ? 1.0 / (1.0 - a.dropout_p) : 0.0;
}

// One query row of one (batch, head): where its sequences start, their lengths, its KV head.
struct Row {
  int64_t b, h, hk, i;  // batch, query head, its KV head, row within the batch
  int64_t q0, k0;       // first packed row of the batch's q and k
  int64_t sq, sk;       // the batch's lengths
  double slope;         // ALiBi slope of (b, h), 0 without
};

// Calls fn(row) for every query row of every (batch, head), in packed order per head.
template <typename F>
void for_each_row(const AttnRefArgs& a, F&& fn) {
  const int64_t group = a.nheads / a.nheads_kv;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t q0 = a.cu_seqlens_q[b], k0 = a.cu_seqlens_k[b];
    const int64_t sq = a.cu_seqlens_q[b + 1] - q0, sk = a.cu_seqlens_k[b + 1] - k0;
    for (int64_t h = 0; h < a.nheads; ++h)
      for (int64_t i = 0; i < sq; ++i) fn(Row{b, h, h / group, i, q0, k0, sq, sk, alibi_slope(a, b, h)});
  }
}

// The logit of row r and key j from the dot product q_i . k_j, and its derivative in that dot
// product; -inf (derivative 0) where the key is masked.
struct Logit {
  double s, ds_ddot;
};
Logit logit(const AttnRefArgs& a, const Row& r, int64_t j, double dot) {
  if (!attention_key_visible(r.i, j, r.sq, r.sk, a.causal, a.window_left, a.window_right))
    return {-std::numeric_limits<double>::infinity(), 0.0};
  double x = a.scale * dot, dx = a.scale;
  if (a.softcap > 0.0) {
    const double t = std::tanh(x / a.softcap);
    x = a.softcap * t;
    dx *= 1.0 - t * t;
  }
  if (!a.alibi_slopes.empty()) x -= r.slope * static_cast<double>(std::llabs(r.i + r.sk - r.sq - j));
  return {x, dx};
}

double dot(const double* x, const double* y, int64_t n) {
  double s = 0.0;
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}

}  // namespace

AttnRefResult attention_fwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            const AttnRefArgs& a, bool want_probs) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto [max_sq, max_sk] = check_args(q, k, v, a);
  const int64_t total_q = a.cu_seqlens_q[a.batch];
  const int64_t H = a.nheads, Hkv = a.nheads_kv, D = a.headdim;

  AttnRefResult res;
  res.out.assign(static_cast<size_t>(total_q * H * D), 0.0);
  res.lse.assign(static_cast<size_t>(H * total_q), -kInf);
  if (want_probs) res.probs.assign(static_cast<size_t>(a.batch * H * max_sq * max_sk), 0.0);
  std::vector<double> s(static_cast<size_t>(max_sk));  // (sk) scores of one row
  for_each_row(a, [&](const Row& r) {
    const double* qi = &q[((r.q0 + r.i) * H + r.h) * D];  // (D)
    double m = -kInf;
    for (int64_t j = 0; j < r.sk; ++j) {
      s[j] = logit(a, r, j, dot(qi, &k[((r.k0 + j) * Hkv + r.hk) * D], D)).s;
      m = std::max(m, s[j]);
    }
    if (m == -kInf) return;  // no visible key (or sk = 0): out 0, lse -inf, probs 0
    double l = 0.0;
    for (int64_t j = 0; j < r.sk; ++j) l += std::exp(s[j] - m);  // exp(-inf) = 0 for masked keys
    const double lse = m + std::log(l);
    res.lse[r.h * total_q + r.q0 + r.i] = lse;
    double* oi = &res.out[((r.q0 + r.i) * H + r.h) * D];  // (D)
    double* pi = want_probs ? &res.probs[((r.b * H + r.h) * max_sq + r.i) * max_sk] : nullptr;  // (max_sk)
    for (int64_t j = 0; j < r.sk; ++j) {
      if (s[j] == -kInf) continue;
      const double p = std::exp(s[j] - lse);
      if (pi) pi[j] = p;
      const double pz = p * dropout_weight(a, max_sq, max_sk, r.b, r.h, r.i, j);
      const double* vj = &v[((r.k0 + j) * Hkv + r.hk) * D];  // (D)
      for (int64_t c = 0; c < D; ++c) oi[c] += pz * vj[c];
    }
  });
  return res;
}

AttnBwdRefResult attention_bwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                               const std::vector<double>& dout, const AttnRefArgs& a) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto [max_sq, max_sk] = check_args(q, k, v, a);
  check(dout.size() == q.size(), "dout must be shaped like q (total_q * nheads * headdim values)");
  const AttnRefResult fwd = attention_fwd(q, k, v, a);
  const int64_t total_q = a.cu_seqlens_q[a.batch];
  const int64_t H = a.nheads, Hkv = a.nheads_kv, D = a.headdim;
  AttnBwdRefResult g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  // Of one row, per key: p_ij, z_ij, dp_ij = z_ij do_i . v_j, and d s_ij / d (q_i . k_j).
  std::vector<double> p(static_cast<size_t>(max_sk)), z(p.size()), dp(p.size()), grad(p.size());
  for_each_row(a, [&](const Row& r) {
    const double lse = fwd.lse[r.h * total_q + r.q0 + r.i];
    if (lse == -kInf) return;  // no visible key: out 0 whatever q, k, v
    const double* qi = &q[((r.q0 + r.i) * H + r.h) * D];     // (D)
    const double* doi = &dout[((r.q0 + r.i) * H + r.h) * D];  // (D)
    double di = 0.0;  // D_i = sum_j p_ij dp_ij
    for (int64_t j = 0; j < r.sk; ++j) {
      const double* kj = &k[((r.k0 + j) * Hkv + r.hk) * D];
      const Logit x = logit(a, r, j, dot(qi, kj, D));
      p[j] = x.s == -kInf ? 0.0 : std::exp(x.s - lse);
      z[j] = dropout_weight(a, max_sq, max_sk, r.b, r.h, r.i, j);
      dp[j] = z[j] * dot(doi, &v[((r.k0 + j) * Hkv + r.hk) * D], D);
      grad[j] = x.ds_ddot;
      di += p[j] * dp[j];
    }
    double* dqi = &g.dq[((r.q0 + r.i) * H + r.h) * D];
    for (int64_t j = 0; j < r.sk; ++j) {
      if (p[j] == 0.0) continue;  // masked (or underflowed): no contribution
      const double* kj = &k[((r.k0 + j) * Hkv + r.hk) * D];
      double* dkj = &g.dk[((r.k0 + j) * Hkv + r.hk) * D];
      double* dvj = &g.dv[((r.k0 + j) * Hkv + r.hk) * D];
      const double ddot = p[j] * (dp[j] - di) * grad[j];  // dL / d(q_i . k_j)
      for (int64_t c = 0; c < D; ++c) {
        dvj[c] += p[j] * z[j] * doi[c];
        dqi[c] += ddot * kj[c];
        dkj[c] += ddot * qi[c];
      }
    }
  });
  return g;
}

}  // namespace flashlab::reference
