// Host side of the attention backward ladder: the forward's checks on q, k, v, out and the
// options (src/attention_validate.h), the backward's own on dout, dq, dk, dv and the lse, then
// dispatch to a rung.
#include <climits>
#include <cstdint>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/validate.h"
#include "kernels/attention/backward/01_naive.cuh"
#include "src/attention_launch.h"
#include "src/attention_validate.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "attention_bwd";

// Element strides of a (batch, seq, heads, d) or packed (total, heads, d) tensor as the kernels
// take them: (batch, row, head), batch 0 for packed.
struct Strides3 {
  int64_t batch, row, head;
};
Strides3 strides_of(const TensorView& t, bool varlen) {
  return varlen ? Strides3{0, t.strides[0], t.strides[1]} : Strides3{t.strides[0], t.strides[1], t.strides[2]};
}


// The automatic choice: rung 1 when deterministic; rung 2 with dropout, or off sm_90, or for
// head dims rung 3 does not take (or strides TMA cannot walk, or softcap at head dim 256); rung 3
// otherwise.
int resolved_rung(int rung, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                  const AttnBwdOptions& opt) {
  if (rung != kAttnBwdRungAuto) return rung;
  if (opt.deterministic) return 1;
  const int64_t d = q.shape[q.ndim() - 1];
  if (opt.dropout_p > 0.f || !attn_bwd_rung3_takes(d, opt.softcap > 0.f)) return 2;
  if (!(detail::tma_strides(q) && detail::tma_strides(k) && detail::tma_strides(v) && detail::tma_strides(dout))) return 2;
  detail::DeviceGuard guard(q.device.index);
  return detail::cc_major() == 9 ? 3 : 2;
}

// The forward's checks, then the backward's; the kernel parameters.
AttnBwdParams validated_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               int rung, const AttnBwdOptions& opt, cudaStream_t stream) {
  FLASHLAB_CHECK(rung == kAttnBwdRungAuto || (rung >= 1 && rung <= kAttnBwdRungs), kOp, ": argument 'rung': expected 1..",
                 kAttnBwdRungs, " or ", kAttnBwdRungAuto, " (auto), got ", rung);
  FLASHLAB_CHECK(!(opt.deterministic && rung >= 2), kOp, ": argument 'deterministic': expected false for rung ", rung,
                 " (its dQ atomics add in a varying order; rung 1 or auto is deterministic), got true");
  const check::Arg Q{kOp, "q", q}, K{kOp, "k", k}, V{kOp, "v", v}, O{kOp, "out", out}, dO{kOp, "dout", dout},
      dQ{kOp, "dq", dq}, dK{kOp, "dk", dk}, dV{kOp, "dv", dv};
  check::dtype_in(Q, {DType::kF16, DType::kBF16});  // no FP8 backward
  FLASHLAB_CHECK(opt.softmax_lse != nullptr, kOp,
                 ": argument 'softmax_lse': expected the forward's log-sum-exp (the backward recomputes P from it), got none");
  FLASHLAB_CHECK(opt.attn_probs == nullptr, kOp, ": argument 'attn_probs': expected none (a forward output), got a tensor");
  const bool varlen = opt.cu_seqlens_q != nullptr;
  // The gradients' checks and rung 3's: host-side, run by the shared validation after its own host checks and
  // before it reads cu_seqlens from the device.
  const auto gradient_checks = [&] {
    const int rank = varlen ? 3 : 4;
    for (const check::Arg* x : {&dO, &dQ, &dK, &dV}) {
      check::cuda(*x);
      check::same_device(*x, Q);
      check::ndim(*x, rank);
      check::last_dim_contiguous(*x);
      check::dtype_eq(*x, Q);
      check::aligned_rows(*x);
    }
    check::shape_eq(dO, O);
    check::shape_eq(dQ, Q);
    check::shape_eq(dK, K);
    check::shape_eq(dV, K);
    // The outputs: disjoint from every input, each other and themselves.
    const check::Arg L{kOp, "softmax_lse", *opt.softmax_lse};
    std::vector<check::Arg> reads{Q, K, V, O, dO, L};
    if (varlen) reads.push_back({kOp, "cu_seqlens_q", *opt.cu_seqlens_q}), reads.push_back({kOp, "cu_seqlens_k", *opt.cu_seqlens_k});
    if (opt.alibi_slopes != nullptr) reads.push_back({kOp, "alibi_slopes", *opt.alibi_slopes});
    for (const check::Arg* w : {&dQ, &dK, &dV}) {
      detail::attention_no_self_overlap(*w);
      for (const check::Arg& r : reads) check::disjoint(*w, r);
    }
    check::disjoint(dQ, dK);
    check::disjoint(dQ, dV);
    check::disjoint(dK, dV);
    if (rung == 3) {  // TMA + wgmma: 64-column boxes of positive strides, built for sm_90a only
      const int64_t d = q.shape[q.ndim() - 1];
      if (!attn_bwd_rung3_head_dim(d)) check::fail(Q, "head dim (last dim) 64, 128 or 256 for rung 3", detail::concat(d));
      FLASHLAB_CHECK(attn_bwd_rung3_takes(d, opt.softcap > 0.f), kOp,
                     ": argument 'softcap': expected 0 at head dim 256 for rung 3 (rung 2 or auto takes it), got ", opt.softcap);
      FLASHLAB_CHECK(!(opt.dropout_p > 0.f), kOp, ": argument 'dropout_p': expected 0 for rung 3 (rung 2 or auto takes dropout), got ",
                     opt.dropout_p);
      for (const check::Arg* x : {&Q, &K, &V, &dO})
        if (!detail::tma_strides(x->t))
          check::fail(*x, "positive strides on every dim of size > 1 for rung 3 (TMA)", detail::concat("strides ", shape_str(x->t.strides)));
      detail::DeviceGuard guard(q.device.index);
      if (detail::cc_major() != 9)
        check::fail(Q, "a device of compute capability 9.x (sm_90a: TMA, wgmma) for rung 3",
                    detail::concat("compute capability ", detail::cc_major(), ".x"));
    }
  };
  // q, k, v, out, the options and the lse's shape: exactly the forward's rules.
  AttnBwdParams p{};
  static_cast<AttnFwdParams&>(p) =
      detail::attention_validated_params(kOp, q, k, v, out, kAttnFwdRungAuto, opt, stream, gradient_checks);

  p.dout = dout.data, p.dq = dq.data, p.dk = dk.data, p.dv = dv.data;
  const Strides3 so = strides_of(dout, varlen), sq = strides_of(dq, varlen), sk = strides_of(dk, varlen),
                 sv = strides_of(dv, varlen);
  p.dout_batch_stride = so.batch, p.dout_row_stride = so.row, p.dout_head_stride = so.head;
  p.dq_batch_stride = sq.batch, p.dq_row_stride = sq.row, p.dq_head_stride = sq.head;
  p.dk_batch_stride = sk.batch, p.dk_row_stride = sk.row, p.dk_head_stride = sk.head;
  p.dv_batch_stride = sv.batch, p.dv_row_stride = sv.row, p.dv_head_stride = sv.head;
  return p;
}

