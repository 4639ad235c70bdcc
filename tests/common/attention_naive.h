// Attention forward (and backward, below) done the way a framework does it in a low-precision
// dtype (fp16 / bf16):
// the "naive same-dtype" computation of the tolerance rule (DESIGN.md, Tests). A kernel's error
// against the float64 reference (src/reference/attention.h) must be at most 2x this one's error
// plus a floor.
//
// Every tensor a framework materialises is rounded to dt; arithmetic inside one op is fp32:
//   1. S = Q K^T: fp32 accumulation, rounded to dt (a dt matmul's output)
//   2. S = scale * S; softcap * tanh(S / softcap); S - slope * |i + sk - sq - j|: each op in
//      fp32, rounded to dt
//   3. masked entries -inf; softmax in fp32 (max first), P rounded to dt; lse = m + log(l) in fp32
//   4. dropout (a keep mask given): P z rounded to dt, z = keep / (1 - p)
//   5. O = P V: fp32 accumulation, rounded to dt
// Fully masked rows (or sk = 0): O = 0, lse = -inf. Inputs are already dt values, given as double.
//
// FP8 (attention_fwd_naive with a NaiveFp8): what an FP8 attention must do, in fp32, with e4m3
// q, k, v given dequantized: logits in fp32 (steps 1-2 without rounding), P = exp(s - max)
// rounded to e4m3 before P V (l sums the fp32 P), O = (sum e4m3(P) v) / l rounded to bf16 (dt).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#include "flashlab/tensor.h"
#include "src/reference/attention.h"
#include "src/reference/quant.h"
#include "tests/common/test_utils.h"

namespace flashlab::testing {

// Dropout weights as a framework applies them in fp32 (keep / (1 - p)), or 1 without dropout; the
// keep mask is (batch, nheads, max_sq, max_sk), its strides found once.
struct NaiveDropout {
  const reference::AttnRefArgs& a;
  int64_t max_sq = 0, max_sk = 0;
  explicit NaiveDropout(const reference::AttnRefArgs& args) : a(args) {
    for (int64_t x = 0; x < a.batch; ++x) {
      max_sq = std::max(max_sq, a.cu_seqlens_q[x + 1] - a.cu_seqlens_q[x]);
      max_sk = std::max(max_sk, a.cu_seqlens_k[x + 1] - a.cu_seqlens_k[x]);
    }
  }
  bool on() const { return !a.dropout_keep.empty(); }
  float weight(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!on()) return 1.f;
    return a.dropout_keep[((b * a.nheads + h) * max_sq + i) * max_sk + j] ? 1.f / (1.f - static_cast<float>(a.dropout_p)) : 0.f;
  }
};

// The FP8 variant of the naive forward; abs_logit is set to the largest scale x sum_c |q_c k_c|
// over the rows and keys (the bound of a logit's accumulation error, see the FP8 test).
struct NaiveFp8 {
  double abs_logit = 0;
};

