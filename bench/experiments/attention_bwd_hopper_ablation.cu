// Experiment (not a rung): variants of attention backward rung 3's main kernel against the
// library's rung 3 in the same process — Q / dO stages (2, or 3 at head dim 128: the most that
// fits), how the shared tiles are addressed (kSharedSpace: STS / LDS, or generic ST.E / LD.E
// through a uintptr_t-aligned base) and the previous step's dQ product issued before this step's
// dK (kDqFirst). Each variant runs inside the library's attention_bwd
// (validation, workspace, preprocess, dq conversion: detail::attention_bwd_with_main), so the
// times compare with the benchmark's attn_bwd rows. bf16, (batch, seqlen, heads, d) contiguous,
// 16k tokens and model dim 2048 as in bench/cases_attention.cu. Built as
// build/*/bench/experiment_attention_bwd_hopper_ablation; quoted in docs/ladder/attention.md.
// Timing: the variants of a shape round-robin (Harness::time_ms_interleaved: L2 flushed, medians of
// 20 rounds, the order rotated every round; timed in turn, the card's clock history favoured the
// first). Correctness: dq, dk, dv of
// each variant, poisoned with NaN before the launch, against the library's rung 3: within 2^-8
// of max |ref| (dk, dv: the same products in the same order; dq: its fp32 adds land in L2 in a
// varying order, a bf16 ulp at most) and no NaN; else FAIL, exit 1.
// pre_post_only runs no main kernel (timing only): the preprocess and the dq conversion alone
// (several rows per warp since 2026-11-26; the warp-per-row form and its timing: bb6e0f4).
// Head dim 256 (its own kernel, backward/03_hopper_split.cuh): dQ's TMA reductions issued by the
// producer's warps (the library's) or the consumers' (dq_tma_by_consumer), or dQ by
// red.global.add.v4.f32 from registers (dq_by_red). Head dim 128: that kernel's form too (split).
// Since 2026-11-27 (23) also: kDqFirst with kDqByProducer (the library's at 64 and 128), three
// stages on it, and the forms before that day's changes (dQ tiles stored in column order, with
// bank conflicts; dK's A operand read from shared memory; both also at 256 where they apply).
// trace (kProbe 6, 2026-11-27 (24)): the library's form writing a timeline of a few blocks (the SM
// clock at each phase of each step; 03_hopper.cuh, bwd_trace); with --trace FILE, each shape's
// timeline is appended to FILE as CSV (d, seqlen, causal, block, step, slot, clock), read by
// bench/experiments/bwd_trace_report.py.
// Usage: experiment_attention_bwd_hopper_ablation [out.json] [--dims 64,128,256] [--variants a,b] [--trace FILE]
#define FLASHLAB_BWD_TRACE 1
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cases.h"
#include "bench/harness.h"
#include "flashlab/attention.h"
#include "bench/experiments/attention_experiment.h"
#include "src/attention_bwd_hopper_launch.cuh"
#include "src/attention_launch.h"

using namespace flashlab;

namespace {

using bench::attention_experiment::Config;
using bench::attention_experiment::download_bf16;

// Largest |got - want| over max |want|, and the NaNs in got.
struct Diff {
  double rel = 0;
  int64_t nans = 0;
};
Diff compare(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, max_ref = 0;
  Diff d;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::fmax(max_ref, std::fabs(want[i]));
    if (std::isnan(got[i])) ++d.nans;
    else worst = std::fmax(worst, std::fabs(got[i] - want[i]));
  }
  d.rel = max_ref > 0 ? worst / max_ref : worst;
  return d;
}

struct Variant {
  const char* name;
  detail::AttnBwdMainLaunch main;  // nullptr: the library's rung 3
  bool checked = true;             // false: timing only (no main kernel: the gradients are not computed)
};

// No main kernel: what the preprocess (D, lse log2(e), dq_accum zeroed) and the dq conversion
// cost on their own.
void no_main(const AttnBwdParams&, DType, cudaStream_t) {}

// kPersistent: a block per SM walking the tiles (03_hopper.cuh), or a block per tile (the library's).
template <int kD, int kStages, bool kShared, bool kDqFirst = false, bool kDqByProducer = false, int kProbe = 0,
          bool kPersistent = false>
