// Benchmark cases of the attention forward ladder (op "attn_fwd"), bf16, q/k/v/out (batch,
// seqlen, nheads, headdim) contiguous, nheads_kv = nheads. Rung 0 is torch SDPA (flash, cuDNN and
// efficient backends), run by bench/peers.py on the same shapes.
// Shapes: 16k tokens and model dim 2048 (batch = 16384 / seqlen, nheads = 2048 / headdim), head
// dim 128, seqlen 512 .. 16k, causal and not; head dims 64 and 256 at seqlen 512 .. 2k. Rungs 3
// and 4 run every shape; rung 1 (naive: the fp32 S matrix, batch x nheads x seqlen^2 x 4 bytes) up to
// seqlen 4k; rung 2 (FA1 order on CUDA cores, one thread block per (batch, head)) up to 2k.
// FLOPs: 4 batch nheads seqlen_q seqlen_k headdim, half when causal (DESIGN.md); bytes: q, k, v
// and out once. Each row carries the rung's workspace (extra "workspace_MB"): the O(N^2) vs O(N)
// memory of the ladder. The other rungs are checked against the default one (rung 4 on sm_90,
// else 3; max |diff|, printed).
// FLASHLAB_ATTN_MIN_RUNG=r runs rungs r.. only. On sm_90, head dim 128 shapes also run FP8 (e4m3
// q, k, v, bf16 out) on rung 4: rows with dtype "e4m3". Dropout rows (shape key dropout_pct):
// attn_dropout_cases, forward rung 3 and backward rung 2.
#include <cstdio>
#include <utility>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "flashlab/attention.h"
#include "kernels/attention/params.h"

namespace flashlab::bench {

namespace {

const char* const kAttnRungNames[] = {"", "naive", "flash1_cuda_cores", "flash2_mma_sync", "hopper_wgmma_ws"};
static_assert(sizeof(kAttnRungNames) / sizeof(kAttnRungNames[0]) == kAttnFwdRungs + 1, "one name per rung");
const char* const kAttnBwdRungNames[] = {"", "naive", "flash2_mma_sync", "hopper_wgmma_ws"};
static_assert(sizeof(kAttnBwdRungNames) / sizeof(kAttnBwdRungNames[0]) == kAttnBwdRungs + 1, "one name per rung");

struct AttnCase {
  int64_t batch, seqlen, nheads, headdim;
  bool causal;
};

std::vector<AttnCase> attn_cases(bool quick) {
  std::vector<AttnCase> cases;
  const std::vector<int64_t> seqlens = quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (bool causal : {false, true}) {
    for (int64_t s : seqlens) cases.push_back({16384 / s, s, 2048 / 128, 128, causal});
    for (int64_t d : {64, 256})
      for (int64_t s : quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{512, 1024, 2048})
        cases.push_back({16384 / s, s, 2048 / d, d, causal});
  }
  return cases;
}

// Dropout rows (dropout_p 0.1: shape key dropout_pct = 10): head dim 128, 16k tokens, seqlen 2k and
// 8k (quick: 2k), causal and not, on the tiled rungs that have dropout (forward 3, backward 2);
// bench/peers.py times SDPA with the same dropout_p. The cost of dropout: against the rows of the
// same shape without it.
constexpr float kBenchDropoutP = 0.1f;
constexpr int64_t kBenchDropoutPct = 10;

std::vector<AttnCase> attn_dropout_cases(bool quick) {
  std::vector<AttnCase> cases;
  for (bool causal : {false, true})
    for (int64_t s : quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 8192})
      cases.push_back({16384 / s, s, 2048 / 128, 128, causal});
  return cases;
}

// A result row of `op` for case c (the shape keys of DESIGN.md); FLOPs: `flop_factor` times the
// forward's 4 batch nheads seqlen^2 headdim, half when causal.
Row attn_row(const char* op, const char* rung_name, int rung, DType dt, const AttnCase& c, double ms, double bytes,
             double flop_factor, double workspace_mb) {
  Row r;
  r.op = op;
  r.impl = "flashlab";
  r.rung_name = rung_name;
  r.rung = rung;
  r.dtype = dtype_name(dt);
  r.shape = {{"batch", c.batch}, {"seqlen_q", c.seqlen}, {"seqlen_k", c.seqlen}, {"nheads_q", c.nheads},
             {"nheads_kv", c.nheads}, {"headdim", c.headdim}, {"causal", c.causal ? 1 : 0}};
  r.ms = ms;
  r.bytes = bytes;
  r.flops = flop_factor * 4.0 * c.batch * c.nheads * c.seqlen * c.seqlen * c.headdim * (c.causal ? 0.5 : 1.0);
  r.extra["workspace_MB"] = workspace_mb;
  return r;
}

}  // namespace

