// Serving benchmarks (op "paged_decode"): batch decode over a paged KV cache, the shapes of
// issue 8's acceptance: bf16, 32 query heads / 8 KV heads, head dim 128, page size 16, NHD;
// batch 64 at KV 4k and 16k, batch 1 at 128k (rung 3 also in the HND layout: shape key "layout"),
// and a skewed batch of 64 (lengths Zipf-distributed
// over 1 .. 32k; shape key "zipf" = 1, kv_len = the longest) (quick: batch 64 at 4k). Each
// request owns contiguous pages (the kernel still reads them through the page table). Bytes: K
// and V read once plus q and out (what a decode step must move), so TB/s reads against the copy
// peak. Timed as the replay of a CUDA graph: rungs 1-2 of the call (the page table's values
// checked once before the capture, as a server would run a planned step), rung 3 of
// batch_decode_run after batch_decode_plan (the plan outside the graph, as FlashInfer's wrapper).
// Rung 0 is torch SDPA on contiguous KV (bench/peers.py): what paging must not cost. Batch 64 also
// with an e4m3 cache (dtype "e4m3" rows; issue 8's bar: >= 1.7x the bf16 row's speed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "bench/cases.h"
#include "flashlab/attention.h"
#include "flashlab/serving.h"

namespace flashlab::bench {

namespace {

const char* const kDecodeRungNames[] = {"", "naive", "gqa", "split"};
static_assert(sizeof(kDecodeRungNames) / sizeof(kDecodeRungNames[0]) == kPagedDecodeRungs + 1, "one name per rung");

struct DecodeCase {
  int64_t batch, kv_len;
  bool zipf;  // lengths Zipf-distributed over 1 .. kv_len (s = 1), else all kv_len
};

// Request lengths: kv_len each, or Zipf(1) over 1 .. kv_len (seeded: the same batch every run).
std::vector<int64_t> request_lengths(const DecodeCase& c) {
  if (!c.zipf) return std::vector<int64_t>(static_cast<size_t>(c.batch), c.kv_len);
  std::vector<double> cdf(static_cast<size_t>(c.kv_len));
  double sum = 0;
  for (int64_t k = 1; k <= c.kv_len; ++k) cdf[k - 1] = sum += 1.0 / static_cast<double>(k);
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> u(0.0, sum);
  std::vector<int64_t> len(static_cast<size_t>(c.batch));
  for (int64_t& l : len) l = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin() + 1;
  len[0] = c.kv_len;  // the longest request present: the case is about it
  return len;
}

// Captures fn into a CUDA graph on the harness's stream and times its replay.
double time_graph(Harness& h, const std::function<void()>& fn) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASHLAB_CUDA_CHECK(cudaStreamBeginCapture(h.stream(), cudaStreamCaptureModeThreadLocal));
  fn();
  FLASHLAB_CUDA_CHECK(cudaStreamEndCapture(h.stream(), &graph));
  FLASHLAB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = h.time_ms([&] { FLASHLAB_CUDA_CHECK(cudaGraphLaunch(exec, h.stream())); });
  FLASHLAB_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FLASHLAB_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms;
}

}  // namespace

