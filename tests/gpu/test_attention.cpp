// attention_fwd, every rung, against the float64 reference (src/reference/attention.h) on fresh
// random inputs, outputs (and lse) poisoned with NaN before each launch. Tolerance (DESIGN.md):
// error <= 2x the error of the same computation done naively in the input dtype
// (tests/common/attention_naive.h) + one unit roundoff of max |ref|. Fully masked rows must give
// exactly 0 and an lse of exactly -inf.
// Rung 4 (Hopper) runs every case rung 3 runs with a head dim of 64 or more, on an sm_90 device.
// Cases: every head dim and dtype; sequence lengths 1 .. 8192 with seqlen_q != seqlen_k both
// ways; causal (bottom-right aligned), sliding windows, softcap, ALiBi ((nheads,) and (batch,
// nheads) slopes), GQA/MQA, varlen batches (with empty sequences), their combinations; strided
// layouts (padded heads, head-major memory); return_attn_probs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "src/attention_hopper_dispatch.h"
#include "src/reference/attention.h"
#include "src/reference/quant.h"
#include "tests/common/attention_cases.h"
#include "tests/common/attention_naive.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

// Runs the case on each of `rungs_asked` and checks out, lse (and probs) against the reference.
// Wherever rung 3 runs, rung 4 (Hopper) runs too if it can here (an sm_90 device, head dim >= 64):
// the FA2 rung's suite is the Hopper rung's.
void check_case(DType dt, const Case& c, std::initializer_list<int> rungs_asked, std::mt19937_64& rng) {
  std::vector<int> rungs(rungs_asked);
  if (std::find(rungs.begin(), rungs.end(), 3) != rungs.end() && c.d >= 64 && device_cc_major() == 9 && c.dropout_p == 0)
    rungs.push_back(4);  // (rung 4 has no dropout)
  const std::vector<int64_t> cuq = prefix(c.lq), cuk = prefix(c.lk);
  const int64_t total_q = cuq.back(), total_k = cuk.back();
  const int64_t max_sq = *std::max_element(c.lq.begin(), c.lq.end()), max_sk = *std::max_element(c.lk.begin(), c.lk.end());
  const HostTensor q = random_tensor(dt, total_q * c.h * c.d, rng, -c.range, c.range);
  const HostTensor k = random_tensor(dt, total_k * c.hk * c.d, rng, -c.range, c.range);
  const HostTensor v = random_tensor(dt, total_k * c.hk * c.d, rng, -1.0, 1.0);
  const std::vector<double> slopes = random_slopes(c, rng);

  const reference::AttnRefArgs args = ref_args(c, cuq, cuk, slopes);
  const reference::AttnRefResult ref = reference::attention_fwd(q.values, k.values, v.values, args, c.probs);
  const reference::AttnRefResult naive = attention_fwd_naive(q.values, k.values, v.values, args, dt);

  const DevTensor lq = make_layout(c, total_q, max_sq, c.h), lk = make_layout(c, total_k, max_sk, c.hk);
  const int64_t es = dtype_size(dt);
  DeviceBuffer dq(std::max<int64_t>(lq.elems, 1) * es), dk(std::max<int64_t>(lk.elems, 1) * es),
      dv(std::max<int64_t>(lk.elems, 1) * es), dout(std::max<int64_t>(lq.elems, 1) * es);
  upload(dq.ptr, scatter(q, lq, c, cuq, c.h));
  upload(dk.ptr, scatter(k, lk, c, cuk, c.hk));
  upload(dv.ptr, scatter(v, lk, c, cuk, c.hk));
  const int64_t lse_n = c.varlen ? c.h * total_q : c.batch * c.h * max_sq;
  DeviceBuffer dlse(std::max<int64_t>(lse_n, 1) * 4), dprobs(std::max<int64_t>(c.batch * c.h * max_sq * max_sk, 1) * es);
  const CaseAux aux(c, cuq, cuk, slopes);

  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView qv(dq.ptr, dt, lq.shape, lq.strides, gpu), kv(dk.ptr, dt, lk.shape, lk.strides, gpu),
      vv(dv.ptr, dt, lk.shape, lk.strides, gpu), ov(dout.ptr, dt, lq.shape, lq.strides, gpu);
  const TensorView cuq_v = aux.cu_q(), cuk_v = aux.cu_k(), slopes_v = aux.alibi_slopes();
  const TensorView lse_v = c.varlen ? device_view(dlse.ptr, DType::kF32, {c.h, total_q})
                                    : device_view(dlse.ptr, DType::kF32, {c.batch, c.h, max_sq});
  const TensorView probs_v = device_view(dprobs.ptr, dt, {c.batch, c.h, max_sq, max_sk});
  AttnFwdOptions opt;
  set_case_options(opt, c, cuq_v, cuk_v, slopes_v, lse_v, max_sq, max_sk);
  if (c.probs) opt.attn_probs = &probs_v;

  double max_ref = 0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
  for (int rung : rungs) {
    const ::testing::Message what = describe(c, dt, rung);
    dout.poison();
    dlse.poison();
    dprobs.poison();
    attention_fwd(qv, kv, vv, ov, nullptr, rung, opt);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> got = gather(decode(dt, download(dout.ptr, dout.bytes)), lq, c, cuq, c.h);
    expect_no_nan(got, what);
    expect_within_tolerance(got, naive.out, ref.out, unit_roundoff(dt) * max_ref, what);

    // lse: (nheads, total_q) in the reference; -inf must match exactly.
    const std::vector<double> lse_dev = decode(DType::kF32, download(dlse.ptr, dlse.bytes));
    std::vector<double> lse(ref.lse.size());
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t hh = 0; hh < c.h; ++hh)
        for (int64_t i = 0; i < c.lq[b]; ++i)
          lse[hh * total_q + cuq[b] + i] = lse_dev[c.varlen ? hh * total_q + cuq[b] + i : (b * c.h + hh) * max_sq + i];
    expect_lse_matches(lse, ref.lse, naive.lse, what);

    if (c.probs) {
      const std::vector<double> p = decode(dt, download(dprobs.ptr, static_cast<size_t>(c.batch * c.h * max_sq * max_sk * es)));
      expect_no_nan(p, what);
      double worst = 0;
      // With dropout a dropped entry is written -p: the sign is the kernel's mask, which must be
      // the one regenerated here (args.dropout_keep).
      for (size_t x = 0; x < p.size(); ++x) {
        const double want = c.dropout_p > 0 && !args.dropout_keep[x] ? -ref.probs[x] : ref.probs[x];
        worst = std::max(worst, std::fabs(p[x] - want));
      }
      // One rounding to dt of a value <= 1, plus the fp32 exponent of a recomputed score.
      EXPECT_LE(worst, 2 * unit_roundoff(dt) + 1e-5) << what << " (probs)";
    }
  }
}

