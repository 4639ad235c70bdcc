// attention_bwd on a machine with no GPU: bad input through the public C++ API
// (include/flashlab/attention.h). Every call must throw flashlab::Error whose message starts
// "attention_bwd: argument", names what was expected and what was given, and launch nothing.
//
// attention_bwd runs the forward's checks on q, k, v, out and the options (src/attention.cu,
// shared through src/attention_validate.h), so those are tested in full by
// test_attention_validation.cpp; here only where the backward changes them (softmax_lse
// required, attn_probs and FP8 refused) and that their messages name attention_bwd. The
// backward's own checks are tested in full: dout, dq, dk, dv (device, rank, layout, dtype,
// shape), the outputs' overlap with every input, each other and themselves, and what rung 3
// takes (head dim, dropout, strides; its compute-capability check needs a device, so here only
// valid rung-3 calls reaching it on a machine without a GPU).
//
// The tensors sit at fake device addresses, so a call that got as far as the device would fail
// with a CUDA error instead: `expect_rejected` below fails on any CUDA error.
//
// Also: attention_bwd_workspace_bytes against its closed form, and, on a machine without a GPU,
// that valid calls pass every host check (the first thing they do next is a CUDA call). The
// disabled tests at the end are gaps of src/attention_bwd.cu, reported, not fixed here.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/attention.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::fake;
using testing::gpu;
using testing::gpu_strided;
using testing::kCpu;
using testing::kGpu;

constexpr DType kBf = DType::kBF16;
const Device kGpu1{DeviceType::kCUDA, 1};
static_assert(kAttnBwdRungs == 3, "the backward rung list of include/flashlab/attention.h changed: update this test");

// Slots of tests/common/validation_utils.h: 4 GiB apart, so distinct tensors never overlap.
enum Slot { kQ = 1, kK, kV, kO, kCuQ, kCuK, kAlibi, kLse, kDout, kDq, kDk, kDv };

// The tensors of one backward call, valid as built: the forward's inputs, its out and
// softmax_lse, the gradient dout, and the gradients written, dq, dk, dv.
struct Call {
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  TensorView cu_q, cu_k;  // varlen only
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;

  // The options of the valid call: the lse, and for varlen the cu_seqlens and max lengths.
  AttnBwdOptions opt() const {
    AttnBwdOptions o;
    o.softmax_lse = &lse;
    if (cu_q.data != nullptr) {
      o.cu_seqlens_q = &cu_q, o.cu_seqlens_k = &cu_k;
      o.max_seqlen_q = max_seqlen_q, o.max_seqlen_k = max_seqlen_k;
    }
    return o;
  }
};

// Fixed length: batch 2, seqlen_q 16, seqlen_k 32, nheads 4, nheads_kv 2 (GQA), headdim d.
Call fixed(DType dt = kBf, int64_t d = 64) {
  Call c;
  c.q = gpu(dt, {2, 16, 4, d}, kQ), c.k = gpu(dt, {2, 32, 2, d}, kK), c.v = gpu(dt, {2, 32, 2, d}, kV);
  c.out = gpu(dt, {2, 16, 4, d}, kO), c.lse = gpu(DType::kF32, {2, 4, 16}, kLse);
  c.dout = gpu(dt, {2, 16, 4, d}, kDout), c.dq = gpu(dt, {2, 16, 4, d}, kDq);
  c.dk = gpu(dt, {2, 32, 2, d}, kDk), c.dv = gpu(dt, {2, 32, 2, d}, kDv);
  return c;
}

// Varlen: batch 2, total_q 40, total_k 70, max_seqlen_q 24, max_seqlen_k 40, nheads 4 / 2, d 64.
Call varlen() {
  Call c;
  c.q = gpu(kBf, {40, 4, 64}, kQ), c.k = gpu(kBf, {70, 2, 64}, kK), c.v = gpu(kBf, {70, 2, 64}, kV);
  c.out = gpu(kBf, {40, 4, 64}, kO), c.lse = gpu(DType::kF32, {4, 40}, kLse);
  c.dout = gpu(kBf, {40, 4, 64}, kDout), c.dq = gpu(kBf, {40, 4, 64}, kDq);
  c.dk = gpu(kBf, {70, 2, 64}, kDk), c.dv = gpu(kBf, {70, 2, 64}, kDv);
  c.cu_q = gpu(DType::kI32, {3}, kCuQ), c.cu_k = gpu(DType::kI32, {3}, kCuK);
  c.max_seqlen_q = 24, c.max_seqlen_k = 40;
  return c;
}

// c with one of its tensors replaced.
Call with(Call c, TensorView Call::*member, TensorView t) {
  c.*member = std::move(t);
  return c;
}

// Asserts attention_bwd is rejected on every rung (or on `rungs`) with a message that starts
// "attention_bwd: argument", never names the forward, and contains every piece, before any
// CUDA call, launching nothing.
void expect_rejected(const Call& c, const std::vector<std::string>& pieces, const AttnBwdOptions& opt,
                     const std::vector<int>& rungs = {1, 2, 3, kAttnBwdRungAuto}) {
  for (int rung : rungs) {
    SCOPED_TRACE("rung " + std::to_string(rung));
    testing::expect_rejected(
        [&] {
          try {
            attention_bwd(c.q, c.k, c.v, c.out, c.dout, c.dq, c.dk, c.dv, nullptr, rung, opt);
          } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_EQ(msg.rfind("attention_bwd: argument", 0), 0u) << msg;
            EXPECT_EQ(msg.find("attention_fwd"), std::string::npos) << "names the forward: " << msg;
            EXPECT_EQ(msg.find("CUDA error"), std::string::npos) << "reached the device before rejecting: " << msg;
            throw;
          }
        },
        pieces);
  }
}

