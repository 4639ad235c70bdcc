// The persistent rung-4 kernel (kernels/attention/04_hopper_persistent.cuh; the library's for
// short key sequences at head dims 64, 128 and 256) against the one-CTA-per-tile rung-4 kernel on the
// same inputs: the per-tile math is the same code in the same order, so out and lse must match bit
// for bit; out and lse are poisoned with NaN before each launch. Cases the fixed-length experiment
// does not cover: varlen batches with empty and short sequences (tiles skipped, tiles past a
// batch's rows), causal with seqlen_q != seqlen_k (tiles with no key), sliding windows, softcap,
// ALiBi, GQA and MQA, several tiles per CTA, fp16 and bf16, head dims 64 and 128, and 256 without
// softcap / ALiBi (the library's reach); at d 64 also both kernels with three consumer warpgroups on 96-key
// blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "flashlab/attention.h"
#include "src/attention_hopper_hdim.cuh"
#include "src/attention_validate.h"
#include "src/core/static_switch.h"
#include "tests/common/attention_cases.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

// The persistent kernel's loop forms (its launcher's switches): kNoMask, without its mask code
// (fixed lengths, no causal / window, no softcap / ALiBi, whole key blocks; the library's at head
// dim 64); kPeel, its block loop split around the masked blocks (kPeelMask); kHalf, each consumer
// warpgroup on its own blocks of the tile with a half last block (kHalfLast); kPeelHalf, both;
// kLag, head dim 64 without its mask code on the library's deeper K/V ring with the second consumer
// warpgroup started blocks behind the first (kLag); kCausalRing, head dim 64 with its mask code on
// kAttnHopperDeepRingStagesCausal K/V stages (the library's causal ring); kOwnO / kPeelOwnO, head dim
// 256 on 64-key blocks with O staged in a tile of its own and Q given back after each warpgroup's
// last Q K^T of the tile (kOwnO), without and with the masked blocks peeled off, and with each
// warpgroup on its own blocks too (kPeelHalfOwnO; the reference: the one-CTA kernel on 64-key
// blocks); *Stsm: O written to its tile by stmatrix; kLagLate / kCausalRingLate: kLag / kCausalRing with the
// O store waited for after the next tile's first Q K^T (kStoreWaitLate; the library's above 512 keys,
// and causal); kCausalRingLateTurns: kCausalRingLate with turns for the exponentials (kExpTurns;
// the library's plain causal form). The other forms take the library's kStoreWaitLate (kAttnHopperStoreWaitLate: at head
// dim 128 without softcap / ALiBi, and with three consumer warpgroups). kTail3: the default form with the
// walk's last three (batch, head) pairs in rounds of one query block (HopperAttnArgs::tail_heads; the
// other forms take the library's tail: with a right mask edge as many pairs as attn_hopper_tail_heads
// gives). kPairs: not the persistent kernel but the one-CTA kernel in CTA pairs that load each K / V
// block once, multicast into both (kCluster 2; no causal / window, fixed lengths, an even count of
// query blocks).
enum class Form { kDefault, kNoMask, kPeel, kHalf, kPeelHalf, kLag, kCausalRing, kOwnO, kPeelOwnO, kPeelHalfOwnO, kPeelOwnOStsm,
                  kPeelHalfOwnOStsm, kLagLate, kCausalRingLate, kTail3, kCausalRingLateTurns, kPairs };
bool own_o(Form form) {
  return form == Form::kOwnO || form == Form::kPeelOwnO || form == Form::kPeelHalfOwnO || form == Form::kPeelOwnOStsm ||
         form == Form::kPeelHalfOwnOStsm;
}

