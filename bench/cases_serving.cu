// Serving benchmarks (op "paged_decode"): batch decode over a paged KV cache, the shapes of
// issue 8's acceptance: bf16, 32 query heads / 8 KV heads, head dim 128, page size 16, NHD;
// batch 64 at KV 4k and 16k, batch 1 at 128k (quick: batch 64 at 4k). Every request owns
// contiguous pages (the kernel still reads them through the page table). Bytes: K and V read
// once plus q and out (what a decode step must move), so TB/s reads against the copy peak.
// Timed as the replay of a CUDA graph of the call (checks of the page table's values run once,
// before the capture, as a server would run a planned step).
// Rung 0 is torch SDPA on contiguous KV (bench/peers.py): what paging must not cost.
#include <cstdint>
#include <numeric>
#include <vector>

#include "bench/cases.h"
#include "flashlab/serving.h"

namespace flashlab::bench {

namespace {

const char* const kDecodeRungNames[] = {"", "naive", "gqa"};
static_assert(sizeof(kDecodeRungNames) / sizeof(kDecodeRungNames[0]) == kPagedDecodeRungs + 1, "one name per rung");

struct DecodeCase {
  int64_t batch, kv_len;
};

}  // namespace

void bench_paged_decode(Harness& h, DType dt) {
  constexpr int64_t kHeads = 32, kHeadsKv = 8, kD = 128, kPage = 16;
  const std::vector<DecodeCase> cases =
      h.options().quick ? std::vector<DecodeCase>{{64, 4096}} : std::vector<DecodeCase>{{64, 4096}, {64, 16384}, {1, 131072}};
  const int64_t es = dtype_size(dt);
  for (const DecodeCase& c : cases) {
    const int64_t pages_per = c.kv_len / kPage, pages = c.batch * pages_per;
    const int64_t cache_n = pages * kPage * kHeadsKv * kD, q_n = c.batch * kHeads * kD;
    DeviceMem kc(cache_n * es), vc(cache_n * es), q(q_n * es), out(q_n * es), lse(c.batch * kHeads * 4),
        ind(pages * 4), ptr((c.batch + 1) * 4), last(c.batch * 4);
    fill_random(kc.p, cache_n, dt == DType::kBF16, 81, h.stream());
    fill_random(vc.p, cache_n, dt == DType::kBF16, 82, h.stream());
    fill_random(q.p, q_n, dt == DType::kBF16, 83, h.stream());
    std::vector<int> indices(static_cast<size_t>(pages)), indptr(static_cast<size_t>(c.batch + 1)),
        last_len(static_cast<size_t>(c.batch), static_cast<int>(kPage));
    std::iota(indices.begin(), indices.end(), 0);
    for (int64_t b = 0; b <= c.batch; ++b) indptr[b] = static_cast<int>(b * pages_per);
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ind.p, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ptr.p, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(last.p, last_len.data(), last_len.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<int64_t> cache_shape = {pages, kPage, kHeadsKv, kD};
    const TensorView lse_v = view(lse.p, DType::kF32, {c.batch, kHeads});
    for (int rung = kPagedDecodeRungs; rung >= 1; --rung) {
      const auto call = [&] {
        batch_decode_paged(view(q.p, dt, {c.batch, kHeads, kD}), view(kc.p, dt, cache_shape), view(vc.p, dt, cache_shape),
                           view(ind.p, DType::kI32, {pages}), view(ptr.p, DType::kI32, {c.batch + 1}),
                           view(last.p, DType::kI32, {c.batch}), view(out.p, dt, {c.batch, kHeads, kD}), &lse_v,
                           KvLayout::kNHD, 0.f, h.stream(), rung);
      };
      // Once as is (the page table's values checked: a device read and a wait), then captured
      // into a CUDA graph, whose replay is timed: a server's decode step, without the checks.
      call();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      FLASHLAB_CUDA_CHECK(cudaStreamBeginCapture(h.stream(), cudaStreamCaptureModeThreadLocal));
      call();
      FLASHLAB_CUDA_CHECK(cudaStreamEndCapture(h.stream(), &graph));
      FLASHLAB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const double ms = h.time_ms([&] { FLASHLAB_CUDA_CHECK(cudaGraphLaunch(exec, h.stream())); });
      FLASHLAB_CUDA_CHECK(cudaGraphExecDestroy(exec));
      FLASHLAB_CUDA_CHECK(cudaGraphDestroy(graph));
      Row r;
      r.op = "paged_decode";
      r.impl = "flashlab";
      r.rung_name = kDecodeRungNames[rung];
      r.rung = rung;
      r.dtype = dtype_name(dt);
      r.shape = {{"batch", c.batch}, {"kv_len", c.kv_len}, {"nheads_q", kHeads}, {"nheads_kv", kHeadsKv}, {"headdim", kD},
                 {"page_size", kPage}};
      r.ms = ms;
      r.bytes = static_cast<double>(2 * cache_n * es + 2 * q_n * es);
      r.flops = 4.0 * c.batch * kHeads * c.kv_len * kD;
      h.add(r);
    }
  }
}

}  // namespace flashlab::bench