const DType kDtypes[] = {DType::kF16, DType::kBF16};

TEST(Attention, EveryRungHeadDimDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(51);
  for (DType dt : kDtypes)
    for (int64_t d : kAttnHeadDims)
      for (bool causal : {false, true}) {
        Case c = fixed(2, 77, 113, 2, 1, d);
        c.causal = causal;
        check_case(dt, c, {1, 2, 3}, rng);
      }
}

// Sequence lengths from 1 to 8192, q and k lengths equal and different both ways (rung 3; rungs
// 1-2 up to 1023).
TEST(Attention, SequenceLengths) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(52);
  const std::pair<int64_t, int64_t> lens[] = {{1, 1},     {17, 17},   {113, 113}, {128, 128}, {256, 256}, {1023, 1023},
                                               {2049, 2049}, {17, 1023}, {1023, 17}, {1, 256},  {256, 1}, {128, 2049}, {2049, 128}};
  for (const auto& [sq, sk] : lens)
    for (bool causal : {false, true}) {
      Case c = fixed(1, sq, sk, 2, 1, 64);
      c.causal = causal;
      if (std::max(sq, sk) <= 1023) check_case(DType::kBF16, c, {1, 2, 3}, rng);
      else check_case(DType::kBF16, c, {3}, rng);
    }
  Case longest = fixed(1, 8192, 8192, 1, 1, 64);
  longest.causal = true;
  check_case(DType::kBF16, longest, {3}, rng);
}

TEST(Attention, SlidingWindows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(53);
  const std::pair<int64_t, int64_t> windows[] = {{32, 16}, {0, 0}, {5, -1}, {-1, 7}, {100, 0}, {1, 300}};
  for (const auto& [wl, wr] : windows)
    for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{200, 200}, {90, 300}, {300, 90}}) {
      Case c = fixed(2, sq, sk, 2, 2, 64);
      c.wl = wl, c.wr = wr;
      check_case(DType::kF16, c, {1, 2, 3}, rng);
    }
  // causal overrides the right window
  Case c = fixed(1, 150, 150, 1, 1, 128);
  c.causal = true, c.wl = 20, c.wr = 50;
  check_case(DType::kBF16, c, {1, 2, 3}, rng);
}

TEST(Attention, SoftcapAndAlibi) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(54);
  for (DType dt : kDtypes) {
    Case c = fixed(2, 130, 190, 4, 2, 64);
    c.softcap = 5.f, c.range = 4.0;  // scores far past the cap
    check_case(dt, c, {1, 2, 3}, rng);
    c.softcap = 0.f, c.alibi = 1, c.causal = true;
    check_case(dt, c, {1, 2, 3}, rng);
    c.alibi = 2, c.causal = false, c.wl = 40, c.wr = 10, c.softcap = 30.f;
    check_case(dt, c, {1, 2, 3}, rng);
  }
}

TEST(Attention, GroupedQueryAttention) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(55);
  for (const auto& [h, hk] : {std::pair<int64_t, int64_t>{8, 1}, {6, 3}, {4, 4}, {12, 4}}) {
    Case c = fixed(2, 100, 160, h, hk, 128);
    c.causal = h % 2 == 0;
    check_case(DType::kBF16, c, {1, 2, 3}, rng);
  }
}

TEST(Attention, VariableLengths) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(56);
  Case c;
  c.batch = 5, c.h = 4, c.hk = 2, c.d = 64, c.varlen = true;
  c.lq = {17, 0, 128, 1, 300};
  c.lk = {17, 5, 200, 1, 100};
  for (DType dt : kDtypes)
    for (bool causal : {false, true}) {
      c.causal = causal;
      check_case(dt, c, {1, 2, 3}, rng);
    }
  // the combination that matters for serving: causal + window + GQA + varlen (+ ALiBi)
  c.causal = true, c.wl = 48, c.alibi = 2;
  check_case(DType::kBF16, c, {1, 2, 3}, rng);
  c.layout = Layout::kPadded;
  check_case(DType::kF16, c, {3}, rng);
}