// The persistent kernel with its masked blocks peeled off (kPeel) and / or each warpgroup on its
// own blocks (kHalf: kHalfLast; at head dim 256 the last block cut to kAttnHopperTailKeys256 keys);
// three: three consumer warpgroups on 96-key blocks (head dim 64, no softcap / ALiBi).
template <bool kPeel, bool kHalf>
void run_persistent_loop_form(const AttnFwdParams& p, DType dt, bool three) {
  HALF_DTYPE_SWITCH(dt, T, [&] {
    BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
      if (p.headdim == 256) {  // 80-key blocks (no softcap / ALiBi: the library's reach)
        constexpr int kTail = kHalf ? detail::kAttnHopperTailKeys256 : 0;
        if constexpr (!kScoreMod)
          detail::launch_attn_hopper_persistent_as<T, 256, false, 2, 0, false, false, kPeel, kHalf, kTail>(p, dt, nullptr);
      } else if (three) {
        if constexpr (!kScoreMod) detail::launch_attn_hopper_persistent_as<T, 64, false, 3, 96, false, false, kPeel, kHalf>(p, dt, nullptr);
      } else if (p.headdim == 64) {
        detail::launch_attn_hopper_persistent_as<T, 64, kScoreMod, 2, 0, false, false, kPeel, kHalf>(p, dt, nullptr);
      } else {
        detail::launch_attn_hopper_persistent_as<T, 128, kScoreMod, 2, 0, false, false, kPeel, kHalf>(p, dt, nullptr);
      }
    });
  });
}

