// Host side of the attention forward ladder: validation (every argument, before anything is
// launched), then dispatch to a rung.
#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/validate.h"
#include "kernels/attention/01_naive.cuh"
#include "kernels/attention/probs.cuh"
#include "src/core/launch.h"
#include "src/attention_launch.h"
#include "src/attention_validate.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "attention_fwd";
constexpr int64_t kMaxGridYZ = 65535;  // nheads and batch are grid dims

bool head_dim_supported(int64_t d) {
  return std::find(std::begin(kAttnHeadDims), std::end(kAttnHeadDims), d) != std::end(kAttnHeadDims);
}

std::string head_dims_str() {
  std::string s;
  for (int d : kAttnHeadDims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// cu_seqlens (host-side checks): int32 (batch + 1,), contiguous, on q's device.
void check_cu_seqlens_tensor(const check::Arg& cu, const check::Arg& ref, int64_t batch) {
  check::cuda(cu);
  check::same_device(cu, ref);
  check::dtype_in(cu, {DType::kI32});
  check::ndim(cu, 1);
  check::contiguous(cu);
  check::aligned(cu, 4);
  check::shape(cu, {batch + 1});
}

// No two elements of a (an output) at one address: with its dims sorted by stride, each stride
// is at least the span of the dims inside it (several blocks would write one element otherwise).
void no_self_overlap(const check::Arg& a) {
  if (a.t.numel() == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int i = 0; i < a.t.ndim(); ++i)
    if (a.t.shape[i] > 1) dims.emplace_back(a.t.strides[i], a.t.shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims inside
  for (const auto& [stride, size] : dims) {
    if (stride < span)
      check::fail(a, "strides under which no two elements share an address",
                  detail::concat("strides ", shape_str(a.t.strides), " for shape ", shape_str(a.t.shape)));
    span = stride * size;
  }
}

// An optional fp32 tensor beside q (slopes, lse, descale factors): on q's device, contiguous, aligned.
void check_f32_aux(const check::Arg& a, const check::Arg& q) {
  check::cuda(a);
  check::same_device(a, q);
  check::dtype_in(a, {DType::kF32});
  check::contiguous(a);
  check::aligned(a, 4);
}

}  // namespace

namespace detail {

// cu_seqlens values (read from the device, so checked last): cu[0] = 0, non-decreasing,
// cu[batch] = the packed rows of `ref`, every length <= max_len; returns the longest.
int64_t cu_seqlens_longest(const check::Arg& cu, const std::vector<int>& v, int64_t batch) {
  if (v[0] != 0) check::fail(cu, "cu_seqlens[0] = 0", detail::concat("cu_seqlens[0] = ", v[0]));
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    if (v[b + 1] < v[b])
      check::fail(cu, "non-decreasing values", detail::concat("cu_seqlens[", b + 1, "] = ", v[b + 1], " < cu_seqlens[", b, "] = ", v[b]));
    longest = std::max<int64_t>(longest, v[b + 1] - v[b]);
  }
  return longest;
}

int64_t check_cu_seqlens_values(const check::Arg& cu, const check::Arg& ref, int64_t batch, int64_t total, int64_t max_len,
                             const char* max_name, cudaStream_t stream) {
  detail::DeviceGuard guard(cu.t.device.index);
  const std::vector<int> v = detail::read_int32(cu.t, stream);
  const int64_t longest = cu_seqlens_longest(cu, v, batch);
  if (v[batch] != total)
    check::fail(cu, detail::concat("cu_seqlens[", batch, "] = ", total, " (the packed rows of '", ref.name, "')"),
                detail::concat(v[batch]));
  FLASHLAB_CHECK(longest <= max_len, cu.op, ": argument '", max_name, "': expected >= the longest sequence (", longest,
                 "), got ", max_len);
  return longest;
}

bool tma_strides(const TensorView& t) {
  for (int dim = 0; dim + 1 < t.ndim(); ++dim)
    if (t.shape[dim] > 1 && t.strides[dim] <= 0) return false;
  return true;
}

void attention_no_self_overlap(const check::Arg& a) { no_self_overlap(a); }

// Every check of attention_fwd() (messages naming `op`); throws flashlab::Error on the first that
// fails, else the kernel parameters (window and scale resolved).
AttnFwdParams attention_validated_params(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& out, int rung, const AttnFwdOptions& opt, cudaStream_t stream,
                                         const std::function<void()>& more_host_checks) {
  const check::Arg Q{op, "q", q}, K{op, "k", k}, V{op, "v", v}, O{op, "out", out};
  FLASHLAB_CHECK(rung == kAttnFwdRungAuto || (rung >= 1 && rung <= kAttnFwdRungs), op, ": argument 'rung': expected 1..",
                 kAttnFwdRungs, " or ", kAttnFwdRungAuto, " (auto), got ", rung);
  const bool varlen = opt.cu_seqlens_q != nullptr || opt.cu_seqlens_k != nullptr;
  FLASHLAB_CHECK(!varlen || (opt.cu_seqlens_q != nullptr && opt.cu_seqlens_k != nullptr), op,
                 ": arguments 'cu_seqlens_q' and 'cu_seqlens_k': expected both or neither, got only '",
                 opt.cu_seqlens_q != nullptr ? "cu_seqlens_q" : "cu_seqlens_k", "'");
  const int rank = varlen ? 3 : 4;
  for (const check::Arg* x : {&Q, &K, &V, &O}) {
    check::cuda(*x);
    check::ndim(*x, rank);
    check::last_dim_contiguous(*x);
  }
  for (const check::Arg* x : {&K, &V, &O}) check::same_device(*x, Q);
  check::dtype_in(Q, {DType::kF16, DType::kBF16, DType::kE4M3});
  const bool fp8 = q.dtype == DType::kE4M3;
  for (const check::Arg* x : {&K, &V}) check::dtype_eq(*x, Q);
  if (fp8) check::dtype_in(O, {DType::kBF16});  // FP8 attention writes bf16
  else check::dtype_eq(O, Q);
  const int hd = rank - 1, hh = rank - 2;  // dims of headdim and heads
  const int64_t d = q.shape[hd], nheads = q.shape[hh], nheads_kv = k.shape[hh];
  if (!head_dim_supported(d)) check::fail(Q, detail::concat("head dim (last dim) one of ", head_dims_str()), detail::concat(d));
  if (k.shape[hd] != d) check::fail(K, detail::concat("head dim ", d, " (as 'q')"), detail::concat(k.shape[hd]));
  check::shape_eq(V, K);
  check::shape_eq(O, Q);
  if (nheads < 1) check::fail(Q, "at least 1 head", detail::concat(nheads, " heads"));
  if (nheads_kv < 1 || nheads % nheads_kv != 0)
    check::fail(K, detail::concat("a number of heads that divides q's ", nheads, " (GQA/MQA)"), detail::concat(nheads_kv));
  FLASHLAB_CHECK(nheads <= kMaxGridYZ, op, ": argument 'q': expected at most ", kMaxGridYZ, " heads, got ", nheads);
  // 16-byte aligned rows for the cp.async copies of rung 3 (all rungs take the same inputs).
  for (const check::Arg* x : {&Q, &K, &V, &O}) check::aligned_rows(*x);
  for (const check::Arg* x : {&Q, &K, &V}) check::disjoint(O, *x);
  no_self_overlap(O);

  AttnFwdParams p{};
  p.q = q.data, p.k = k.data, p.v = v.data, p.o = out.data;
  int64_t batch, max_sq, max_sk;
  if (varlen) {
    const check::Arg CQ{op, "cu_seqlens_q", *opt.cu_seqlens_q}, CK{op, "cu_seqlens_k", *opt.cu_seqlens_k};
    check::cuda(CQ);
    FLASHLAB_CHECK(opt.cu_seqlens_q->ndim() == 1 && opt.cu_seqlens_q->shape[0] >= 2, op,
                   ": argument 'cu_seqlens_q': expected shape [batch + 1] with batch >= 1, got ",
                   shape_str(opt.cu_seqlens_q->shape));
    batch = opt.cu_seqlens_q->shape[0] - 1;
    FLASHLAB_CHECK(batch <= kMaxGridYZ, op, ": argument 'cu_seqlens_q': expected at most ", kMaxGridYZ, " sequences, got ", batch);
    FLASHLAB_CHECK(opt.max_seqlen_q >= 0 && opt.max_seqlen_q <= INT_MAX / 2, op,
                   ": argument 'max_seqlen_q': expected 0 .. 2^30 - 1, got ", opt.max_seqlen_q);
    FLASHLAB_CHECK(opt.max_seqlen_k >= 0 && opt.max_seqlen_k <= INT_MAX / 2, op,
                   ": argument 'max_seqlen_k': expected 0 .. 2^30 - 1, got ", opt.max_seqlen_k);
    check_cu_seqlens_tensor(CQ, Q, batch);
    check_cu_seqlens_tensor(CK, K, batch);
    FLASHLAB_CHECK(q.shape[0] <= INT_MAX, op, ": argument 'q': expected at most 2^31 - 1 packed rows, got ", q.shape[0]);
    FLASHLAB_CHECK(k.shape[0] <= INT_MAX, op, ": argument 'k': expected at most 2^31 - 1 packed rows, got ", k.shape[0]);
    max_sq = opt.max_seqlen_q, max_sk = opt.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const int*>(opt.cu_seqlens_q->data);
    p.cu_seqlens_k = static_cast<const int*>(opt.cu_seqlens_k->data);
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
    p.q_row_stride = q.strides[0], p.q_head_stride = q.strides[1];
    p.k_row_stride = k.strides[0], p.k_head_stride = k.strides[1];
    p.v_row_stride = v.strides[0], p.v_head_stride = v.strides[1];
    p.o_row_stride = out.strides[0], p.o_head_stride = out.strides[1];
  } else {
    for (const check::Arg* x : {&Q, &K}) check::nonempty(*x);
    batch = q.shape[0], max_sq = q.shape[1], max_sk = k.shape[1];
    if (k.shape[0] != batch) check::fail(K, detail::concat("batch ", batch, " (as 'q')"), detail::concat(k.shape[0]));
    FLASHLAB_CHECK(batch <= kMaxGridYZ, op, ": argument 'q': expected batch <= ", kMaxGridYZ, ", got ", batch);
    FLASHLAB_CHECK(max_sq <= INT_MAX / 2 && max_sk <= INT_MAX / 2, op,
                   ": arguments 'q', 'k': expected sequence lengths < 2^30, got ", max_sq, " and ", max_sk);
    p.q_batch_stride = q.strides[0], p.q_row_stride = q.strides[1], p.q_head_stride = q.strides[2];
    p.k_batch_stride = k.strides[0], p.k_row_stride = k.strides[1], p.k_head_stride = k.strides[2];
    p.v_batch_stride = v.strides[0], p.v_row_stride = v.strides[1], p.v_head_stride = v.strides[2];
    p.o_batch_stride = out.strides[0], p.o_row_stride = out.strides[1], p.o_head_stride = out.strides[2];
  }
  p.total_q = varlen ? q.shape[0] : max_sq, p.total_k = varlen ? k.shape[0] : max_sk;
  p.batch = static_cast<int>(batch), p.nheads = static_cast<int>(nheads), p.nheads_kv = static_cast<int>(nheads_kv);
  p.headdim = static_cast<int>(d), p.seqlen_q = static_cast<int>(max_sq), p.seqlen_k = static_cast<int>(max_sk);

  // Scalars.
  const float scale = opt.softmax_scale;
  FLASHLAB_CHECK(std::isnan(scale) || (std::isfinite(scale)), op, ": argument 'softmax_scale': expected a finite value, got ", scale);
  p.scale = std::isnan(scale) || scale <= 0.f ? 1.f / std::sqrt(static_cast<float>(d)) : scale;
  FLASHLAB_CHECK(std::isfinite(opt.softcap) && opt.softcap >= 0.f, op, ": argument 'softcap': expected a finite value >= 0, got ", opt.softcap);
  p.softcap = opt.softcap;
  FLASHLAB_CHECK(opt.window_left >= -1, op, ": argument 'window_left': expected >= -1 (-1: unbounded), got ", opt.window_left);
  FLASHLAB_CHECK(opt.window_right >= -1, op, ": argument 'window_right': expected >= -1 (-1: unbounded), got ", opt.window_right);
  // A window past both sequence lengths is unbounded (and keeps the kernels' int arithmetic small).
  const auto window = [&](int64_t w) { return w > max_sq + max_sk ? -1 : static_cast<int>(w); };
  p.window_left = window(opt.window_left);
  p.window_right = opt.causal ? 0 : window(opt.window_right);

  if (opt.alibi_slopes != nullptr) {
    const check::Arg A{op, "alibi_slopes", *opt.alibi_slopes};
    check_f32_aux(A, Q);
    const auto& s = opt.alibi_slopes->shape;
    if (!((s.size() == 1 && s[0] == nheads) || (s.size() == 2 && s[0] == batch && s[1] == nheads)))
      check::fail(A, detail::concat("shape [", nheads, "] or [", batch, ", ", nheads, "]"), shape_str(s));
    p.alibi_slopes = static_cast<const float*>(opt.alibi_slopes->data);
    p.alibi_batch_stride = s.size() == 2 ? nheads : 0;
  }
  if (opt.softmax_lse != nullptr) {
    const check::Arg L{op, "softmax_lse", *opt.softmax_lse};
    check_f32_aux(L, Q);
    if (varlen) check::shape(L, {nheads, q.shape[0]});
    else check::shape(L, {batch, nheads, max_sq});
    for (const check::Arg* x : {&Q, &K, &V, &O}) check::disjoint(L, *x);
    p.lse = static_cast<float*>(opt.softmax_lse->data);
    p.lse_batch_stride = varlen ? 0 : nheads * max_sq;
    p.lse_head_stride = varlen ? q.shape[0] : max_sq;
  }
  // FP8 descale factors: fp32, one per tensor or one per (batch, kv head), read by rung 4. The three
  // share one pair of strides, so they must be all of one kind.
  const struct {
    const char* name;
    const TensorView* t;
    const float** dst;
  } descales[3] = {{"q_descale", opt.q_descale, &p.q_descale},
                   {"k_descale", opt.k_descale, &p.k_descale},
                   {"v_descale", opt.v_descale, &p.v_descale}};
  int given = 0, per_head_given = 0;
  for (const auto& x : descales) {
    if (x.t == nullptr) continue;
    const check::Arg D{op, x.name, *x.t};
    if (!fp8) check::fail(D, "no descale factor for fp16 / bf16 inputs (FP8 e4m3 only)", "a tensor");
    check_f32_aux(D, Q);
    const auto& s = x.t->shape;
    const bool one = x.t->numel() == 1, per_head = s.size() == 2 && s[0] == batch && s[1] == nheads_kv;
    if (!one && !per_head)
      check::fail(D, detail::concat("one element or shape [", batch, ", ", nheads_kv, "] (batch, nheads_kv)"), shape_str(s));
    ++given, per_head_given += one ? 0 : 1;
    *x.dst = static_cast<const float*>(x.t->data);
  }
  FLASHLAB_CHECK(per_head_given == 0 || per_head_given == given, op,
                 ": arguments 'q_descale', 'k_descale', 'v_descale': expected all per tensor (one element) or all per "
                 "(batch, nheads_kv), got a mix");
  if (per_head_given > 0) p.descale_batch_stride = nheads_kv, p.descale_head_stride = 1;
  // Dropout: rungs 1 and 3 (the automatic choice takes rung 3), no FP8.
  FLASHLAB_CHECK(std::isfinite(opt.dropout_p) && opt.dropout_p >= 0.f && opt.dropout_p < 1.f, op,
                 ": argument 'dropout_p': expected a finite value in [0, 1), got ", opt.dropout_p);
  if (opt.dropout_p > 0.f) {
    FLASHLAB_CHECK(!fp8, op, ": argument 'dropout_p': expected 0 for e4m3 inputs (no FP8 dropout), got ", opt.dropout_p);
    FLASHLAB_CHECK(rung == kAttnFwdRungAuto || rung == 1 || rung == 3, op, ": argument 'rung': expected 1, 3 or ",
                   kAttnFwdRungAuto, " (auto) with dropout_p > 0 (dropout runs on rungs 1 and 3 so far), got ", rung);
    p.dropout_p = opt.dropout_p;
    p.dropout_scale = 1.f / (1.f - opt.dropout_p);
    p.dropout_threshold = kernels::dropout_threshold(opt.dropout_p);
    p.dropout_seed = opt.dropout_seed;
    p.dropout_offset = opt.dropout_offset;
  }
  if (fp8) {  // TMA + 8-bit wgmma: rung 4 on sm_90a, head dim 128
    FLASHLAB_CHECK(rung == kAttnFwdRungAuto || rung == 4, op, ": argument 'rung': expected 4 or ", kAttnFwdRungAuto,
                   " (auto) for e4m3 inputs (FP8 runs on the Hopper rung only), got ", rung);
    if (d != 128) check::fail(Q, "head dim (last dim) 128 for e4m3 inputs", detail::concat(d));
    FLASHLAB_CHECK(opt.attn_probs == nullptr, op, ": argument 'attn_probs': expected none for e4m3 inputs, got a tensor");
  }
  if (opt.attn_probs != nullptr) {
    const check::Arg P{op, "attn_probs", *opt.attn_probs};
    FLASHLAB_CHECK(opt.softmax_lse != nullptr, op,
                   ": argument 'attn_probs': expected together with 'softmax_lse' (P is computed from it), got no softmax_lse");
    check::cuda(P);
    check::same_device(P, Q);
    check::dtype_eq(P, Q);
    check::contiguous(P);
    check::aligned(P, dtype_size(q.dtype));
    check::shape(P, {batch, nheads, max_sq, max_sk});
    for (const check::Arg* x : {&Q, &K, &V, &O}) check::disjoint(P, *x);
    check::disjoint(P, check::Arg{op, "softmax_lse", *opt.softmax_lse});
  }
  // What the kernels read (cu_seqlens, slopes) must not lie inside what they write.
  {
    std::vector<check::Arg> reads, writes{O};
    if (opt.cu_seqlens_q != nullptr) reads.push_back({op, "cu_seqlens_q", *opt.cu_seqlens_q});
    if (opt.cu_seqlens_k != nullptr) reads.push_back({op, "cu_seqlens_k", *opt.cu_seqlens_k});
    if (opt.alibi_slopes != nullptr) reads.push_back({op, "alibi_slopes", *opt.alibi_slopes});
    if (opt.softmax_lse != nullptr) writes.push_back({op, "softmax_lse", *opt.softmax_lse});
    if (opt.attn_probs != nullptr) writes.push_back({op, "attn_probs", *opt.attn_probs});
    for (const check::Arg& r : reads)
      for (const check::Arg& w : writes) check::disjoint(r, w);
  }
  if (rung == 4 || fp8) {  // TMA + wgmma: 128-byte boxes, positive strides, built for sm_90a only
    if (d < 64) check::fail(Q, "head dim (last dim) 64, 96, 128, 192 or 256 for rung 4 (64-column TMA boxes)", detail::concat(d));
    for (const check::Arg* x : {&Q, &K, &V, &O})
      if (!tma_strides(x->t))
        check::fail(*x, "positive strides on every dim of size > 1 for rung 4 (TMA)", detail::concat("strides ", shape_str(x->t.strides)));
    detail::DeviceGuard guard(q.device.index);
    if (detail::cc_major() != 9)
      check::fail(Q, fp8 ? "a device of compute capability 9.x (sm_90a: TMA, wgmma) for e4m3 inputs"
                         : "a device of compute capability 9.x (sm_90a: TMA, wgmma) for rung 4",
                  detail::concat("compute capability ", detail::cc_major(), ".x"));
  }
  if (more_host_checks) more_host_checks();
  // Last: the only checks that read device memory (and wait for `stream`). Skipped while the
  // stream is being captured into a CUDA graph (a device-to-host copy cannot be captured); the
  // kernels then trust cu_seqlens as given.
  if (varlen) {
    detail::DeviceGuard guard(q.device.index);
    if (!detail::capturing(stream)) {
      check_cu_seqlens_values(check::Arg{op, "cu_seqlens_q", *opt.cu_seqlens_q}, Q, batch, q.shape[0], max_sq, "max_seqlen_q", stream);
      check_cu_seqlens_values(check::Arg{op, "cu_seqlens_k", *opt.cu_seqlens_k}, K, batch, k.shape[0], max_sk, "max_seqlen_k", stream);
    }
  }
  return p;
}

}  // namespace detail

namespace {

template <typename T>
void launch_rung(const AttnFwdParams& p, DType dtype, int rung, cudaStream_t stream) {
  const int64_t max_sq = p.seqlen_q;
  if (rung == 1) {
    auto* s = static_cast<float*>(detail::workspace(stream, attention_fwd_workspace_bytes(1, p.batch, p.nheads, p.seqlen_q, p.seqlen_k, p.headdim)));
    const dim3 tile(32, 8);
    const dim3 scores_grid(static_cast<unsigned>(detail::ceil_div(p.seqlen_k, 32) * detail::ceil_div(max_sq, 8)), p.nheads, p.batch);
    FLASHLAB_LAUNCH(kernels::attn_naive_scores_kernel<T>, scores_grid, tile, 0, stream, p, s);
    const dim3 rows_grid(static_cast<unsigned>(detail::ceil_div(max_sq, 128)), p.nheads, p.batch);
    FLASHLAB_LAUNCH(kernels::attn_naive_softmax_kernel, rows_grid, 128, 0, stream, p, s);
    const dim3 pv_grid(static_cast<unsigned>(detail::ceil_div(p.headdim, 32) * detail::ceil_div(max_sq, 8)), p.nheads, p.batch);
    FLASHLAB_LAUNCH(kernels::attn_naive_pv_kernel<T>, pv_grid, tile, 0, stream, p, s);
    return;
  }
  if (rung == 2) {
    void* ws = detail::workspace(stream, attention_fwd_workspace_bytes(2, p.batch, p.nheads, p.seqlen_q, p.seqlen_k, p.headdim));
    detail::launch_attn_flash1(p, dtype, ws, stream);
    return;
  }
  if (rung == 3) {
    detail::launch_attn_flash2(p, dtype, stream);
    return;
  }
  detail::launch_attn_hopper(p, dtype, stream);
}

// kAttnFwdRungAuto: the Hopper rung where it runs (sm_90, head dim >= 64, strides TMA can walk),
// else FlashAttention-2; with dropout the naive rung (rung 3 has it too, and becomes the choice
// once measured on a GPU).
int resolved_rung(int rung, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                  const AttnFwdOptions& opt) {
  if (rung != kAttnFwdRungAuto) return rung;
  if (opt.dropout_p > 0.f) return 3;  // the tiled rung that has dropout
  if (q.dtype == DType::kE4M3) return 4;  // FP8: the Hopper rung (validated: sm_90)
  detail::DeviceGuard guard(q.device.index);
  const bool tma = detail::tma_strides(q) && detail::tma_strides(k) && detail::tma_strides(v) && detail::tma_strides(out);
  return detail::cc_major() == 9 && q.shape[q.ndim() - 1] >= 64 && tma ? 4 : 3;
}

}  // namespace

int64_t attention_fwd_workspace_bytes(int rung, int64_t batch, int64_t nheads, int64_t seqlen_q, int64_t seqlen_k,
                                      int64_t headdim) {
  if (rung != kAttnFwdRungAuto) check::rung("attention_fwd_workspace_bytes", rung, kAttnFwdRungs);
  FLASHLAB_CHECK(batch >= 0 && nheads >= 0 && seqlen_q >= 0 && seqlen_k >= 0 && headdim >= 0,
                 "attention_fwd_workspace_bytes: expected sizes >= 0, got batch ", batch, ", nheads ", nheads, ", seqlen_q ",
                 seqlen_q, ", seqlen_k ", seqlen_k, ", headdim ", headdim);
  const auto product = [](std::initializer_list<int64_t> xs) {
    int64_t p = 1;
    for (int64_t x : xs) {
      FLASHLAB_CHECK(x == 0 || p <= INT64_MAX / x, "attention_fwd_workspace_bytes: the size overflows int64");
      p *= x;
    }
    return p;
  };
  if (rung == 1) return product({batch, nheads, seqlen_q, seqlen_k, static_cast<int64_t>(sizeof(float))});
  if (rung == 2) return product({batch, nheads, seqlen_q, headdim + 2, static_cast<int64_t>(sizeof(float))});
  return 0;  // rungs 3 and 4 (and the automatic choice, one of them)
}

void attention_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   cudaStream_t stream, int rung, const AttnFwdOptions& options) {
  const AttnFwdParams p = detail::attention_validated_params(kOp, q, k, v, out, rung, options, stream);
  detail::DeviceGuard guard(q.device.index);
  rung = resolved_rung(rung, q, k, v, out, options);
  if (p.seqlen_q == 0) return;  // varlen with no query rows: nothing to write
  if (q.dtype == DType::kE4M3) return detail::launch_attn_hopper(p, q.dtype, stream);  // rung 4 only (validated)
  HALF_DTYPE_SWITCH(q.dtype, T, [&] {
    launch_rung<T>(p, q.dtype, rung, stream);
    if (options.attn_probs != nullptr && p.seqlen_k > 0) {
      const dim3 grid(static_cast<unsigned>(detail::ceil_div(p.seqlen_k, 32) * detail::ceil_div(p.seqlen_q, 8)), p.nheads, p.batch);
      FLASHLAB_LAUNCH(kernels::attn_probs_kernel<T>, grid, dim3(32, 8), 0, stream, p, static_cast<T*>(options.attn_probs->data));
    }
  });
}

}  // namespace flashlab