// Causal with seqlen_q > seqlen_k: the first sq - sk rows see no key (0 output, -inf lse); a
// window that leaves rows empty too.
TEST(Attention, FullyMaskedRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(57);
  Case c = fixed(1, 200, 70, 2, 1, 64);
  c.causal = true;
  check_case(DType::kBF16, c, {1, 2, 3}, rng);
  Case w = fixed(1, 100, 100, 1, 1, 32);
  w.wl = 0, w.wr = 0;  // only the diagonal: every row sees one key
  check_case(DType::kF16, w, {1, 2, 3}, rng);
  w.d = 128;  // the same for rung 4 (head dims >= 64)
  check_case(DType::kF16, w, {3}, rng);
  // Rung 4: rows 0 .. 463 see no key, so in the query block at row 384 the first consumer
  // warpgroup (rows 384 .. 447) is fully masked while the second has keys; two key blocks.
  Case m = fixed(2, 700, 236, 2, 2, 64);
  m.causal = true;
  check_case(DType::kBF16, m, {3}, rng);
}

TEST(Attention, StridedLayouts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(58);
  for (Layout layout : {Layout::kPadded, Layout::kHeadMajor}) {
    Case c = fixed(3, 65, 129, 4, 2, 96);
    c.layout = layout, c.causal = true;
    check_case(DType::kBF16, c, {1, 2, 3}, rng);
  }
}

TEST(Attention, ReturnAttnProbs) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(59);
  Case c = fixed(2, 40, 70, 2, 1, 64);
  c.causal = true, c.wl = 20, c.probs = true;
  check_case(DType::kBF16, c, {1, 3}, rng);
  Case v;
  v.batch = 3, v.h = 2, v.hk = 2, v.d = 32, v.varlen = true, v.probs = true;
  v.lq = {5, 0, 33};
  v.lk = {9, 4, 20};
  check_case(DType::kF16, v, {3}, rng);
  v.d = 64;  // rung 4 too
  check_case(DType::kF16, v, {3}, rng);
}

// Several query and key blocks per CTA for every head dim of rung 4 (its block sizes depend on
// the head dim): the K/V pipeline wraps around its stages, both consumer warpgroups have rows,
// tails in both sequences; varlen with a long sequence next to short ones.
TEST(Attention, LongerSequencesEveryHeadDim) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(61);
  for (int64_t d : {64, 96, 128, 192, 256})
    for (bool causal : {false, true}) {
      Case c = fixed(1, 300, 777, 2, 1, d);
      c.causal = causal;
      check_case(d % 128 == 0 ? DType::kBF16 : DType::kF16, c, {3}, rng);
    }
  Case v;
  v.batch = 4, v.h = 4, v.hk = 1, v.d = 128, v.varlen = true;
  v.lq = {3, 520, 129, 64};
  v.lk = {700, 515, 1, 300};
  for (bool causal : {false, true}) {
    v.causal = causal;
    check_case(DType::kBF16, v, {3}, rng);
  }
}

// Head dim 128 over 8192 keys or more: rung 4 takes 176-key blocks (src/attention_hopper_hdim.cuh;
// not with softcap / ALiBi), the last one partial; causal with seqlen_q < seqlen_k, a sliding
// window, GQA, and varlen where only the longest sequence reaches 8192 keys.
TEST(Attention, Rung4WideKeyBlocks) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(63);
  for (bool causal : {false, true}) {
    Case c = fixed(1, 200, 8192 + 37, 2, 1, 128);
    c.causal = causal;
    check_case(DType::kBF16, c, {3}, rng);
  }
  // Plain causal at 8k keys: the persistent kernel's reach there (kAttnHopperPersistentUpToPlainCausal128).
  Case pc = fixed(2, 300, 8192, 2, 1, 128);
  pc.causal = true;
  check_case(DType::kBF16, pc, {3}, rng);
  Case w = fixed(1, 300, 8192, 4, 1, 128);
  w.wl = 700, w.wr = 50;
  check_case(DType::kF16, w, {3}, rng);
  Case v;
  v.batch = 3, v.h = 2, v.hk = 1, v.d = 128, v.varlen = true;
  v.lq = {64, 1, 150};
  v.lk = {8200, 0, 333};
  v.causal = true;
  check_case(DType::kBF16, v, {3}, rng);
}