// attention_fwd's parameters for these views (its validation), then the persistent kernel, or
// the one-CTA-per-tile kernel of rung 4 (two consumer warpgroups, 128-key blocks: the per-tile
// math of the persistent kernel). attention_fwd itself takes the persistent kernel for short key
// sequences, so the reference is launched directly.
// three: both kernels with three consumer warpgroups on 96-key blocks (head dim 64, no softcap /
// ALiBi: the library's persistent kernel for causal 1k-2k keys there). form: the persistent kernel's
// loop form (Form).
void run_rung4(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttnFwdOptions& opt, bool persistent, bool three = false, Form form = Form::kDefault) {
  const AttnFwdParams p = detail::attention_validated_params("attention_fwd", q, k, v, out, 4, opt, nullptr);
  ASSERT_GT(p.total_q, 0);  // attention_fwd sends empty packed tensors to rung 3
  ASSERT_GT(p.total_k, 0);
  if (persistent && (form == Form::kPeel || form == Form::kHalf || form == Form::kPeelHalf)) {
    if (form == Form::kPeel) run_persistent_loop_form<true, false>(p, q.dtype, three);
    else if (form == Form::kHalf) run_persistent_loop_form<false, true>(p, q.dtype, three);
    else run_persistent_loop_form<true, true>(p, q.dtype, three);
    return;
  }
  if (persistent && (form == Form::kLag || form == Form::kCausalRing || form == Form::kLagLate || form == Form::kCausalRingLate ||
                     form == Form::kCausalRingLateTurns)) {
    ASSERT_EQ(p.headdim, 64);
    ASSERT_TRUE(p.softcap == 0.f && p.alibi_slopes == nullptr);
    constexpr int kStages = detail::kAttnHopperDeepRingStages, kLag = detail::kAttnHopperDeepRingLag,
                  kStagesCausal = detail::kAttnHopperDeepRingStagesCausal;
    HALF_DTYPE_SWITCH(q.dtype, T, [&] {
      if (form == Form::kLag) detail::launch_attn_hopper_persistent_lag<T, true, kStages, kLag>(p, q.dtype, nullptr);
      else if (form == Form::kLagLate) detail::launch_attn_hopper_persistent_lag<T, true, kStages, kLag, true>(p, q.dtype, nullptr);
      else if (form == Form::kCausalRing) detail::launch_attn_hopper_persistent_lag<T, false, kStagesCausal, 0>(p, q.dtype, nullptr);
      else if (form == Form::kCausalRingLate) detail::launch_attn_hopper_persistent_lag<T, false, kStagesCausal, 0, true>(p, q.dtype, nullptr);
      else detail::launch_attn_hopper_persistent_lag<T, false, kStagesCausal, 0, true, true>(p, q.dtype, nullptr);
    });
    return;
  }
  if (persistent && form == Form::kPairs) {
    ASSERT_TRUE(detail::attn_hopper_pairs(p, 128));
    HALF_DTYPE_SWITCH(q.dtype, T, [&] {
      BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
        if (p.headdim == 128) detail::launch_attn_hopper_pairs<T, 128, kScoreMod>(p, q.dtype, nullptr);
        else if constexpr (!kScoreMod) detail::launch_attn_hopper_pairs<T, 256, false>(p, q.dtype, nullptr);
      });
    });
    return;
  }
  if (own_o(form)) {
    ASSERT_EQ(p.headdim, 256);
    ASSERT_TRUE(p.softcap == 0.f && p.alibi_slopes == nullptr);
    HALF_DTYPE_SWITCH(q.dtype, T, [&] {
      if (!persistent) detail::launch_attn_hopper_variant<T, 256, false, true, true, 64>(p, q.dtype, nullptr);
      else if (form == Form::kOwnO) detail::launch_attn_hopper_persistent_own_o<T, false>(p, q.dtype, nullptr);
      else if (form == Form::kPeelOwnO) detail::launch_attn_hopper_persistent_own_o<T, true>(p, q.dtype, nullptr);
      else if (form == Form::kPeelHalfOwnO) detail::launch_attn_hopper_persistent_own_o<T, true, true>(p, q.dtype, nullptr);
      else if (form == Form::kPeelOwnOStsm) detail::launch_attn_hopper_persistent_own_o<T, true, false, true>(p, q.dtype, nullptr);
      else detail::launch_attn_hopper_persistent_own_o<T, true, true, true>(p, q.dtype, nullptr);
    });
    return;
  }
  if (persistent && form == Form::kNoMask) {
    ASSERT_TRUE(detail::attn_hopper_no_mask(p, 128));
    HALF_DTYPE_SWITCH(q.dtype, T, [&] {
      if (p.headdim == 64) detail::launch_attn_hopper_persistent_nomask<T, 64>(p, q.dtype, nullptr);
      else detail::launch_attn_hopper_persistent_nomask<T, 128>(p, q.dtype, nullptr);
    });
    return;
  }
  if (three) {
    ASSERT_EQ(p.headdim, 64);
    ASSERT_TRUE(p.softcap == 0.f && p.alibi_slopes == nullptr);
    HALF_DTYPE_SWITCH(q.dtype, T, [&] {
      constexpr int kN = detail::kAttnHopperPersistentThreeBlockN;
      if (persistent) detail::launch_attn_hopper_persistent_three<T>(p, q.dtype, nullptr);
      else detail::launch_attn_hopper_variant<T, 64, false, true, true, kN, false, false, true, false, 3>(p, q.dtype, nullptr);
    });
    return;
  }
  const int tail = form == Form::kTail3 ? 3 : -1;
  HALF_DTYPE_SWITCH(q.dtype, T, [&] {
    BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
      if constexpr (!kScoreMod) {  // head dim 256: without softcap / ALiBi (the library's reach)
        if (p.headdim == 256) {
          if (persistent) detail::launch_attn_hopper_persistent<T, 256, false>(p, q.dtype, nullptr, 0.01, tail);
          else detail::launch_attn_hopper_variant<T, 256, false, true, true>(p, q.dtype, nullptr);
          return;
        }
      }
      ASSERT_NE(p.headdim, 256);
      if (persistent) {
        if (p.headdim == 64) detail::launch_attn_hopper_persistent_as<T, 64, kScoreMod>(p, q.dtype, nullptr, 0.01, tail);
        else detail::launch_attn_hopper_persistent_as<T, 128, kScoreMod>(p, q.dtype, nullptr, 0.01, tail);
      } else {
        if (p.headdim == 64) detail::launch_attn_hopper_variant<T, 64, kScoreMod, true, true>(p, q.dtype, nullptr);
        else detail::launch_attn_hopper_variant<T, 128, kScoreMod, true, true>(p, q.dtype, nullptr);
      }
    });
  });
}