// Same arguments and layouts as reference::attention_fwd; returns out and lse (probs empty).
// fp8: the FP8 computation (above), dt the output dtype.
inline reference::AttnRefResult attention_fwd_naive(const std::vector<double>& q, const std::vector<double>& k,
                                                    const std::vector<double>& v, const reference::AttnRefArgs& a,
                                                    DType dt, NaiveFp8* fp8 = nullptr) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t H = a.nheads, Hkv = a.nheads_kv, D = a.headdim;
  if (a.batch < 1 || H < 1 || Hkv < 1 || D < 1 || H % Hkv != 0 ||
      static_cast<int64_t>(a.cu_seqlens_q.size()) != a.batch + 1 ||
      static_cast<int64_t>(a.cu_seqlens_k.size()) != a.batch + 1)
    throw std::invalid_argument("attention_fwd_naive: inconsistent batch / heads / cu_seqlens");
  const int64_t total_q = a.cu_seqlens_q[a.batch], total_k = a.cu_seqlens_k[a.batch];
  const int64_t n_slopes = static_cast<int64_t>(a.alibi_slopes.size());
  if (static_cast<int64_t>(q.size()) != total_q * H * D || static_cast<int64_t>(k.size()) != total_k * Hkv * D ||
      static_cast<int64_t>(v.size()) != total_k * Hkv * D || (n_slopes != 0 && n_slopes != H && n_slopes != a.batch * H))
    throw std::invalid_argument("attention_fwd_naive: operand sizes do not match the arguments");
  auto rd = [dt](float x) { return static_cast<float>(round_to(dt, x)); };
  auto rd_logit = [&](float x) { return fp8 != nullptr ? x : rd(x); };  // FP8: fp32 logits
  const NaiveDropout drop(a);

  reference::AttnRefResult r;
  r.out.assign(static_cast<size_t>(total_q * H * D), 0.0);
  r.lse.assign(static_cast<size_t>(H * total_q), -static_cast<double>(kInf));
  const float scale = static_cast<float>(a.scale), cap = static_cast<float>(a.softcap);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t q0 = a.cu_seqlens_q[b], k0 = a.cu_seqlens_k[b];
    const int64_t sq = a.cu_seqlens_q[b + 1] - q0, sk = a.cu_seqlens_k[b + 1] - k0;
    std::vector<float> s(static_cast<size_t>(sk));  // (sk) one row of S, then of P
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      const float slope =
          n_slopes == 0 ? 0.f : static_cast<float>(n_slopes == H ? a.alibi_slopes[h] : a.alibi_slopes[b * H + h]);
      for (int64_t i = 0; i < sq; ++i) {
        const double* qi = &q[((q0 + i) * H + h) * D];
        float m = -kInf;
        for (int64_t j = 0; j < sk; ++j) {
          const double* kj = &k[((k0 + j) * Hkv + hk) * D];
          float acc = 0.f;
          double abs_sum = 0;
          for (int64_t c = 0; c < D; ++c) {
            acc += static_cast<float>(qi[c]) * static_cast<float>(kj[c]);
            if (fp8 != nullptr) abs_sum += std::fabs(qi[c] * kj[c]);
          }
          if (fp8 != nullptr) fp8->abs_logit = std::max(fp8->abs_logit, a.scale * abs_sum);
          float x = rd_logit(scale * rd_logit(acc));
          if (cap > 0.f) x = rd_logit(cap * std::tanh(x / cap));
          if (n_slopes != 0) x = rd_logit(x - slope * static_cast<float>(std::llabs(i + sk - sq - j)));
          if (!reference::attention_key_visible(i, j, sq, sk, a.causal, a.window_left, a.window_right)) x = -kInf;
          s[j] = x;
          m = std::max(m, x);
        }
        if (m == -kInf) continue;  // fully masked: out 0, lse -inf
        float l = 0.f;
        for (int64_t j = 0; j < sk; ++j) l += std::exp(s[j] - m);
        r.lse[h * total_q + q0 + i] = m + std::log(l);
        if (fp8 != nullptr) {  // e4m3(P) V / l
          for (int64_t j = 0; j < sk; ++j) s[j] = static_cast<float>(reference::round_e4m3(std::exp(s[j] - m)));
          for (int64_t c = 0; c < D; ++c) {
            float acc = 0.f;
            for (int64_t j = 0; j < sk; ++j) acc += s[j] * static_cast<float>(v[((k0 + j) * Hkv + hk) * D + c]);
            r.out[((q0 + i) * H + h) * D + c] = rd(acc / l);
          }
          continue;
        }
        for (int64_t j = 0; j < sk; ++j) s[j] = rd(std::exp(s[j] - m) / l);
        if (drop.on())  // dropout: a dt tensor P * z
          for (int64_t j = 0; j < sk; ++j) s[j] = rd(s[j] * drop.weight(b, h, i, j));
        for (int64_t c = 0; c < D; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < sk; ++j) acc += s[j] * static_cast<float>(v[((k0 + j) * Hkv + hk) * D + c]);
          r.out[((q0 + i) * H + h) * D + c] = rd(acc);
        }
      }
    }
  }
  return r;
}

