// float64 reference of attention forward (include/flashlab/attention.h) and its gradients. Inputs are given
// already widened to double (the exact values the kernel reads), packed row-major; outputs
// are double. Independent of any kernel code: it is the oracle the rungs are held against.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

struct AttnRefArgs {
  int64_t batch = 1, nheads = 1, nheads_kv = 1, headdim = 1;
  // (batch + 1), packed row offsets; fixed length is cu_seqlens[b] = b * seqlen.
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;
  double scale = 1.0;  // already resolved (no 1/sqrt(d) default here)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1 unbounded; causal forces window_right = 0
  double softcap = 0.0;                         // > 0: s = softcap * tanh(s / softcap)
  std::vector<double> alibi_slopes;             // empty, (nheads), or (batch * nheads)
  // Dropout: empty (none), or (batch, nheads, max_sq, max_sk) with 1 where the entry is kept; a
  // kept p_ij weighs v_j by 1 / (1 - dropout_p) (lse and probs are those before dropout).
  std::vector<uint8_t> dropout_keep;
  double dropout_p = 0.0;  // in [0, 1)
};

struct AttnRefResult {
  std::vector<double> out;    // (total_q, nheads, headdim)
  std::vector<double> lse;    // (nheads, total_q); -inf for fully masked rows
  std::vector<double> probs;  // (batch, nheads, max_sq, max_sk) when asked; 0 past a batch's
                              // lengths and where masked
};

// q: (total_q, nheads, headdim), k, v: (total_k, nheads_kv, headdim), row-major packed, with
// total_q = cu_seqlens_q[batch], total_k = cu_seqlens_k[batch]. Per batch b, head h (KV head
// h / (nheads / nheads_kv)), row i, key j:
//   s = scale * q_i . k_j; softcap; minus slope * |i + sk - sq - j|; -inf where masked;
//   lse_i = log sum_j exp(s_ij) (max subtracted first); o_i = sum_j exp(s_ij - lse_i) z_ij v_j,
//   z_ij = dropout_keep / (1 - dropout_p) with dropout, else 1.
// A row with no visible key (or sk = 0) gives o_i = 0, lse_i = -inf, probs 0.
// Throws std::invalid_argument on inconsistent sizes or arguments.
AttnRefResult attention_fwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            const AttnRefArgs& args, bool want_probs = false);

struct AttnBwdRefResult {
  std::vector<double> dq;  // (total_q, nheads, headdim)
  std::vector<double> dk;  // (total_k, nheads_kv, headdim): summed over the query heads of a group
  std::vector<double> dv;  // (total_k, nheads_kv, headdim): likewise
};

// Gradients of L = sum(dout * out) for out = attention_fwd(q, k, v, args).out, dout shaped like
// out. With p_ij = exp(s_ij - lse_i) of the forward, z_ij its dropout weight and g = d s /
// d (q_i . k_j) (scale, times 1 - (s'/softcap)^2 with softcap, s' the capped score before ALiBi):
//   dv_j = sum_i p_ij z_ij do_i;  dp_ij = z_ij do_i . v_j;  D_i = sum_j p_ij dp_ij;
//   ds_ij = p_ij (dp_ij - D_i);  dq_i = sum_j ds_ij g_ij k_j;  dk_j = sum_i ds_ij g_ij q_i.
// Masked keys and rows that see no key contribute nothing. Throws like attention_fwd.
AttnBwdRefResult attention_bwd(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                               const std::vector<double>& dout, const AttnRefArgs& args);

// The mask rule alone: key j is kept for query i (diagonal aligned bottom-right, d = i + sk - sq)
// iff j >= d - window_left (window_left >= 0) and j <= d + window_right (window_right >= 0);
// causal takes window_right = 0. Range checks (0 <= j < sk) are the caller's.
bool attention_key_visible(int64_t i, int64_t j, int64_t sq, int64_t sk, bool causal, int64_t window_left,
                           int64_t window_right);

}  // namespace flashlab::reference