void check_same_as_rung4(DType dt, const Case& c, std::mt19937_64& rng, bool three = false, Form form = Form::kDefault) {
  static const char* const kForm[] = {")", ", without masks)", ", masked blocks peeled)", ", half last blocks)",
                                      ", masked blocks peeled, half last blocks)", ", without masks, lagging warpgroup)",
                                      ", the causal K/V ring)", ", O's own staging tile)", ", masked blocks peeled, O's own staging tile)",
                                      ", masked blocks peeled, half last blocks, O's own staging tile)",
                                      ", masked blocks peeled, O's own staging tile by stmatrix)",
                                      ", masked blocks peeled, half last blocks, O's own staging tile by stmatrix)",
                                      ", without masks, lagging warpgroup, O store waited for late)",
                                      ", the causal K/V ring, O store waited for late)",
                                      ", the last three (batch, head) pairs in rounds of one query block)",
                                      ", the causal K/V ring, O store waited for late, turns for the exponentials)",
                                      ""};
  const ::testing::Message what =
      form == Form::kPairs ? describe(c, dt, 4) << " (the one-CTA kernel in CTA pairs)"
                           : describe(c, dt, 4) << (three ? " (persistent, three consumers" : " (persistent") << kForm[static_cast<int>(form)];
  const std::vector<int64_t> cuq = prefix(c.lq), cuk = prefix(c.lk);
  const int64_t total_q = cuq.back(), total_k = cuk.back();
  const int64_t max_sq = *std::max_element(c.lq.begin(), c.lq.end()), max_sk = *std::max_element(c.lk.begin(), c.lk.end());
  const HostTensor q = random_tensor(dt, total_q * c.h * c.d, rng, -2.0, 2.0);
  const HostTensor k = random_tensor(dt, total_k * c.hk * c.d, rng, -2.0, 2.0);
  const HostTensor v = random_tensor(dt, total_k * c.hk * c.d, rng, -1.0, 1.0);
  const DevTensor lq = make_layout(c, total_q, max_sq, c.h), lk = make_layout(c, total_k, max_sk, c.hk);
  const int64_t es = dtype_size(dt);
  DeviceBuffer dq(lq.elems * es), dk(lk.elems * es), dv(lk.elems * es), out4(lq.elems * es), outp(lq.elems * es);
  upload(dq.ptr, scatter(q, lq, c, cuq, c.h));
  upload(dk.ptr, scatter(k, lk, c, cuk, c.hk));
  upload(dv.ptr, scatter(v, lk, c, cuk, c.hk));
  const int64_t lse_n = c.varlen ? c.h * total_q : c.batch * c.h * max_sq;
  DeviceBuffer lse4(lse_n * 4), lsep(lse_n * 4);
  const std::vector<double> slopes = random_slopes(c, rng);
  const CaseAux aux(c, cuq, cuk, slopes);
  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView qv(dq.ptr, dt, lq.shape, lq.strides, gpu), kv(dk.ptr, dt, lk.shape, lk.strides, gpu),
      vv(dv.ptr, dt, lk.shape, lk.strides, gpu);
  const TensorView cuq_v = aux.cu_q(), cuk_v = aux.cu_k(), slopes_v = aux.alibi_slopes();
  const auto lse_view = [&](const DeviceBuffer& b) {
    return c.varlen ? device_view(b.ptr, DType::kF32, {c.h, total_q}) : device_view(b.ptr, DType::kF32, {c.batch, c.h, max_sq});
  };
  const TensorView lse4_v = lse_view(lse4), lsep_v = lse_view(lsep);
  for (const DeviceBuffer* b : {&out4, &outp, &lse4, &lsep}) b->poison();
  AttnFwdOptions opt;
  set_case_options(opt, c, cuq_v, cuk_v, slopes_v, lse4_v, max_sq, max_sk);
  run_rung4(qv, kv, vv, TensorView(out4.ptr, dt, lq.shape, lq.strides, gpu), opt, false, three,
            own_o(form) ? form : Form::kDefault);
  opt.softmax_lse = &lsep_v;
  run_rung4(qv, kv, vv, TensorView(outp.ptr, dt, lq.shape, lq.strides, gpu), opt, true, three, form);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // Compared where the output lives (gather: the packed rows), bit for bit.
  const std::vector<double> a = gather(decode(dt, download(out4.ptr, out4.bytes)), lq, c, cuq, c.h),
                            b = gather(decode(dt, download(outp.ptr, outp.bytes)), lq, c, cuq, c.h);
  expect_no_nan(b, what);
  int64_t out_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) out_diff += !(a[i] == b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]));
  EXPECT_EQ(out_diff, 0) << what << " (out: elements that differ from rung 4)";
  const std::vector<double> la = decode(DType::kF32, download(lse4.ptr, lse4.bytes)),
                            lb = decode(DType::kF32, download(lsep.ptr, lsep.bytes));
  int64_t lse_diff = 0;
  for (int64_t bb = 0; bb < c.batch; ++bb)
    for (int64_t hh = 0; hh < c.h; ++hh)
      for (int64_t i = 0; i < c.lq[bb]; ++i) {
        const int64_t at = c.varlen ? hh * total_q + cuq[bb] + i : (bb * c.h + hh) * max_sq + i;
        lse_diff += !(la[at] == lb[at]);  // -inf == -inf; NaN (unwritten) never equal
      }
  EXPECT_EQ(lse_diff, 0) << what << " (lse: rows that differ from rung 4)";
}