void main_variant(const AttnBwdParams& p, DType dtype, cudaStream_t s) {
  detail::launch_attn_bwd_hopper_variant<__nv_bfloat16, kD, false, kStages, kShared, kDqFirst, kDqByProducer, kProbe, kPersistent>(
      p, dtype, s);
}

template <int kD, int kDqMode = 2, int kProbe = 0>
void main_split(const AttnBwdParams& p, DType dtype, cudaStream_t s) {
  detail::launch_attn_bwd_hopper_split<__nv_bfloat16, kD, false, kDqMode, kProbe>(p, dtype, s);
}

template <int kD>
std::vector<Variant> variants() {
  if constexpr (kD == 256) {
    // Head dim 256's own kernel (03_hopper_split.cuh): dQ's TMA reductions issued by the producer's warps (the library's), by the consumers, or dQ
    // by red.global.add from registers; a probe (timing only, wrong gradients): no dQ reduction.
    return {{"rung3_library", nullptr},
            {"dq_tma_by_consumer", main_split<256, 1>},
            {"dq_by_red", main_split<256, 0>},
            {"dq_stores_column_order", main_split<256, 2, 3>},
            {"descriptors_rebuilt", main_split<256, 2, 9>},
            {"probe_no_dq_reduce", main_split<256, 2, 2>, false},
            {"pre_post_only", no_main, false}};
  } else {
    std::vector<Variant> v = {{"rung3_library", nullptr},
                              {"stages2_generic", main_variant<kD, 2, false>},
                              {"stages2_shared", main_variant<kD, 2, true>}};
    if constexpr (kD == 128) {
      v.push_back({"stages3_generic", main_variant<kD, 3, false>});
      v.push_back({"stages3_shared", main_variant<kD, 3, true>});
    }
    // dQ's product issued before dK's (kDqFirst), on the library's form of each head dim.
    v.push_back({"dq_first", main_variant<kD, 2, true, true>});
    // dQ's reductions issued by the producer's warps (kDqByProducer), on the library's form.
    v.push_back({"dq_by_producer", main_variant<kD, 2, true, false, true>});
    // Both: the library's kernel through the variant launcher (its time against rung3_library's
    // is the run's noise).
    v.push_back({"dq_first_by_producer", main_variant<kD, 2, true, true, true>});
    // The library's form as a persistent kernel (a block per SM walking the tiles; kPersistent).
    v.push_back({"persistent", main_variant<kD, 2, true, true, true, 0, true>});
    // Three stages on the library's form (one dQ tile per consumer then: two do not fit).
    if constexpr (kD == 128) v.push_back({"stages3_dq_first_by_producer", main_variant<kD, 3, true, true, true>});
    // The library's form with the dQ tile stored in column order (two-way bank conflicts), and
    // with dK's A operand (dS^T) read from shared memory: the forms before 2026-11-27 (23).
    v.push_back({"dq_stores_column_order", main_variant<kD, 2, true, false, kD == 64, 3>});
    v.push_back({"dk_from_smem", main_variant<kD, 2, true, false, kD == 64, 4>});
    // The split form (03_hopper_split.cuh, d 256's): the consumers split the head dim and the two
    // score products, 128-key blocks.
    if constexpr (kD == 128) v.push_back({"split", main_split<128>});
    // The library's form writing a timeline (kProbe 6; --trace).
    v.push_back({"trace", main_variant<kD, 2, true, true, true, 6>});
    // Every wgmma descriptor rebuilt from its address (kProbe 9; the library adds the k-step's
    // offset to the first one since 2026-11-27 (24)).
    v.push_back({"descriptors_rebuilt", main_variant<kD, 2, true, true, true, 9>});
    // D loaded into registers before the wait for dP^T (kProbe 13; plain scores at d 128).
    if constexpr (kD == 128) v.push_back({"dsum_prefetched", main_variant<kD, 2, true, true, true, 13>});
    // Turns between the consumers (the forward's pingpong; kProbe 7 / 8): a consumer's score
    // products wait for the other's dV product / its dQ and dK products.
    v.push_back({"turns_after_dv", main_variant<kD, 2, true, true, true, 7>});
    v.push_back({"turns_after_dk", main_variant<kD, 2, true, true, true, 8>});
    // Probes on the library's form (timing only, wrong gradients): no Q / dO reloads after the
    // first two steps; no dQ reductions (on kDqFirst + kDqByProducer since 2026-11-27 (23)).
    v.push_back({"probe_no_reload", main_variant<kD, 2, true, true, true, 1>, false});
    v.push_back({"probe_no_dq_reduce", main_variant<kD, 2, true, true, true, 2>, false});
    // ... no dK / dV stores at the block's end (kProbe 14: timing only).
    v.push_back({"probe_no_dkdv_store", main_variant<kD, 2, true, true, true, 14>, false});
    // dK / dV stored from registers, four bytes a thread and row (kProbe 15: the library's epilogue
    // before 2026-11-27 (26), which stages them for TMA stores).
    v.push_back({"dkdv_stores_from_registers", main_variant<kD, 2, true, true, true, 15>});
    // dQ's proxy fence and dq_full arrive after the next step's score products (kProbe 16).
    v.push_back({"dq_fence_deferred", main_variant<kD, 2, true, true, true, 16>});
    v.push_back({"pre_post_only", no_main, false});
    return v;
  }
}