void expect_rejected(const Call& c, const std::vector<std::string>& pieces) { expect_rejected(c, pieces, c.opt()); }

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Asserts the call passes every host check: on a machine without a GPU its first CUDA call
// (a DeviceGuard's cudaGetDevice, before any read or launch) then fails. Callers skip where a
// GPU is present, since the fake pointers would reach it.
void expect_host_checks_pass(const Call& c, const AttnBwdOptions& opt, int rung = kAttnBwdRungAuto) {
  const int64_t launches = check::launch_count();
  try {
    attention_bwd(c.q, c.k, c.v, c.out, c.dout, c.dq, c.dk, c.dv, nullptr, rung, opt);
    ADD_FAILURE() << "expected a CUDA error on a machine without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA error"), std::string::npos) << "rejected by a host check: " << msg;
    EXPECT_NE(msg.find("cudaGetDevice"), std::string::npos) << msg;
  }
  EXPECT_EQ(check::launch_count(), launches);
}

void expect_host_checks_pass(const Call& c, int rung = kAttnBwdRungAuto) { expect_host_checks_pass(c, c.opt(), rung); }

// The four gradient tensors of fixed(): the one read (dout) and the three written.
struct Grad {
  TensorView Call::*member;
  const char* name;
  std::vector<int64_t> shape;
  int slot;
};
const Grad kGrads[] = {{&Call::dout, "dout", {2, 16, 4, 64}, kDout},
                       {&Call::dq, "dq", {2, 16, 4, 64}, kDq},
                       {&Call::dk, "dk", {2, 32, 2, 64}, kDk},
                       {&Call::dv, "dv", {2, 32, 2, 64}, kDv}};

// ---- rung, dtypes, and the forward's options the backward takes differently

TEST(AttentionBwdValidation, RungOutOfRange) {
  const Call c = fixed();
  for (int rung : {0, kAttnBwdRungs + 1, -2, 100})
    expect_rejected(c, {"argument 'rung'", "expected 1..3 or -1 (auto)", "got " + std::to_string(rung)}, c.opt(), {rung});
  // The rung is checked first: with a CPU q and no lse, a bad rung names the rung.
  const Call cpu_q = with(c, &Call::q, TensorView(fake(0, kQ), kBf, {2, 16, 4, 64}, kCpu));
  expect_rejected(cpu_q, {"argument 'rung'", "got 0"}, AttnBwdOptions{}, {0});
  const Call vl = varlen();
  expect_rejected(vl, {"argument 'rung'", "got 4"}, vl.opt(), {4});
  // Rungs 2 and 3 add dQ with atomics: never deterministic (rung 1 and the automatic choice are).
  AttnBwdOptions det = c.opt();
  det.deterministic = true;
  for (int rung : {2, 3})
    expect_rejected(c,
                    {"argument 'deterministic'",
                     "expected false for rung " + std::to_string(rung) +
                         " (its dQ atomics add in a varying order; rung 1 or auto is deterministic)",
                     "got true"},
                    det, {rung});
  // Dropout: its range is the forward's rule, on every rung.
  AttnBwdOptions drop = c.opt();
  drop.dropout_p = 1.f;
  expect_rejected(c, {"argument 'dropout_p'", "expected a finite value in [0, 1)", "got 1"}, drop);
}

// Rung 3 (TMA + wgmma): head dims 64, 128 and 256, no softcap at 256, no dropout, positive
// strides on q, k, v and dout (dims of size 1 aside), compute capability 9.x; checked after the
// shared and gradient checks, in that order. Each call here passes every check on rungs 1, 2 and
// auto.
TEST(AttentionBwdValidation, Rung3Hopper) {
  const std::vector<int> rung3{3};
  for (int64_t d : {32, 96, 192})
    for (DType dt : {DType::kF16, kBf}) {
      SCOPED_TRACE(d);
      const Call c = fixed(dt, d);
      expect_rejected(c, {"argument 'q'", "expected head dim (last dim) 64, 128 or 256 for rung 3", "got " + std::to_string(d)},
                      c.opt(), rung3);
    }
  {
    const Call c = fixed(kBf, 256);
    AttnBwdOptions capped = c.opt();
    capped.softcap = 5.f;
    expect_rejected(c, {"argument 'softcap'", "expected 0 at head dim 256 for rung 3 (rung 2 or auto takes it)", "got 5"},
                    capped, rung3);
  }
  const Call c = fixed();
  AttnBwdOptions drop = c.opt();
  drop.dropout_p = 0.5f;
  expect_rejected(c, {"argument 'dropout_p'", "expected 0 for rung 3 (rung 2 or auto takes dropout)", "got 0.5"}, drop, rung3);
  // TMA walks positive strides only: k broadcast over the batch (stride 0), q's rows reversed,
  // v's heads reversed, dout broadcast over the heads (a gradient torch may hand over).
  const std::string tma = "expected positive strides on every dim of size > 1 for rung 3 (TMA)";
  const Call k0 = with(c, &Call::k, gpu_strided(kBf, {2, 32, 2, 64}, {0, 128, 64, 1}, kK));
  const Call q_rev = with(c, &Call::q, gpu_strided(kBf, {2, 16, 4, 64}, {4096, -256, 64, 1}, kQ));
  const Call v_rev = with(c, &Call::v, gpu_strided(kBf, {2, 32, 2, 64}, {4096, 128, -64, 1}, kV));
  const Call dout0 = with(c, &Call::dout, gpu_strided(kBf, {2, 16, 4, 64}, {1024, 64, 0, 1}, kDout));
  expect_rejected(k0, {"argument 'k'", tma, "got strides [0, 128, 64, 1]"}, k0.opt(), rung3);
  expect_rejected(q_rev, {"argument 'q'", tma, "got strides [4096, -256, 64, 1]"}, q_rev.opt(), rung3);
  expect_rejected(v_rev, {"argument 'v'", tma, "got strides [4096, 128, -64, 1]"}, v_rev.opt(), rung3);
  expect_rejected(dout0, {"argument 'dout'", tma, "got strides [1024, 64, 0, 1]"}, dout0.opt(), rung3);
  // The order: deterministic (before any tensor), the shared and gradient checks, head dim,
  // dropout, strides.
  const Call d32 = fixed(kBf, 32);
  AttnBwdOptions o = d32.opt();
  o.deterministic = true, o.dropout_p = 0.5f;
  expect_rejected(d32, {"argument 'deterministic'", "expected false for rung 3"}, o, rung3);
  const Call d32_bad_dq = with(d32, &Call::dq, gpu(kBf, {2, 16, 4, 64}, kDq));
  expect_rejected(d32_bad_dq, {"argument 'dq'", "expected shape [2, 16, 4, 32] (same as 'q')", "got [2, 16, 4, 64]"},
                  d32_bad_dq.opt(), rung3);
  o = d32.opt();
  o.dropout_p = 0.5f;
  expect_rejected(d32, {"argument 'q'", "expected head dim (last dim) 64, 128 or 256 for rung 3", "got 32"}, o, rung3);
  o = k0.opt();
  o.dropout_p = 0.5f;
  expect_rejected(k0, {"argument 'dropout_p'", "expected 0 for rung 3"}, o, rung3);
  // Rung 3 only: the other rungs take all of these (machines without a GPU only, as below).
  if (has_gpu()) return;  // the fake pointers would reach it
  for (int rung : {1, 2, kAttnBwdRungAuto}) {
    SCOPED_TRACE("rung " + std::to_string(rung));
    for (const Call* x : {&d32, &k0, &q_rev, &v_rev, &dout0}) expect_host_checks_pass(*x, rung);
    expect_host_checks_pass(fixed(kBf, 96), rung);
  }
}