// Varlen: empty, short and long sequences (tiles past a batch's rows are skipped).
Case ragged_varlen(int64_t d) {
  Case vl;
  vl.batch = 5, vl.h = 4, vl.hk = 2, vl.d = d, vl.varlen = true, vl.causal = true;
  vl.lq = {300, 0, 1, 1000, 129};
  vl.lk = {300, 7, 0, 1000, 257};
  return vl;
}

// The cases without softcap / ALiBi: many tiles per CTA (132 SMs: 8 batches x `rows` rows x 8
// heads), causal and not; seqlen_q > seqlen_k, causal (the first query blocks see no key: tiles
// with no block); a sliding window with GQA; MQA with ragged lengths; varlen.
void check_plain_cases(DType dt, int64_t d, int64_t rows, std::mt19937_64& rng, bool three = false, Form form = Form::kDefault) {
  for (bool causal : {false, true}) {
    Case c = fixed(8, rows, rows, 8, 8, d);
    c.causal = causal;
    check_same_as_rung4(dt, c, rng, three, form);
  }
  Case nk = fixed(2, 700, 300, 4, 2, d);
  nk.causal = true;
  check_same_as_rung4(dt, nk, rng, three, form);
  Case w = fixed(3, 900, 1200, 8, 2, d);
  w.wl = 200, w.wr = 50;
  check_same_as_rung4(dt, w, rng, three, form);
  check_same_as_rung4(dt, fixed(2, 333, 517, 6, 1, d), rng, three, form);
  check_same_as_rung4(dt, ragged_varlen(d), rng, three, form);
}

// Softcap (causal) and ALiBi ((nheads,) slopes with a window).
void check_score_mod_cases(DType dt, int64_t d, std::mt19937_64& rng, Form form = Form::kDefault) {
  Case sc = fixed(2, 640, 640, 4, 4, d);
  sc.causal = true, sc.softcap = 30.f;
  check_same_as_rung4(dt, sc, rng, false, form);
  Case al = fixed(2, 500, 800, 4, 2, d);
  al.alibi = 1, al.wl = 300, al.wr = 0;
  check_same_as_rung4(dt, al, rng, false, form);
}

TEST(AttentionPersistent, SameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2026);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128}) {
      check_plain_cases(dt, d, 1024, rng);  // 8 x 1024 rows x 8 heads = 512 tiles
      check_score_mod_cases(dt, d, rng);
      Case vl = ragged_varlen(d);  // ALiBi with (batch, nheads) slopes on varlen
      vl.alibi = 2, vl.causal = false;
      check_same_as_rung4(dt, vl, rng);
      // d 64: three consumer warpgroups, 96-key blocks (no softcap / ALiBi; the library's, with
      // kHalfLast and kPeelMask).
      if (d == 64) check_plain_cases(dt, d, 1536, rng, true);
    }
}

