// attention_bwd, every rung, against the float64 reference's gradients (src/reference/attention.h,
// attention_bwd) on fresh random inputs and output gradients. The backward is fed what it gets in
// training: out and softmax_lse from attention_fwd (the automatic rung) on the device. dq, dk, dv
// are poisoned with NaN before each launch. Tolerance (DESIGN.md, flash-attn's rule): each
// gradient's error <= 2x the error of the same computation done by autograd in the input dtype
// (tests/common/attention_naive.h, attention_bwd_naive) + one unit roundoff of its max |ref| (+ a
// bound on the fp32 rounding of terms that cancel, for gradients that vanish: see below).
// Cases: every head dim and dtype; seqlen_q != seqlen_k both ways, 1 included; causal with rows
// that see no key (their dq must be 0); sliding windows; softcap; ALiBi; GQA/MQA (dk, dv summed
// over the group); varlen with empty sequences (no rows: dk = dv = 0; no keys: dq = 0); strided
// layouts; and bit-identical gradients from run to run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "flashlab/attention.h"
#include "kernels/attention/params.h"
#include "src/reference/attention.h"
#include "tests/common/attention_cases.h"
#include "tests/common/attention_naive.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

// Runs the case's forward (automatic rung) then the backward on `rung`, `repeats` times (the
// gradients of every run bit-identical to the first), and checks dq, dk, dv.
void check_bwd_case_on(DType dt, const Case& c, int rung, std::mt19937_64& rng, int repeats) {
  const std::vector<int64_t> cuq = prefix(c.lq), cuk = prefix(c.lk);
  const int64_t total_q = cuq.back(), total_k = cuk.back();
  const int64_t max_sq = *std::max_element(c.lq.begin(), c.lq.end()), max_sk = *std::max_element(c.lk.begin(), c.lk.end());
  const HostTensor q = random_tensor(dt, total_q * c.h * c.d, rng, -c.range, c.range);
  const HostTensor k = random_tensor(dt, total_k * c.hk * c.d, rng, -c.range, c.range);
  const HostTensor v = random_tensor(dt, total_k * c.hk * c.d, rng, -1.0, 1.0);
  const HostTensor dout = random_tensor(dt, total_q * c.h * c.d, rng, -1.0, 1.0);
  const std::vector<double> slopes = random_slopes(c, rng);

  const reference::AttnRefArgs args = ref_args(c, cuq, cuk, slopes);
  const reference::AttnBwdRefResult ref = reference::attention_bwd(q.values, k.values, v.values, dout.values, args);
  const reference::AttnBwdRefResult naive = attention_bwd_naive(q.values, k.values, v.values, dout.values, args, dt);

  const DevTensor lq = make_layout(c, total_q, max_sq, c.h), lk = make_layout(c, total_k, max_sk, c.hk);
  const int64_t es = dtype_size(dt);
  const auto q_bytes = std::max<int64_t>(lq.elems, 1) * es, k_bytes = std::max<int64_t>(lk.elems, 1) * es;
  DeviceBuffer bq(q_bytes), bk(k_bytes), bv(k_bytes), bo(q_bytes), bdo(q_bytes), bdq(q_bytes), bdk(k_bytes), bdv(k_bytes);
  upload(bq.ptr, scatter(q, lq, c, cuq, c.h));
  upload(bk.ptr, scatter(k, lk, c, cuk, c.hk));
  upload(bv.ptr, scatter(v, lk, c, cuk, c.hk));
  upload(bdo.ptr, scatter(dout, lq, c, cuq, c.h));
  const int64_t lse_n = c.varlen ? c.h * total_q : c.batch * c.h * max_sq;
  DeviceBuffer blse(std::max<int64_t>(lse_n, 1) * 4);
  const CaseAux aux(c, cuq, cuk, slopes);

  const Device gpu{DeviceType::kCUDA, 0};
  const auto view_q = [&](const DeviceBuffer& b) { return TensorView(b.ptr, dt, lq.shape, lq.strides, gpu); };
  const auto view_k = [&](const DeviceBuffer& b) { return TensorView(b.ptr, dt, lk.shape, lk.strides, gpu); };
  const TensorView cuq_v = aux.cu_q(), cuk_v = aux.cu_k(), slopes_v = aux.alibi_slopes();
  const TensorView lse_v = c.varlen ? device_view(blse.ptr, DType::kF32, {c.h, total_q})
                                    : device_view(blse.ptr, DType::kF32, {c.batch, c.h, max_sq});
  AttnBwdOptions opt;
  set_case_options(opt, c, cuq_v, cuk_v, slopes_v, lse_v, max_sq, max_sk);
  opt.deterministic = repeats > 1;
  attention_fwd(view_q(bq), view_k(bk), view_k(bv), view_q(bo), nullptr, kAttnFwdRungAuto, opt);

  // Packed rows of q that see no key and of k that no row sees: their gradients are exactly 0
  // (elsewhere a reference 0 can come from cancellation, e.g. a row that sees one key).
  std::vector<bool> q_blind(static_cast<size_t>(total_q), true), k_unseen(static_cast<size_t>(total_k), true);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.lq[b]; ++i)
      for (int64_t j = 0; j < c.lk[b]; ++j)
        if (reference::attention_key_visible(i, j, c.lq[b], c.lk[b], c.causal, c.wl, c.wr))
          q_blind[cuq[b] + i] = false, k_unseen[cuk[b] + j] = false;

  const ::testing::Message what = describe(c, dt, rung);
  std::vector<uint8_t> first_dq, first_dk, first_dv;
  for (int run = 0; run < repeats; ++run) {
    bdq.poison();
    bdk.poison();
    bdv.poison();
    attention_bwd(view_q(bq), view_k(bk), view_k(bv), view_q(bo), view_q(bdo), view_q(bdq), view_k(bdk), view_k(bdv), nullptr,
                  rung, opt);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> raw_dq = download(bdq.ptr, bdq.bytes), raw_dk = download(bdk.ptr, bdk.bytes),
                         raw_dv = download(bdv.ptr, bdv.bytes);
    if (run > 0) {
      EXPECT_TRUE(raw_dq == first_dq && raw_dk == first_dk && raw_dv == first_dv)
          << what << ": run " << run << "'s gradients differ from the first run's";
      continue;
    }
    const struct {
      const char* name;
      const std::vector<uint8_t>& raw;
      const DevTensor& layout;
      const std::vector<int64_t>& cu;
      int64_t heads;
      const std::vector<double>& ref;
      const std::vector<double>& naive;
      const std::vector<bool>& zero_rows;
    } grads[] = {{"dq", raw_dq, lq, cuq, c.h, ref.dq, naive.dq, q_blind},
                 {"dk", raw_dk, lk, cuk, c.hk, ref.dk, naive.dk, k_unseen},
                 {"dv", raw_dv, lk, cuk, c.hk, ref.dv, naive.dv, k_unseen}};
    // A gradient that vanishes by cancellation (a row that sees one key: ds = p (dp - D) with
    // D = dp) is 0 in the reference and in the naive computation, which sums dp and D alike; a
    // kernel whose tensor cores sum dp in another order leaves fp32 rounding of the cancelled
    // terms, |scale dout . v| |q or k| <= scale d max|dout| max|v| max(|q|, |k|) per key. So the
    // floor adds 2^-22 of that bound (next to the unit roundoff of max |ref|, it only matters
    // where the gradient is ~0).
    const auto max_abs = [](const std::vector<double>& x) {
      double m = 0;
      for (double e : x) m = std::max(m, std::fabs(e));
      return m;
    };
    const double cancel = std::ldexp(args.scale * c.d * max_abs(dout.values) * max_abs(v.values) *
                                         std::max(max_abs(q.values), max_abs(k.values)),
                                     -22);
    for (const auto& g : grads) {
      const std::vector<double> got = gather(decode(dt, g.raw), g.layout, c, g.cu, g.heads);
      const ::testing::Message gw = ::testing::Message(what) << " (" << g.name << ")";
      expect_no_nan(got, gw);
      expect_within_tolerance(got, g.naive, g.ref, unit_roundoff(dt) * max_abs(g.ref) + cancel, gw);
      // Rows / keys that take part in no visible pair have a gradient of exactly 0.
      int64_t nonzero = 0;
      for (size_t x = 0; x < got.size(); ++x) nonzero += g.zero_rows[x / (g.heads * c.d)] && got[x] != 0;
      EXPECT_EQ(nonzero, 0) << gw << ": nonzero in rows that take part in no visible (row, key) pair";
    }
    first_dq = std::move(raw_dq), first_dk = std::move(raw_dk), first_dv = std::move(raw_dv);
  }
}