void bench_attention(Harness& h, DType dt) {
  const int64_t es = dtype_size(dt);
  // FLASHLAB_ATTN_MIN_RUNG=3: skip the slow rungs 1-2 (quicker runs while tuning the top rungs).
  const char* min_rung_env = std::getenv("FLASHLAB_ATTN_MIN_RUNG");
  const int min_rung = min_rung_env != nullptr ? std::atoi(min_rung_env) : 1;
  const bool hopper = on_hopper();  // rung 4 runs on sm_90 only
  for (const AttnCase& c : attn_cases(h.options().quick)) {
    const int64_t n = c.batch * c.seqlen * c.nheads * c.headdim;
    DeviceMem q(n * es), k(n * es), v(n * es), out(n * es), ref(n * es);
    fill_random(q.p, n, dt == DType::kBF16, 71, h.stream());
    fill_random(k.p, n, dt == DType::kBF16, 72, h.stream());
    fill_random(v.p, n, dt == DType::kBF16, 73, h.stream());
    const std::vector<int64_t> shape = {c.batch, c.seqlen, c.nheads, c.headdim};
    const auto add_row = [&](int rung, DType row_dt, double ms, double bytes, double workspace_mb) {
      h.add(attn_row("attn_fwd", kAttnRungNames[rung], rung, row_dt, c, ms, bytes, 1.0, workspace_mb));
    };
    AttnFwdOptions opt;
    opt.causal = c.causal;
    attention_fwd(view(q.p, dt, shape), view(k.p, dt, shape), view(v.p, dt, shape), view(ref.p, dt, shape), h.stream(),
                  kAttnFwdRungAuto, opt);
    for (int rung = kAttnFwdRungs; rung >= 1; --rung) {
      if ((rung == 1 && c.seqlen > 4096) || (rung == 2 && c.seqlen > 2048) || rung < min_rung || (rung == 4 && !hopper))
        continue;
      const double ms = h.time_ms([&] {
        attention_fwd(view(q.p, dt, shape), view(k.p, dt, shape), view(v.p, dt, shape), view(out.p, dt, shape), h.stream(),
                      rung, opt);
      });
      add_row(rung, dt, ms, 4.0 * n * es,
              attention_fwd_workspace_bytes(rung, c.batch, c.nheads, c.seqlen, c.seqlen, c.headdim) / 1048576.0);
      if (rung != (hopper ? 4 : 3)) {
        const double diff = relative_difference(out.p, ref.p, n, dt, h.stream());
        std::printf("  attn_fwd rung %d vs the default rung: max |diff| / max |default| = %.2e\n", rung, diff);
      }
    }
    // FP8 (e4m3 q, k, v, bf16 out; rung 4, head dim 128): the same shape, timed with the pass that
    // transposes V (part of every FP8 call). No peer here runs FP8 attention.
    if (hopper && c.headdim == 128 && min_rung <= 4) {
      DeviceMem q8(n), k8(n), v8(n);
      fill_random(q8.p, n, 2, 81, h.stream());
      fill_random(k8.p, n, 2, 82, h.stream());
      fill_random(v8.p, n, 2, 83, h.stream());
      const double ms = h.time_ms([&] {
        attention_fwd(view(q8.p, DType::kE4M3, shape), view(k8.p, DType::kE4M3, shape), view(v8.p, DType::kE4M3, shape),
                      view(out.p, DType::kBF16, shape), h.stream(), 4, opt);
      });
      // e4m3 q, k, v read, bf16 out written; the workspace holds the transposed V.
      add_row(4, DType::kE4M3, ms, 3.0 * n + 2.0 * n, static_cast<double>(n) / 1048576.0);
    }
  }
  if (min_rung > 3) return;
  for (const AttnCase& c : attn_dropout_cases(h.options().quick)) {
    const int64_t n = c.batch * c.seqlen * c.nheads * c.headdim;
    DeviceMem q(n * es), k(n * es), v(n * es), out(n * es);
    fill_random(q.p, n, dt == DType::kBF16, 71, h.stream());
    fill_random(k.p, n, dt == DType::kBF16, 72, h.stream());
    fill_random(v.p, n, dt == DType::kBF16, 73, h.stream());
    const std::vector<int64_t> shape = {c.batch, c.seqlen, c.nheads, c.headdim};
    AttnFwdOptions opt;
    opt.causal = c.causal, opt.dropout_p = kBenchDropoutP, opt.dropout_seed = 1234;
    const double ms = h.time_ms([&] {
      attention_fwd(view(q.p, dt, shape), view(k.p, dt, shape), view(v.p, dt, shape), view(out.p, dt, shape), h.stream(), 3,
                    opt);
    });
    Row r = attn_row("attn_fwd", kAttnRungNames[3], 3, dt, c, ms, 4.0 * n * es, 1.0, 0.0);
    r.shape.push_back({"dropout_pct", kBenchDropoutPct});
    h.add(r);
  }
}