// The persistent kernel without its mask code (kNoMask), where no block needs a mask: fixed lengths,
// keys a multiple of 128 (rows not: the last query block partial), many tiles per CTA, GQA / MQA;
// bit for bit as the one-CTA kernel. Its launcher refuses a call that needs a mask (causal, keys
// not a multiple of the block, varlen) before any launch.
TEST(AttentionPersistent, NoMaskSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2028);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128}) {
      check_same_as_rung4(dt, fixed(8, 1000, 1024, 8, 8, d), rng, false, Form::kNoMask);  // 512 tiles
      check_same_as_rung4(dt, fixed(2, 300, 384, 6, 2, d), rng, false, Form::kNoMask);
      check_same_as_rung4(dt, fixed(3, 130, 128, 4, 1, d), rng, false, Form::kNoMask);  // one key block
    }
  AttnFwdParams p{};
  p.seqlen_k = 384, p.window_left = -1, p.window_right = 0;  // causal
  EXPECT_FALSE(detail::attn_hopper_no_mask(p, 128));
  p.window_right = -1;
  EXPECT_TRUE(detail::attn_hopper_no_mask(p, 128));
  p.seqlen_k = 385;
  EXPECT_FALSE(detail::attn_hopper_no_mask(p, 128));
  p.seqlen_k = 384;
  p.softcap = 30.f;
  EXPECT_FALSE(detail::attn_hopper_no_mask(p, 128));
  p.softcap = 0.f;
  int cu[2] = {0, 384};
  p.cu_seqlens_q = cu;
  EXPECT_FALSE(detail::attn_hopper_no_mask(p, 128));
  p.cu_seqlens_q = nullptr;
  p.batch = 1, p.nheads = p.nheads_kv = 1, p.headdim = 64, p.seqlen_q = 1;
  p.window_right = 0;
  const auto causal_call = [&] { detail::launch_attn_hopper_persistent_nomask<__nv_bfloat16, 64>(p, DType::kBF16, nullptr); };
  EXPECT_THROW(causal_call(), Error);
}

// The persistent kernels with the block loop split around the masked blocks (kPeelMask): every
// case of SameAsRung4 (causal, seqlen_q > seqlen_k, windows on both sides, ragged keys, varlen,
// softcap, ALiBi with a window), and head dim 256's plain cases, bit for bit as the one-CTA kernel.
TEST(AttentionPersistent, PeelMaskSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2029);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128}) {
      check_plain_cases(dt, d, 1024, rng, false, Form::kPeel);
      check_score_mod_cases(dt, d, rng, Form::kPeel);
      Case wl = fixed(2, 1000, 1000, 4, 2, d);  // a left window only: masked blocks at the start
      wl.wl = 300;
      check_same_as_rung4(dt, wl, rng, false, Form::kPeel);
      if (d == 64) check_plain_cases(dt, d, 1536, rng, true, Form::kPeel);
    }
  for (DType dt : {DType::kBF16, DType::kF16}) check_plain_cases(dt, 256, 512, rng, false, Form::kPeel);  // 80-key blocks
}