template <typename T>
void launch_naive(AttnBwdParams p, cudaStream_t stream) {
  const int64_t mat = static_cast<int64_t>(p.batch) * p.nheads * p.seqlen_q * p.seqlen_k;
  auto* ws = static_cast<float*>(
      detail::workspace(stream, attention_bwd_workspace_bytes(1, p.batch, p.nheads, p.seqlen_q, p.seqlen_k, p.headdim)));
  float* prob = ws;
  float* dsg = ws + mat;
  p.dsum = ws + 2 * mat;
  p.dsum_rows = p.seqlen_q;
  const dim3 tile(32, 8);
  // Varlen max lengths may be 0 (no rows, or no keys, in any sequence): those grids are empty.
  // dq is still written (0) without keys, dk and dv (0) without rows.
  if (p.seqlen_q > 0) {
    const dim3 rows_grid(static_cast<unsigned>(detail::ceil_div(p.seqlen_q, 128)), p.nheads, p.batch);
    FLASHLAB_LAUNCH(kernels::attn_bwd_naive_dsum_kernel<T>, rows_grid, 128, 0, stream, p);
    if (p.seqlen_k > 0) {
      const dim3 ds_grid(static_cast<unsigned>(detail::ceil_div(p.seqlen_k, 32) * detail::ceil_div(p.seqlen_q, 8)), p.nheads,
                         p.batch);
      FLASHLAB_LAUNCH(kernels::attn_bwd_naive_ds_kernel<T>, ds_grid, tile, 0, stream, p, prob, dsg);
    }
    const dim3 dq_grid(static_cast<unsigned>(detail::ceil_div(p.headdim, 32) * detail::ceil_div(p.seqlen_q, 8)), p.nheads,
                       p.batch);
    FLASHLAB_LAUNCH(kernels::attn_bwd_naive_dq_kernel<T>, dq_grid, tile, 0, stream, p, dsg);
  }
  if (p.seqlen_k > 0) {
    const dim3 dkdv_grid(static_cast<unsigned>(detail::ceil_div(p.headdim, 32) * detail::ceil_div(p.seqlen_k, 8)),
                         p.nheads_kv, p.batch);
    FLASHLAB_LAUNCH(kernels::attn_bwd_naive_dkdv_kernel<T>, dkdv_grid, tile, 0, stream, p, prob, dsg);
  }
}

}  // namespace