// fp16 / bf16 only: no FP8 backward (e4m3 is a forward-only input), no fp32 or integer inputs.
TEST(AttentionBwdValidation, Dtypes) {
  constexpr DType e4 = DType::kE4M3;
  // The forward's FP8 call: q, k, v e4m3, out bf16, head dim 128; the gradients bf16.
  Call fp8 = fixed(kBf, 128);
  fp8.q = gpu(e4, {2, 16, 4, 128}, kQ), fp8.k = gpu(e4, {2, 32, 2, 128}, kK), fp8.v = gpu(e4, {2, 32, 2, 128}, kV);
  expect_rejected(fp8, {"argument 'q'", "expected dtype fp16 or bf16", "got e4m3"});
  for (DType dt : {DType::kF32, DType::kI8, DType::kE5M2}) {
    expect_rejected(fixed(dt), {"argument 'q'", "expected dtype fp16 or bf16", std::string("got ") + dtype_name(dt)});
  }
  expect_rejected(with(varlen(), &Call::q, gpu(DType::kF32, {40, 4, 64}, kQ)),
                  {"argument 'q'", "expected dtype fp16 or bf16", "got fp32"});
  // The forward's dtype rules still hold for k, v, out.
  expect_rejected(with(fixed(), &Call::v, gpu(DType::kF16, {2, 32, 2, 64}, kV)),
                  {"argument 'v'", "expected dtype bf16 (same as 'q')", "got fp16"});
  // The FP8 descale factors: refused with fp16 / bf16 inputs, as in the forward.
  const Call c = fixed();
  const TensorView one = gpu(DType::kF32, {1}, kAlibi);
  AttnBwdOptions o = c.opt();
  o.k_descale = &one;
  expect_rejected(c, {"argument 'k_descale'", "expected no descale factor for fp16 / bf16 inputs"}, o);
}

// The backward recomputes P from the forward's lse: required, and shaped as the forward wrote it.
TEST(AttentionBwdValidation, SoftmaxLseRequired) {
  for (const Call& c : {fixed(), varlen()}) {
    AttnBwdOptions o = c.opt();
    o.softmax_lse = nullptr;
    expect_rejected(c,
                    {"argument 'softmax_lse'", "expected the forward's log-sum-exp (the backward recomputes P from it)",
                     "got none"},
                    o);
  }
  expect_rejected(with(fixed(), &Call::lse, gpu(DType::kF32, {2, 16, 4}, kLse)),
                  {"argument 'softmax_lse'", "expected shape [2, 4, 16]", "got [2, 16, 4]"});
  expect_rejected(with(fixed(), &Call::lse, gpu(kBf, {2, 4, 16}, kLse)),
                  {"argument 'softmax_lse'", "expected dtype fp32", "got bf16"});
  expect_rejected(with(varlen(), &Call::lse, gpu(DType::kF32, {2, 4, 24}, kLse)),
                  {"argument 'softmax_lse'", "expected shape [4, 40]", "got [2, 4, 24]"});
  expect_rejected(with(fixed(), &Call::lse, TensorView(fake(0, kLse), DType::kF32, {2, 4, 16}, kCpu)),
                  {"argument 'softmax_lse'", "expected a CUDA tensor", "got cpu tensor"});
}

// attn_probs is a forward output (for tests): the backward takes none.
TEST(AttentionBwdValidation, AttnProbsRefused) {
  const TensorView probs = gpu(kBf, {2, 4, 16, 32}, kAlibi), probs_packed = gpu(kBf, {2, 4, 24, 40}, kAlibi);
  const Call c = fixed(), vl = varlen();
  AttnBwdOptions o = c.opt();
  o.attn_probs = &probs;
  expect_rejected(c, {"argument 'attn_probs'", "expected none (a forward output)", "got a tensor"}, o);
  AttnBwdOptions ov = vl.opt();
  ov.attn_probs = &probs_packed;
  expect_rejected(vl, {"argument 'attn_probs'", "expected none (a forward output)", "got a tensor"}, ov);
}