// Inputs rung 4's tensor maps must cope with: strides of size-1 dims as DLPack exporters write
// them (1 or 0, unaligned), and varlen batches with no key rows at all (a tensor map cannot have
// a zero dim: the launcher hands those to rung 3). Checked against rung 3 on the same inputs
// (both are held to the reference by the cases above) and, for the empty keys, the reference.
TEST(Attention, Rung4OddStridesAndEmptyKeys) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(62);
  const int64_t h = 4, d = 128, sk = 300;
  const HostTensor q = random_tensor(DType::kBF16, h * d, rng, -2, 2);
  const HostTensor kv = random_tensor(DType::kBF16, sk * h * d, rng, -2, 2);
  DeviceBuffer dq(q.bytes.size()), dk(kv.bytes.size()), o3(q.bytes.size()), o4(q.bytes.size());
  upload(dq.ptr, q.bytes);
  upload(dk.ptr, kv.bytes);
  const Device gpu{DeviceType::kCUDA, 0};
  // q, out: (1, 1, h, d) with strides 1 and 0 on the size-1 batch and row dims.
  const TensorView qv(dq.ptr, DType::kBF16, {1, 1, h, d}, {1, 0, d, 1}, gpu);
  const TensorView kvv = device_view(dk.ptr, DType::kBF16, {1, sk, h, d});
  AttnFwdOptions opt;
  opt.causal = true;
  for (auto [rung, buf] : {std::pair<int, DeviceBuffer*>{3, &o3}, {4, &o4}}) {
    buf->poison();
    attention_fwd(qv, kvv, kvv, TensorView(buf->ptr, DType::kBF16, {1, 1, h, d}, {1, 1, d, 1}, gpu), nullptr, rung, opt);
  }
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> a = decode(DType::kBF16, download(o3.ptr, o3.bytes)), b = decode(DType::kBF16, download(o4.ptr, o4.bytes));
  double max_ref = 0;
  for (double x : a) max_ref = std::max(max_ref, std::fabs(x));
  expect_no_nan(b, ::testing::Message() << "rung 4, odd strides");
  EXPECT_LE(max_abs_err(b, a), 4 * unit_roundoff(DType::kBF16) * max_ref) << "rung 4 vs rung 3, odd strides";

  Case c;
  c.batch = 2, c.h = 2, c.hk = 1, c.d = 64, c.varlen = true;
  c.lq = {5, 7};
  c.lk = {0, 0};
  check_case(DType::kBF16, c, {3}, rng);
}

// ---- FP8 (e4m3 q, k, v; bf16 out; rung 4, head dim 128) ----------------------------------------
// Inputs: random e4m3 codes (|value| <= range) and fp32 descale factors (per tensor, or per
// (batch, kv head)); the float64 reference runs on the dequantized values. Naive computation for
// the tolerance rule: what an FP8 attention must do, in fp32, with P rounded to e4m3 before P V:
// s = scale (q.k) in fp32, p = exp(s - max), l = sum p (fp32), o = sum e4m3(p) v / l, rounded
// to bf16. The kernel differs in where its P is rounded (relative to the running max of its key
// blocks) and its summation order; held to 2x the naive error (tests/common/attention_naive.h,
// NaiveFp8) + one bf16 unit roundoff of max |ref|.
// The lse adds one term: the FP8 tensor cores do not keep fp32's 24 bits while they add the
// products of a dot product (DeepSeek-V3's report puts it near 14 bits on Hopper), so their
// logits carry an error the fp32 naive computation does not have. Measured on an H100 (cf57815),
// in the single-key cases where the lse is the logit itself: up to 1.0e-4 x scale x sum_c
// |q_c k_c| (2^-13.3). The floor adds 2^-12 x scale x sum_c |q_c k_c| (its maximum over the case).

// n random e4m3 codes with |value| <= range (no NaN codes) as a HostTensor (values exact).
HostTensor random_e4m3(int64_t n, std::mt19937_64& rng, double range) {
  HostTensor t = empty_tensor(DType::kE4M3, n);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t code;
    double v;
    do {
      code = static_cast<uint8_t>(byte(rng));
      v = reference::decode_e4m3(code);
    } while (std::isnan(v) || std::fabs(v) > range);
    t.bytes[i] = code;
    t.values[i] = v;
  }
  return t;
}