// Backward (op "attn_bwd"): the forward's 16k-token shapes (head dim 128 at seqlen 512 .. 16k, head
// dims 64 and 256 at 512 .. 2k), causal and not; rung 3 on sm_90 at head dims 64, 128 and 256; rung 1 (naive: the fp32 P and dS matrices, 2 x
// batch x nheads x seqlen^2 x 4 bytes) at head dim 128 up to seqlen 2k. The forward (automatic
// rung) runs once per shape for out and lse; the timed call is attention_bwd alone.
// FLOPs: 2.5x the forward's (DESIGN.md); bytes: q, k, v, out, dout read and dq, dk, dv written
// once. Rung 0 is torch SDPA's backward (bench/peers.py, the same shapes).
void bench_attention_bwd(Harness& h, DType dt) {
  const int64_t es = dtype_size(dt);
  const bool hopper = on_hopper();  // rung 3 runs on sm_90 only
  // The cases without dropout, then the dropout ones (backward rung 2; out and lse from forward
  // rung 3 under the same mask).
  std::vector<std::pair<AttnCase, bool>> cases;
  for (const AttnCase& c : attn_cases(h.options().quick)) cases.push_back({c, false});
  for (const AttnCase& c : attn_dropout_cases(h.options().quick)) cases.push_back({c, true});
  for (const auto& [c, dropout] : cases) {
    const int64_t n = c.batch * c.seqlen * c.nheads * c.headdim;
    DeviceMem q(n * es), k(n * es), v(n * es), out(n * es), dout(n * es), dq(n * es), dk(n * es), dv(n * es),
        lse(c.batch * c.nheads * c.seqlen * 4);
    fill_random(q.p, n, dt == DType::kBF16, 71, h.stream());
    fill_random(k.p, n, dt == DType::kBF16, 72, h.stream());
    fill_random(v.p, n, dt == DType::kBF16, 73, h.stream());
    fill_random(dout.p, n, dt == DType::kBF16, 74, h.stream());
    const std::vector<int64_t> shape = {c.batch, c.seqlen, c.nheads, c.headdim};
    const TensorView lse_v = view(lse.p, DType::kF32, {c.batch, c.nheads, c.seqlen});
    AttnBwdOptions opt;
    opt.causal = c.causal;
    opt.softmax_lse = &lse_v;
    if (dropout) opt.dropout_p = kBenchDropoutP, opt.dropout_seed = 1234;
    attention_fwd(view(q.p, dt, shape), view(k.p, dt, shape), view(v.p, dt, shape), view(out.p, dt, shape), h.stream(),
                  dropout ? 3 : kAttnFwdRungAuto, opt);
    for (int rung = kAttnBwdRungs; rung >= 1; --rung) {
      if (rung == 1 && (dropout || c.seqlen > 2048 || c.headdim != 128)) continue;
      if (rung == 3 && (!hopper || dropout || !attn_bwd_rung3_takes(c.headdim, false))) continue;  // rung 3's reach
      const double ms = h.time_ms([&] {
        attention_bwd(view(q.p, dt, shape), view(k.p, dt, shape), view(v.p, dt, shape), view(out.p, dt, shape),
                      view(dout.p, dt, shape), view(dq.p, dt, shape), view(dk.p, dt, shape), view(dv.p, dt, shape),
                      h.stream(), rung, opt);
      });
      Row r = attn_row("attn_bwd", kAttnBwdRungNames[rung], rung, dt, c, ms, 8.0 * n * es, 2.5,
                       attention_bwd_workspace_bytes(rung, c.batch, c.nheads, c.seqlen, c.seqlen, c.headdim) / 1048576.0);
      if (dropout) r.shape.push_back({"dropout_pct", kBenchDropoutPct});
      h.add(r);
    }
  }
}

}  // namespace flashlab::bench