// Errors found by the forward's checks name the backward (the helper asserts the message starts
// "attention_bwd: argument" and never says attention_fwd).
TEST(AttentionBwdValidation, SharedChecksNameTheBackward) {
  const Call c = fixed();
  AttnBwdOptions o = c.opt();
  o.window_left = -2;
  expect_rejected(c, {"argument 'window_left'", "expected >= -1 (-1: unbounded)", "got -2"}, o);
  o = c.opt();
  o.causal = true, o.window_right = -5;
  expect_rejected(c, {"argument 'window_right'", "got -5"}, o);
  o = c.opt();
  o.softcap = -1.f;
  expect_rejected(c, {"argument 'softcap'", "expected a finite value >= 0", "got -1"}, o);
  o = c.opt();
  o.softmax_scale = std::numeric_limits<float>::infinity();
  expect_rejected(c, {"argument 'softmax_scale'", "expected a finite value", "got inf"}, o);
  const TensorView alibi_bad = gpu(DType::kF32, {3, 4}, kAlibi);
  o = c.opt();
  o.alibi_slopes = &alibi_bad;
  expect_rejected(c, {"argument 'alibi_slopes'", "expected shape [4] or [2, 4]", "got [3, 4]"}, o);
  // q, k, v, out.
  expect_rejected(with(c, &Call::q, TensorView(fake(0, kQ), kBf, {2, 16, 4, 64}, kCpu)),
                  {"argument 'q'", "expected a CUDA tensor", "got cpu tensor"});
  expect_rejected(fixed(kBf, 80), {"argument 'q'", "expected head dim (last dim) one of 32, 64, 96, 128, 192, 256", "got 80"});
  Call gqa = fixed();
  gqa.k = gpu(kBf, {2, 32, 3, 64}, kK), gqa.v = gpu(kBf, {2, 32, 3, 64}, kV);
  gqa.dk = gpu(kBf, {2, 32, 3, 64}, kDk), gqa.dv = gpu(kBf, {2, 32, 3, 64}, kDv);
  expect_rejected(gqa, {"argument 'k'", "expected a number of heads that divides q's 4 (GQA/MQA)", "got 3"});
  expect_rejected(with(c, &Call::out, gpu(kBf, {2, 16, 2, 64}, kO)),
                  {"argument 'out'", "expected shape [2, 16, 4, 64] (same as 'q')", "got [2, 16, 2, 64]"});
  expect_rejected(with(c, &Call::out, gpu(kBf, {2, 16, 4, 64}, kQ, 1024)),
                  {"argument 'out'", "expected memory disjoint from 'q'", "got a partial overlap"});
  // Varlen: the host checks of cu_seqlens and max_seqlen, a packed q without them.
  const Call vl = varlen();
  AttnBwdOptions ov = vl.opt();
  ov.cu_seqlens_k = nullptr;
  expect_rejected(vl, {"arguments 'cu_seqlens_q' and 'cu_seqlens_k'", "expected both or neither", "got only 'cu_seqlens_q'"}, ov);
  ov = vl.opt();
  ov.max_seqlen_q = -1;
  expect_rejected(vl, {"argument 'max_seqlen_q'", "expected 0 .. 2^30 - 1", "got -1"}, ov);
  const TensorView cu_bad = gpu(DType::kI64, {3}, kCuK);
  ov = vl.opt();
  ov.cu_seqlens_k = &cu_bad;
  expect_rejected(vl, {"argument 'cu_seqlens_k'", "expected dtype int32", "got int64"}, ov);
  const TensorView alibi_vl = gpu(DType::kF32, {40, 4}, kAlibi);
  ov = vl.opt();
  ov.alibi_slopes = &alibi_vl;
  expect_rejected(vl, {"argument 'alibi_slopes'", "expected shape [4] or [2, 4]", "got [40, 4]"}, ov);
  AttnBwdOptions no_cu;
  no_cu.softmax_lse = &vl.lse;
  expect_rejected(vl, {"argument 'q'", "expected 4 dims", "got 3 dims, shape [40, 4, 64]"}, no_cu);
}

// ---- dout, dq, dk, dv: device, rank, dtype, layout, shape

TEST(AttentionBwdValidation, GradientsNotOnTheGpu) {
  for (const Grad& g : kGrads) {
    SCOPED_TRACE(g.name);
    const std::string arg = std::string("argument '") + g.name + "'";
    expect_rejected(with(fixed(), g.member, TensorView(fake(0, g.slot), kBf, g.shape, kCpu)),
                    {arg, "expected a CUDA tensor", "got cpu tensor"});
    expect_rejected(with(fixed(), g.member, TensorView(fake(0, g.slot), kBf, g.shape, Device{DeviceType::kCUDAHost, 0})),
                    {arg, "expected a CUDA tensor", "got cuda_host (pinned cpu) tensor"});
    expect_rejected(with(fixed(), g.member, TensorView(nullptr, kBf, g.shape, kGpu)),
                    {arg, "expected a non-null data pointer", "got null"});
    expect_rejected(with(fixed(), g.member, TensorView(fake(0, g.slot), kBf, g.shape, kGpu1)),
                    {arg, "expected a tensor on cuda:0 (same as 'q')", "got cuda:1"});
  }
}

TEST(AttentionBwdValidation, GradientsRank) {
  for (const Grad& g : kGrads) {
    SCOPED_TRACE(g.name);
    const std::string arg = std::string("argument '") + g.name + "'";
    // The packed (total, heads, d) form without cu_seqlens, and a (batch, heads, seqlen, d)-sized
    // tensor flattened to 2-D.
    const std::vector<int64_t> packed{g.shape[0] * g.shape[1], g.shape[2], g.shape[3]};
    expect_rejected(with(fixed(), g.member, gpu(kBf, packed, g.slot)),
                    {arg, "expected 4 dims", "got 3 dims, shape " + shape_str(packed)});
    expect_rejected(with(fixed(), g.member, gpu(kBf, {g.shape[0] * g.shape[1] * g.shape[2], 64}, g.slot)),
                    {arg, "expected 4 dims", "got 2 dims"});
  }
}

TEST(AttentionBwdValidation, GradientsDtype) {
  for (const Grad& g : kGrads) {
    SCOPED_TRACE(g.name);
    const std::string arg = std::string("argument '") + g.name + "'";
    // fp32 gradients (what an fp32 accumulation would want) are refused: q's dtype only.
    expect_rejected(with(fixed(), g.member, gpu(DType::kF32, g.shape, g.slot)),
                    {arg, "expected dtype bf16 (same as 'q')", "got fp32"});
    expect_rejected(with(fixed(), g.member, gpu(DType::kF16, g.shape, g.slot)),
                    {arg, "expected dtype bf16 (same as 'q')", "got fp16"});
  }
  Call f16 = fixed(DType::kF16);
  f16.dk = gpu(kBf, {2, 32, 2, 64}, kDk);
  expect_rejected(f16, {"argument 'dk'", "expected dtype fp16 (same as 'q')", "got bf16"});
}