// Rung 3 (Hopper): sm_90, head dims 64, 128 and 256 (without softcap), no dropout (its rejections:
// tests/cpu).
bool rung_takes(int rung, const Case& c) {
  return rung != 3 || (device_cc_major() == 9 && attn_bwd_rung3_takes(c.d, c.softcap > 0.f) && c.dropout_p == 0.f);
}

// Every rung that takes the case (rungs 2 and 3 are not deterministic: repeats only on rung 1).
void check_bwd_case(DType dt, const Case& c, std::mt19937_64& rng, int repeats = 1) {
  for (int rung = 1; rung <= kAttnBwdRungs; ++rung)
    if (rung_takes(rung, c)) check_bwd_case_on(dt, c, rung, rng, rung == 1 ? repeats : 1);
}

const DType kDtypes[] = {DType::kF16, DType::kBF16};

TEST(AttentionBwd, EveryHeadDimDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(71);
  for (DType dt : kDtypes)
    for (int64_t d : kAttnHeadDims) check_bwd_case(dt, fixed(2, 37, 53, 4, 2, d), rng);
}

TEST(AttentionBwd, SequenceLengthsAndMasks) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(72);
  const int64_t lens[][2] = {{1, 1}, {1, 77}, {77, 1}, {64, 64}, {129, 63}, {63, 129}};
  for (const auto& l : lens)
    for (bool causal : {false, true}) {
      Case c = fixed(1, l[0], l[1], 2, 2, 64);
      c.causal = causal;  // sq > sk: the first sq - sk rows see no key
      check_bwd_case(DType::kBF16, c, rng);
    }
  const int64_t windows[][2] = {{0, 0}, {16, 0}, {-1, 5}, {7, 9}, {200, -1}};
  for (const auto& w : windows) {
    Case c = fixed(2, 96, 80, 2, 1, 128);
    c.wl = w[0], c.wr = w[1];
    check_bwd_case(DType::kF16, c, rng);
  }
}