void bench_paged_decode(Harness& h, DType dt) {
  constexpr int64_t kHeads = 32, kHeadsKv = 8, kD = 128, kPage = 16;
  const std::vector<DecodeCase> cases =
      h.options().quick ? std::vector<DecodeCase>{{64, 4096, false}}
                        : std::vector<DecodeCase>{{64, 4096, false}, {64, 16384, false}, {1, 131072, false}, {64, 32768, true}};
  const int64_t es = dtype_size(dt);
  for (const DecodeCase& c : cases) {
    const std::vector<int64_t> len = request_lengths(c);
    std::vector<int> indptr(static_cast<size_t>(c.batch + 1), 0), last_len(static_cast<size_t>(c.batch));
    int64_t tokens = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t pages_b = (len[b] + kPage - 1) / kPage;
      indptr[b + 1] = static_cast<int>(indptr[b] + pages_b);
      last_len[b] = static_cast<int>(len[b] - (pages_b - 1) * kPage);
      tokens += len[b];
    }
    const int64_t pages = indptr[c.batch];
    const int64_t cache_n = pages * kPage * kHeadsKv * kD, q_n = c.batch * kHeads * kD;
    DeviceMem kc(cache_n * es), vc(cache_n * es), q(q_n * es), out(q_n * es), lse(c.batch * kHeads * 4),
        ind(pages * 4), ptr((c.batch + 1) * 4), last(c.batch * 4);
    fill_random(kc.p, cache_n, dt == DType::kBF16, 81, h.stream());
    fill_random(vc.p, cache_n, dt == DType::kBF16, 82, h.stream());
    fill_random(q.p, q_n, dt == DType::kBF16, 83, h.stream());
    std::vector<int> indices(static_cast<size_t>(pages));
    std::iota(indices.begin(), indices.end(), 0);
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ind.p, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ptr.p, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(last.p, last_len.data(), last_len.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<int64_t> cache_shape = {pages, kPage, kHeadsKv, kD};
    const TensorView qv = view(q.p, dt, {c.batch, kHeads, kD}), kv = view(kc.p, dt, cache_shape),
                     vv = view(vc.p, dt, cache_shape), iv = view(ind.p, DType::kI32, {pages}),
                     pv = view(ptr.p, DType::kI32, {c.batch + 1}), lv = view(last.p, DType::kI32, {c.batch}),
                     ov = view(out.p, dt, {c.batch, kHeads, kD}), lse_v = view(lse.p, DType::kF32, {c.batch, kHeads});
    const int64_t ws_bytes = batch_decode_workspace_bytes(c.batch, kHeads, kHeadsKv, kD, 0);
    DeviceMem ws(static_cast<size_t>(ws_bytes));
    const TensorView wv = view(ws.p, DType::kU8, {ws_bytes});
    const TensorView indptr_host(indptr.data(), DType::kI32, {c.batch + 1}, Device{DeviceType::kCPU, 0});
    // A row of this case: the cache's dtype name and element size (q and out stay dt).
    const auto add_row = [&](int rung, const char* kv_dtype, int64_t kv_es, bool hnd, double ms) {
      Row r;
      r.op = "paged_decode";
      r.impl = "flashlab";
      r.rung_name = kDecodeRungNames[rung];
      r.rung = rung;
      r.dtype = kv_dtype;
      r.shape = {{"batch", c.batch}, {"kv_len", c.kv_len}, {"nheads_q", kHeads}, {"nheads_kv", kHeadsKv}, {"headdim", kD},
                 {"page_size", kPage}};
      if (c.zipf) r.shape.emplace_back("zipf", 1);
      r.shape_text = {{"layout", hnd ? "HND" : "NHD"}};
      r.ms = ms;
      r.bytes = static_cast<double>(2 * tokens * kHeadsKv * kD * kv_es + 2 * q_n * es);
      r.flops = 4.0 * static_cast<double>(tokens) * kHeads * kD;
      h.add(r);
    };
    // Rung 3 also with the HND layout (the same buffers viewed as (pages, heads, page_size, d)):
    // a page's rows of one head contiguous, 4 KB, instead of 256-byte rows 2 KB apart.
    for (int variant = kPagedDecodeRungs + 1; variant >= 1; --variant) {
      const int rung = std::min(variant, kPagedDecodeRungs);
      const bool hnd = variant > kPagedDecodeRungs;
      if ((c.zipf && rung == 1) || (c.zipf && hnd)) continue;  // the skewed case is about the split
      double ms = 0;
      if (rung == 3) {
        const DecodePlanInfo plan = batch_decode_plan(indptr_host, kPage, kHeads, kHeadsKv, kD, wv, h.stream());
        const std::vector<int64_t> hnd_shape = {pages, kHeadsKv, kPage, kD};
        const TensorView kh = view(kc.p, dt, hnd_shape), vh = view(vc.p, dt, hnd_shape);
        const auto call = [&] {
          batch_decode_run(plan, wv, qv, hnd ? kh : kv, hnd ? vh : vv, iv, pv, lv, ov, &lse_v,
                           hnd ? KvLayout::kHND : KvLayout::kNHD, 0.f, h.stream());
        };
        call();  // the page table's values checked (a device read and a wait), outside the graph
        ms = time_graph(h, call);
      } else {
        const auto call = [&] {
          batch_decode_paged(qv, kv, vv, iv, pv, lv, ov, &lse_v, KvLayout::kNHD, 0.f, h.stream(), rung);
        };
        call();
        ms = time_graph(h, call);
      }
      add_row(rung, dtype_name(dt), es, hnd, ms);
    }
    // FP8 KV (rung 3, NHD, batch 64): the same buffers refilled with e4m3 values (half the bytes),
    // scales 0.5; dtype "e4m3" (the cache's; q and out stay bf16), against the bf16 rows above.
    if (c.batch == 64 && !c.zipf) {
      fill_random(kc.p, cache_n, 2, 84, h.stream());
      fill_random(vc.p, cache_n, 2, 85, h.stream());
      const TensorView k8 = view(kc.p, DType::kE4M3, cache_shape), v8 = view(vc.p, DType::kE4M3, cache_shape);
      const DecodePlanInfo plan =
          batch_decode_plan(indptr_host, kPage, kHeads, kHeadsKv, kD, wv, h.stream(), DType::kE4M3);
      const auto call = [&] {
        batch_decode_run(plan, wv, qv, k8, v8, iv, pv, lv, ov, &lse_v, KvLayout::kNHD, 0.f, h.stream(), 0.5f, 0.5f);
      };
      call();
      add_row(3, "e4m3", 1, false, time_graph(h, call));
    }
  }
}