TEST(AttentionBwdValidation, GradientsLayout) {
  for (const Grad& g : kGrads) {
    SCOPED_TRACE(g.name);
    const std::string arg = std::string("argument '") + g.name + "'";
    const int64_t seq = g.shape[1], heads = g.shape[2], d = g.shape[3];
    // Every other element of a twice-as-wide tensor.
    const std::vector<int64_t> every_other{2 * seq * heads * d, 2 * heads * d, 2 * d, 2};
    expect_rejected(with(fixed(), g.member, gpu_strided(kBf, g.shape, every_other, g.slot)),
                    {arg, "expected unit stride in the last dim", "got strides " + shape_str(every_other)});
    // Rows padded by 4 elements (8 bytes): every other row starts off a 16-byte boundary.
    const std::vector<int64_t> padded{seq * (heads * d + 4), heads * d + 4, d, 1};
    expect_rejected(with(fixed(), g.member, gpu_strided(kBf, g.shape, padded, g.slot)),
                    {arg, "expected strides that are multiples of 8 elements (16-byte aligned rows)",
                     "got strides " + shape_str(padded)});
    // Heads 68 elements apart.
    const std::vector<int64_t> heads68{seq * heads * 68, heads * 68, 68, 1};
    expect_rejected(with(fixed(), g.member, gpu_strided(kBf, g.shape, heads68, g.slot)),
                    {arg, "expected strides that are multiples of 8 elements"});
    // Element-aligned, not 16-byte aligned.
    expect_rejected(with(fixed(), g.member, gpu(kBf, g.shape, g.slot, 8)),
                    {arg, "expected a data pointer aligned to 16 bytes", "(offset 8)"});
  }
  // fp16 too: 8 elements in 16 bytes.
  const std::vector<int64_t> padded{16 * 260, 260, 64, 1};
  expect_rejected(with(fixed(DType::kF16), &Call::dq, gpu_strided(DType::kF16, {2, 16, 4, 64}, padded, kDq)),
                  {"argument 'dq'", "expected strides that are multiples of 8 elements", "got strides [4160, 260, 64, 1]"});
}

TEST(AttentionBwdValidation, GradientsShape) {
  const std::string as_out = "expected shape [2, 16, 4, 64] (same as 'out')";
  expect_rejected(with(fixed(), &Call::dout, gpu(kBf, {2, 16, 4, 32}, kDout)), {"argument 'dout'", as_out, "got [2, 16, 4, 32]"});
  expect_rejected(with(fixed(), &Call::dout, gpu(kBf, {2, 32, 4, 64}, kDout)), {"argument 'dout'", as_out, "got [2, 32, 4, 64]"});
  expect_rejected(with(fixed(), &Call::dout, gpu(kBf, {2, 4, 16, 64}, kDout)), {"argument 'dout'", as_out, "got [2, 4, 16, 64]"});
  // dq like q; shaped like k by mistake.
  const std::string as_q = "expected shape [2, 16, 4, 64] (same as 'q')";
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 32, 2, 64}, kDq)), {"argument 'dq'", as_q, "got [2, 32, 2, 64]"});
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {1, 16, 4, 64}, kDq)), {"argument 'dq'", as_q, "got [1, 16, 4, 64]"});
  // dk, dv like k: under GQA, not one per query head (the expanded heads are summed, not written).
  const std::string as_k = "expected shape [2, 32, 2, 64] (same as 'k')";
  expect_rejected(with(fixed(), &Call::dk, gpu(kBf, {2, 32, 4, 64}, kDk)), {"argument 'dk'", as_k, "got [2, 32, 4, 64]"});
  expect_rejected(with(fixed(), &Call::dv, gpu(kBf, {2, 32, 4, 64}, kDv)), {"argument 'dv'", as_k, "got [2, 32, 4, 64]"});
  expect_rejected(with(fixed(), &Call::dk, gpu(kBf, {2, 16, 4, 64}, kDk)), {"argument 'dk'", as_k, "got [2, 16, 4, 64]"});
  expect_rejected(with(fixed(), &Call::dv, gpu(kBf, {2, 31, 2, 64}, kDv)), {"argument 'dv'", as_k, "got [2, 31, 2, 64]"});
}

// ---- the outputs dq, dk, dv: disjoint from every input, each other and themselves

TEST(AttentionBwdValidation, OutputsOverlapAnInput) {
  auto disjoint = [](const char* out, const char* in) {
    return std::vector<std::string>{std::string("argument '") + out + "'",
                                    std::string("expected memory disjoint from '") + in + "'"};
  };
  auto same = [&](const char* out, const char* in) {
    auto pieces = disjoint(out, in);
    pieces.push_back(std::string("got the same memory as '") + in + "'");
    return pieces;
  };
  auto partial = [&](const char* out, const char* in) {
    auto pieces = disjoint(out, in);
    pieces.push_back("got a partial overlap");
    return pieces;
  };
  // Identical (the in-place case other ops allow): gradients written over what is still read.
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kQ)), same("dq", "q"));
  expect_rejected(with(fixed(), &Call::dk, gpu(kBf, {2, 32, 2, 64}, kK)), same("dk", "k"));
  expect_rejected(with(fixed(), &Call::dv, gpu(kBf, {2, 32, 2, 64}, kV)), same("dv", "v"));
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kDout)), same("dq", "dout"));
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kO)), same("dq", "out"));
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kLse)), same("dq", "softmax_lse"));
  expect_rejected(with(fixed(), &Call::dv, gpu(kBf, {2, 32, 2, 64}, kK)), same("dv", "k"));
  // Partial overlaps: an output starting inside an input, an input starting inside an output.
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kQ, 1024)), partial("dq", "q"));
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kDout, 16)), partial("dq", "dout"));
  expect_rejected(with(fixed(), &Call::dq, gpu(kBf, {2, 16, 4, 64}, kLse, 64)), partial("dq", "softmax_lse"));
  expect_rejected(with(fixed(), &Call::lse, gpu(DType::kF32, {2, 4, 16}, kDk, 256)), partial("dk", "softmax_lse"));
  expect_rejected(with(fixed(), &Call::dout, gpu(kBf, {2, 16, 4, 64}, kDv, 4096)), partial("dv", "dout"));
  expect_rejected(with(fixed(), &Call::dk, gpu(kBf, {2, 32, 2, 64}, kV, 8192)), partial("dk", "v"));
  // The ALiBi slopes are read too.
  const Call c = fixed();
  const TensorView alibi_in_dv = gpu(DType::kF32, {4}, kDv, 64);
  AttnBwdOptions o = c.opt();
  o.alibi_slopes = &alibi_in_dv;
  expect_rejected(c, partial("dv", "alibi_slopes"), o);
}