TEST(AttentionBwd, SoftcapAndAlibi) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(73);
  Case c = fixed(2, 70, 90, 4, 2, 64);
  c.softcap = 5.f, c.range = 3.0;  // logits past the cap's knee
  check_bwd_case(DType::kBF16, c, rng);
  c.softcap = 0.f, c.range = 2.0, c.alibi = 1, c.causal = true;
  check_bwd_case(DType::kF16, c, rng);
  c.softcap = 10.f, c.alibi = 2;
  check_bwd_case(DType::kBF16, c, rng);
}

TEST(AttentionBwd, GroupedQueryAttention) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(74);
  for (int64_t hk : {1, 2, 8}) {
    Case c = fixed(1, 65, 65, 8, hk, 64);
    c.causal = hk == 2;
    check_bwd_case(DType::kBF16, c, rng);
  }
}

TEST(AttentionBwd, VariableLengths) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(75);
  Case v;
  v.batch = 4, v.h = 4, v.hk = 2, v.d = 128, v.varlen = true;
  v.lq = {17, 0, 64, 33};  // a batch without rows: its keys get dk = dv = 0
  v.lk = {40, 9, 0, 33};   // one without keys: its rows get dq = 0
  check_bwd_case(DType::kF16, v, rng);
  v.causal = true, v.alibi = 2;
  check_bwd_case(DType::kBF16, v, rng);
}

TEST(AttentionBwd, StridedLayouts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(76);
  for (Layout layout : {Layout::kPadded, Layout::kHeadMajor})
    for (int64_t d : {96, 128}) {  // 128: rung 3's tensor maps over the strides
      Case c = fixed(2, 50, 70, 4, 2, d);
      c.layout = layout, c.causal = true;
      check_bwd_case(DType::kBF16, c, rng);
    }
}

TEST(AttentionBwd, LongerSequences) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(77);
  Case c = fixed(1, 300, 513, 2, 1, 128);
  c.causal = true;
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(1, 513, 300, 2, 2, 256);
  check_bwd_case(DType::kF16, c, rng);
  // A window across several key blocks: blocks inside it, straddling either edge, outside it.
  c = fixed(1, 400, 333, 2, 1, 64);
  c.wl = 100, c.wr = 20;
  check_bwd_case(DType::kF16, c, rng);
  // Many steps per key block (rung 3's two Q / dO stages and two dS buffers wrap around many
  // times), GQA, rung 3's head dims 64 and 128 (256: AttentionBwd.HeadDim256).
  c = fixed(1, 600, 300, 4, 2, 128);
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(1, 520, 300, 4, 1, 64);
  c.causal = true, c.softcap = 8.f, c.range = 2.0;
  check_bwd_case(DType::kF16, c, rng);
}

