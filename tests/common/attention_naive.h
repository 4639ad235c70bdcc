// Attention forward done the way a framework does it in a low-precision dtype (fp16 / bf16):
// the "naive same-dtype" computation of the tolerance rule (DESIGN.md, Tests). A kernel's error
// against the float64 reference (src/reference/attention.h) must be at most 2x this one's error
// plus a floor.
//
// Every tensor a framework materialises is rounded to dt; arithmetic inside one op is fp32:
//   1. S = Q K^T: fp32 accumulation, rounded to dt (a dt matmul's output)
//   2. S = scale * S; softcap * tanh(S / softcap); S - slope * |i + sk - sq - j|: each op in
//      fp32, rounded to dt
//   3. masked entries -inf; softmax in fp32 (max first), P rounded to dt; lse = m + log(l) in fp32
//   4. O = P V: fp32 accumulation, rounded to dt
// Fully masked rows (or sk = 0): O = 0, lse = -inf. Inputs are already dt values, given as double.
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
#include "tests/common/test_utils.h"

namespace flashlab::testing {

// Same arguments and layouts as reference::attention_fwd; returns out and lse (probs empty).
inline reference::AttnRefResult attention_fwd_naive(const std::vector<double>& q, const std::vector<double>& k,
                                                    const std::vector<double>& v, const reference::AttnRefArgs& a,
                                                    DType dt) {
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
          for (int64_t c = 0; c < D; ++c) acc += static_cast<float>(qi[c]) * static_cast<float>(kj[c]);
          float x = rd(scale * rd(acc));
          if (cap > 0.f) x = rd(cap * std::tanh(x / cap));
          if (n_slopes != 0) x = rd(x - slope * static_cast<float>(std::llabs(i + sk - sq - j)));
          if (!reference::attention_key_visible(i, j, sq, sk, a.causal, a.window_left, a.window_right)) x = -kInf;
          s[j] = x;
          m = std::max(m, x);
        }
        if (m == -kInf) continue;  // fully masked: out 0, lse -inf
        float l = 0.f;
        for (int64_t j = 0; j < sk; ++j) l += std::exp(s[j] - m);
        r.lse[h * total_q + q0 + i] = m + std::log(l);
        for (int64_t j = 0; j < sk; ++j) s[j] = rd(std::exp(s[j] - m) / l);
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

}  // namespace flashlab::testing
