// Experiment (not a rung): attention rung 4 with its overlap techniques switched off one at a
// time — pingpong between the consumer warpgroups (kPingpong), the softmax of block n under
// the P V GEMM of block n - 1 (kOverlap) and warp specialization (kSpecialized: a producer
// warpgroup issuing the loads) — against the library's rung 4 (all on) and rung 3 in the same
// process. bf16, q/k/v/out (batch, seqlen, heads, d) contiguous, 16k tokens and model
// dim 2048 as in bench/cases_attention.cu. Built as build/*/bench/experiment_attention_hopper_ablation;
// quoted in docs/ladder/attention.md. Timing: the benchmark harness (warm-up, L2 flushed, median
// of CUDA events). Correctness: each variant's output, poisoned with NaN before the launch, must
// equal the output of the library's kernel with its default (128 at d <= 128) key blocks within
// 2^-8 relative to max |out| (the overlap variants change nothing but the order of issue;
// differences mean a bug; other key-block widths, the library's own call at d 128 (176 from 8k
// keys) and d 256 (64 up to 512 keys), rung 3 and the variants that rescale O otherwise than the
// library's kernel (*eager*, *lazy*, before_1126) round differently: 2^-6) and contain no NaN;
// else FAIL, exit 1.
// Also the persistent kernel with a dynamic tile scheduler (04_hopper_persistent.cuh).
// Also the library kernel with the P V wait pinned after the softmax and not (wait_pinned,
// wait_unpinned; kernels/common/wgmma.cuh wgmma_wait_after), with its wgmma descriptors rebuilt
// at every k-step (desc_rebuilt), and with both as before 2026-11-26 (before_1126).
// The variants of a shape are timed round-robin (Harness::time_ms_interleaved; medians of 20
// rounds): timed one after another, identical kernels came out up to 17% apart on an H100
// (2026-11-26), the first after an idle spell fastest.
// "pingpong+overlap" is the kernel with two consumer warpgroups and 128-key blocks: the library's
// at d 128 below 8k keys (176-key blocks from 8k on) and at d 256 (80-key blocks there); at d 64 the
// library has three consumer warpgroups (3_consumers) since 2026-11-26.
// --pairs: the one-CTA kernel in CTA pairs that load each K / V block once, multicast into both
// (pairs, kBlockN=176_pairs; kCluster 2), against the library and the same kernel alone, without a
// mask: d 128 2k..16k, d 256 2k..4k.
// --wide-persistent: d 128 8k..16k, causal and not: the persistent kernel on 176-key blocks with its
// masked blocks peeled off (persistent_176_peel) and without (persistent_176), and its library form
// from 2k keys on 128 (persistent_peel_late), against the library's one-CTA kernel on 176 (kBlockN=176).
// --narrow128: d 128 512..1k, causal and not: the library's persistent form (persistent_late) on 64-key
// blocks (two and four K/V stages) and 96-key blocks.
// --sweep: only the library, pingpong+overlap, kBlockN=176, persistent and persistent_176 at
// d 128, seqlen 512..16k. --sweep64: the library, 3_consumers, 3_consumers_tail, persistent,
// persistent_3c_n96 and persistent_3c_n112 at d 64, seqlen 512..16k. --sweep256: the library, pingpong+overlap (80-key
// blocks), kBlockN=64 and the persistent kernel on 80- and 64-key blocks (persistent_n80,
// persistent_n64) at d 256, seqlen 512..4k. FLASHLAB_ROUNDS=n: n rounds
// (default 20; 200 gave the same ratios, H100 2026-11-26). FLASHLAB_SEQLEN=n: a sweep at seqlen n only.
// --tree: the softmax's row max and sum folded as trees against running values (kTreeReduce:
// *_tree / *_chain against the library's default) in the kernels the library takes at d 64, 128,
// 256 and FP8.
// --persistent-pingpong: the persistent kernels with and without pingpong turns (*_no_pingpong) at
// d 64 and 128, 512..4k.
// --fp8: the FP8 variants (run_fp8) at d 128, 512..16k.
// --seq128: d 128, three consumer warpgroups without overlap and pingpong, 2k..16k.
// --direct-o: the persistent kernels' tile boundary: Q given back after the tile's last Q K^T with O
// stored from registers (persistent_direct_o) or staged in the last K/V stage (persistent_stage_o),
// the probe of it (probe_persistent_early_q), and at d 256 narrower key blocks with two Q buffers
// (persistent_n48, _n32, _n32_3stages), against the library's; d 256 512..4k, d 64 / 128 512..1k.
// --sum: the rows' sums of P by the tensor cores (*_sum, kSumByMma) at d 64 and 128.
// --own-o: d 256's persistent kernel on 64-key blocks with O staged in a tile of its own and Q given
// back after the tile's last Q K^T (kOwnO), with and without the peeled loop, O written to its tile by
// stmatrix or 4-byte stores, 512..2k.
// --stage-o3: d 128's persistent kernel on three K/V stages (one Q buffer) with O staged in the
// last block's stage (kStageO) and the early-Q probe on three stages, 512..2k.
// --one-stage: d 256's persistent kernel with one K/V stage and two Q buffers (persistent_n80_1stage).
// --two-ctas: one consumer warpgroup on 64-row tiles, two CTAs an SM (2ctas*), at d 64 and 128.
// --store-probe: the persistent kernels at d 64 and 128 (512..2k) against probes without the
// epilogue's wait for the TMA store's reads (timing only).
// --late-wait: the library's persistent forms at d 64 (512..2k) and 128 (512..4k) with that wait after
// the next tile's first Q K^T (*_late, kStoreWaitLate), causal and not. --late-wait2: those with O to
// its staging tile by stmatrix (*_stsm), with pingpong turns (d 64), on four stages with a lag of one
// block (d 64): d 64 causal 512..1k, d 128 512..1k.
// --exp-turns: d 64's persistent forms (512..1k, causal and not) and d 128's (512..2k) with turns
// around the softmax's exponentials instead of none / around the GEMMs (*turns, kExpTurns), and the
// block loop without intra-warpgroup overlap (*serial*, kSerial), as cuDNN's fprop kernels.
// --exp-turns2: d 64 causal (512..1k), the turns on two, three and four K/V stages (the library's
// since 2026-11-29: four) against the three-stage ring without them, and the three-stage turns with the
// walk's tail at 8, 16 and 64 pairs (turns_tail*; the library's: 32). --exp-turns3: d 64 causal (512..2k), the
// turns on three to six stages, and on four with tails of 16, 32 and 64 pairs (turns4_tail*).
// --tail-order: causal, the library's persistent forms with the walk's last G (batch, head) pairs in
// rounds of one query block each (tail*, HopperAttnArgs::tail_heads), d 64 512..2k, d 128 512..4k,
// d 256 512..1k. --tail-order2: the tails of 8 and 32 pairs and the library's, causal, in the persistent
// forms (d 64 512..2k, d 128 512..4k, d 256 512..1k) and the one-CTA kernels above them (d 64 4k..8k,
// d 128 8k..16k, d 256 2k..4k; onecta_tail*).
// --tail: the persistent kernels without a mask with and without their last tiles split along the
// keys (persistent_tail*, kSplitTail), and the split's kernel never splitting
// (persistent_tail_kernel_unsplit), d 64 512..1k, d 128 512..4k, d 256 512.
// --nomask: the kernels without a mask against the same kernels without their mask test and pass
// and varlen epilogue (*_nomask, kNoMask): d 64 512..8k (persistent, three consumer warpgroups with
// the split tail), d 128 512..4k (persistent).
// --peel: the persistent kernels with the block loop split around its masked blocks (*_peel,
// kPeelMask) against the library's, d 64 512..2k, d 128 512..4k, d 256 512..1k, causal and not
// (FLASHLAB_PEEL_D256_ONLY=1: d 256 only).
// --half: the persistent kernels with each consumer warpgroup on its own blocks of the tile and a half
// last block where its rows see only that (*_half, kHalfLast) against the same kernels without, causal:
// d 64 512..2k (two consumer warpgroups, and three on 96-key blocks, also peeled), d 128 512..4k (also
// peeled).
// --lag: d 64's two-warpgroup persistent kernel with its second consumer warpgroup started kLag blocks
// behind the first (*_lagN, kLag) on K/V rings of 3 and 4 stages (_s3, _s4), with and without its
// mask code, 512..1k, causal and not. --lag2: a lag of one block on two stages without pingpong turns
// (*_no_pingpong_lag1), d 64 at 1k and d 128 at 512..1k, causal and not.
// --tail-keys: d 256's persistent kernel (peeled) with each warpgroup's last block cut to its first
// 32, 48 or 64 keys where its rows see no more of it (*_tail32 .., kHalfLast with kTailKeys), 512..1k,
// causal and not.
// Usage: experiment_attention_hopper_ablation [--sweep | --pairs | --wide-persistent | --narrow128 | --sweep64 | --sweep256 | --tree | --persistent-pingpong | --fp8 | --seq128
//        | --store-probe | --late-wait | --late-wait2 | --exp-turns | --exp-turns2 | --exp-turns3 | --tail-order | --tail-order2 | --direct-o | --own-o | --stage-o3 | --sum | --two-ctas | --one-stage | --tail | --nomask | --peel | --half | --lag | --lag2
//        | --tail-keys]
//        [out.json]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cases.h"
#include "bench/harness.h"
#include "flashlab/attention.h"
#include "bench/experiments/attention_experiment.h"
#include "src/attention_hopper_hdim.cuh"

using namespace flashlab;