// Each consumer warpgroup on its own blocks of the tile, a half last block where its rows see only
// that (kHalfLast), with and without the masked blocks peeled off: every case of SameAsRung4
// (causal on whole tiles: the first warpgroup's diagonal block is half; seqlen_q > seqlen_k; windows
// on both sides; keys ending in the first half of a block (517: 5 of 128); varlen; softcap; ALiBi),
// keys ending in a block's first half without a mask (320 = 2.5 x 128), a right window that hides a
// warpgroup's last blocks, and at d 64 three consumer warpgroups on 96-key blocks (whose first one
// skips the tile's last block on the causal diagonal, and whose second takes its last block half),
// bit for bit as the one-CTA kernel; and head dim 256's plain cases with each warpgroup's last block
// cut to its first 32 keys (kTailKeys).
TEST(AttentionPersistent, HalfLastSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2030);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128})
      for (Form form : {Form::kHalf, Form::kPeelHalf}) {
        check_plain_cases(dt, d, 1024, rng, false, form);
        check_score_mod_cases(dt, d, rng, form);
        check_same_as_rung4(dt, fixed(3, 320, 320, 4, 2, d), rng, false, form);
        Case wr = fixed(2, 1000, 1000, 4, 2, d);  // a right window only
        wr.wr = 40;
        check_same_as_rung4(dt, wr, rng, false, form);
        if (d == 64) check_plain_cases(dt, d, 1536, rng, true, form);
      }
  // Head dim 256 (80-key blocks, the last cut to 32 keys; the library's causal kernel there until
  // kOwnO replaced it, OwnOSameAsRung4).
  for (DType dt : {DType::kBF16, DType::kF16}) check_plain_cases(dt, 256, 512, rng, false, Form::kPeelHalf);
}

// Head dim 64's deeper K/V rings (the library's over the persistent kernel's reach there): without a
// mask with the second consumer warpgroup started blocks behind the first (kLag: many tiles per CTA;
// one tile, and one key block, per CTA, where the first warpgroup lets the second start at the end
// of its walk), and with the mask code on three stages (every plain case: causal, seqlen_q >
// seqlen_k, windows, ragged keys, varlen), each with the O store waited for at once and late
// (kStoreWaitLate: tiles without keys between tiles with keys, varlen tiles by copy, walks of one
// tile), and late with the two consumer warpgroups taking turns for their exponentials (kExpTurns: the
// library's causal form); bit for bit as the one-CTA kernel.
TEST(AttentionPersistent, DeepRingSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2031);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (bool late : {false, true}) {
      const Form lag = late ? Form::kLagLate : Form::kLag;
      check_same_as_rung4(dt, fixed(8, 512, 512, 8, 8, 64), rng, false, lag);  // 256 tiles, 4 blocks each
      check_same_as_rung4(dt, fixed(8, 1000, 1024, 8, 8, 64), rng, false, lag);
      check_same_as_rung4(dt, fixed(2, 300, 384, 6, 2, 64), rng, false, lag);
      check_same_as_rung4(dt, fixed(3, 130, 128, 4, 1, 64), rng, false, lag);  // one key block
      check_same_as_rung4(dt, fixed(1, 100, 256, 1, 1, 64), rng, false, lag);  // one tile: one CTA
      // Tiles of two blocks, several a CTA: the first warpgroup lets the second start at its second tile.
      check_same_as_rung4(dt, fixed(8, 1000, 256, 8, 8, 64), rng, false, lag);
      check_plain_cases(dt, 64, 512, rng, false, late ? Form::kCausalRingLate : Form::kCausalRing);
      if (late) check_plain_cases(dt, 64, 512, rng, false, Form::kCausalRingLateTurns);
    }
}

// The walk's tail (HopperAttnArgs::tail_heads) of three (batch, head) pairs, fewer than the walk's, so
// that the tail begins mid-walk: every plain case (causal and not, seqlen_q > seqlen_k with tiles of no
// key, windows, ragged keys, varlen with tiles past a sequence's rows) at head dims 64, 128 and 256,
// and softcap / ALiBi at 64 and 128; bit for bit as the one-CTA kernel (out and lse poisoned: a tile
// the walk skipped would leave NaN).
TEST(AttentionPersistent, TailOrderSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2033);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128, 256}) {
      check_plain_cases(dt, d, 512, rng, false, Form::kTail3);
      if (d != 256) check_score_mod_cases(dt, d, rng, Form::kTail3);
    }
}