// Whether `name` is an entry of the comma-separated `list`.
bool listed(const std::string& list, const std::string& name) {
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

// --variants a,b: only these (and rung3_library, the reference, always first); empty: all.
std::string g_variants;
std::string g_trace_file;  // --trace: where the trace variant's timelines go

// The trace variant once more, its timeline appended to g_trace_file.
void write_trace(const Config& c, const std::function<void()>& run_trace) {
  using flashlab::kernels::g_bwd_trace;
  std::vector<long long> t(sizeof(g_bwd_trace) / sizeof(long long), 0);
  FLASHLAB_CUDA_CHECK(cudaMemcpyToSymbol(g_bwd_trace, t.data(), sizeof(g_bwd_trace)));
  run_trace();
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  FLASHLAB_CUDA_CHECK(cudaMemcpyFromSymbol(t.data(), g_bwd_trace, sizeof(g_bwd_trace)));
  FILE* f = std::fopen(g_trace_file.c_str(), "a");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", g_trace_file.c_str());
    return;
  }
  constexpr int kCtas = flashlab::kernels::kBwdTraceCtas, kSteps = flashlab::kernels::kBwdTraceSteps,
                kSlots = flashlab::kernels::kBwdTraceSlots;
  for (int b = 0; b < kCtas; ++b)
    for (int st = 0; st < kSteps; ++st)
      for (int sl = 0; sl < kSlots; ++sl) {
        const long long v = t[(static_cast<size_t>(b) * kSteps + st) * kSlots + sl];
        if (v != 0)
          std::fprintf(f, "%lld,%lld,%d,%d,%d,%d,%lld\n", static_cast<long long>(c.headdim), static_cast<long long>(c.seqlen),
                       c.causal ? 1 : 0, b, st, sl, v);
      }
  std::fclose(f);
}