// Head dim 256 (rung 3's own kernel, backward/03_hopper_split.cuh: 64-key blocks, the consumers
// splitting the head dim and the two score products): masks and windows across its 64-key blocks,
// ALiBi, GQA, varlen with empty sequences and with a window, strides, many steps per block (its
// two stages and two dS^T buffers wrap around), edge sizes, blocks without a step, softcap (rung
// 2 only).
TEST(AttentionBwd, HeadDim256) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(79);
  for (bool causal : {false, true}) {
    Case c = fixed(2, 130, 200, 2, 1, 256);
    c.causal = causal;
    check_bwd_case(DType::kBF16, c, rng);
  }
  Case c = fixed(1, 200, 70, 2, 2, 256);  // sq > sk, causal: the first rows see no key
  c.causal = true;
  check_bwd_case(DType::kF16, c, rng);
  c = fixed(1, 190, 210, 4, 2, 256);
  c.wl = 70, c.wr = 10;
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(2, 96, 140, 4, 4, 256);
  c.alibi = 2, c.causal = true;
  check_bwd_case(DType::kF16, c, rng);
  c = fixed(1, 600, 130, 8, 1, 256);  // 80 steps per block (MQA over 8 heads x 10 row blocks)
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(1, 70, 90, 2, 1, 256);
  c.softcap = 5.f, c.range = 3.0;  // rung 2 only
  check_bwd_case(DType::kBF16, c, rng);
  for (Layout layout : {Layout::kPadded, Layout::kHeadMajor}) {
    c = fixed(2, 50, 70, 4, 2, 256);
    c.layout = layout, c.causal = true;
    check_bwd_case(DType::kBF16, c, rng);
  }
  Case v;
  v.batch = 4, v.h = 4, v.hk = 2, v.d = 256, v.varlen = true;
  v.lq = {17, 0, 130, 33};
  v.lk = {70, 9, 0, 65};
  check_bwd_case(DType::kBF16, v, rng);
  v.causal = true, v.alibi = 1;
  check_bwd_case(DType::kF16, v, rng);
  v.causal = false, v.alibi = 0, v.wl = 20, v.wr = 3;  // varlen with a window
  check_bwd_case(DType::kBF16, v, rng);
  // Edges: one row and one key; keys a whole number of blocks (no block needs the key mask);
  // windows with one edge only; ALiBi without a mask (i - j of both signs); blocks with keys but
  // no step (a causal window of 16 over 400 keys and 64 rows: keys below 320 see no row).
  c = fixed(1, 1, 1, 2, 1, 256);
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(1, 100, 128, 2, 2, 256);
  check_bwd_case(DType::kF16, c, rng);
  for (const auto& w : {std::pair<int, int>{-1, 5}, std::pair<int, int>{30, -1}}) {
    c = fixed(1, 150, 150, 2, 1, 256);
    c.wl = w.first, c.wr = w.second;
    check_bwd_case(DType::kBF16, c, rng);
  }
  c = fixed(1, 90, 130, 2, 2, 256);
  c.alibi = 2;
  check_bwd_case(DType::kBF16, c, rng);
  c = fixed(1, 64, 400, 2, 1, 256);
  c.causal = true, c.wl = 16;
  check_bwd_case(DType::kF16, c, rng);
}

// Dropout: the forward (automatic rung: rung 3) and the backward (rungs 1 and 2) regenerate one mask
// from the seed and offset; gradients against the reference under that mask (regenerated on the
// host). Every head dim for rung 2's 64-key dropout kernel.
TEST(AttentionBwd, Dropout) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(79);
  Case c = fixed(2, 70, 90, 4, 2, 64);
  c.causal = true, c.dropout_p = 0.25f, c.seed = 0xfeedbeefcafef00dull, c.offset = 3;
  check_bwd_case(DType::kBF16, c, rng, 3);
  c.causal = false, c.softcap = 5.f, c.alibi = 1, c.dropout_p = 0.6f, c.offset = 4;
  check_bwd_case(DType::kF16, c, rng);
  Case v;
  v.batch = 3, v.h = 2, v.hk = 2, v.d = 128, v.varlen = true;
  v.lq = {17, 0, 64}, v.lk = {40, 9, 33};
  v.dropout_p = 0.5f, v.seed = 7, v.offset = 0;
  check_bwd_case(DType::kBF16, v, rng);
  for (int64_t d : kAttnHeadDims) {
    Case e = fixed(1, 100, 150, 2, 1, d);
    e.causal = d % 64 == 0, e.dropout_p = 0.3f, e.seed = 2000 + d, e.offset = 1;
    check_bwd_case(DType::kF16, e, rng);
  }
}

TEST(AttentionBwd, Deterministic) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(78);
  Case c = fixed(2, 200, 150, 4, 1, 64);
  c.causal = true;
  check_bwd_case(DType::kBF16, c, rng, 10);
}

}  // namespace
}  // namespace flashlab