TEST(AttentionBwdValidation, OutputsOverlapEachOther) {
  // dk and dv in one buffer (MHA, seqlen_q = seqlen_k: every shape alike).
  Call c = fixed();
  c.k = gpu(kBf, {2, 16, 4, 64}, kK), c.v = gpu(kBf, {2, 16, 4, 64}, kV), c.lse = gpu(DType::kF32, {2, 4, 16}, kLse);
  c.dk = gpu(kBf, {2, 16, 4, 64}, kDk), c.dv = gpu(kBf, {2, 16, 4, 64}, kDk);
  expect_rejected(c, {"argument 'dk'", "expected memory disjoint from 'dv'", "got the same memory as 'dv'"});
  c.dv = gpu(kBf, {2, 16, 4, 64}, kDv);
  expect_rejected(with(c, &Call::dq, gpu(kBf, {2, 16, 4, 64}, kDk)),
                  {"argument 'dq'", "expected memory disjoint from 'dk'", "got the same memory as 'dk'"});
  expect_rejected(with(c, &Call::dq, gpu(kBf, {2, 16, 4, 64}, kDv)),
                  {"argument 'dq'", "expected memory disjoint from 'dv'", "got the same memory as 'dv'"});
  // Partial overlaps, fixed GQA shapes.
  expect_rejected(with(fixed(), &Call::dv, gpu(kBf, {2, 32, 2, 64}, kDk, 2048)),
                  {"argument 'dk'", "expected memory disjoint from 'dv'", "got a partial overlap"});
  expect_rejected(with(fixed(), &Call::dk, gpu(kBf, {2, 32, 2, 64}, kDq, 512)),
                  {"argument 'dq'", "expected memory disjoint from 'dk'", "got a partial overlap"});
}

// Two elements of one output at one address: several blocks would write it.
TEST(AttentionBwdValidation, OutputOverlapsItself) {
  const std::string self = "expected strides under which no two elements share an address";
  // dq's heads at one address (a broadcast view), dk's heads 8 elements apart.
  expect_rejected(with(fixed(), &Call::dq, gpu_strided(kBf, {2, 16, 4, 64}, {8192, 512, 0, 1}, kDq)),
                  {"argument 'dq'", self, "got strides [8192, 512, 0, 1] for shape [2, 16, 4, 64]"});
  expect_rejected(with(fixed(), &Call::dk, gpu_strided(kBf, {2, 32, 2, 64}, {4096, 128, 8, 1}, kDk)), {"argument 'dk'", self});
  // dv's batches on top of each other.
  expect_rejected(with(fixed(), &Call::dv, gpu_strided(kBf, {2, 32, 2, 64}, {0, 128, 64, 1}, kDv)), {"argument 'dv'", self});
}

// ---- valid calls pass every host check (machines without a GPU only)

TEST(AttentionBwdValidation, ValidCallsPassTheHostChecks) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: the fake pointers would reach it";
  for (int rung : {1, 2, 3, kAttnBwdRungAuto}) {
    expect_host_checks_pass(fixed(), rung);
    expect_host_checks_pass(fixed(DType::kF16), rung);
  }
  // Rung 3 at head dim 128 too: it passes every host check, then asks the device for its
  // compute capability (the first CUDA call here).
  expect_host_checks_pass(fixed(kBf, 128), 3);
  expect_host_checks_pass(fixed(DType::kF16, 128), 3);
  // Every head dim, fp16 and bf16, MHA and MQA.
  for (int d : kAttnHeadDims)
    for (DType dt : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(d);
      Call mqa;
      mqa.q = gpu(dt, {1, 7, 3, d}, kQ), mqa.k = gpu(dt, {1, 5, 1, d}, kK), mqa.v = gpu(dt, {1, 5, 1, d}, kV);
      mqa.out = gpu(dt, {1, 7, 3, d}, kO), mqa.lse = gpu(DType::kF32, {1, 3, 7}, kLse);
      mqa.dout = gpu(dt, {1, 7, 3, d}, kDout), mqa.dq = gpu(dt, {1, 7, 3, d}, kDq);
      mqa.dk = gpu(dt, {1, 5, 1, d}, kDk), mqa.dv = gpu(dt, {1, 5, 1, d}, kDv);
      expect_host_checks_pass(mqa);
      Call mha;
      mha.q = gpu(dt, {2, 8, 8, d}, kQ), mha.k = gpu(dt, {2, 9, 8, d}, kK), mha.v = gpu(dt, {2, 9, 8, d}, kV);
      mha.out = gpu(dt, {2, 8, 8, d}, kO), mha.lse = gpu(DType::kF32, {2, 8, 8}, kLse);
      mha.dout = gpu(dt, {2, 8, 8, d}, kDout), mha.dq = gpu(dt, {2, 8, 8, d}, kDq);
      mha.dk = gpu(dt, {2, 9, 8, d}, kDk), mha.dv = gpu(dt, {2, 9, 8, d}, kDv);
      expect_host_checks_pass(mha);
    }
  // Every option the backward takes; NaN / negative scale mean the default.
  const Call c = fixed();
  const TensorView alibi = gpu(DType::kF32, {4}, kAlibi), alibi_b = gpu(DType::kF32, {2, 4}, kAlibi);
  AttnBwdOptions o = c.opt();
  o.alibi_slopes = &alibi, o.causal = true, o.window_left = 0, o.softcap = 50.f, o.deterministic = true;
  o.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_host_checks_pass(c, o);
  o.alibi_slopes = &alibi_b, o.softmax_scale = -3.f, o.causal = false, o.window_right = 5;
  o.window_left = std::numeric_limits<int64_t>::max();
  expect_host_checks_pass(c, o);
  // Gradient layouts: padded rows and heads (multiples of 8), a size-1 batch with any stride, a
  // (batch, heads, seqlen, d) buffer viewed as (batch, seqlen, heads, d).
  Call strided = c;
  strided.dout = gpu_strided(kBf, {2, 16, 4, 64}, {16 * 264, 264, 64, 1}, kDout);
  strided.dq = gpu_strided(kBf, {2, 16, 4, 64}, {8192, 64, 1024, 1}, kDq);
  strided.dk = gpu_strided(kBf, {2, 32, 2, 64}, {32 * 2 * 72, 2 * 72, 72, 1}, kDk);
  for (int rung : {1, 2, 3, kAttnBwdRungAuto}) expect_host_checks_pass(strided, rung);
  Call one = fixed();
  one.q = gpu(kBf, {1, 16, 4, 64}, kQ), one.k = gpu(kBf, {1, 32, 2, 64}, kK), one.v = gpu(kBf, {1, 32, 2, 64}, kV);
  one.out = gpu(kBf, {1, 16, 4, 64}, kO), one.lse = gpu(DType::kF32, {1, 4, 16}, kLse);
  one.dout = gpu_strided(kBf, {1, 16, 4, 64}, {12345, 256, 64, 1}, kDout), one.dq = gpu(kBf, {1, 16, 4, 64}, kDq);
  one.dk = gpu_strided(kBf, {1, 32, 2, 64}, {7, 128, 64, 1}, kDk), one.dv = gpu(kBf, {1, 32, 2, 64}, kDv);
  for (int rung : {1, 2, 3, kAttnBwdRungAuto}) expect_host_checks_pass(one, rung);
  // Rung 3's positive strides exempt dims of size 1: q's batch stride 0 with batch 1.
  expect_host_checks_pass(with(one, &Call::q, gpu_strided(kBf, {1, 16, 4, 64}, {0, 256, 64, 1}, kQ)), 3);
  // dout may be out itself (both are read).
  expect_host_checks_pass(with(c, &Call::dout, c.out));
  // Varlen (its first CUDA call comes earlier: see the disabled test at the end of the file).
  expect_host_checks_pass(varlen(), 1);
  expect_host_checks_pass(varlen(), 3);
  expect_host_checks_pass(varlen());
  // Dropout on rungs 1, 2 and auto (rung 3 has none: Rung3Hopper above).
  AttnBwdOptions drop = c.opt();
  drop.dropout_p = 0.5f, drop.dropout_seed = 99, drop.dropout_offset = 3;
  for (int rung : {1, 2, kAttnBwdRungAuto}) expect_host_checks_pass(c, drop, rung);
}