// The backward of the same framework computation (autograd through the ops above, every
// materialised gradient rounded to dt, arithmetic inside one op fp32), for the tolerance rule of
// the backward rungs:
//   1. the forward above (S, P, O in dt; P = softmax of the rounded logits)
//   2. dV = (P z)^T dO, dP = dO V^T: fp32 accumulation, rounded to dt; with dropout dP z rounded
//   3. dS = P (dP - rowsum(P dP)) in fp32, rounded to dt (softmax backward); masked entries 0
//   4. softcap: dX = dS (1 - tanh^2(x / softcap)) rounded; scale: dQK = scale dX rounded
//   5. dQ = dQK K, dK = dQK^T Q: fp32 accumulation, rounded to dt
//   6. GQA: the group's per-head dK, dV (each a dt tensor) summed in fp32, rounded to dt
// Same arguments and layouts as reference::attention_bwd.
inline reference::AttnBwdRefResult attention_bwd_naive(const std::vector<double>& q, const std::vector<double>& k,
                                                       const std::vector<double>& v, const std::vector<double>& dout,
                                                       const reference::AttnRefArgs& a, DType dt) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t H = a.nheads, Hkv = a.nheads_kv, D = a.headdim, group = H / std::max<int64_t>(Hkv, 1);
  if (dout.size() != q.size()) throw std::invalid_argument("attention_bwd_naive: dout must be shaped like q");
  (void)attention_fwd_naive(q, k, v, a, dt);  // the same argument checks
  const int64_t total_k = a.cu_seqlens_k[a.batch];
  const int64_t n_slopes = static_cast<int64_t>(a.alibi_slopes.size());
  auto rd = [dt](float x) { return static_cast<float>(round_to(dt, x)); };
  const NaiveDropout drop(a);
  const float scale = static_cast<float>(a.scale), cap = static_cast<float>(a.softcap);

  reference::AttnBwdRefResult g;
  g.dq.assign(q.size(), 0.0);
  // Per query head (before the GQA sum): (total_k, H, D).
  std::vector<float> dk_h(static_cast<size_t>(total_k * H * D), 0.f), dv_h(dk_h.size(), 0.f);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t q0 = a.cu_seqlens_q[b], k0 = a.cu_seqlens_k[b];
    const int64_t sq = a.cu_seqlens_q[b + 1] - q0, sk = a.cu_seqlens_k[b + 1] - k0;
    // This (batch, head)'s matrices, row-major (sq, sk): the pre-cap logits X, P, dQK.
    std::vector<float> x(static_cast<size_t>(sq * sk)), p(x.size()), pz(x.size()), dqk(x.size());
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      const float slope =
          n_slopes == 0 ? 0.f : static_cast<float>(n_slopes == H ? a.alibi_slopes[h] : a.alibi_slopes[b * H + h]);
      const auto qv = [&](int64_t i, int64_t c) { return static_cast<float>(q[((q0 + i) * H + h) * D + c]); };
      const auto kv = [&](int64_t j, int64_t c) { return static_cast<float>(k[((k0 + j) * Hkv + hk) * D + c]); };
      const auto vv = [&](int64_t j, int64_t c) { return static_cast<float>(v[((k0 + j) * Hkv + hk) * D + c]); };
      const auto dov = [&](int64_t i, int64_t c) { return static_cast<float>(dout[((q0 + i) * H + h) * D + c]); };
      for (int64_t i = 0; i < sq; ++i) {  // forward: S and P as attention_fwd_naive
        float m = -kInf;
        std::vector<float> s(static_cast<size_t>(sk));
        for (int64_t j = 0; j < sk; ++j) {
          float acc = 0.f;
          for (int64_t c = 0; c < D; ++c) acc += qv(i, c) * kv(j, c);
          float xs = rd(scale * rd(acc));
          x[i * sk + j] = xs;
          if (cap > 0.f) xs = rd(cap * std::tanh(xs / cap));
          if (n_slopes != 0) xs = rd(xs - slope * static_cast<float>(std::llabs(i + sk - sq - j)));
          if (!reference::attention_key_visible(i, j, sq, sk, a.causal, a.window_left, a.window_right)) xs = -kInf;
          s[j] = xs;
          m = std::max(m, xs);
        }
        float l = 0.f;
        if (m != -kInf)
          for (int64_t j = 0; j < sk; ++j) l += std::exp(s[j] - m);
        for (int64_t j = 0; j < sk; ++j) {
          p[i * sk + j] = m == -kInf ? 0.f : rd(std::exp(s[j] - m) / l);
          pz[i * sk + j] = drop.on() ? rd(p[i * sk + j] * drop.weight(b, h, i, j)) : p[i * sk + j];
        }
      }
      for (int64_t i = 0; i < sq; ++i) {  // dP, dS, dQK of row i
        std::vector<float> dp(static_cast<size_t>(sk));
        float rowsum = 0.f;
        for (int64_t j = 0; j < sk; ++j) {
          float acc = 0.f;
          for (int64_t c = 0; c < D; ++c) acc += dov(i, c) * vv(j, c);
          dp[j] = rd(acc);
          if (drop.on()) dp[j] = rd(dp[j] * drop.weight(b, h, i, j));
          rowsum += p[i * sk + j] * dp[j];
        }
        for (int64_t j = 0; j < sk; ++j) {
          float ds = rd(p[i * sk + j] * (dp[j] - rowsum));
          if (cap > 0.f) {
            const float t = std::tanh(x[i * sk + j] / cap);
            ds = rd(ds * (1.f - t * t));
          }
          dqk[i * sk + j] = rd(scale * ds);
        }
      }
      for (int64_t i = 0; i < sq; ++i)  // dQ = dQK K
        for (int64_t c = 0; c < D; ++c) {
          float acc = 0.f;
          for (int64_t j = 0; j < sk; ++j) acc += dqk[i * sk + j] * kv(j, c);
          g.dq[((q0 + i) * H + h) * D + c] = rd(acc);
        }
      for (int64_t j = 0; j < sk; ++j)  // dK = dQK^T Q, dV = P^T dO (this query head)
        for (int64_t c = 0; c < D; ++c) {
          float acc_k = 0.f, acc_v = 0.f;
          for (int64_t i = 0; i < sq; ++i) acc_k += dqk[i * sk + j] * qv(i, c), acc_v += pz[i * sk + j] * dov(i, c);
          dk_h[((k0 + j) * H + h) * D + c] = rd(acc_k);
          dv_h[((k0 + j) * H + h) * D + c] = rd(acc_v);
        }
    }
  }
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  for (int64_t r = 0; r < total_k; ++r)  // GQA: sum the group's heads
    for (int64_t hk = 0; hk < Hkv; ++hk)
      for (int64_t c = 0; c < D; ++c) {
        float sk_ = 0.f, sv_ = 0.f;
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) sk_ += dk_h[(r * H + h) * D + c], sv_ += dv_h[(r * H + h) * D + c];
        g.dk[(r * Hkv + hk) * D + c] = rd(sk_);
        g.dv[(r * Hkv + hk) * D + c] = rd(sv_);
      }
  return g;
}

}  // namespace flashlab::testing