template <int kD>
void run_config(bench::Harness& h, const Config& c, bool& all_ok) {
  const int64_t batch = c.batch(), heads = c.heads(), n = c.elements();
  bench::DeviceMem q(n * 2), k(n * 2), v(n * 2), out(n * 2), dout(n * 2), dq(n * 2), dk(n * 2), dv(n * 2),
      lse(batch * heads * c.seqlen * 4);
  bench::fill_random(q.p, n, 1, 91, h.stream());
  bench::fill_random(k.p, n, 1, 92, h.stream());
  bench::fill_random(v.p, n, 1, 93, h.stream());
  bench::fill_random(dout.p, n, 1, 94, h.stream());
  const std::vector<int64_t> shape = {batch, c.seqlen, heads, c.headdim};
  const auto t = [&](void* p) { return bench::view(p, DType::kBF16, shape); };
  const TensorView lse_v = bench::view(lse.p, DType::kF32, {batch, heads, c.seqlen});
  AttnBwdOptions opt;
  opt.causal = c.causal;
  opt.softmax_lse = &lse_v;
  attention_fwd(t(q.p), t(k.p), t(v.p), t(out.p), h.stream(), kAttnFwdRungAuto, opt);
  const auto run = [&](const Variant& var) {
    if (var.main == nullptr) attention_bwd(t(q.p), t(k.p), t(v.p), t(out.p), t(dout.p), t(dq.p), t(dk.p), t(dv.p), h.stream(), 3, opt);
    else
      detail::attention_bwd_with_main(t(q.p), t(k.p), t(v.p), t(out.p), t(dout.p), t(dq.p), t(dk.p), t(dv.p), h.stream(), 3,
                                      opt, var.main);
  };
  std::vector<Variant> vars;
  for (const Variant& v : variants<kD>())
    if (vars.empty() || g_variants.empty() || listed(g_variants, v.name))
      vars.push_back(v);
  run(vars[0]);
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
  const std::vector<float> want_q = download_bf16(dq.p, n), want_k = download_bf16(dk.p, n), want_v = download_bf16(dv.p, n);
  const double flops = 2.5 * 4.0 * batch * heads * c.seqlen * c.seqlen * c.headdim * (c.causal ? 0.5 : 1.0);
  std::vector<std::function<void()>> fns;
  for (size_t j = 0; j < vars.size(); ++j) fns.push_back([&, j] { run(vars[j]); });
  const std::vector<double> ms = h.time_ms_interleaved(fns);
  for (size_t j = 0; j < vars.size(); ++j) {
    for (void* g : {dq.p, dk.p, dv.p}) FLASHLAB_CUDA_CHECK(cudaMemsetAsync(g, 0xff, n * 2, h.stream()));  // NaN
    run(vars[j]);
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(h.stream()));
    const Diff eq = compare(download_bf16(dq.p, n), want_q), ek = compare(download_bf16(dk.p, n), want_k),
               ev = compare(download_bf16(dv.p, n), want_v);
    const double rel = std::fmax(eq.rel, std::fmax(ek.rel, ev.rel));
    const int64_t nans = eq.nans + ek.nans + ev.nans;
    const bool ok = !vars[j].checked || (nans == 0 && rel <= 1.0 / 256);
    all_ok &= ok;
    std::printf("d %3lld seqlen %5lld causal %d  %-18s %8.4f ms  %6.1f TFLOP/s  max rel diff dq %.1e dk %.1e dv %.1e  NaN %lld  %s\n",
                static_cast<long long>(c.headdim), static_cast<long long>(c.seqlen), c.causal ? 1 : 0, vars[j].name, ms[j],
                flops / (ms[j] * 1e-3) / 1e12, eq.rel, ek.rel, ev.rel, static_cast<long long>(nans),
                !vars[j].checked ? "(timing only)" : ok ? "ok" : "FAIL");
    bench::Row r = bench::attention_experiment::variant_row("attn_bwd_ablation", vars[j].name, c, ms[j], flops, 8.0 * n * 2);
    r.extra["max_rel_diff_vs_rung3"] = rel;
    h.add(r);
  }
  if (!g_trace_file.empty())
    for (const Variant& v : vars)
      if (std::strcmp(v.name, "trace") == 0) write_trace(c, [&] { run(v); });
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  opt.min_reps = 20;
  std::string dims = "64,128,256";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dims") == 0 && i + 1 < argc) dims = argv[++i];
    else if (std::strcmp(argv[i], "--variants") == 0 && i + 1 < argc) g_variants = argv[++i];
    else if (std::strcmp(argv[i], "--trace") == 0 && i + 1 < argc) g_trace_file = argv[++i];
    else opt.out = argv[i];
  }
  const auto want = [&](const char* d) { return listed(dims, d); };
  bench::Harness h(opt);
  bool all_ok = true;
  for (bool causal : {false, true}) {
    if (want("128"))
      for (int64_t s : {512, 2048, 8192}) run_config<128>(h, {s, 128, causal}, all_ok);
    if (want("64"))
      for (int64_t s : {512, 2048}) run_config<64>(h, {s, 64, causal}, all_ok);
    if (want("256"))
      for (int64_t s : {512, 2048}) run_config<256>(h, {s, 256, causal}, all_ok);
  }
  h.write_json();
  std::printf(all_ok ? "all variants ok\n" : "FAIL: a variant differs from rung 3 or left NaN\n");
  return all_ok ? 0 : 1;
}