// ---- attention_bwd_workspace_bytes: the closed form of include/flashlab/attention.h

TEST(AttentionBwdWorkspace, ClosedForms) {
  // Rung 1: the fp32 P and dS matrices, batch x nheads x seqlen_q x seqlen_k each, and D,
  // batch x nheads x seqlen_q.
  auto rung1 = [](int64_t b, int64_t h, int64_t sq, int64_t sk) { return (2 * b * h * sq * sk + b * h * sq) * 4; };
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 2, 4, 16, 32, 64), (2 * 2 * 4 * 16 * 32 + 2 * 4 * 16) * 4);
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 2, 4, 16, 32, 256), rung1(2, 4, 16, 32));  // no head dim
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 1, 1, 1, 1, 32), 12);
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 1, 32, 4096, 4096, 128), (int64_t{1} << 32) + (int64_t{1} << 19));  // past int32
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 65535, 1, 100000, 1000, 64), rung1(65535, 1, 100000, 1000));
  // No keys: D only. No rows: nothing.
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 3, 5, 7, 0, 64), 3 * 5 * 7 * 4);
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 3, 5, 0, 7, 64), 0);
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 0, 5, 7, 9, 64), 0);
  // Rung 2: the fp32 dq accumulator (headdim floats a row), D and lse, each for batch x nheads x
  // seqlen_q rounded up to 128; the automatic choice is rung 2's.
  EXPECT_EQ(attention_bwd_workspace_bytes(2, 2, 4, 16, 32, 64), 2 * 4 * 128 * (64 + 2) * 4);
  EXPECT_EQ(attention_bwd_workspace_bytes(2, 2, 4, 16, 0, 128), 2 * 4 * 128 * (128 + 2) * 4);  // no keys: the same
  EXPECT_EQ(attention_bwd_workspace_bytes(2, 3, 5, 128, 9, 32), 3 * 5 * 128 * (32 + 2) * 4);
  EXPECT_EQ(attention_bwd_workspace_bytes(2, 3, 5, 129, 9, 32), 3 * 5 * 256 * (32 + 2) * 4);
  EXPECT_EQ(attention_bwd_workspace_bytes(2, 3, 5, 0, 9, 32), 0);  // no rows: nothing
  EXPECT_EQ(attention_bwd_workspace_bytes(kAttnBwdRungAuto, 2, 4, 16, 32, 64), attention_bwd_workspace_bytes(2, 2, 4, 16, 32, 64));
  // Rung 3: rung 2's (the same preprocess, accumulator and dq conversion), so the automatic
  // choice's workspace is right whichever of the two it takes.
  EXPECT_EQ(attention_bwd_workspace_bytes(3, 2, 4, 16, 32, 64), 2 * 4 * 128 * (64 + 2) * 4);
  for (const auto& s : std::vector<std::vector<int64_t>>{
           {2, 4, 16, 32, 64}, {3, 5, 65, 9, 128}, {1, 32, 4096, 4096, 128}, {3, 5, 0, 9, 64}, {2, 4, 16, 0, 64}})
    EXPECT_EQ(attention_bwd_workspace_bytes(3, s[0], s[1], s[2], s[3], s[4]),
              attention_bwd_workspace_bytes(2, s[0], s[1], s[2], s[3], s[4]))
        << shape_str(s);
  // Twice the forward's rung 1 (its S/P matrix) plus D.
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 2, 4, 16, 32, 64),
            2 * attention_fwd_workspace_bytes(1, 2, 4, 16, 32, 64) + 2 * 4 * 16 * 4);
  // The largest sizes that fit: P and dS at 2^61 bytes each.
  EXPECT_EQ(attention_bwd_workspace_bytes(1, 1, 1, 1, int64_t{1} << 59, 64), (int64_t{1} << 62) + 4);
}