// Batch prefill over the paged cache (op "paged_prefill"): bf16, 32 query heads / 8 KV heads,
// head dim 128, page sizes 16 and 64, NHD, causal; batches of requests whose queries are their
// last qo_len tokens: full prefills (qo_len = kv_len: 8 x 2k, 4 x 4k, 1 x 16k) and chunked prefills
// (16 x 512 new tokens over 4k) (quick: 8 x 2k). Pages are handed out in a shuffled order (a server's pool
// after some churn). Each paged rung is timed beside attention_fwd's varlen forward of the same
// kernel family on contiguous K/V of the same shape (impl "flashlab-contiguous", rung 3 or 4):
// issue 8's bar is >= 0.9x of it. Both timed as CUDA-graph replays (the paged one under a plan).
// FLOPs: the visible (query, key) pairs x 4 d x heads; bytes: q,
// K, V read and out written once.
void bench_paged_prefill(Harness& h, DType dt) {
  constexpr int64_t kHeads = 32, kHeadsKv = 8, kD = 128;
  struct PrefillCase {
    int64_t batch, qo_len, kv_len, page;
  };
  std::vector<PrefillCase> cases;
  for (const int64_t page : {16, 64})
    for (const PrefillCase& c : h.options().quick ? std::vector<PrefillCase>{{8, 2048, 2048, 0}}
                                                  : std::vector<PrefillCase>{{8, 2048, 2048, 0}, {4, 4096, 4096, 0},
                                                                             {1, 16384, 16384, 0}, {16, 512, 4096, 0}})
      cases.push_back({c.batch, c.qo_len, c.kv_len, page});
  const bool hopper = on_hopper();
  const int64_t es = dtype_size(dt);
  for (const PrefillCase& c : cases) {
    const int64_t kPage = c.page;
    const int64_t total_q = c.batch * c.qo_len, total_k = c.batch * c.kv_len, pages_per = (c.kv_len + kPage - 1) / kPage;
    const int64_t pages = c.batch * pages_per;
    std::vector<int> indices(static_cast<size_t>(pages)), indptr(static_cast<size_t>(c.batch + 1)), last_len(static_cast<size_t>(c.batch)),
        cuq(static_cast<size_t>(c.batch + 1)), cuk(static_cast<size_t>(c.batch + 1));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), std::mt19937_64(9));
    for (int64_t b = 0; b <= c.batch; ++b) {
      indptr[b] = static_cast<int>(b * pages_per), cuq[b] = static_cast<int>(b * c.qo_len), cuk[b] = static_cast<int>(b * c.kv_len);
      if (b < c.batch) last_len[b] = static_cast<int>(c.kv_len - (pages_per - 1) * kPage);
    }
    const int64_t q_n = total_q * kHeads * kD, kv_n = total_k * kHeadsKv * kD, cache_n = pages * kPage * kHeadsKv * kD;
    DeviceMem q(q_n * es), out(q_n * es), kc(cache_n * es), vc(cache_n * es), k(kv_n * es), v(kv_n * es), ind(pages * 4),
        ptr((c.batch + 1) * 4), last(c.batch * 4), cq((c.batch + 1) * 4), ck((c.batch + 1) * 4);
    fill_random(q.p, q_n, dt == DType::kBF16, 91, h.stream());
    fill_random(kc.p, cache_n, dt == DType::kBF16, 92, h.stream());
    fill_random(vc.p, cache_n, dt == DType::kBF16, 93, h.stream());
    fill_random(k.p, kv_n, dt == DType::kBF16, 94, h.stream());
    fill_random(v.p, kv_n, dt == DType::kBF16, 95, h.stream());
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ind.p, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ptr.p, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(last.p, last_len.data(), last_len.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(cq.p, cuq.data(), cuq.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ck.p, cuk.data(), cuk.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<int64_t> cache_shape = {pages, kPage, kHeadsKv, kD};
    const TensorView qv = view(q.p, dt, {total_q, kHeads, kD}), ov = view(out.p, dt, {total_q, kHeads, kD}),
                     kcv = view(kc.p, dt, cache_shape), vcv = view(vc.p, dt, cache_shape), kv = view(k.p, dt, {total_k, kHeadsKv, kD}),
                     vv = view(v.p, dt, {total_k, kHeadsKv, kD}), iv = view(ind.p, DType::kI32, {pages}),
                     pv = view(ptr.p, DType::kI32, {c.batch + 1}), lv = view(last.p, DType::kI32, {c.batch}),
                     cqv = view(cq.p, DType::kI32, {c.batch + 1}), ckv = view(ck.p, DType::kI32, {c.batch + 1});
    // Visible pairs of a causal request: query i (at position kv_len - qo_len + i) sees that many + 1 keys.
    const double pairs = static_cast<double>(c.batch) * (static_cast<double>(c.kv_len - c.qo_len) * c.qo_len +
                                                         0.5 * static_cast<double>(c.qo_len) * (c.qo_len + 1));
    const auto add_row = [&](const char* impl, const char* rung_name, int rung, double ms) {
      Row r;
      r.op = "paged_prefill";
      r.impl = impl;
      r.rung_name = rung_name;
      r.rung = rung;
      r.dtype = dtype_name(dt);
      r.shape = {{"batch", c.batch}, {"qo_len", c.qo_len}, {"kv_len", c.kv_len}, {"nheads_q", kHeads}, {"nheads_kv", kHeadsKv},
                 {"headdim", kD}, {"page_size", kPage}, {"causal", 1}};
      r.ms = ms;
      r.bytes = static_cast<double>((2 * q_n + 2 * kv_n) * es);
      r.flops = 4.0 * pairs * kHeads * kD;
      h.add(r);
      return ms;
    };
    PagedPrefillOptions popt;
    popt.causal = true;
    AttnFwdOptions fopt;
    fopt.causal = true, fopt.cu_seqlens_q = &cqv, fopt.cu_seqlens_k = &ckv, fopt.max_seqlen_q = c.qo_len, fopt.max_seqlen_k = c.kv_len;
    for (int rung = kPagedPrefillRungs; rung >= 1; --rung) {
      if (rung == 2 && !hopper) continue;
      const int fwd_rung = rung == 2 ? 4 : 3;
      // Both timed as CUDA-graph replays: the kernels alone, without the host checks' device reads
      // (outside a graph the one-shot paged call reads four index arrays and the varlen forward
      // two, each a wait). The paged call runs under a plan (the values read and checked once).
      const PrefillPlanInfo plan = batch_prefill_paged_plan(cqv, iv, pv, lv, kPage, h.stream());
      const auto paged_call = [&] {
        batch_prefill_paged_run(plan, qv, cqv, kcv, vcv, iv, pv, lv, ov, nullptr, KvLayout::kNHD, popt, h.stream(), rung);
      };
      const auto contiguous_call = [&] { attention_fwd(qv, kv, vv, ov, h.stream(), fwd_rung, fopt); };
      contiguous_call();  // cu_seqlens checked once, outside the graph
      const double paged = add_row("flashlab", rung == 2 ? "hopper" : "flash2", rung, time_graph(h, paged_call));
      const double contiguous =
          add_row("flashlab-contiguous", rung == 2 ? "hopper" : "flash2", fwd_rung, time_graph(h, contiguous_call));
      std::printf("  paged_prefill page %d rung %d: %.3f ms vs the contiguous forward (rung %d) %.3f ms: %.3fx\n",
                  static_cast<int>(kPage), rung, paged, fwd_rung, contiguous, contiguous / paged);
    }
  }
}

}  // namespace flashlab::bench