namespace {

using bench::attention_experiment::Config;
using bench::attention_experiment::download_bf16;

// Kernel parameters for contiguous (batch, seqlen, heads, d) tensors, as attention_fwd builds them.
AttnFwdParams params(const Config& c, int64_t batch, int64_t heads, void* q, void* k, void* v, void* o) {
  AttnFwdParams p{};
  p.q = q, p.k = k, p.v = v, p.o = o;
  const int64_t row = heads * c.headdim, bs = c.seqlen * row;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = bs;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = c.headdim;
  p.total_q = p.total_k = c.seqlen;
  p.batch = static_cast<int>(batch), p.nheads = p.nheads_kv = static_cast<int>(heads), p.headdim = static_cast<int>(c.headdim);
  p.seqlen_q = p.seqlen_k = static_cast<int>(c.seqlen);
  p.scale = 1.f / std::sqrt(static_cast<float>(c.headdim));
  p.window_left = -1, p.window_right = c.causal ? 0 : -1;
  return p;
}

template <int kD, bool kPingpong, bool kOverlap, int kBlockN = 0, bool kPinWait = (kD == 128), bool kDescAdvance = true,
          bool kRescaleUnderQk = false, int kConsumers = 2, bool kLazyRescale = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>,
          bool kTreeReduce = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>, bool kSpecialized = true, bool kSplitTail = false,
          bool kSumByMma = false, bool kNoMask = false>
void launch(const AttnFwdParams& p, cudaStream_t s) {
  detail::launch_attn_hopper_variant<__nv_bfloat16, kD, false, kPingpong, kOverlap, kBlockN, false, kPinWait, kDescAdvance,
                                     kRescaleUnderQk, kConsumers, kLazyRescale, kTreeReduce, kSpecialized, kSumByMma, kSplitTail, false,
                                     kNoMask>(p, DType::kBF16, s);
}

// The persistent kernel (bf16, no softcap / ALiBi); kArgs: launch_attn_hopper_persistent's
// template arguments after kScoreMod.
template <int kD, auto... kArgs>
void launch_persistent(const AttnFwdParams& p, cudaStream_t s) {
  detail::launch_attn_hopper_persistent<__nv_bfloat16, kD, false, kArgs...>(p, DType::kBF16, s);
}

// Head dim 64's two-warpgroup persistent ring (bf16, no softcap / ALiBi) without a lag, the O store
// waited for late: without the mask code (kNoMask; then O written to its staging tile by stmatrix, as
// in the lagging form) or with it, on kStages K/V stages, with turns for the exponentials (kTurns,
// kExpTurns) or not, the block loop without intra-warpgroup overlap (kSerial) or not; the walk's tail
// of `tail` pairs (-1: the library's).
template <bool kNoMask, int kStages, bool kTurns, bool kSerial>
struct Ring {
  static void launch(const AttnFwdParams& p, cudaStream_t s, int tail = -1) {
    detail::launch_attn_hopper_persistent_as<__nv_bfloat16, 64, false, 2, 0, false, kNoMask, false, false, 0, kStages, 0, true, false,
                                             kNoMask, kTurns, kSerial>(p, DType::kBF16, s, 0.01, tail);
  }
};

struct Variant {
  const char* name;
  std::function<void()> fn;
};

// The variants timed round-robin (Harness::time_ms_interleaved): their times in ms.
std::vector<double> time_variants(bench::Harness& h, const std::vector<Variant>& variants) {
  std::vector<std::function<void()>> fns;
  for (const Variant& var : variants) fns.push_back(var.fn);
  return h.time_ms_interleaved(fns);
}

// The output (n bf16 values at out) of a variant, poisoned with NaN before it runs, against
// want: the largest difference relative to max_ref, and the NaNs left.
struct OutputDiff {
  double rel;
  int64_t nans;
};
OutputDiff output_diff(const Variant& var, void* out, int64_t n, const std::vector<float>& want, float max_ref, cudaStream_t s) {
  FLASHLAB_CUDA_CHECK(cudaMemsetAsync(out, 0xff, n * 2, s));  // NaN
  var.fn();
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<float> got = download_bf16(out, n);
  double worst = 0;
  int64_t nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) ++nans;
    else worst = std::fmax(worst, std::fabs(got[i] - want[i]));
  }
  return {worst / max_ref, nans};
}

// The reference output (n bf16 values at ref, written on s) and max |ref|.
struct Reference {
  std::vector<float> want;
  float max_ref = 0;
};
Reference reference_output(const void* ref, int64_t n, cudaStream_t s) {
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(s));
  Reference r{download_bf16(ref, n)};
  for (float x : r.want) r.max_ref = std::fmax(r.max_ref, std::fabs(x));
  return r;
}

// FLOPs of one forward at c (half when causal).
double attention_flops(const Config& c) {
  return 4.0 * c.batch() * c.heads() * c.seqlen * c.seqlen * c.headdim * (c.causal ? 0.5 : 1.0);
}

// The variants named in `names` only (all if empty), in their listed order.
std::vector<Variant> kept(const std::vector<Variant>& variants, const std::vector<std::string>& names) {
  if (names.empty()) return variants;
  std::vector<Variant> out;
  for (const Variant& var : variants)
    for (const std::string& name : names)
      if (var.name == name) out.push_back(var);
  return out;
}