// One FP8 case: descales per tensor (per_head = false) or per (batch, kv head). nan_v_rows: packed
// key rows [first, last) whose V is NaN (e4m3 code 0x7f), for a varlen case where they belong to a
// sequence without queries.
void check_case_fp8(const Case& c, bool per_head, std::mt19937_64& rng, std::pair<int64_t, int64_t> nan_v_rows = {0, 0}) {
  const std::vector<int64_t> cuq = prefix(c.lq), cuk = prefix(c.lk);
  const int64_t total_q = cuq.back(), total_k = cuk.back();
  const int64_t max_sq = *std::max_element(c.lq.begin(), c.lq.end()), max_sk = *std::max_element(c.lk.begin(), c.lk.end());
  const HostTensor q = random_e4m3(total_q * c.h * c.d, rng, c.range);
  const HostTensor k = random_e4m3(total_k * c.hk * c.d, rng, c.range);
  HostTensor v = random_e4m3(total_k * c.hk * c.d, rng, 4.0);
  for (int64_t x = nan_v_rows.first * c.hk * c.d; x < nan_v_rows.second * c.hk * c.d; ++x) {
    v.bytes[x] = 0x7f;
    v.values[x] = std::nan("");
  }
  const int64_t n_desc = per_head ? c.batch * c.hk : 1;
  std::uniform_real_distribution<double> unit(0.25, 1.0);
  std::vector<float> desc[3];  // q, k, v
  for (auto& d : desc)
    for (int64_t x = 0; x < n_desc; ++x) d.push_back(static_cast<float>(unit(rng)) / (&d == &desc[2] ? 4.f : 1.f));
  const std::vector<double> slopes = random_slopes(c, rng);
  // Dequantized values (exact in double): x_e4m3 * descale of (batch, kv head).
  const auto dequant = [&](const HostTensor& t, const std::vector<int64_t>& cu, int64_t heads, const std::vector<float>& ds) {
    std::vector<double> out(t.values.size());
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t r = cu[b]; r < cu[b + 1]; ++r)
        for (int64_t hh = 0; hh < heads; ++hh) {
          const int64_t hk = hh / (heads / c.hk);
          const double f = ds[per_head ? b * c.hk + hk : 0];
          for (int64_t x = 0; x < c.d; ++x) out[(r * heads + hh) * c.d + x] = t.values[(r * heads + hh) * c.d + x] * f;
        }
    return out;
  };
  const std::vector<double> qd = dequant(q, cuq, c.h, desc[0]), kd = dequant(k, cuk, c.hk, desc[1]),
                            vd = dequant(v, cuk, c.hk, desc[2]);
  const reference::AttnRefArgs args = ref_args(c, cuq, cuk, slopes);
  const reference::AttnRefResult ref = reference::attention_fwd(qd, kd, vd, args);
  NaiveFp8 fp8;
  const reference::AttnRefResult naive = attention_fwd_naive(qd, kd, vd, args, DType::kBF16, &fp8);

  const DevTensor lq = make_layout(c, total_q, max_sq, c.h, 1), lk = make_layout(c, total_k, max_sk, c.hk, 1);
  const DevTensor lo = make_layout(c, total_q, max_sq, c.h, 2);  // bf16 out
  DeviceBuffer dq(std::max<int64_t>(lq.elems, 1)), dk(std::max<int64_t>(lk.elems, 1)), dv(std::max<int64_t>(lk.elems, 1)),
      dout(std::max<int64_t>(lo.elems, 1) * 2);
  upload(dq.ptr, scatter(q, lq, c, cuq, c.h));
  upload(dk.ptr, scatter(k, lk, c, cuk, c.hk));
  upload(dv.ptr, scatter(v, lk, c, cuk, c.hk));
  DeviceBuffer ddesc(3 * n_desc * 4), dlse(std::max<int64_t>(c.varlen ? c.h * total_q : c.batch * c.h * max_sq, 1) * 4);
  for (int x = 0; x < 3; ++x)
    FLASHLAB_CUDA_CHECK(cudaMemcpy(static_cast<float*>(ddesc.ptr) + x * n_desc, desc[x].data(), n_desc * 4, cudaMemcpyHostToDevice));
  const CaseAux aux(c, cuq, cuk, slopes);

  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView qv(dq.ptr, DType::kE4M3, lq.shape, lq.strides, gpu), kv(dk.ptr, DType::kE4M3, lk.shape, lk.strides, gpu),
      vv(dv.ptr, DType::kE4M3, lk.shape, lk.strides, gpu), ov(dout.ptr, DType::kBF16, lo.shape, lo.strides, gpu);
  std::vector<TensorView> desc_v;
  for (int x = 0; x < 3; ++x) {
    float* ptr = static_cast<float*>(ddesc.ptr) + x * n_desc;
    desc_v.push_back(per_head ? device_view(ptr, DType::kF32, {c.batch, c.hk}) : device_view(ptr, DType::kF32, {1}));
  }
  const TensorView cuq_v = aux.cu_q(), cuk_v = aux.cu_k(), slopes_v = aux.alibi_slopes();
  const TensorView lse_v = c.varlen ? device_view(dlse.ptr, DType::kF32, {c.h, total_q})
                                    : device_view(dlse.ptr, DType::kF32, {c.batch, c.h, max_sq});
  AttnFwdOptions opt;
  set_case_options(opt, c, cuq_v, cuk_v, slopes_v, lse_v, max_sq, max_sk);
  opt.q_descale = &desc_v[0], opt.k_descale = &desc_v[1], opt.v_descale = &desc_v[2];

  const ::testing::Message what = ::testing::Message(describe(c, DType::kE4M3, 4)) << (per_head ? " descale per head" : " descale per tensor");
  double max_ref = 0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
  // The output of a launch with options o (poisoned before) against the reference.
  const auto check_out = [&](const AttnFwdOptions& o, const ::testing::Message& label) {
    dout.poison();
    attention_fwd(qv, kv, vv, ov, nullptr, kAttnFwdRungAuto, o);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> got = gather(decode(DType::kBF16, download(dout.ptr, dout.bytes)), lo, c, cuq, c.h);
    expect_no_nan(got, label);
    expect_within_tolerance(got, naive.out, ref.out, unit_roundoff(DType::kBF16) * max_ref, label);
  };
  dlse.poison();
  check_out(opt, what);
  const std::vector<double> lse_dev = decode(DType::kF32, download(dlse.ptr, dlse.bytes));
  std::vector<double> lse(ref.lse.size()), lse_ref = ref.lse, lse_naive = naive.lse;
  int64_t inf_mismatch = 0;
  double max_lse = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t hh = 0; hh < c.h; ++hh)
      for (int64_t i = 0; i < c.lq[b]; ++i) {
        const size_t x = static_cast<size_t>(hh * total_q + cuq[b] + i);
        lse[x] = lse_dev[c.varlen ? x : static_cast<size_t>((b * c.h + hh) * max_sq + i)];
        if (std::isinf(lse_ref[x]) || std::isinf(lse[x])) {
          inf_mismatch += lse[x] != lse_ref[x];
          lse[x] = lse_ref[x] = lse_naive[x] = 0;
        }
        max_lse = std::max(max_lse, std::fabs(lse_ref[x]));
      }
  EXPECT_EQ(inf_mismatch, 0) << what << ": lse rows where exactly one of kernel and reference is -inf";
  expect_within_tolerance(lse, lse_naive, lse_ref, 1e-5 * (1 + max_lse) + std::ldexp(fp8.abs_logit, -12),
                          ::testing::Message(what) << " (lse)");
  // Without the lse the library takes another kernel (the rows' sums by the tensor cores,
  // src/attention_hopper_hdim.cuh): the output against the same reference.
  AttnFwdOptions no_lse = opt;
  no_lse.softmax_lse = nullptr;
  check_out(no_lse, ::testing::Message(what) << " (no lse)");
}