TEST(AttentionBwdWorkspace, Errors) {
  auto expect_error = [](std::vector<std::string> pieces, int rung, int64_t b, int64_t h, int64_t sq, int64_t sk,
                         int64_t d) {
    pieces.push_back("attention_bwd_workspace_bytes: ");
    testing::expect_rejected([&] { attention_bwd_workspace_bytes(rung, b, h, sq, sk, d); }, pieces);
  };
  for (int rung : {0, 4, -2}) expect_error({"argument 'rung'", "expected 1..3", "got " + std::to_string(rung)}, rung, 2, 4, 16, 32, 64);
  const std::string sizes = "expected sizes >= 0";
  expect_error({sizes, "got batch -1, nheads 4, seqlen_q 16, seqlen_k 32, headdim 64"}, 1, -1, 4, 16, 32, 64);
  expect_error({sizes, "nheads -4"}, 1, 2, -4, 16, 32, 64);
  expect_error({sizes, "seqlen_q -16"}, 1, 2, 4, -16, 32, 64);
  expect_error({sizes, "seqlen_k -32"}, kAttnBwdRungAuto, 2, 4, 16, -32, 64);
  expect_error({sizes, "headdim -64"}, 1, 2, 4, 16, 32, -64);
  const std::string overflow = "the size overflows int64";
  const int64_t max = std::numeric_limits<int64_t>::max();
  expect_error({overflow}, 1, max, 2, 1, 1, 64);                              // batch x nheads
  expect_error({overflow}, 1, 65535, 65535, int64_t{1} << 30, 1 << 30, 256);  // x seqlen_k
  expect_error({overflow}, 1, 1, 1, 1, (int64_t{1} << 60), 64);               // 2 x P x 4 bytes
  expect_error({overflow}, 2, 1, 1, int64_t{1} << 54, 1, 256);                // rung 2: padded rows x (d + 2) x 4 bytes
  expect_error({overflow}, 3, 1, 1, int64_t{1} << 54, 1, 256);                // rung 3: rung 2's
}

// ---- the varlen gradient checks run before the shared validation's only device work (the read
// of the cu_seqlens values), so a bad gradient is named without waiting on the stream (and on a
// machine without a GPU).
TEST(AttentionBwdValidation, VarlenGradientChecksComeBeforeTheDeviceRead) {
  expect_rejected(with(varlen(), &Call::dout, gpu(kBf, {41, 4, 64}, kDout)),
                  {"argument 'dout'", "expected shape [40, 4, 64] (same as 'out')", "got [41, 4, 64]"});
  expect_rejected(with(varlen(), &Call::dq, gpu(kBf, {70, 2, 64}, kDq)),
                  {"argument 'dq'", "expected shape [40, 4, 64] (same as 'q')", "got [70, 2, 64]"});
  expect_rejected(with(varlen(), &Call::dk, gpu(DType::kF16, {70, 2, 64}, kDk)),
                  {"argument 'dk'", "expected dtype bf16 (same as 'q')", "got fp16"});
  expect_rejected(with(varlen(), &Call::dv, gpu(kBf, {2, 40, 2, 64}, kDv)), {"argument 'dv'", "expected 3 dims", "got 4 dims"});
  expect_rejected(with(varlen(), &Call::dv, gpu(kBf, {70, 2, 64}, kDk)),
                  {"argument 'dk'", "expected memory disjoint from 'dv'", "got the same memory as 'dv'"});
  expect_rejected(with(varlen(), &Call::cu_q, gpu(DType::kI32, {3}, kDq, 64)),
                  {"argument 'dq'", "expected memory disjoint from 'cu_seqlens_q'", "got a partial overlap"});
}

// Rung 3's host checks (head dim, dropout, strides) run with the gradient checks, before the
// shared validation's device read of the cu_seqlens values: a varlen call that rung 3 refuses
// names the argument without waiting on the stream (and without a GPU).
TEST(AttentionBwdValidation, VarlenRung3ChecksComeBeforeTheDeviceRead) {
  Call d32 = varlen();
  d32.q = gpu(kBf, {40, 4, 32}, kQ), d32.k = gpu(kBf, {70, 2, 32}, kK), d32.v = gpu(kBf, {70, 2, 32}, kV);
  d32.out = gpu(kBf, {40, 4, 32}, kO), d32.dout = gpu(kBf, {40, 4, 32}, kDout), d32.dq = gpu(kBf, {40, 4, 32}, kDq);
  d32.dk = gpu(kBf, {70, 2, 32}, kDk), d32.dv = gpu(kBf, {70, 2, 32}, kDv);
  expect_rejected(d32, {"argument 'q'", "expected head dim (last dim) 64, 128 or 256 for rung 3", "got 32"}, d32.opt(), {3});
  const Call vl = varlen();
  AttnBwdOptions drop = vl.opt();
  drop.dropout_p = 0.5f;
  expect_rejected(vl, {"argument 'dropout_p'", "expected 0 for rung 3"}, drop, {3});
  const Call k0 = with(vl, &Call::k, gpu_strided(kBf, {70, 2, 64}, {128, 0, 1}, kK));
  expect_rejected(k0, {"argument 'k'", "expected positive strides on every dim of size > 1 for rung 3 (TMA)"}, k0.opt(), {3});
}

// The overflow check covers the whole sum (2 x P + D floats x 4 bytes), also with few keys or none.
TEST(AttentionBwdWorkspace, OverflowWithFewKeys) {
  // 3 x 2^58 rows, one key: (2 + 1) x 3 x 2^58 x 4 bytes = 9 x 2^60.
  EXPECT_THROW(attention_bwd_workspace_bytes(1, 3, int64_t{1} << 29, int64_t{1} << 29, 1, 64), Error);
  // 2^62 rows, no keys: 2^62 x 4 bytes.
  EXPECT_THROW(attention_bwd_workspace_bytes(1, int64_t{1} << 62, 1, 1, 0, 64), Error);
}

}  // namespace
}  // namespace flashlab