int64_t attention_bwd_workspace_bytes(int rung, int64_t batch, int64_t nheads, int64_t seqlen_q, int64_t seqlen_k,
                                      int64_t headdim) {
  constexpr const char* op = "attention_bwd_workspace_bytes";
  if (rung != kAttnBwdRungAuto) check::rung(op, rung, kAttnBwdRungs);
  FLASHLAB_CHECK(batch >= 0 && nheads >= 0 && seqlen_q >= 0 && seqlen_k >= 0 && headdim >= 0, op,
                 ": expected sizes >= 0, got batch ", batch, ", nheads ", nheads, ", seqlen_q ", seqlen_q, ", seqlen_k ",
                 seqlen_k, ", headdim ", headdim);
  constexpr int64_t kMaxFloats = INT64_MAX / static_cast<int64_t>(sizeof(float));
  int64_t rows = 1;  // batch x nheads x seqlen_q
  for (int64_t x : {batch, nheads, seqlen_q}) {
    FLASHLAB_CHECK(x == 0 || rows <= kMaxFloats / x, op, ": the size overflows int64");
    rows *= x;
  }
  if (rung == 1) {  // 2 rows seqlen_k + rows floats: P, dS g, D
    FLASHLAB_CHECK(seqlen_k == 0 || rows <= (kMaxFloats - rows) / 2 / seqlen_k, op, ": the size overflows int64");
    return (2 * rows * seqlen_k + rows) * static_cast<int64_t>(sizeof(float));
  }
  // Rungs 2 and 3: the dq accumulator, D and lse log2(e), each for batch x nheads x seqlen_q rounded up
  // to a query block (rows_padded; the accumulator headdim floats a row).
  const int64_t blocks = seqlen_q / kAttnBwdRowPad + (seqlen_q % kAttnBwdRowPad != 0);
  const int64_t heads = seqlen_q > 0 ? rows / seqlen_q : 0;  // batch x nheads (fits: rows did)
  FLASHLAB_CHECK(heads == 0 || blocks <= kMaxFloats / 2 / kAttnBwdRowPad / heads, op, ": the size overflows int64");
  const int64_t rows_padded = heads * blocks * kAttnBwdRowPad;
  FLASHLAB_CHECK(rows_padded == 0 || headdim <= kMaxFloats / rows_padded - 2, op, ": the size overflows int64");
  return rows_padded * (headdim + 2) * static_cast<int64_t>(sizeof(float));
}

namespace {

// attention_bwd; main: nullptr (the rung's own main kernel) or a stand-in for rung 2's or 3's.
void attention_bwd_impl(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        cudaStream_t stream, int rung, const AttnBwdOptions& options, detail::AttnBwdMainLaunch main) {
  AttnBwdParams p = validated_params(q, k, v, out, dout, dq, dk, dv, rung, options, stream);
  detail::DeviceGuard guard(q.device.index);
  rung = resolved_rung(rung, q, k, v, dout, options);
  if (rung == 1) return HALF_DTYPE_SWITCH(q.dtype, T, [&] { launch_naive<T>(p, stream); });
  auto* ws = static_cast<float*>(
      detail::workspace(stream, attention_bwd_workspace_bytes(2, p.batch, p.nheads, p.seqlen_q, p.seqlen_k, p.headdim)));
  p.dsum_rows = static_cast<int>(detail::ceil_div(p.seqlen_q, kAttnBwdRowPad) * kAttnBwdRowPad);
  p.dq_accum = ws;  // batch x nheads x dsum_rows x headdim (rung 3 uses batch x seqlen_q >= total_q rows of it)
  p.dq_accum_tiled = rung == 2;
  p.dsum = ws + static_cast<int64_t>(p.batch) * p.nheads * p.dsum_rows * p.headdim;
  p.lse_log2 = p.dsum + static_cast<int64_t>(p.batch) * p.nheads * p.dsum_rows;
  detail::launch_attn_bwd_preprocess(p, q.dtype, stream);
  if (main != nullptr) main(p, q.dtype, stream);
  else if (rung == 3) detail::launch_attn_bwd_hopper(p, q.dtype, stream);
  else detail::launch_attn_bwd_flash2(p, q.dtype, stream);
  detail::launch_attn_bwd_dq_convert(p, q.dtype, stream);
}

}  // namespace

void attention_bwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   cudaStream_t stream, int rung, const AttnBwdOptions& options) {
  attention_bwd_impl(q, k, v, out, dout, dq, dk, dv, stream, rung, options, nullptr);
}

void detail::attention_bwd_with_main(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                     const TensorView& dout, const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, cudaStream_t stream, int rung, const AttnBwdOptions& options,
                                     AttnBwdMainLaunch main) {
  FLASHLAB_CHECK(rung == 2 || rung == 3, "attention_bwd_with_main: argument 'rung': expected 2 or 3, got ", rung);
  attention_bwd_impl(q, k, v, out, dout, dq, dk, dv, stream, rung, options, main);
}

}  // namespace flashlab