TEST(Attention, Fp8Rung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "FP8 attention runs on sm_90 only";
  std::mt19937_64 rng(80);
  std::vector<Case> cases;
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {128, 128}, {200, 333}, {333, 200}, {1000, 1000}}) {
    cases.push_back(fixed(2, sq, sk, 4, 4, 128));
    Case causal = fixed(1, sq, sk, 2, 1, 128);  // MQA, causal
    causal.causal = true;
    cases.push_back(causal);
  }
  Case window = fixed(1, 500, 700, 4, 2, 128);
  window.wl = 100, window.wr = 30;
  cases.push_back(window);
  Case mods = fixed(2, 300, 300, 4, 2, 128);
  mods.softcap = 20.f, mods.alibi = 2, mods.causal = true;
  cases.push_back(mods);
  Case padded = fixed(2, 257, 129, 4, 2, 128);
  padded.layout = Layout::kPadded;
  cases.push_back(padded);
  Case head_major = fixed(2, 130, 250, 2, 2, 128);
  head_major.layout = Layout::kHeadMajor;
  cases.push_back(head_major);
  // Over more than kAttnHopperFp8VtInKernelUpTo keys: V^T from the pass before the kernel.
  cases.push_back(fixed(1, 200, 2100, 2, 1, 128));
  Case long_causal = fixed(1, 300, 2300, 2, 2, 128);
  long_causal.causal = true;
  cases.push_back(long_causal);
  Case varlen;
  varlen.batch = 4, varlen.h = 4, varlen.hk = 2, varlen.d = 128, varlen.varlen = true, varlen.causal = true;
  varlen.lq = {100, 0, 257, 31};
  varlen.lk = {300, 5, 0, 129};
  cases.push_back(varlen);
  varlen.lq = {100, 60};  // the longest sequence over 2k keys: the pass (padded per sequence)
  varlen.lk = {2200, 150};
  varlen.batch = 2;
  cases.push_back(varlen);
  for (const Case& c : cases) {
    check_case_fp8(c, false, rng);
    check_case_fp8(c, true, rng);
  }
}

// Four small FP8 cases (GQA causal with ragged lengths; varlen with empty sequences; GQA without a
// mask, whose 16 tiles the library splits in 3 parts each on any GPU of 48 SMs or more; causal over
// 1030 keys (the three-warpgroup kernel), 12 tiles in 4 parts, some without a key;
// src/attention_hopper_dispatch.h): the reduced sweep compute-sanitizer runs (scripts/device.sh
// FLASHLAB_SANITIZE_FILTER=Attention.Fp8Small).
TEST(Attention, Fp8Small) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "FP8 attention runs on sm_90 only";
  std::mt19937_64 rng(81);
  Case causal = fixed(1, 200, 333, 4, 2, 128);
  causal.causal = true;
  Case varlen;
  varlen.batch = 3, varlen.h = 2, varlen.hk = 1, varlen.d = 128, varlen.varlen = true;
  varlen.lq = {70, 0, 129};
  varlen.lk = {150, 9, 0};
  check_case_fp8(causal, true, rng);
  check_case_fp8(varlen, false, rng);
  check_case_fp8(fixed(2, 200, 333, 4, 2, 128), true, rng);
  Case long_causal = fixed(1, 1030, 1030, 2, 1, 128);
  long_causal.causal = true;
  check_case_fp8(long_causal, false, rng);
}

// Varlen FP8 whose second sequence (9 keys, no query) has NaN in every value of V: the first
// sequence's last key block (keys 128-255 of its 150) reads those rows, as the next sequence's; rung
// 4 zeroes V^T there (keys past the sequence's end: masked probabilities times 0), so the first
// and third sequences' outputs stay finite and match the reference.
TEST(Attention, Fp8VarlenNaNPastEnd) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "FP8 attention runs on sm_90 only";
  std::mt19937_64 rng(84);
  Case varlen;
  varlen.batch = 3, varlen.h = 2, varlen.hk = 1, varlen.d = 128, varlen.varlen = true;
  varlen.lq = {70, 0, 129};
  varlen.lk = {150, 9, 40};
  check_case_fp8(varlen, false, rng, {150, 159});
  varlen.causal = true;
  check_case_fp8(varlen, true, rng, {150, 159});
}