// The one-CTA kernel in CTA pairs that load each K / V block once, multicast into both (kCluster 2):
// no mask with many tiles per SM (the pairs' K / V stages released by both CTAs' consumers, round after
// round), keys past the last whole block (its mask), GQA / MQA, one key block (fewer than the stages),
// one pair, softcap at d 128; bit for bit as the same kernel alone, at head dims 128 and 256. The
// launcher refuses causal, a window, varlen and an odd count of query blocks before any launch.
TEST(AttentionPersistent, PairsSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2035);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {128, 256}) {
      check_same_as_rung4(dt, fixed(8, 1024, 1024, 8, 8, d), rng, false, Form::kPairs);  // 512 tiles
      check_same_as_rung4(dt, fixed(2, 500, 517, 6, 2, d), rng, false, Form::kPairs);   // ragged keys, GQA
      check_same_as_rung4(dt, fixed(3, 256, 128, 4, 1, d), rng, false, Form::kPairs);   // MQA, one key block
      check_same_as_rung4(dt, fixed(1, 200, 1000, 1, 1, d), rng, false, Form::kPairs);  // one pair
    }
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Case sc = fixed(2, 768, 640, 4, 4, 128);
    sc.softcap = 30.f;
    check_same_as_rung4(dt, sc, rng, false, Form::kPairs);
  }
  AttnFwdParams p{};
  p.batch = 1, p.nheads = p.nheads_kv = 1, p.headdim = 128, p.seqlen_q = 256, p.seqlen_k = 256;
  p.window_left = -1, p.window_right = -1;
  EXPECT_TRUE(detail::attn_hopper_pairs(p, 128));
  p.seqlen_q = 384;  // three query blocks
  EXPECT_FALSE(detail::attn_hopper_pairs(p, 128));
  p.seqlen_q = 256;
  int cu[2] = {0, 256};
  p.cu_seqlens_q = cu;
  EXPECT_FALSE(detail::attn_hopper_pairs(p, 128));
  p.cu_seqlens_q = nullptr;
  p.window_left = 100;
  EXPECT_FALSE(detail::attn_hopper_pairs(p, 128));
  p.window_left = -1, p.window_right = 0;  // causal
  EXPECT_FALSE(detail::attn_hopper_pairs(p, 128));
  const auto causal_call = [&] { detail::launch_attn_hopper_pairs<__nv_bfloat16, 128, false>(p, DType::kBF16, nullptr); };
  EXPECT_THROW(causal_call(), Error);
}

// Head dim 256 (one Q buffer; 80-key blocks; no softcap / ALiBi: the library's reach there).
TEST(AttentionPersistent, SameAsRung4HeadDim256) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2027);
  for (DType dt : {DType::kBF16, DType::kF16}) check_plain_cases(dt, 256, 512, rng);  // 256 tiles: about two per CTA
}

// Head dim 256 on 64-key blocks with O staged in a tile of its own, which the two consumer
// warpgroups take in turn, and the Q buffer given back after each warpgroup's last Q K^T of the tile
// (kOwnO), with and without the masked blocks peeled off, and with each warpgroup on its own blocks
// (kHalfLast: on the causal diagonal the first warpgroup skips the tile's last block): every plain
// case (many tiles per CTA, causal, seqlen_q > seqlen_k with tiles of no key, windows, ragged keys,
// varlen) and a right window that hides a warpgroup's last blocks, bit for bit as the one-CTA kernel
// on 64-key blocks; the peeled forms also with O written to its tile by stmatrix.
TEST(AttentionPersistent, OwnOSameAsRung4) {
  SKIP_WITHOUT_GPU();
  if (device_cc_major() != 9) GTEST_SKIP() << "rung 4 runs on sm_90 only";
  std::mt19937_64 rng(2032);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (Form form : {Form::kOwnO, Form::kPeelOwnO, Form::kPeelHalfOwnO, Form::kPeelOwnOStsm, Form::kPeelHalfOwnOStsm}) {
      check_plain_cases(dt, 256, 512, rng, false, form);
      Case wr = fixed(2, 600, 600, 4, 2, 256);  // a right window only
      wr.wr = 40;
      check_same_as_rung4(dt, wr, rng, false, form);
    }
}

}  // namespace
}  // namespace flashlab