// names: the variants to run (the sweeps' lists in main), all if empty.
template <int kD>
void run_config(bench::Harness& h, const Config& c, bool& all_ok, const std::vector<std::string>& names = {}) {
  const int64_t batch = c.batch(), heads = c.heads(), n = c.elements();
  bench::DeviceMem q(n * 2), k(n * 2), v(n * 2), out(n * 2), ref(n * 2);
  bench::fill_random(q.p, n, 1, 81, h.stream());
  bench::fill_random(k.p, n, 1, 82, h.stream());
  bench::fill_random(v.p, n, 1, 83, h.stream());
  const std::vector<int64_t> shape = {batch, c.seqlen, heads, c.headdim};
  AttnFwdOptions opt;
  opt.causal = c.causal;
  const auto api = [&](int rung, void* o) {
    attention_fwd(bench::view(q.p, DType::kBF16, shape), bench::view(k.p, DType::kBF16, shape),
                  bench::view(v.p, DType::kBF16, shape), bench::view(o, DType::kBF16, shape), h.stream(), rung, opt);
  };
  launch<kD, true, true>(params(c, batch, heads, q.p, k.p, v.p, ref.p), h.stream());
  const auto [want, max_ref] = reference_output(ref.p, n, h.stream());
  const AttnFwdParams p = params(c, batch, heads, q.p, k.p, v.p, out.p);
  const double flops = attention_flops(c);

  std::vector<Variant> variants = {
      {"rung3_fa2", [&] { api(3, out.p); }},
      {"rung4_library", [&] { api(4, out.p); }},
      {"pingpong+overlap", [&] { launch<kD, true, true>(p, h.stream()); }},
      {"overlap_only", [&] { launch<kD, false, true>(p, h.stream()); }},
      // Without warp specialization: no producer warpgroup; the first consumer thread issues the
      // TMA loads between its block steps (kSpecialized off).
      {"no_warp_specialization", [&] {
         constexpr bool kLazy = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>, kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
         launch<kD, true, true, 0, (kD == 128), true, false, 2, kLazy, kTree, false>(p, h.stream());
       }},
      {"pingpong_only", [&] { launch<kD, true, false>(p, h.stream()); }},
      {"neither", [&] { launch<kD, false, false>(p, h.stream()); }},
      // The P V wait kept after the softmax (the library's choice at d 128), or where ptxas puts
      // it (the top of the softmax: nothing under the product; the library until 2026-11-26).
      {"wait_pinned", [&] { launch<kD, true, true, 0, true>(p, h.stream()); }},
      {"wait_unpinned", [&] { launch<kD, true, true, 0, false>(p, h.stream()); }},
      // wgmma descriptors rebuilt from the address at every k-step (hopper_attn_gemm_qk).
      {"desc_rebuilt", [&] { launch<kD, true, true, 0, (kD == 128), false>(p, h.stream()); }},
      // The rung before 2026-11-26: both of the above, and O rescaled at every block.
      {"before_1126", [&] { launch<kD, true, true, 0, false, false, false, 2, false>(p, h.stream()); }},
      // O and l rescaled whenever a row's max grows (kLazyRescale off: the rung until 2026-11-26
      // evening, still the library's at d 64), and lazily (on: the library's at d 128 and 256).
      {"eager_rescale", [&] { launch<kD, true, true, 0, (kD == 128), true, false, 2, false>(p, h.stream()); }},
      {"lazy_rescale", [&] { launch<kD, true, true, 0, (kD == 128), true, false, 2, true>(p, h.stream()); }},
      // O rescaled under the next block's Q K^T product (kRescaleUnderQk), 128-key blocks.
      {"rescale_under_qk", [&] { launch<kD, true, true, 0, (kD == 128), true, true>(p, h.stream()); }},
  };
  // Other key-block widths (the library's: 128 for d <= 128, 96 for 192, 80 for 256).
  if constexpr (kD == 128) {
    variants.push_back({"kBlockN=176", [&] { launch<kD, true, true, 176>(p, h.stream()); }});
    variants.push_back({"kBlockN=160", [&] { launch<kD, true, true, 160>(p, h.stream()); }});
    // Three consumer warpgroups (192-row tiles) on narrower key blocks: S and P of 64 / 80 keys
    // leave room for O in 160 registers (96 keys spill).
    variants.push_back({"3_consumers_n64", [&] { launch<kD, true, true, 64, false, true, false, 3>(p, h.stream()); }});
    variants.push_back({"3_consumers_n80", [&] { launch<kD, true, true, 80, false, true, false, 3>(p, h.stream()); }});
    // Three consumer warpgroups one GEMM at a time, no pingpong (the library's FP8 kernel's form):
    // without the overlap 112- and 128-key blocks fit 160 registers.
    variants.push_back({"3_consumers_n128_seq", [&] { launch<kD, false, false, 128, false, true, false, 3>(p, h.stream()); }});
    variants.push_back({"3_consumers_n112_seq", [&] { launch<kD, false, false, 112, false, true, false, 3>(p, h.stream()); }});
  }
  if constexpr (kD == 64) {
    variants.push_back({"kBlockN=192", [&] { launch<kD, true, true, 192>(p, h.stream()); }});
    // Three consumer warpgroups, 192-row tiles (FlashAttention-3's d 64 shape; same key blocks and
    // per-row sums as the library: its output should match to the bit).
    variants.push_back({"3_consumers", [&] { launch<kD, true, true, 0, false, true, false, 3>(p, h.stream()); }});
    variants.push_back({"3_consumers_no_pingpong", [&] { launch<kD, false, true, 0, false, true, false, 3>(p, h.stream()); }});
    variants.push_back({"3_consumers_lazy", [&] { launch<kD, true, true, 0, false, true, false, 3, true>(p, h.stream()); }});
    // ... with the last, partial wave's tiles split along the keys (kSplitTail; the library's
    // without a mask).
    // ... and without the mask test and pass and the varlen epilogue (kNoMask; no causal, whole key blocks).
    if (!c.causal)
      variants.push_back({"3_consumers_tail_nomask", [&] {
                            constexpr bool kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
                            launch<kD, true, true, 0, false, true, false, 3, false, kTree, true, true, false, true>(p, h.stream());
                          }});
    variants.push_back({"3_consumers_tail", [&] {
                          constexpr bool kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
                          launch<kD, true, true, 0, false, true, false, 3, false, kTree, true, true>(p, h.stream());
                        }});
  }
  if constexpr (kD == 256) variants.push_back({"kBlockN=64", [&] { launch<kD, true, true, 64>(p, h.stream()); }});
  // In CTA pairs sharing each K / V block by multicast (kCluster 2; no causal): the library's key blocks
  // (pairs), and 176 keys at d 128 (kBlockN=176_pairs).
  if constexpr (kD == 128 || kD == 256)
    if (!c.causal) {
      variants.push_back({"pairs", [&] { detail::launch_attn_hopper_pairs<__nv_bfloat16, kD, false>(p, DType::kBF16, h.stream()); }});
      if constexpr (kD == 128)
        variants.push_back(
            {"kBlockN=176_pairs", [&] { detail::launch_attn_hopper_pairs<__nv_bfloat16, kD, false, 176>(p, DType::kBF16, h.stream()); }});
    }
  // One consumer warpgroup on 64-row tiles, two CTAs an SM (kConsumers 1): each CTA's first block
  // and epilogue under the other's block loop; no pingpong turns (one warpgroup), 128-key blocks at
  // d 64 (and 192), 64 or 80 at d 128 (two CTAs' K/V rings must fit the SM's shared memory).
  if constexpr (kD == 64) {
    variants.push_back({"2ctas", [&] { launch<kD, false, true, 0, false, true, false, 1>(p, h.stream()); }});
    variants.push_back({"2ctas_n192", [&] { launch<kD, false, true, 192, false, true, false, 1>(p, h.stream()); }});
  }
  if constexpr (kD == 128) {
    variants.push_back({"2ctas_n64", [&] { launch<kD, false, true, 64, true, true, false, 1>(p, h.stream()); }});
    variants.push_back({"2ctas_n80", [&] { launch<kD, false, true, 80, true, true, false, 1>(p, h.stream()); }});
  }
  // The persistent kernel with its dynamic tile scheduler (kernels/attention/04_hopper_persistent.cuh;
  // head dims up to 128).
  if constexpr (kD <= 128)
    variants.push_back({"persistent", [&] { launch_persistent<kD>(p, h.stream()); }});
  // ... with its last tiles split along the keys (kSplitTail; measured slower, not the library's):
  // where attn_hopper_persistent_split_tail's model saves 1% (_tail; where it splits nothing, the
  // library's kernel runs), or anything (_tail_any).
  variants.push_back({"persistent_tail", [&] { detail::launch_attn_hopper_persistent_split<__nv_bfloat16, kD>(p, DType::kBF16, h.stream()); }});
  variants.push_back({"persistent_tail_any", [&] { detail::launch_attn_hopper_persistent_split<__nv_bfloat16, kD>(p, DType::kBF16, h.stream(), 0.0); }});
  // ... without the mask test and pass and the varlen epilogue (kNoMask; no causal / window, fixed
  // lengths, whole key blocks).
  if (!c.causal) variants.push_back({"persistent_nomask", [&] { detail::launch_attn_hopper_persistent_nomask<__nv_bfloat16, kD>(p, DType::kBF16, h.stream()); }});
  // ... with the block loop split around its masked blocks (kPeelMask): two consumer warpgroups
  // (persistent_peel), three on 96-key blocks at d 64 (persistent_3c_n96_peel).
  if constexpr (kD <= 128 || kD == 256) {
    variants.push_back({"persistent_peel", [&] { detail::launch_attn_hopper_persistent_peel<__nv_bfloat16, kD, false>(p, DType::kBF16, h.stream()); }});
    if constexpr (kD == 64)
      variants.push_back({"persistent_3c_n96_peel", [&] {
                            detail::launch_attn_hopper_persistent_peel<__nv_bfloat16, kD, false, 3, 96>(p, DType::kBF16, h.stream());
                          }});
  }
  // ... with each consumer warpgroup on its own blocks of the tile, the last one half where its rows
  // see only that (kHalfLast): two consumer warpgroups (persistent_half; d 128 also peeled,
  // persistent_peel_half), three on 96-key blocks at d 64 (persistent_3c_n96_half).
  if constexpr (kD <= 128) {
    variants.push_back({"persistent_half", [&] { detail::launch_attn_hopper_persistent_half<__nv_bfloat16, kD, false>(p, DType::kBF16, h.stream()); }});
    if constexpr (kD == 128)
      variants.push_back({"persistent_peel_half", [&] {
                            detail::launch_attn_hopper_persistent_half<__nv_bfloat16, kD, false, 2, 0, true>(p, DType::kBF16, h.stream());
                          }});
    if constexpr (kD == 64) {
      variants.push_back({"persistent_3c_n96_half", [&] {
                            detail::launch_attn_hopper_persistent_half<__nv_bfloat16, kD, false, 3, 96>(p, DType::kBF16, h.stream());
                          }});
      variants.push_back({"persistent_3c_n96_peel_half", [&] {
                            detail::launch_attn_hopper_persistent_half<__nv_bfloat16, kD, false, 3, 96, true>(p, DType::kBF16, h.stream());
                          }});
    }
  }
  // A variant of launcher `launch` (called with p, dtype and stream).
  [[maybe_unused]] const auto add = [&](const char* name, auto launch) { variants.push_back({name, [&, launch] { launch(p, DType::kBF16, h.stream()); }}); };
  // ... at d 64 on a deeper K/V ring (_s3, _s4) with the second consumer warpgroup starting kLag blocks
  // behind the first (_lagN), with the mask code and without (nomask, no causal).
  if constexpr (kD == 64) {
    using B = __nv_bfloat16;
    add("persistent_s3", detail::launch_attn_hopper_persistent_lag<B, false, 3, 0>);
    add("persistent_lag1_s3", detail::launch_attn_hopper_persistent_lag<B, false, 3, 1>);
    add("persistent_lag2_s3", detail::launch_attn_hopper_persistent_lag<B, false, 3, 2>);
    add("persistent_lag2_s4", detail::launch_attn_hopper_persistent_lag<B, false, 4, 2>);
    add("persistent_s4", detail::launch_attn_hopper_persistent_lag<B, false, 4, 0>);
    add("persistent_lag1_s4", detail::launch_attn_hopper_persistent_lag<B, false, 4, 1>);
    if (!c.causal) {
      add("persistent_nomask_s3", detail::launch_attn_hopper_persistent_lag<B, true, 3, 0>);
      add("persistent_nomask_lag1_s3", detail::launch_attn_hopper_persistent_lag<B, true, 3, 1>);
      add("persistent_nomask_lag2_s3", detail::launch_attn_hopper_persistent_lag<B, true, 3, 2>);
      add("persistent_nomask_lag2_s4", detail::launch_attn_hopper_persistent_lag<B, true, 4, 2>);
      add("persistent_nomask_s4", detail::launch_attn_hopper_persistent_lag<B, true, 4, 0>);
      add("persistent_nomask_lag1_s4", detail::launch_attn_hopper_persistent_lag<B, true, 4, 1>);
      add("persistent_nomask_lag3_s4", detail::launch_attn_hopper_persistent_lag<B, true, 4, 3>);
      add("persistent_nomask_lag3_s5", detail::launch_attn_hopper_persistent_lag<B, true, 5, 3>);
      add("persistent_nomask_lag4_s5", detail::launch_attn_hopper_persistent_lag<B, true, 5, 4>);
      add("persistent_nomask_lag4_s6", detail::launch_attn_hopper_persistent_lag<B, true, 6, 4>);
      add("persistent_nomask_lag5_s6", detail::launch_attn_hopper_persistent_lag<B, true, 6, 5>);
    }
  }
  // ... with the O store's wait for its reads of the Q buffer after the next tile's first Q K^T
  // (kStoreWaitLate, *_late; *_wait: at once) in the persistent forms at d 64 (the deeper rings, with a
  // lag without a mask; three consumer warpgroups, causal 2k) and d 128 (peeled from 2k keys). The
  // launchers through launch_attn_hopper_persistent_as take the library's choice
  // (kAttnHopperStoreWaitLate: late at d 128 since 2026-11-28), launch_persistent at once.
  if constexpr (kD <= 128) {
    using B = __nv_bfloat16;
    add("persistent_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, kD, false, 2, 0, false, false, false, false, 0, 2, 0, true>(a...); });
    add("persistent_peel_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, kD, false, 2, 0, false, false, true, false, 0, 2, 0, true>(a...); });
    add("persistent_peel_wait", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, kD, false, 2, 0, false, false, true, false, 0, 2, 0, false>(a...); });
    if constexpr (kD == 128) {
      // ... without pingpong turns around the GEMMs, with turns around the exponentials (kExpTurns),
      // the block loop with intra-warpgroup overlap (_exp_turns) or without (_serial_turns, kSerial).
      const auto exp_turns = [&](auto serial) {
        launch_persistent<128, 0, true, true, 2, kernels::kAttnLazyRescaleDefault<B, 128>, 2, kernels::kAttnTreeReduceDefault<B, 128>, false,
                          true, false, false, false, false, false, false, false, false, 0, 0, false, false, true, true,
                          decltype(serial)::value>(p, h.stream());
      };
      variants.push_back({"persistent_exp_turns", [exp_turns] { exp_turns(std::false_type{}); }});
      variants.push_back({"persistent_serial_turns", [exp_turns] { exp_turns(std::true_type{}); }});
    }
    if constexpr (kD == 128) {
      // ... on narrower key blocks (64, 96; 64 also on four K/V stages), the library's form below 2k keys.
      add("persistent_n64_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 128, false, 2, 64, false, false, false, false, 0, 2, 0, true>(a...); });
      add("persistent_n64_s4_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 128, false, 2, 64, false, false, false, false, 0, 4, 0, true>(a...); });
      add("persistent_n96_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 128, false, 2, 96, false, false, false, false, 0, 2, 0, true>(a...); });
    }
    if constexpr (kD == 128)
      add("persistent_late_stsm",
          [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 128, false, 2, 0, false, false, false, false, 0, 2, 0, true, false, true>(a...); });
    if (!c.causal)
      add("persistent_nomask_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, kD, false, 2, 0, false, true, false, false, 0, 2, 0, true>(a...); });
    if constexpr (kD == 64) {
      add("persistent_s3_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, false, false, false, 0, 3, 0, true>(a...); });
      add("persistent_s4_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, false, false, false, 0, 4, 0, true>(a...); });
      if (!c.causal) {
        add("persistent_nomask_lag3_s4_late",
            [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, true, false, false, 0, 4, 3, true>(a...); });
        add("persistent_nomask_lag2_s3_late",
            [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, true, false, false, 0, 3, 2, true>(a...); });
      }
      // ... and with O written to its staging tile by stmatrix (_stsm), pingpong turns (_pingpong), or
      // on four stages with the second warpgroup a block behind (lag1_s4), causal and not.
      add("persistent_s3_late_stsm",
          [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, false, false, false, 0, 3, 0, true, false, true>(a...); });
      variants.push_back({"persistent_s3_late_pingpong", [&] {
                            launch_persistent<64, 0, true, true, 3, kernels::kAttnLazyRescaleDefault<B, 64>, 2,
                                              kernels::kAttnTreeReduceDefault<B, 64>, true, true, false, false, false, false, false, false,
                                              false, false, 0, 0, false, false, true>(p, h.stream());
                          }});
      add("persistent_lag1_s4_late", [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 2, 0, false, false, false, false, 0, 4, 1, true>(a...); });
      // ... with turns around the exponentials instead of none (_turns, kExpTurns), and the block loop
      // without intra-warpgroup overlap (_serial, kSerial), on 2-6 K/V stages (_sN), causal and not.
      const auto ring = [&](const char* name, auto form) {
        variants.push_back({name, [&] { decltype(form)::launch(p, h.stream()); }});
      };
      ring("persistent_s2_late_turns", Ring<false, 2, true, false>{});
      ring("persistent_s3_late_turns", Ring<false, 3, true, false>{});
      ring("persistent_s4_late_turns", Ring<false, 4, true, false>{});
      ring("persistent_s5_late_turns", Ring<false, 5, true, false>{});
      ring("persistent_s6_late_turns", Ring<false, 6, true, false>{});
      ring("persistent_s2_late_serial_turns", Ring<false, 2, true, true>{});
      ring("persistent_s3_late_serial_turns", Ring<false, 3, true, true>{});
      ring("persistent_s3_late_serial", Ring<false, 3, false, true>{});
      if (!c.causal) {
        ring("persistent_nomask_s4_late_turns", Ring<true, 4, true, false>{});
        ring("persistent_nomask_s2_late_serial_turns", Ring<true, 2, true, true>{});
        ring("persistent_nomask_s3_late_serial_turns", Ring<true, 3, true, true>{});
        ring("persistent_nomask_s4_late_serial_turns", Ring<true, 4, true, true>{});
      }
      add("persistent_3c_n96_peel_half_late",
          [](auto&&... a) { detail::launch_attn_hopper_persistent_as<B, 64, false, 3, 96, false, false, true, true, 0, 2, 0, true>(a...); });
    }
  }
  // ... the library's causal form for this shape with the walk's last G (batch, head) pairs in rounds
  // of one query block each, from the last down (HopperAttnArgs::tail_heads; tail_lib: the library's
  // G, attn_hopper_tail_heads; tail0: the grid's order throughout).
  if (c.causal) {
    using B = __nv_bfloat16;
    const auto causal_form = [&, s = c.seqlen](int g) {
      if constexpr (kD == 64) {  // (until 2026-11-29: three consumer warpgroups above 1k keys, three stages without turns below)
        Ring<false, detail::kAttnHopperDeepRingStagesCausal, true, false>::launch(p, h.stream(), g);
      } else if constexpr (kD == 128) {
        if (s >= detail::kAttnHopperPeelFrom)
          detail::launch_attn_hopper_persistent_as<B, 128, false, 2, 0, false, false, true>(p, DType::kBF16, h.stream(), 0.01, g);
        else
          detail::launch_attn_hopper_persistent_as<B, 128, false>(p, DType::kBF16, h.stream(), 0.01, g);
      } else if constexpr (kD == 256) {
        detail::launch_attn_hopper_persistent_own_o<B, true, true>(p, DType::kBF16, h.stream(), g);
      }
    };
    // ... and d 64's causal ring with turns for the exponentials on three and four stages (the
    // library's since 2026-11-29: four) with other tails (turns_tail*, turns4_tail*; the library's: 32).
    if constexpr (kD == 64) {
      using Turns3 = Ring<false, 3, true, false>;
      using Turns4 = Ring<false, detail::kAttnHopperDeepRingStagesCausal, true, false>;
      variants.push_back({"turns_tail8", [&] { Turns3::launch(p, h.stream(), 8); }});
      variants.push_back({"turns_tail16", [&] { Turns3::launch(p, h.stream(), 16); }});
      variants.push_back({"turns_tail64", [&] { Turns3::launch(p, h.stream(), 64); }});
      variants.push_back({"turns4_tail16", [&] { Turns4::launch(p, h.stream(), 16); }});
      variants.push_back({"turns4_tail32", [&] { Turns4::launch(p, h.stream(), 32); }});
      variants.push_back({"turns4_tail64", [&] { Turns4::launch(p, h.stream(), 64); }});
    }
    variants.push_back({"tail_lib", [causal_form] { causal_form(-1); }});
    variants.push_back({"tail0", [causal_form] { causal_form(0); }});
    variants.push_back({"tail8", [causal_form] { causal_form(8); }});
    variants.push_back({"tail16", [causal_form] { causal_form(16); }});
    variants.push_back({"tail32", [causal_form] { causal_form(32); }});
    variants.push_back({"tail132", [causal_form] { causal_form(132); }});
    // ... and the one-CTA kernels the library takes above the persistent kernel's reach (d 64: three
    // consumer warpgroups; d 128: 176-key blocks from 8k; d 256: 80-key blocks), the grid's last G pairs
    // in rounds of one query block (onecta_tail*; the grid's order: onecta_tail0).
    const auto one_cta_form = [&](int g) {
      if constexpr (kD == 64)
        detail::launch_attn_hopper_variant<B, 64, false, true, true, 0, false, false, true, false, 3,
                                           kernels::kAttnLazyRescaleDefault<B, 64>, kernels::kAttnTreeReduceDefault<B, 64>, true, false,
                                           false>(p, DType::kBF16, h.stream(), true, g);
      else if constexpr (kD == 128)
        detail::launch_attn_hopper_variant<B, 128, false, true, true, 176>(p, DType::kBF16, h.stream(), true, g);
      else
        detail::launch_attn_hopper_variant<B, kD, false, true, true>(p, DType::kBF16, h.stream(), true, g);
    };
    variants.push_back({"onecta_tail_lib", [one_cta_form] { one_cta_form(-1); }});
    variants.push_back({"onecta_tail0", [one_cta_form] { one_cta_form(0); }});
    variants.push_back({"onecta_tail8", [one_cta_form] { one_cta_form(8); }});
    variants.push_back({"onecta_tail32", [one_cta_form] { one_cta_form(32); }});
  }
  // ... at d 256 (80-key blocks) with each warpgroup's last block cut to its first 32 / 48 / 64 keys
  // where its rows see no more of it (kHalfLast with kTailKeys; 512 keys end 32 keys into the 7th
  // block, 1k 64 into the 13th), peeled as the library's.
  if constexpr (kD == 256) {
    using B = __nv_bfloat16;
    variants.push_back({"persistent_peel_tail32", [&] { detail::launch_attn_hopper_persistent_half<B, kD, false, 2, 0, true, 32>(p, DType::kBF16, h.stream()); }});
    variants.push_back({"persistent_peel_tail48", [&] { detail::launch_attn_hopper_persistent_half<B, kD, false, 2, 0, true, 48>(p, DType::kBF16, h.stream()); }});
    variants.push_back({"persistent_peel_tail64", [&] { detail::launch_attn_hopper_persistent_half<B, kD, false, 2, 0, true, 64>(p, DType::kBF16, h.stream()); }});
  }
  // ... the kSplitTail kernel never splitting (what its parts' code costs the other tiles).
  variants.push_back({"persistent_tail_kernel_unsplit",
                      [&] { detail::launch_attn_hopper_persistent_split<__nv_bfloat16, kD>(p, DType::kBF16, h.stream(), -1.0); }});
  // ... with every consumer warp computing each tile's coordinates itself (kSharedTile off).
  if constexpr (kD <= 128)
    variants.push_back({"persistent_recompute", [&] { launch_persistent<kD, 0, true, false>(p, h.stream()); }});
  // ... with the pingpong turns restarted at each tile (the persistent kernel before 2026-11-26 noon).
  if constexpr (kD <= 128)
    variants.push_back({"persistent_restart", [&] { launch_persistent<kD, 0, false>(p, h.stream()); }});
  // ... with O rescaled whenever a row's max grows (kLazyRescale off), and lazily (on).
  if constexpr (kD <= 128)
    variants.push_back({"persistent_eager", [&] { launch_persistent<kD, 0, true, true, 2, false>(p, h.stream()); }});
  if constexpr (kD <= 128)
    variants.push_back({"persistent_lazy", [&] { launch_persistent<kD, 0, true, true, 2, true>(p, h.stream()); }});
  // ... with 176-key blocks (the one-CTA kernel's from 8k keys at d 128).
  if constexpr (kD == 128) {
    variants.push_back({"persistent_176", [&] { launch_persistent<kD, 176>(p, h.stream()); }});
    // ... with the masked blocks peeled off (kPeelMask, the library's from 2k keys on 128; its O store
    // waited for late needs two Q buffers, which 176-key blocks leave no room for).
    variants.push_back({"persistent_176_peel", [&] {
                          detail::launch_attn_hopper_persistent_as<__nv_bfloat16, 128, false, 2, 176, false, false, true, false, 0, 2, 0,
                                                                   false>(p, DType::kBF16, h.stream());
                        }});
  }
  // ... with three consumer warpgroups (192-row tiles; 152 registers each: 128-key blocks spilled
  // 48 bytes, 96 and 112 do not).
  if constexpr (kD == 64) {
    // (the library's for causal 1k-2k keys, with its warpgroups on their own blocks and its masked
    // blocks peeled off: persistent_3c_n96_peel_half)
    variants.push_back({"persistent_3c_n96", [&] {
                          detail::launch_attn_hopper_persistent_as<__nv_bfloat16, 64, false, 3, 96>(p, DType::kBF16, h.stream());
                        }});
    variants.push_back({"persistent_3c_n112", [&] { launch_persistent<kD, 112, true, true, 2, false, 3>(p, h.stream()); }});
  }
  // ... with a deeper K/V ring: 3 stages (d 128: then one Q buffer), 4 at d 64.
  if constexpr (kD <= 128)
    variants.push_back({"persistent_3stages", [&] { launch_persistent<kD, 0, true, true, 3>(p, h.stream()); }});
  if constexpr (kD == 64)
    variants.push_back({"persistent_4stages", [&] { launch_persistent<kD, 0, true, true, 4>(p, h.stream()); }});

  // The softmax's row max and sum as running values (kTreeReduce off, *_chain) or folded as trees
  // (on, *_tree) in the kernels the library takes; the plain names take the library's default
  // (kAttnTreeReduceDefault: trees at d 64 only).
  if constexpr (kD == 64) {
    variants.push_back({"3_consumers_chain",
                        [&] { launch<kD, true, true, 0, false, true, false, 3, false, false>(p, h.stream()); }});
    variants.push_back({"persistent_chain", [&] { launch_persistent<kD, 0, true, true, 2, false, 2, false>(p, h.stream()); }});
    variants.push_back({"persistent_3c_n96_chain",
                        [&] { launch_persistent<kD, 96, true, true, 2, false, 3, false>(p, h.stream()); }});
  }
  if constexpr (kD == 128) {
    variants.push_back({"pingpong+overlap_tree",
                        [&] { launch<kD, true, true, 0, true, true, false, 2, true, true>(p, h.stream()); }});
    variants.push_back({"kBlockN=176_tree",
                        [&] { launch<kD, true, true, 176, true, true, false, 2, true, true>(p, h.stream()); }});
    variants.push_back({"persistent_tree", [&] { launch_persistent<kD, 0, true, true, 2, true, 2, true>(p, h.stream()); }});
  }
  // The persistent kernel at d 256 (one Q buffer; 80- and 64-key blocks).
  if constexpr (kD == 256) {
    variants.push_back({"persistent_n80", [&] { launch_persistent<kD, 80>(p, h.stream()); }});
    variants.push_back({"persistent_n64", [&] { launch_persistent<kD, 64>(p, h.stream()); }});
    // Narrower key blocks leave room for a second Q buffer (48 keys: 2 x 64 KB + 2 x 48 KB), so
    // the next tile's Q loads under this one's math and epilogue; 32 keys: also a third K/V stage.
    variants.push_back({"persistent_n48", [&] { launch_persistent<kD, 48>(p, h.stream()); }});
    variants.push_back({"persistent_n32", [&] { launch_persistent<kD, 32>(p, h.stream()); }});
    variants.push_back({"persistent_n32_3stages", [&] { launch_persistent<kD, 32, true, true, 3>(p, h.stream()); }});
    // One K/V stage instead of two, so that two Q buffers fit beside it (2 x 64 + 80 KB): the next
    // tile's Q loads under this one, each K / V block after both consumers' use of the last.
    variants.push_back({"persistent_n80_1stage", [&] { launch_persistent<kD, 80, true, true, 1>(p, h.stream()); }});
    // 64-key blocks leave room for a staging tile of O's own (one warpgroup's 64 rows, 32 KB, the
    // two warpgroups in turn; kOwnO): the Q buffer goes back after the tile's last Q K^T. With the
    // library's loop split around the masked blocks (*_peel) and without.
    // Through the library's launchers of these forms (src/attention_hopper_hdim.cuh).
    using T = __nv_bfloat16;
    const auto bf16 = DType::kBF16;
    variants.push_back({"persistent_n64_peel",
                        [&] { detail::launch_attn_hopper_persistent_as<T, kD, false, 2, 64, false, false, true>(p, bf16, h.stream()); }});
    variants.push_back({"persistent_n64_own_o", [&] { detail::launch_attn_hopper_persistent_own_o<T, false>(p, bf16, h.stream()); }});
    variants.push_back({"persistent_n64_peel_own_o", [&] { detail::launch_attn_hopper_persistent_own_o<T, true>(p, bf16, h.stream()); }});
    // ... and with each warpgroup on its own blocks (kHalfLast: on the causal diagonal the first skips
    // the tile's last 64-key block), the library's causal form at d 256.
    variants.push_back({"persistent_n64_peel_half", [&] {
                          detail::launch_attn_hopper_persistent_as<T, kD, false, 2, 64, false, false, true, true>(p, bf16, h.stream());
                        }});
    variants.push_back({"persistent_n64_peel_half_own_o",
                        [&] { detail::launch_attn_hopper_persistent_own_o<T, true, true>(p, bf16, h.stream()); }});
    // ... with O written to its tile by stmatrix (*_stsm).
    variants.push_back({"persistent_n64_peel_own_o_stsm",
                        [&] { detail::launch_attn_hopper_persistent_own_o<T, true, false, true>(p, bf16, h.stream()); }});
    variants.push_back({"persistent_n64_peel_half_own_o_stsm",
                        [&] { detail::launch_attn_hopper_persistent_own_o<T, true, true, true>(p, bf16, h.stream()); }});
  }
  // The persistent kernel giving its Q buffer back after the tile's last Q K^T, O stored from
  // registers (kDirectO; the next tile's Q loads under this tile's last block and epilogue).
  {
    constexpr bool kLazy = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>, kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
    constexpr bool kPp = kernels::kAttnPersistentPingpongDefault<kD, 2>;
    constexpr int kN = kD == 256 ? 80 : 0;
    if constexpr (kD <= 128 || kD == 256)
      variants.push_back({"persistent_direct_o",
                          [&] { launch_persistent<kD, kN, true, true, 2, kLazy, 2, kTree, kPp, true, true>(p, h.stream()); }});
    // ... with O staged in the last block's K/V stage instead of the Q buffer (kStageO; with pingpong
    // turns: not d 64).
    if constexpr (kD == 128 || kD == 256)
      variants.push_back({"persistent_stage_o",
                          [&] { launch_persistent<kD, kN, true, true, 2, kLazy, 2, kTree, kPp, true, false, false, true>(p, h.stream()); }});
    // At d 128 on three K/V stages (then one Q buffer): O staged in the last block's stage, so that
    // the next tile's Q loads after the last Q K^T and its first blocks into the two other stages;
    // and the probe of the early Q alone on three stages.
    if constexpr (kD == 128) {
      variants.push_back({"persistent_3stages_stage_o",
                          [&] { launch_persistent<kD, 0, true, true, 3, kLazy, 2, kTree, kPp, true, false, false, true>(p, h.stream()); }});
      variants.push_back({"probe_persistent_3stages_early_q",
                          [&] { launch_persistent<kD, 0, true, true, 3, kLazy, 2, kTree, kPp, true, false, true>(p, h.stream()); }});
    }
    // The rows' sums of P by the tensor cores (kSumByMma, the library's FP8 form: an m64n8k16 wgmma
  // per k-step of P V against ones; l then sums P as rounded to bf16) in the kernels the library
  // takes at d 64 (persistent, three consumer warpgroups) and d 128 (persistent, one-CTA).
  if constexpr (kD == 64) {
    constexpr bool kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
    variants.push_back({"3_consumers_sum", [&] { launch<kD, true, true, 0, false, true, false, 3, false, kTree, true, false, true>(p, h.stream()); }});
  }
  if constexpr (kD == 128)
    variants.push_back({"pingpong+overlap_sum", [&] { launch<kD, true, true, 0, true, true, false, 2, true, false, true, false, true>(p, h.stream()); }});
  if constexpr (kD <= 128) {
    constexpr bool kLazy = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>, kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
    constexpr bool kPp = kernels::kAttnPersistentPingpongDefault<kD, 2>;
    variants.push_back({"persistent_sum", [&] {
                          launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, kPp, true, false, false, false, true>(p, h.stream());
                        }});
  }
  // A probe (timing only): Q given back early, O still staged in it (kEarlyQProbe).
    if constexpr (kD <= 128 || kD == 256)
      variants.push_back({"probe_persistent_early_q",
                          [&] { launch_persistent<kD, kN, true, true, 2, kLazy, 2, kTree, kPp, true, false, true>(p, h.stream()); }});
  }
  if constexpr (kD == 256) {
    variants.push_back({"pingpong+overlap_tree",
                        [&] { launch<kD, true, true, 0, false, true, false, 2, true, true>(p, h.stream()); }});
    variants.push_back({"kBlockN=64_tree",
                        [&] { launch<kD, true, true, 64, false, true, false, 2, true, true>(p, h.stream()); }});
  }
  // The persistent kernels without pingpong turns (kPingpong off; the library's at d 64 with two
  // consumer warpgroups, whose "persistent" takes them there: persistent_pingpong has them).
  if constexpr (kD <= 128) {
    constexpr bool kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
    constexpr bool kLazy = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>;
    variants.push_back({"persistent_no_pingpong",
                        [&] { launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, false>(p, h.stream()); }});
    variants.push_back({"persistent_pingpong",
                        [&] { launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, true>(p, h.stream()); }});
    // ... and with the second consumer warpgroup started a block behind the first (kLag 1; two
    // stages: at d 128 a third does not fit beside two Q buffers), with the mask code and without.
    variants.push_back({"persistent_no_pingpong_lag1", [&] {
                          launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, false, true, false, false, false, false, false,
                                            false, false, false, 1>(p, h.stream());
                        }});
    if (!c.causal)
      variants.push_back({"persistent_nomask_no_pingpong_lag1", [&] {
                            launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, false, true, false, false, false, false, false,
                                              true, false, false, 1>(p, h.stream());
                          }});
    if (!c.causal)
      variants.push_back({"persistent_nomask_no_pingpong", [&] {
                            launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, false, true, false, false, false, false, false,
                                              true>(p, h.stream());
                          }});
  }
  if constexpr (kD == 64)
    variants.push_back({"persistent_3c_n96_no_pingpong",
                        [&] { launch_persistent<kD, 96, true, true, 2, false, 3, true, false>(p, h.stream()); }});
  // Probes (timing only, wrong output): the persistent kernels without the epilogue's wait for the
  // TMA store's reads of O (what that wait costs a tile).
  if constexpr (kD <= 128) {
    constexpr bool kLazy = kernels::kAttnLazyRescaleDefault<__nv_bfloat16, kD>, kTree = kernels::kAttnTreeReduceDefault<__nv_bfloat16, kD>;
    constexpr bool kPp = kernels::kAttnPersistentPingpongDefault<kD, 2>;
    variants.push_back({"probe_persistent_store_nowait",
                        [&] { launch_persistent<kD, 0, true, true, 2, kLazy, 2, kTree, kPp, false>(p, h.stream()); }});
  }
  if constexpr (kD == 64)
    variants.push_back({"probe_persistent_3c_n96_store_nowait", [&] {
                          launch_persistent<kD, 96, true, true, 2, false, 3, true, kernels::kAttnPersistentPingpongDefault<64, 3>, false>(
                              p, h.stream());
                        }});
  variants = kept(variants, names);
  // Timings first (round-robin), then the checks.
  const std::vector<double> ms = time_variants(h, variants);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& var = variants[vi];
    const auto [rel, nans] = output_diff(var, out.p, n, want, max_ref, h.stream());
    // Rung 3 and other key-block widths sum in another order (rounding differences): 2^-6 for
    // them, 2^-8 for the variants of the same blocks.
    const std::string name = var.name;
    const bool other_order =
        name == "rung3_fa2" || name.rfind("kBlockN=", 0) == 0 || name.rfind("3_consumers_n", 0) == 0 ||
        name.rfind("persistent_176", 0) == 0 || name.rfind("persistent_n64", 0) == 0 || name.rfind("persistent_n96", 0) == 0 || name.rfind("persistent_n48", 0) == 0 ||
        name.rfind("persistent_n32", 0) == 0 || name.rfind("2ctas_n", 0) == 0 || name.rfind("persistent_3c", 0) == 0 ||
        name == "before_1126" || name.find("eager") != std::string::npos || name.find("lazy") != std::string::npos ||
        name.find("chain") != std::string::npos || name.find("tree") != std::string::npos || name.find("_tail") != std::string::npos ||
        name.find("_sum") != std::string::npos ||
        name == "rung4_library" || name.rfind("tail", 0) == 0 || name.rfind("onecta_tail", 0) == 0;  // the library's forms: any kernel
    const bool probe = name.rfind("probe_", 0) == 0;  // timing only: its output may be wrong
    const bool ok = probe || (nans == 0 && rel <= (other_order ? 1.0 / 64 : 1.0 / 256));
    all_ok &= ok;
    std::printf("d %3lld seqlen %5lld causal %d  %-18s %8.4f ms  %6.1f TFLOP/s  max|diff|/max|ref| %.2e  NaN %lld  %s\n",
                static_cast<long long>(c.headdim), static_cast<long long>(c.seqlen), c.causal ? 1 : 0, var.name, ms[vi],
                flops / (ms[vi] * 1e-3) / 1e12, rel, static_cast<long long>(nans), probe ? "(timing only)" : ok ? "ok" : "FAIL");
    bench::Row r = bench::attention_experiment::variant_row("attn_fwd_ablation", var.name, c, ms[vi], flops, 4.0 * n * 2);
    r.extra["max_rel_diff_vs_rung4"] = rel;
    h.add(r);
  }
}

// FP8 (e4m3 q, k, v in [-4, 4], no descale factors, bf16 out) at d 128: the kernels the library
// takes and their alternatives (below), against the first (2^-6 relative; 2^-4 where the key blocks
// or the row sums differ: P rounds to e4m3 at other running maxima, l sums the rounded P). The
// reference: the two-warpgroup kernel on V^T from the pass before it (kFp8VtPass, the rung until
// 2026-11-27; the library's over more than 2k keys since). Timed as the library's call (with the
// pass where a variant takes it).
template <bool kTreeReduce, bool kPingpong = true, int kBlockN = 128, int kConsumers = 2, bool kOverlap = true, bool kSumByMma = false,
          bool kSplitTail = false, bool kVtPass = false>
void launch_fp8(const AttnFwdParams& p, cudaStream_t s, bool pdl = true) {
  detail::launch_attn_hopper_variant<__nv_fp8_e4m3, 128, false, kPingpong, kOverlap, kBlockN, false, true, true, false, kConsumers,
                                     kernels::kAttnLazyRescaleDefault<__nv_fp8_e4m3, 128>, kTreeReduce, true, kSumByMma,
                                     kSplitTail, kVtPass>(p, DType::kE4M3, s, pdl);
}

void run_fp8(bench::Harness& h, const Config& c, bool& all_ok) {
  const int64_t batch = c.batch(), heads = c.heads(), n = c.elements();
  bench::DeviceMem q(n), k(n), v(n), out(n * 2), ref(n * 2);
  // FLASHLAB_FP8_NORMAL=1: e4m3 of standard normals (as attention_vs_sdpa.py's) instead of uniform in [-4, 4].
  const char* normal = std::getenv("FLASHLAB_FP8_NORMAL");
  const int code = normal != nullptr && normal[0] == '1' ? 3 : 2;
  bench::fill_random(q.p, n, code, 81, h.stream());
  bench::fill_random(k.p, n, code, 82, h.stream());
  bench::fill_random(v.p, n, code, 83, h.stream());
  launch_fp8<false, true, 128, 2, true, false, false, true>(params(c, batch, heads, q.p, k.p, v.p, ref.p), h.stream());
  const auto [want, max_ref] = reference_output(ref.p, n, h.stream());
  const AttnFwdParams p = params(c, batch, heads, q.p, k.p, v.p, out.p);
  const double flops = attention_flops(c);
  // fp8: two consumer warpgroups, pingpong, overlap, 128-key blocks (the library's with softcap /
  // ALiBi, and causal up to 1k keys); fp8_n192 / fp8_n224: wider key blocks (V^T in chunks of 64 /
  // 32 keys; 256 spills), on the pass's V^T (the producer's transpose spills 4-8 bytes there). *_3c_*_no_overlap_no_pingpong: three consumer warpgroups, kOverlap off
  // (S, softmax, then P V: 128-key blocks fit 160 registers so; with kOverlap they spill 144 bytes),
  // no pingpong turns; the library's otherwise, *_sum (kSumByMma) without an LSE out. _tree:
  // kTreeReduce; _tail: the last, partial wave's tiles split along the keys (kSplitTail; the
  // library's without a mask); _vtpass: V^T from the pass before the kernel (kFp8VtPass; else the
  // producer warpgroup transposes V in the kernel); _nopdl: the kernel launched after the pass
  // without programmatic dependent launch; vt_pass_only: the pass alone (its cost; no output).
  // Left out once measured, with their kernel switches
  // (docs/ladder/attention.md): _sum_tail_stagger (the consumer warpgroups starting each tile a
  // GEMM apart, kStagger, cb18863), _polyK (every K-th n8 tile's exponents on the FMA pipe, kExpPoly:
  // _sum_poly2 / 3 / 4 / 8 and _poly4, db8231b, 30aee62), _split and _sum_split (P V in two halves,
  // the first under the second's exponents, kPvSplit, 30aee62),
  // fp8_3c_n128_no_overlap_no_pingpong_sum_tree (29af8c4), fp8_tree / fp8_no_pingpong
  // (17d4575 / 8bb39f1), fp8_n160, fp8_n192_no_pingpong, fp8_3c_n64, fp8_3c_n96 (dc1c35e), the
  // two-warpgroup *_sum kernels (91b6165), three warpgroups on 96-key blocks with overlap or with
  // P V and the next Q K^T issued together (85db2aa), the library's three-warpgroup kernels taking
  // turns for their exponentials (*_turns, kExpTurns of the one-CTA kernel, 1fd0c77 and 063f6b6).
  const std::vector<Variant> variants = {{"fp8", [&] { launch_fp8<false>(p, h.stream()); }},
                                         {"fp8_vtpass", [&] { launch_fp8<false, true, 128, 2, true, false, false, true>(p, h.stream()); }},
                                         {"fp8_n192", [&] { launch_fp8<false, true, 192, 2, true, false, false, true>(p, h.stream()); }},
                                         {"fp8_n224", [&] { launch_fp8<false, true, 224, 2, true, false, false, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong", [&] { launch_fp8<false, false, 128, 3, false>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_sum", [&] { launch_fp8<false, false, 128, 3, false, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_tail", [&] { launch_fp8<false, false, 128, 3, false, false, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_tail_vtpass", [&] { launch_fp8<false, false, 128, 3, false, false, true, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_sum_tail", [&] { launch_fp8<false, false, 128, 3, false, true, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_sum_tail_vtpass", [&] { launch_fp8<false, false, 128, 3, false, true, true, true>(p, h.stream()); }},
                                         {"fp8_3c_n128_no_overlap_no_pingpong_sum_tail_vtpass_nopdl", [&] { launch_fp8<false, false, 128, 3, false, true, true, true>(p, h.stream(), false); }},
                                         {"vt_pass_only", [&] {
                                            using Tr = kernels::HopperAttnTraits<128, false, 128, 1, 3, true>;
                                            (void)detail::attn_fp8_transposed_v<Tr>(p, h.stream());
                                          }}};
  const std::vector<double> ms = time_variants(h, variants);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const bool pass_only = std::string(variants[vi].name) == "vt_pass_only";  // writes no output
    const auto [rel, nans] = pass_only ? OutputDiff{0, 0} : output_diff(variants[vi], out.p, n, want, max_ref, h.stream());
    // Other key-block widths round P to e4m3 at other running maxima (the max moves at block
    // boundaries), and the sums by the tensor cores add the rounded P: compared at e4m3's relative
    // step (2^-4) instead.
    const std::string name = variants[vi].name;
    const bool other_rounding = name == "fp8_n192" || name == "fp8_n224" || name.find("_sum") != std::string::npos ||
                                name.find("_tail") != std::string::npos;
    const bool ok = nans == 0 && rel <= (other_rounding ? 1.0 / 16 : 1.0 / 64);
    all_ok &= ok;
    std::printf("e4m3 d 128 seqlen %5lld causal %d  %-18s %8.4f ms  %6.1f TFLOP/s  max|diff|/max|ref| %.2e  NaN %lld  %s\n",
                static_cast<long long>(c.seqlen), c.causal ? 1 : 0, variants[vi].name, ms[vi], flops / (ms[vi] * 1e-3) / 1e12,
                rel, static_cast<long long>(nans), ok ? "ok" : "FAIL");
    bench::Row r = bench::attention_experiment::variant_row("attn_fwd_ablation", variants[vi].name, c, ms[vi], flops, 5.0 * n);
    r.dtype = "e4m3";
    r.extra["max_rel_diff_vs_rung4"] = rel;
    h.add(r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  opt.min_reps = 20;
  // FLASHLAB_ROUNDS=n: n rounds of the round-robin instead of 20 (a longer, sustained run).
  if (const char* rounds = std::getenv("FLASHLAB_ROUNDS")) opt.min_reps = std::atoi(rounds);
  const std::string mode = argc > 1 && std::string(argv[1]).rfind("--", 0) == 0 ? argv[1] : "";
  if (argc > 1 + !mode.empty()) opt.out = argv[1 + !mode.empty()];
  bench::Harness h(opt);
  bool all_ok = true;
  // FLASHLAB_SEQLEN=n: the sweeps at that sequence length only (e.g. one shape for a profiler).
  const char* only = std::getenv("FLASHLAB_SEQLEN");
  const auto swept = [only](std::vector<int64_t> all) {
    return only == nullptr ? all : std::vector<int64_t>{std::atoll(only)};
  };
  if (mode == "--sweep") {  // d 128 over the benchmark's sequence lengths
    const std::vector<std::string> names = {"rung4_library", "pingpong+overlap", "kBlockN=176", "persistent", "persistent_176"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048, 4096, 8192, 16384})) run_config<128>(h, {s, 128, causal}, all_ok, names);
  } else if (mode == "--pairs") {  // the one-CTA kernel in CTA pairs (multicast K / V), no mask: d 128 2k..16k, d 256 2k..4k
    const std::vector<std::string> d128 = {"rung4_library", "pingpong+overlap", "pairs", "kBlockN=176", "kBlockN=176_pairs"};
    for (int64_t s : swept({2048, 4096, 8192, 16384})) run_config<128>(h, {s, 128, false}, all_ok, d128);
    const std::vector<std::string> d256 = {"rung4_library", "pingpong+overlap", "pairs"};
    for (int64_t s : swept({2048, 4096})) run_config<256>(h, {s, 256, false}, all_ok, d256);
  } else if (mode == "--wide-persistent") {  // d 128 8k..16k: the persistent kernel's library form on 176-key blocks
    const std::vector<std::string> names = {"rung4_library", "kBlockN=176", "persistent_176", "persistent_176_peel",
                                            "persistent_peel_late"};
    for (bool causal : {false, true})
      for (int64_t s : swept({8192, 16384})) run_config<128>(h, {s, 128, causal}, all_ok, names);
  } else if (mode == "--narrow128") {  // d 128 512..1k: the persistent kernel on 64- and 96-key blocks
    const std::vector<std::string> names = {"rung4_library", "persistent_late", "persistent_n64_late", "persistent_n64_s4_late",
                                            "persistent_n96_late"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024})) run_config<128>(h, {s, 128, causal}, all_ok, names);
  } else if (mode == "--sweep256") {  // d 256, 512..4k: 80- against 64-key blocks, one-CTA against persistent
    const std::vector<std::string> names = {"rung4_library", "pingpong+overlap", "kBlockN=64", "persistent_n80", "persistent_n64"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<256>(h, {s, 256, causal}, all_ok, names);
  } else if (mode == "--sweep64") {  // d 64, 512..16k
    const std::vector<std::string> names = {"rung4_library", "3_consumers", "3_consumers_tail", "persistent",
                                            "persistent_3c_n96", "persistent_3c_n112"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048, 4096, 8192, 16384})) run_config<64>(h, {s, 64, causal}, all_ok, names);
  } else if (mode == "--tree") {  // the softmax's reductions as trees against running values
    const std::vector<std::string> d64 = {"rung4_library", "3_consumers", "3_consumers_chain", "persistent", "persistent_chain",
                                          "persistent_3c_n96", "persistent_3c_n96_chain"};
    const std::vector<std::string> d128 = {"rung4_library", "pingpong+overlap", "pingpong+overlap_tree", "kBlockN=176",
                                           "kBlockN=176_tree", "persistent", "persistent_tree"};
    const std::vector<std::string> d256 = {"rung4_library", "pingpong+overlap", "pingpong+overlap_tree", "kBlockN=64",
                                           "kBlockN=64_tree"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048, 8192})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 2048, 8192, 16384})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
      for (int64_t s : swept({512, 2048})) run_config<256>(h, {s, 256, causal}, all_ok, d256);
      for (int64_t s : swept({2048, 8192, 16384})) run_fp8(h, {s, 128, causal}, all_ok);
    }
  } else if (mode == "--persistent-pingpong") {  // the persistent kernels with and without pingpong turns
    const std::vector<std::string> d64 = {"rung4_library", "persistent_pingpong", "persistent_no_pingpong", "persistent_3c_n96",
                                          "persistent_3c_n96_no_pingpong", "3_consumers"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent_pingpong", "persistent_no_pingpong"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--store-probe") {  // the persistent kernels with and without the epilogue's store wait
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "probe_persistent_store_nowait", "persistent_3c_n96",
                                          "probe_persistent_3c_n96_store_nowait"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "probe_persistent_store_nowait"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024, 2048})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--late-wait") {  // the O store's wait after the next tile's first Q K^T, in the library's forms
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_late", "persistent_nomask",
                                          "persistent_nomask_late", "persistent_nomask_lag3_s4", "persistent_nomask_lag3_s4_late",
                                          "persistent_nomask_lag2_s3_late", "persistent_s3", "persistent_s3_late",
                                          "persistent_s4_late", "persistent_3c_n96_peel_half", "persistent_3c_n96_peel_half_late"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_late", "persistent_peel_wait",
                                           "persistent_peel_late"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--late-wait2") {  // the late forms with stmatrix, turns, a lag: d 64 causal, d 128 512..1k
    const std::vector<std::string> d64 = {"rung4_library", "persistent_s3_late", "persistent_s3_late_stsm", "persistent_s3_late_pingpong",
                                          "persistent_lag1_s4_late", "persistent_s4_late"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_late", "persistent_late_stsm"};
    for (bool causal : {true, false}) {
      if (causal)
        for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--exp-turns") {  // turns around the exponentials, the block loop without overlap
    const std::vector<std::string> d64 = {"rung4_library", "persistent_nomask_lag3_s4", "persistent_nomask_lag3_s4_late",
                                          "persistent_nomask_s4_late_turns", "persistent_nomask_s2_late_serial_turns",
                                          "persistent_nomask_s3_late_serial_turns", "persistent_nomask_s4_late_serial_turns",
                                          "persistent_s3_late", "persistent_s3_late_turns", "persistent_s2_late_serial_turns",
                                          "persistent_s3_late_serial_turns", "persistent_s3_late_serial"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent_late", "persistent_exp_turns", "persistent_serial_turns"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024, 2048})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--exp-turns2") {  // d 64 causal: the turns on 2-4 K/V stages
    const std::vector<std::string> d64 = {"rung4_library",      "persistent_s3_late", "persistent_s2_late_turns", "persistent_s3_late_turns",
                                          "persistent_s4_late_turns", "turns_tail8",     "turns_tail16",            "turns_tail64"};
    for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, true}, all_ok, d64);
  } else if (mode == "--exp-turns3") {  // d 64 causal: the turns on 3-6 K/V stages, the walk's tail on four
    const std::vector<std::string> d64 = {"rung4_library",        "persistent_s3_late_turns", "persistent_s4_late_turns",
                                          "persistent_s5_late_turns", "persistent_s6_late_turns", "turns4_tail16",
                                          "turns4_tail32",        "turns4_tail64"};
    for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, true}, all_ok, d64);
  } else if (mode == "--tail-order") {  // causal: the walk's last pairs in rounds of one query block
    const std::vector<std::string> names = {"rung4_library", "tail0", "tail_lib", "tail16", "tail32", "tail132"};
    for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, true}, all_ok, names);
    for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, true}, all_ok, names);
    for (int64_t s : swept({512, 1024})) run_config<256>(h, {s, 256, true}, all_ok, names);
  } else if (mode == "--tail-order2") {  // causal: the tail at 8 / 32 pairs and the library's, persistent and one-CTA kernels
    const std::vector<std::string> names = {"rung4_library", "tail0", "tail_lib", "tail8", "tail32"};
    const std::vector<std::string> one_cta = {"rung4_library", "onecta_tail0", "onecta_tail_lib", "onecta_tail8", "onecta_tail32"};
    for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, true}, all_ok, names);
    for (int64_t s : swept({4096, 8192})) run_config<64>(h, {s, 64, true}, all_ok, one_cta);
    for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, true}, all_ok, names);
    for (int64_t s : swept({8192, 16384})) run_config<128>(h, {s, 128, true}, all_ok, one_cta);
    for (int64_t s : swept({512, 1024})) run_config<256>(h, {s, 256, true}, all_ok, names);
    for (int64_t s : swept({2048, 4096})) run_config<256>(h, {s, 256, true}, all_ok, one_cta);
  } else if (mode == "--two-ctas") {  // one consumer warpgroup, two CTAs an SM, against the library
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "3_consumers", "2ctas", "2ctas_n192"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "pingpong+overlap", "2ctas_n64", "2ctas_n80"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048, 8192})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024, 2048, 8192})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--direct-o") {  // the persistent kernels' tile boundary (d 256: one Q buffer)
    const std::vector<std::string> d256 = {"rung4_library", "persistent_n80", "persistent_direct_o", "persistent_stage_o",
                                           "probe_persistent_early_q", "persistent_n48", "persistent_n32", "persistent_n32_3stages"};
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_direct_o", "probe_persistent_early_q"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_direct_o", "persistent_stage_o",
                                           "probe_persistent_early_q"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<256>(h, {s, 256, causal}, all_ok, d256);
      for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--stage-o3") {  // d 128: three K/V stages, O staged in the last one
    const std::vector<std::string> d128 = {"rung4_library",       "persistent",
                                           "persistent_3stages",  "persistent_stage_o",
                                           "persistent_3stages_stage_o", "probe_persistent_3stages_early_q",
                                           "probe_persistent_early_q"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
  } else if (mode == "--own-o") {  // d 256: O's own staging tile beside 64-key blocks, Q given back early
    const std::vector<std::string> d256 = {"rung4_library",       "persistent_n80",       "persistent_n64",
                                           "persistent_n64_peel", "persistent_n64_own_o", "persistent_n64_peel_own_o",
                                           "persistent_n64_peel_own_o_stsm", "probe_persistent_early_q"};
    const std::vector<std::string> d256_causal = {"rung4_library", "persistent_n64_peel", "persistent_n64_peel_own_o",
                                                  "persistent_n64_peel_half", "persistent_n64_peel_half_own_o",
                                                  "persistent_n64_peel_half_own_o_stsm", "probe_persistent_early_q"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048})) run_config<256>(h, {s, 256, causal}, all_ok, causal ? d256_causal : d256);
  } else if (mode == "--one-stage") {  // d 256: one K/V stage and two Q buffers
    const std::vector<std::string> d256 = {"rung4_library", "persistent_n80", "persistent_n80_1stage", "probe_persistent_early_q"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048})) run_config<256>(h, {s, 256, causal}, all_ok, d256);
  } else if (mode == "--seq128") {  // d 128: three consumer warpgroups without overlap and pingpong
    const std::vector<std::string> names = {"rung4_library", "pingpong+overlap", "kBlockN=176", "3_consumers_n128_seq",
                                            "3_consumers_n112_seq"};
    for (bool causal : {false, true})
      for (int64_t s : swept({2048, 8192, 16384})) run_config<128>(h, {s, 128, causal}, all_ok, names);
  } else if (mode == "--tail") {  // the persistent kernels with and without their last tiles split
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_tail", "persistent_tail_any",
                                          "persistent_tail_kernel_unsplit"};
    const std::vector<std::string> d256 = {"rung4_library", "persistent_n80", "persistent_tail", "persistent_tail_any",
                                           "persistent_tail_kernel_unsplit"};
    for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, false}, all_ok, d64);
    for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, false}, all_ok, d64);
    for (int64_t s : swept({512})) run_config<256>(h, {s, 256, false}, all_ok, d256);
  } else if (mode == "--nomask") {  // the persistent kernels without the mask code
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_nomask", "3_consumers_tail",
                                          "3_consumers_tail_nomask"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_nomask"};
    for (int64_t s : swept({512, 1024, 2048, 4096, 8192})) run_config<64>(h, {s, 64, false}, all_ok, d64);
    for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, false}, all_ok, d128);
  } else if (mode == "--peel") {  // the persistent kernels with the block loop split around its masked blocks
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_peel", "persistent_nomask",
                                          "persistent_3c_n96", "persistent_3c_n96_peel"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_peel"};
    const std::vector<std::string> d256 = {"rung4_library", "persistent_n80", "persistent_peel"};
    for (bool causal : {true, false}) {
      if (std::getenv("FLASHLAB_PEEL_D256_ONLY") == nullptr) {
        for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
        for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
      }
      for (int64_t s : swept({512, 1024})) run_config<256>(h, {s, 256, causal}, all_ok, d256);
    }
  } else if (mode == "--half") {  // each consumer warpgroup on its own blocks, a half last block
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_half", "persistent_3c_n96", "persistent_3c_n96_half",
                                          "persistent_3c_n96_peel_half"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_half", "persistent_peel", "persistent_peel_half"};
    for (int64_t s : swept({512, 1024, 2048})) run_config<64>(h, {s, 64, true}, all_ok, d64);
    for (int64_t s : swept({512, 1024, 2048, 4096})) run_config<128>(h, {s, 128, true}, all_ok, d128);
  } else if (mode == "--lag") {  // d 64: the second consumer warpgroup started blocks behind the first
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_s3", "persistent_lag1_s3", "persistent_lag2_s3",
                                          "persistent_s4", "persistent_lag1_s4", "persistent_lag2_s4", "persistent_nomask",
                                          "persistent_nomask_s3", "persistent_nomask_lag1_s3", "persistent_nomask_lag2_s3",
                                          "persistent_nomask_s4", "persistent_nomask_lag1_s4", "persistent_nomask_lag2_s4",
                                          "persistent_nomask_lag3_s4", "persistent_nomask_lag3_s5", "persistent_nomask_lag4_s5",
                                          "persistent_nomask_lag4_s6", "persistent_nomask_lag5_s6"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
  } else if (mode == "--lag2") {  // a lag of one block on two stages: d 64 at 1k, d 128 at 512..1k (without turns)
    const std::vector<std::string> d64 = {"rung4_library", "persistent", "persistent_nomask", "persistent_no_pingpong_lag1",
                                          "persistent_nomask_no_pingpong_lag1"};
    const std::vector<std::string> d128 = {"rung4_library", "persistent", "persistent_nomask", "persistent_no_pingpong",
                                           "persistent_no_pingpong_lag1", "persistent_nomask_no_pingpong",
                                           "persistent_nomask_no_pingpong_lag1"};
    for (bool causal : {false, true}) {
      for (int64_t s : swept({1024})) run_config<64>(h, {s, 64, causal}, all_ok, d64);
      for (int64_t s : swept({512, 1024})) run_config<128>(h, {s, 128, causal}, all_ok, d128);
    }
  } else if (mode == "--tail-keys") {  // d 256: the last block cut to the keys its rows see
    const std::vector<std::string> d256 = {"rung4_library", "persistent_peel", "persistent_peel_tail32", "persistent_peel_tail48",
                                           "persistent_peel_tail64"};
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024})) run_config<256>(h, {s, 256, causal}, all_ok, d256);
  } else if (mode == "--fp8") {  // FP8 d 128, 512..16k
    for (bool causal : {false, true})
      for (int64_t s : swept({512, 1024, 2048, 4096, 8192, 16384})) run_fp8(h, {s, 128, causal}, all_ok);
  } else if (mode.empty()) {
    for (bool causal : {false, true}) {
      for (int64_t s : {2048, 8192}) run_config<128>(h, {s, 128, causal}, all_ok);
      for (int64_t s : {2048, 8192}) run_config<64>(h, {s, 64, causal}, all_ok);
      run_config<256>(h, {2048, 256, causal}, all_ok);
    }
  } else {
    std::fprintf(stderr, "unknown mode %s (--sweep, --pairs, --wide-persistent, --narrow128, --sweep64, --sweep256, --tree, --persistent-pingpong, --fp8, --seq128, --store-probe, --late-wait, --late-wait2, --exp-turns, --exp-turns2, --exp-turns3, --tail-order, --tail-order2, --direct-o, --own-o, --stage-o3, --sum, --two-ctas, --one-stage, --tail, --nomask, --peel, --half, --lag, --lag2, --tail-keys)\n",
                 mode.c_str());
    return 2;
  }
  h.write_json();
  std::printf(all_ok ? "all variants ok\n" : "FAIL: a variant differs from rung 4 or left NaN\n");
  return all_ok ? 0 : 1;
}