// The last, partial wave's tiles split along the keys (kSplitTail, src/attention_hopper_dispatch.h:
// FP8 without a mask or causal, fixed lengths): MQA with as many heads as make more tiles than SMs and a
// split in at least 3 parts; 650 keys are 6 blocks of 128 (the last partial), so the parts are
// uneven (4 parts: 1, 2, 1, 2 blocks). And causal over 1100 keys (the three-warpgroup kernel from
// 1k keys), 4 heads: 24 tiles in 4 parts, the first query block's 2 key blocks leaving 2 parts
// without a key. Against the reference with and without the LSE.
TEST(Attention, Fp8SplitTail) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "FP8 attention runs on sm_90 only";
  int sms = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int64_t kSq = 600, kSk = 650, kQueryBlocks = 4;  // ceil(600 / 192): the FP8 kernel's 192-row tiles
  constexpr int kKeyBlocks = 6;
  int64_t heads = 0;
  for (int64_t h = 1; h <= 4 * sms && heads == 0; ++h)
    if (kQueryBlocks * h > sms && detail::attn_hopper_split_tail(kQueryBlocks * h, sms, kKeyBlocks).splits >= 3) heads = h;
  ASSERT_GT(heads, 0) << "no head count splits the last wave of " << sms << " SMs";
  std::mt19937_64 rng(82);
  check_case_fp8(fixed(1, kSq, kSk, heads, 1, 128), false, rng);
  ASSERT_GE(detail::attn_hopper_split_tail(6 * 4, sms, 9).splits, 2) << "6 query blocks x 4 heads, 9 key blocks, " << sms << " SMs";
  Case causal = fixed(1, 1100, 1100, 4, 2, 128);
  causal.causal = true;
  check_case_fp8(causal, true, rng);
}

// The split tail at 16 bits (src/attention_hopper_hdim.cuh: head dim 64 without a mask over more
// than 1k keys, the three-warpgroup kernel): 6 query blocks of 192 rows x 4 heads x batch 2 = 48
// tiles over 11 key blocks, split in 2 parts on an H100's 132 SMs; fp16 and bf16, GQA, out and lse
// of rungs 3 and 4 against the reference.
TEST(Attention, SplitTail16Bit) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() == 9) {
    int sms = 0;
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    ASSERT_GE(detail::attn_hopper_split_tail(6 * 4 * 2, sms, 11).splits, 2) << "48 tiles, 11 key blocks, " << sms << " SMs";
  }
  std::mt19937_64 rng(83);
  for (DType dt : {DType::kF16, DType::kBF16}) check_case(dt, fixed(2, 1100, 1300, 4, 2, 64), {3}, rng);
}

// Self-attention on one random bf16 (batch, seqlen, heads, d) tensor as q, k and v: run(rung,
// opt) launches attention_fwd and returns out's bytes.
struct SelfAttention {
  std::vector<int64_t> shape;
  DeviceBuffer q, out;
  SelfAttention(std::mt19937_64& rng, int64_t b, int64_t s, int64_t h, int64_t d)
      : shape{b, s, h, d}, q(b * s * h * d * 2), out(b * s * h * d * 2) {
    upload(q.ptr, random_tensor(DType::kBF16, b * s * h * d, rng, -2, 2).bytes);
  }
  std::vector<uint8_t> run(int rung, const AttnFwdOptions& opt) const {
    const TensorView qv = device_view(q.ptr, DType::kBF16, shape);
    attention_fwd(qv, qv, qv, device_view(out.ptr, DType::kBF16, shape), nullptr, rung, opt);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    return download(out.ptr, out.bytes);
  }
};

// Repeated launches give bit-identical outputs (no atomics in any rung).
TEST(Attention, Deterministic) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(60);
  const SelfAttention sa(rng, 2, 300, 4, 128);
  AttnFwdOptions opt;
  opt.causal = true;
  for (int rung = 1; rung <= kAttnFwdRungs; ++rung) {
    if (rung == 4 && device_cc_major() != 9) continue;
    const std::vector<uint8_t> first = sa.run(rung, opt);
    EXPECT_EQ(sa.run(rung, opt), first) << "rung " << rung;
  }
}

// `call` (writing `out` on `stream`, a fresh stream) captured into a CUDA graph before any eager
// call on the stream, run eagerly, then captured again: every replay's output (out poisoned before)
// equals the eager call's bit for bit (the second graph replayed twice). Returns the eager output.
std::vector<uint8_t> expect_replays_match_eager(const Stream& stream, const DeviceBuffer& out, const std::function<void()>& call,
                                                const std::string& what) {
  const auto replayed = [&](const Graph& g) {
    out.poison();
    g.replay(stream.s);
    return download(out.ptr, out.bytes);
  };
  Graph first;  // before any eager call on this stream: no workspace yet
  first.capture(stream.s, call);
  out.poison();
  call();
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  const std::vector<uint8_t> eager = download(out.ptr, out.bytes);
  EXPECT_EQ(replayed(first), eager) << what << " (captured first)";
  Graph second;  // the workspace exists now
  second.capture(stream.s, call);
  EXPECT_EQ(replayed(second), eager) << what << " (captured after an eager call)";
  EXPECT_EQ(replayed(second), eager) << what << " (second replay)";
  return eager;
}

// The automatic rung inside a CUDA graph (global capture, as torch.cuda.graph) at a length that
// takes rung 4's persistent kernel: captured on a fresh stream (no counters workspace yet, and
// capture allows no cudaMalloc) it falls back to the one-CTA kernel; captured again once an
// eager call has set the workspace up, the graph holds the persistent kernel. Every replay's
// output equals the eager call's, bit for bit (both kernels sum in the same order).
TEST(Attention, Rung4UnderGraphCapture) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(61);
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      const SelfAttention sa(rng, 2, 300, 4, d);
      const TensorView qv = device_view(sa.q.ptr, DType::kBF16, sa.shape);
      const TensorView ov = device_view(sa.out.ptr, DType::kBF16, sa.shape);
      AttnFwdOptions opt;
      opt.causal = causal;
      Stream stream;
      expect_replays_match_eager(
          stream, sa.out, [&] { attention_fwd(qv, qv, qv, ov, stream.s, kAttnFwdRungAuto, opt); },
          "d " + std::to_string(d) + " causal " + std::to_string(causal));
    }
}

// FP8 over more than kAttnHopperFp8VtInKernelUpTo keys takes V^T from a pass before the kernel, into
// the stream's workspace; a CUDA graph captured on a fresh stream (no workspace, and no cudaMalloc
// during a capture) takes the kernel's own transpose instead. Both the same bits: the same kernel
// but for its producer (a local window keeps out the split tail, whose parts need a workspace too).
// With and without the LSE (the row sums in fp32 or by the tensor cores).
TEST(Attention, Fp8UnderGraphCapture) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "FP8 attention runs on sm_90 only";
  constexpr int64_t kSeq = 2100, kHeads = 2, kD = 128, kN = kSeq * kHeads * kD;
  static_assert(kSeq > detail::kAttnHopperFp8VtInKernelUpTo, "a key length that takes the pass");
  std::mt19937_64 rng(85);
  DeviceBuffer dq(kN), dk(kN), dv(kN), dout(kN * 2), dlse(kHeads * kSeq * 4);
  upload(dq.ptr, random_e4m3(kN, rng, 2.0).bytes);
  upload(dk.ptr, random_e4m3(kN, rng, 2.0).bytes);
  upload(dv.ptr, random_e4m3(kN, rng, 4.0).bytes);
  const Device gpu{DeviceType::kCUDA, 0};
  const std::vector<int64_t> shape = {1, kSeq, kHeads, kD};
  const TensorView qv = device_view(dq.ptr, DType::kE4M3, shape), kv = device_view(dk.ptr, DType::kE4M3, shape),
                   vv = device_view(dv.ptr, DType::kE4M3, shape), ov = device_view(dout.ptr, DType::kBF16, shape),
                   lse_v = device_view(dlse.ptr, DType::kF32, {1, kHeads, kSeq});
  for (bool with_lse : {true, false}) {
    AttnFwdOptions opt;
    opt.window_left = 1000, opt.window_right = 0;
    if (with_lse) opt.softmax_lse = &lse_v;
    Stream stream;
    // Captured first: V transposed in the kernel; eager and captured after: the pass.
    const std::string what = std::string("lse ") + (with_lse ? "1" : "0");
    const std::vector<uint8_t> eager = expect_replays_match_eager(
        stream, dout, [&] { attention_fwd(qv, kv, vv, ov, stream.s, kAttnFwdRungAuto, opt); }, what);
    expect_no_nan(decode(DType::kBF16, eager), ::testing::Message() << what);
  }
}

// Dropout (rungs 1 and 3, and the automatic choice, rung 3): out and lse against the reference
// under the mask regenerated on the host from the seed and offset (the same Philox functions),
// and probs whose signs must be that mask, so the kernel's mask is the host's entry by entry
// (the host draws' keep rate is tests/cpu/test_philox.cpp's). Masks, softcap, ALiBi, GQA,
// varlen.
TEST(AttentionDropout, MatchesTheReferenceUnderItsMask) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(92);
  Case c = fixed(2, 77, 113, 4, 2, 64);
  c.causal = true, c.probs = true, c.dropout_p = 0.3f, c.seed = 0x0123456789abcdefull, c.offset = 7;
  check_case(DType::kBF16, c, {1, 3, kAttnFwdRungAuto}, rng);
  c.causal = false, c.wl = 20, c.wr = 5, c.softcap = 8.f, c.alibi = 2, c.dropout_p = 0.9f, c.offset = 8;
  check_case(DType::kF16, c, {1, 3}, rng);
  for (int64_t d : kAttnHeadDims) {  // rung 3's key-block widths and tile counts per head dim
    Case e = fixed(1, 150, 200, 2, 1, d);
    e.causal = d % 64 == 0, e.probs = true, e.dropout_p = 0.2f, e.seed = 1000 + d, e.offset = 2;
    check_case(DType::kBF16, e, {1, 3}, rng);
  }
  Case v;
  v.batch = 3, v.h = 2, v.hk = 1, v.d = 128, v.varlen = true, v.probs = true;
  v.lq = {17, 0, 64}, v.lk = {40, 9, 33};
  v.dropout_p = 0.5f, v.seed = 42, v.offset = 1;
  check_case(DType::kBF16, v, {1, 3, kAttnFwdRungAuto}, rng);
}

// The same seed and offset give bit-identical outputs; another offset or seed another mask.
TEST(AttentionDropout, SeedAndOffsetSelectTheMask) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(93);
  const SelfAttention sa(rng, 1, 96, 2, 64);
  const auto run = [&](uint64_t seed, uint32_t offset) {
    AttnFwdOptions opt;
    opt.dropout_p = 0.5f, opt.dropout_seed = seed, opt.dropout_offset = offset;
    return sa.run(kAttnFwdRungAuto, opt);
  };
  const std::vector<uint8_t> base = run(5, 10);
  EXPECT_EQ(run(5, 10), base) << "same seed and offset";
  EXPECT_NE(run(5, 11), base) << "another offset";
  EXPECT_NE(run(6, 10), base) << "another seed";
}

}  // namespace
}  // namespace flashlab
