// batch_prefill_paged (include/flashlab/serving.h), both rungs, on fresh random inputs with the
// outputs poisoned (NaN) first:
//   - against the float64 reference of attention over each request's keys gathered from the
//     cache, with attention_fwd's rule (tests/gpu/test_attention.cpp, DESIGN.md): error <= 2x the
//     naive same-dtype computation's + one unit roundoff of max |ref|; rows that see no key give
//     exactly 0 and an lse of exactly -inf;
//   - bit for bit against attention_fwd's varlen forward over the gathered K/V (rung 1 against
//     forward rung 3, rung 2 against forward rung 4, same scale): paging changes no bit.
// Every cache slot no request owns (unused pages, the tail of each last page) holds NaN: a kernel
// that lets one into P V (0 x NaN) fails.
// Cases: page sizes 1, 8, 16, 48 (not a power of two), 64 and 256 (rung 2 loads whole key blocks
// by TMA, a box per page, where the page size tiles the block: 8, 16, 64 and 256 at head dim 128;
// at 16 V is k-step-major, a box per page: d 64, 128, 256);
// NHD and HND; fp16 and bf16; head dims 64, 128, 256;
// MHA, GQA 4 and 8, MQA; causal, sliding window, softcap; queries longer than the keys (causal
// rows that see nothing), requests without queries or without keys, one-query requests, keys
// up to 2k. Under CUDA-graph capture (max_qo_len given): replays after the page table and the
// query split changed in place. The rejections that read the device (qo_indptr's and the page
// table's values, max_qo_len too small), nothing launched. Plan / run: the plan's checks, runs
// under it (with and without lse, captured) bit for bit the one-shot call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "flashlab/attention.h"
#include "src/attention_hopper_dispatch.h"
#include "flashlab/serving.h"
#include "src/reference/attention.h"
#include "tests/common/attention_cases.h"
#include "tests/common/attention_naive.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/paged_cache.h"
#include "tests/common/test_utils.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct PrefillCase {
  DType dt = DType::kBF16;
  int64_t page_size = 16;
  KvLayout layout = KvLayout::kNHD;
  int64_t h = 4, hk = 1, d = 128;
  std::vector<int64_t> lq, lk;  // per request: queries, keys (the queries are the last lq keys' positions)
  bool causal = false;
  int64_t wl = -1;
  float softcap = 0.f;
};

::testing::Message describe(const PrefillCase& c, int rung) {
  ::testing::Message m;
  m << dtype_name(c.dt) << " rung " << rung << " page_size " << c.page_size << (c.layout == KvLayout::kNHD ? " NHD" : " HND")
    << " heads " << c.h << "/" << c.hk << " d " << c.d << " lq";
  for (int64_t x : c.lq) m << " " << x;
  m << " lk";
  for (int64_t x : c.lk) m << " " << x;
  m << (c.causal ? " causal" : "") << " window_left " << c.wl;
  if (c.softcap > 0) m << " softcap " << c.softcap;
  return m;
}

std::vector<int> to_int32(const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); }

std::vector<uint8_t> int32_bytes(const std::vector<int>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The host side of a case: the cache (NaN wherever no request has a token), the queries, the
// page table, and each request's keys gathered into packed (total_k, hk, d) tensors.
struct PrefillHost {
  PrefillCase c;
  PageTable t;
  int64_t max_pages, total_q = 0, total_k = 0, max_lq = 0;
  std::vector<int64_t> cuq, cuk;
  HostTensor q, kc, vc, kp, vp;
  // spare_pages: pool pages beyond the requests' (3 that no request owns, or room to grow).
  PrefillHost(const PrefillCase& pc, std::mt19937_64& rng, int64_t spare_pages = 3)
      : c(pc), t(pc.page_size, pages_for(pc.lk, pc.page_size) + spare_pages, pc.lk.size(), rng),
        max_pages(pages_for(pc.lk, pc.page_size) + spare_pages), cuq(prefix(pc.lq)), cuk(prefix(pc.lk)),
        q(random_tensor(pc.dt, cuq.back() * pc.h * pc.d, rng, -2.0, 2.0)),
        kc(random_tensor(pc.dt, max_pages * pc.page_size * pc.hk * pc.d, rng, -2.0, 2.0)),
        vc(random_tensor(pc.dt, max_pages * pc.page_size * pc.hk * pc.d, rng, -1.0, 1.0)),
        kp(empty_tensor(pc.dt, cuk.back() * pc.hk * pc.d)), vp(empty_tensor(pc.dt, cuk.back() * pc.hk * pc.d)) {
    t.grow(c.lk);
    total_q = cuq.back(), total_k = cuk.back();
    max_lq = c.lq.empty() ? 0 : *std::max_element(c.lq.begin(), c.lq.end());
    poison_unowned();
    gather();
  }
  int64_t batch() const { return static_cast<int64_t>(c.lq.size()); }
  std::vector<int64_t> cache_shape() const {
    return c.layout == KvLayout::kNHD ? std::vector<int64_t>{max_pages, c.page_size, c.hk, c.d}
                                      : std::vector<int64_t>{max_pages, c.hk, c.page_size, c.d};
  }
  // Slots that hold no request's token: NaN in both caches.
  void poison_unowned() {
    std::vector<uint8_t> owned(static_cast<size_t>(max_pages * c.page_size), 0);
    for (size_t b = 0; b < c.lk.size(); ++b)
      for (int64_t j = 0; j < c.lk[b]; ++j)
        owned[static_cast<size_t>(t.pages[b][static_cast<size_t>(j / c.page_size)] * c.page_size + j % c.page_size)] = 1;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t page = 0; page < max_pages; ++page)
      for (int64_t slot = 0; slot < c.page_size; ++slot) {
        if (owned[static_cast<size_t>(page * c.page_size + slot)]) continue;
        for (int64_t hh = 0; hh < c.hk; ++hh)
          for (int64_t x = 0; x < c.d; ++x) {
            const auto i = static_cast<size_t>(cache_offset(c.layout, c.page_size, c.hk, c.d, page, slot, hh) + x);
            store_value(kc, i, nan), store_value(vc, i, nan);
          }
      }
  }
  void gather() {
    const size_t row = static_cast<size_t>(c.d) * dtype_size(c.dt);
    for (size_t b = 0; b < c.lk.size(); ++b)
      for (int64_t j = 0; j < c.lk[b]; ++j)
        for (int64_t hh = 0; hh < c.hk; ++hh) {
          const int64_t page = t.pages[b][static_cast<size_t>(j / c.page_size)];
          const auto from = static_cast<size_t>(cache_offset(c.layout, c.page_size, c.hk, c.d, page, j % c.page_size, hh));
          const auto to = static_cast<size_t>(((cuk[b] + j) * c.hk + hh) * c.d);
          std::memcpy(kp.bytes.data() + to * dtype_size(c.dt), kc.bytes.data() + from * dtype_size(c.dt), row);
          std::memcpy(vp.bytes.data() + to * dtype_size(c.dt), vc.bytes.data() + from * dtype_size(c.dt), row);
          std::copy_n(kc.values.begin() + static_cast<int64_t>(from), c.d, kp.values.begin() + static_cast<int64_t>(to));
          std::copy_n(vc.values.begin() + static_cast<int64_t>(from), c.d, vp.values.begin() + static_cast<int64_t>(to));
        }
  }
  float scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d))); }
  reference::AttnRefArgs ref_args() const {
    reference::AttnRefArgs a;
    a.batch = batch(), a.nheads = c.h, a.nheads_kv = c.hk, a.headdim = c.d;
    a.cu_seqlens_q = cuq, a.cu_seqlens_k = cuk;
    a.scale = scale();
    a.causal = c.causal, a.window_left = c.wl, a.window_right = c.causal ? 0 : -1, a.softcap = c.softcap;
    return a;
  }
  PagedPrefillOptions options() const {
    PagedPrefillOptions o;
    o.causal = c.causal, o.window_left = static_cast<int>(c.wl), o.softcap = c.softcap, o.softmax_scale = scale();
    return o;
  }
};

// The device side: inputs, the page table (room for table_cap pages), qo_indptr, outputs.
struct PrefillDevice {
  const PrefillHost& host;
  int64_t table_cap;
  DeviceBuffer q, kc, vc, ind, ptr, last, qo, out, lse;
  PrefillDevice(const PrefillHost& hs, int64_t cap)
      : host(hs), table_cap(std::max<int64_t>(cap, 1)), q(std::max<size_t>(hs.q.bytes.size(), 16)), kc(hs.kc.bytes.size()),
        vc(hs.vc.bytes.size()), ind(static_cast<size_t>(table_cap) * 4), ptr(static_cast<size_t>(hs.batch() + 1) * 4),
        last(static_cast<size_t>(std::max<int64_t>(hs.batch(), 1)) * 4), qo(static_cast<size_t>(hs.batch() + 1) * 4),
        out(std::max<size_t>(hs.q.bytes.size(), 16)), lse(static_cast<size_t>(std::max<int64_t>(hs.total_q * hs.c.h, 1)) * 4) {
    if (!hs.q.bytes.empty()) upload(q.ptr, hs.q.bytes);
    upload(kc.ptr, hs.kc.bytes);
    upload(vc.ptr, hs.vc.bytes);
    set_table(hs.t, hs.c.lq);
  }
  // The page table and the query split, copied on `stream` (waited for).
  void set_table(const PageTable& t, const std::vector<int64_t>& lq, cudaStream_t stream = nullptr) const {
    ASSERT_LE(t.total_pages(), table_cap);
    const std::vector<uint8_t> i = int32_bytes(t.indices), p = int32_bytes(t.indptr), l = int32_bytes(t.last),
                               c = int32_bytes(to_int32(prefix(lq)));
    if (!i.empty()) FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ind.ptr, i.data(), i.size(), cudaMemcpyHostToDevice, stream));
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ptr.ptr, p.data(), p.size(), cudaMemcpyHostToDevice, stream));
    if (!l.empty()) FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(last.ptr, l.data(), l.size(), cudaMemcpyHostToDevice, stream));
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(qo.ptr, c.data(), c.size(), cudaMemcpyHostToDevice, stream));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  void poison(cudaStream_t stream = nullptr) const {
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xff, out.bytes, stream));
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(lse.ptr, 0xff, lse.bytes, stream));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  TensorView qv() const { return device_view(q.ptr, host.c.dt, {host.total_q, host.c.h, host.c.d}); }
  TensorView outv() const { return device_view(out.ptr, host.c.dt, {host.total_q, host.c.h, host.c.d}); }
  TensorView lsev() const { return device_view(lse.ptr, DType::kF32, {host.total_q, host.c.h}); }
  void run(int rung, int64_t max_qo_len = -1, cudaStream_t stream = nullptr, bool with_lse = true) const {
    const TensorView l = lsev();
    batch_prefill_paged(qv(), device_view(qo.ptr, DType::kI32, {host.batch() + 1}), device_view(kc.ptr, host.c.dt, host.cache_shape()),
                        device_view(vc.ptr, host.c.dt, host.cache_shape()), device_view(ind.ptr, DType::kI32, {table_cap}),
                        device_view(ptr.ptr, DType::kI32, {host.batch() + 1}), device_view(last.ptr, DType::kI32, {host.batch()}),
                        outv(), with_lse ? &l : nullptr, host.c.layout, host.options(), max_qo_len, stream, rung);
  }
  TensorView qov() const { return device_view(qo.ptr, DType::kI32, {host.batch() + 1}); }
  TensorView indv() const { return device_view(ind.ptr, DType::kI32, {table_cap}); }
  TensorView ptrv() const { return device_view(ptr.ptr, DType::kI32, {host.batch() + 1}); }
  TensorView lastv() const { return device_view(last.ptr, DType::kI32, {host.batch()}); }
  PrefillPlanInfo plan(cudaStream_t stream = nullptr) const {
    return batch_prefill_paged_plan(qov(), indv(), ptrv(), lastv(), host.c.page_size, stream);
  }
  // Under a plan; pages < 0: the whole pool, else a view of its first `pages` pages.
  void run_planned(const PrefillPlanInfo& plan, int rung, cudaStream_t stream = nullptr, bool with_lse = true,
                   int64_t pages = -1) const {
    std::vector<int64_t> shape = host.cache_shape();
    if (pages >= 0) shape[0] = pages;
    const TensorView l = lsev();
    batch_prefill_paged_run(plan, qv(), qov(), device_view(kc.ptr, host.c.dt, shape), device_view(vc.ptr, host.c.dt, shape),
                            indv(), ptrv(), lastv(), outv(), with_lse ? &l : nullptr, host.c.layout, host.options(), stream,
                            rung);
  }
  std::vector<uint8_t> out_bytes() const { return download(out.ptr, static_cast<size_t>(host.q.bytes.size())); }
  std::vector<double> got_lse() const {  // as the reference's (nheads, total_q)
    const std::vector<double> raw = decode(DType::kF32, download(lse.ptr, lse.bytes));
    std::vector<double> t(static_cast<size_t>(host.total_q * host.c.h));
    for (int64_t i = 0; i < host.total_q; ++i)
      for (int64_t hh = 0; hh < host.c.h; ++hh) t[static_cast<size_t>(hh * host.total_q + i)] = raw[static_cast<size_t>(i * host.c.h + hh)];
    return t;
  }
};

// out and lse of a run against the reference (attention_fwd's rule).
void expect_matches_reference(const PrefillHost& hs, const PrefillDevice& dev, const reference::AttnRefResult& ref,
                              const reference::AttnRefResult& naive, const ::testing::Message& what) {
  const std::vector<double> got = decode(hs.c.dt, dev.out_bytes());
  expect_no_nan(got, what);
  double max_ref = 0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
  expect_within_tolerance(got, naive.out, ref.out, unit_roundoff(hs.c.dt) * max_ref, what);
  expect_lse_matches(dev.got_lse(), ref.lse, naive.lse, what);
}

// attention_fwd's varlen forward at `fwd_rung` over the gathered keys: out and lse bytes.
struct ContiguousResult {
  std::vector<uint8_t> out;
  std::vector<double> lse;  // (nheads, total_q)
};
ContiguousResult contiguous_forward(const PrefillHost& hs, const PrefillDevice& dev, int fwd_rung) {
  const PrefillCase& c = hs.c;
  DeviceBuffer k(std::max<size_t>(hs.kp.bytes.size(), 16)), v(std::max<size_t>(hs.vp.bytes.size(), 16)), out(dev.out.bytes),
      lse(static_cast<size_t>(std::max<int64_t>(hs.total_q * c.h, 1)) * 4), cuq(hs.cuq.size() * 4), cuk(hs.cuk.size() * 4);
  if (!hs.kp.bytes.empty()) upload(k.ptr, hs.kp.bytes), upload(v.ptr, hs.vp.bytes);
  upload(cuq.ptr, int32_bytes(to_int32(hs.cuq)));
  upload(cuk.ptr, int32_bytes(to_int32(hs.cuk)));
  out.poison();
  lse.poison();
  const TensorView cq = device_view(cuq.ptr, DType::kI32, {hs.batch() + 1}), ck = device_view(cuk.ptr, DType::kI32, {hs.batch() + 1});
  const TensorView lv = device_view(lse.ptr, DType::kF32, {c.h, hs.total_q});
  AttnFwdOptions opt;
  opt.causal = c.causal, opt.window_left = static_cast<int>(c.wl), opt.window_right = c.causal ? 0 : -1, opt.softcap = c.softcap;
  opt.softmax_scale = hs.scale();
  opt.cu_seqlens_q = &cq, opt.cu_seqlens_k = &ck;
  opt.max_seqlen_q = hs.max_lq;
  opt.max_seqlen_k = hs.c.lk.empty() ? 0 : *std::max_element(c.lk.begin(), c.lk.end());
  opt.softmax_lse = &lv;
  attention_fwd(dev.qv(), device_view(k.ptr, c.dt, {hs.total_k, c.hk, c.d}), device_view(v.ptr, c.dt, {hs.total_k, c.hk, c.d}),
                device_view(out.ptr, c.dt, {hs.total_q, c.h, c.d}), nullptr, fwd_rung, opt);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return {download(out.ptr, hs.q.bytes.size()), decode(DType::kF32, download(lse.ptr, lse.bytes))};
}

std::vector<int> rungs_here() {
  std::vector<int> r{1};
  if (device_cc_major() == 9) r.push_back(2);
  return r;
}

void check_prefill(const PrefillCase& c, std::mt19937_64& rng) {
  const PrefillHost hs(c, rng);
  const reference::AttnRefArgs args = hs.ref_args();
  const reference::AttnRefResult ref = reference::attention_fwd(hs.q.values, hs.kp.values, hs.vp.values, args);
  const reference::AttnRefResult naive = attention_fwd_naive(hs.q.values, hs.kp.values, hs.vp.values, args, c.dt);
  const PrefillDevice dev(hs, hs.t.total_pages());
  for (int rung : rungs_here()) {
    const ::testing::Message what = describe(c, rung);
    dev.poison();
    dev.run(rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    expect_matches_reference(hs, dev, ref, naive, what);
    // The same bits as the contiguous forward's rung of the same kernel, where that takes key
    // blocks of the paged kernel's width (rung 4 changes width with the key length:
    // src/attention_hopper_dispatch.h; the reference check above holds either way).
    const int max_lk = c.lk.empty() ? 0 : static_cast<int>(*std::max_element(c.lk.begin(), c.lk.end()));
    const int d = static_cast<int>(c.d);
    const int key_block = detail::attn_hopper_key_block(d, c.softcap > 0.f, c.causal, static_cast<int>(c.wl), max_lk);
    if (rung == 2 && key_block != attn_hopper_default_key_block(d)) continue;
    const ContiguousResult contiguous = contiguous_forward(hs, dev, rung == 1 ? 3 : 4);
    EXPECT_TRUE(dev.out_bytes() == contiguous.out) << what << ": out differs from attention_fwd's on the gathered keys";
    const std::vector<double> lse = dev.got_lse();
    int64_t differ = 0;
    for (size_t x = 0; x < lse.size(); ++x) differ += !(lse[x] == contiguous.lse[x]);
    EXPECT_EQ(differ, 0) << what << ": lse values that differ from attention_fwd's on the gathered keys";
  }
}

TEST(PagedPrefill, MatchesTheReferenceAndTheContiguousForward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2511);
  PrefillCase c;
  // Ragged: an empty request, a one-query request, queries longer than keys, a long request.
  c.lq = {5, 0, 1, 300, 130, 64};
  c.lk = {5, 7, 900, 200, 2048, 0};
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND})
    for (int64_t page_size : {1, 16, 48}) {
      c.layout = layout, c.page_size = page_size;
      for (bool causal : {false, true}) {
        c.causal = causal;
        check_prefill(c, rng);
      }
    }
  // Rung 2's TMA boxes: pages of 8 (16 a key block, 32 boxes) and 256 (a key block within a page).
  for (int64_t page_size : {8, 256}) {
    c.page_size = page_size;
    check_prefill(c, rng);
  }
  c.layout = KvLayout::kNHD, c.page_size = 64;
  c.dt = DType::kF16, c.h = 8, c.hk = 8, c.d = 64, c.causal = true;  // MHA, d 64
  check_prefill(c, rng);
  c.page_size = 16;  // d 64 with V k-step-major (one column box)
  check_prefill(c, rng);
  c.dt = DType::kBF16, c.h = 8, c.hk = 1, c.d = 256, c.page_size = 256;  // MQA, d 256, pages longer than a key block
  check_prefill(c, rng);
  c.h = 16, c.hk = 2, c.d = 128, c.page_size = 16, c.causal = false;  // GQA 8, sliding window, softcap
  c.wl = 100;
  check_prefill(c, rng);
  c.wl = -1, c.softcap = 30.f, c.causal = true;
  check_prefill(c, rng);
  c.layout = KvLayout::kHND, c.d = 256, c.softcap = 5.f, c.dt = DType::kF16;
  check_prefill(c, rng);
}

// Prefill as a server runs it: a chunk of new tokens per request (appended to the cache before
// the call) attending causally to everything before them.
TEST(PagedPrefill, ChunkedPrefillOfLongRequests) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2512);
  PrefillCase c;
  c.h = 32, c.hk = 8, c.d = 128, c.causal = true;
  c.lq = {512, 1000, 37};
  c.lk = {4096, 1000, 3000};
  check_prefill(c, rng);
}

// Captured with max_qo_len, replayed after the requests grew and the queries were split
// differently (same total, no request over max_qo_len): each replay matches the reference of
// the new state, and is the one-shot call's bits.
TEST(PagedPrefill, GraphReplaysAfterTheTableChanged) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2513);
  PrefillCase c;
  c.h = 8, c.hk = 2, c.d = 128, c.causal = true, c.page_size = 16;
  c.lq = {100, 20, 8};
  c.lk = {300, 20, 1000};
  const std::vector<int64_t> lq2 = {40, 80, 8}, lk2 = {420, 90, 1010};  // grown keys, same 128 queries
  PrefillHost hs(c, rng, pages_for(lk2, c.page_size));
  PrefillHost grown_view = hs;  // the state after growth: the same cache, a longer table
  grown_view.c.lq = lq2, grown_view.c.lk = lk2;
  grown_view.t.grow(lk2);
  // The grown requests' new slots hold random values written into the cache (as appends would).
  for (size_t b = 0; b < lk2.size(); ++b)
    for (int64_t j = c.lk[b]; j < lk2[b]; ++j)
      for (int64_t hh = 0; hh < c.hk; ++hh)
        for (int64_t x = 0; x < c.d; ++x) {
          const int64_t page = grown_view.t.pages[b][static_cast<size_t>(j / c.page_size)];
          const auto i = static_cast<size_t>(cache_offset(c.layout, c.page_size, c.hk, c.d, page, j % c.page_size, hh) + x);
          std::uniform_real_distribution<double> dist(-1.0, 1.0);
          store_value(grown_view.kc, i, static_cast<float>(dist(rng))), store_value(grown_view.vc, i, static_cast<float>(dist(rng)));
        }
  grown_view.cuq = prefix(lq2), grown_view.cuk = prefix(lk2), grown_view.total_k = grown_view.cuk.back();
  grown_view.kp = empty_tensor(c.dt, grown_view.total_k * c.hk * c.d), grown_view.vp = empty_tensor(c.dt, grown_view.total_k * c.hk * c.d);
  grown_view.gather();
  const int64_t max_qo = 128;
  for (int rung : rungs_here()) {
    const ::testing::Message what = describe(c, rung) << " (graph)";
    const PrefillDevice dev(hs, grown_view.t.total_pages());
    Stream stream;
    Graph graph;
    dev.poison(stream.s);
    graph.capture(stream.s, [&] { dev.run(rung, max_qo, stream.s); });
    graph.replay(stream.s);
    {
      const reference::AttnRefArgs args = hs.ref_args();
      expect_matches_reference(hs, dev, reference::attention_fwd(hs.q.values, hs.kp.values, hs.vp.values, args),
                               attention_fwd_naive(hs.q.values, hs.kp.values, hs.vp.values, args, c.dt), what);
    }
    // Grow in place: the new cache bytes and table, the new query split.
    upload(dev.kc.ptr, grown_view.kc.bytes);
    upload(dev.vc.ptr, grown_view.vc.bytes);
    dev.set_table(grown_view.t, lq2, stream.s);
    dev.poison(stream.s);
    graph.replay(stream.s);
    const PrefillDevice fresh(grown_view, grown_view.t.total_pages());
    {
      const reference::AttnRefArgs args = grown_view.ref_args();
      const ::testing::Message after = ::testing::Message(what) << " after growth";
      const reference::AttnRefResult ref = reference::attention_fwd(grown_view.q.values, grown_view.kp.values, grown_view.vp.values, args);
      const reference::AttnRefResult naive = attention_fwd_naive(grown_view.q.values, grown_view.kp.values, grown_view.vp.values, args, c.dt);
      expect_matches_reference(grown_view, dev, ref, naive, after);
      fresh.poison();
      fresh.run(rung);
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(fresh.out_bytes() == dev.out_bytes()) << after << ": the replay's bits differ from a one-shot call's";
    }
  }
}

// Plan / run: the plan reads and checks the index tensors once; runs under it (plain, without
// lse, captured and replayed) give the one-shot call's bits. Bad values are rejected by the plan,
// a pool smaller than the table reaches by the run; nothing launched either way.
TEST(PagedPrefill, PlanAndRun) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2515);
  PrefillCase c;
  c.h = 8, c.hk = 2, c.d = 128, c.causal = true, c.page_size = 16;
  c.lq = {100, 0, 37, 1};
  c.lk = {300, 20, 1000, 64};
  const PrefillHost hs(c, rng);
  const PrefillDevice dev(hs, hs.t.total_pages());
  const PrefillPlanInfo plan = dev.plan();
  EXPECT_EQ(plan.batch, 4);
  EXPECT_EQ(plan.total_q, hs.total_q);
  EXPECT_EQ(plan.max_qo_len, 100);
  EXPECT_EQ(plan.kv_pages, hs.t.total_pages());
  EXPECT_EQ(plan.pages_used, *std::max_element(hs.t.indices.begin(), hs.t.indices.end()) + 1);
  const auto expect_untouched = [&] {
    const std::vector<uint8_t> after = download(dev.out.ptr, dev.out.bytes);
    EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](uint8_t x) { return x == 0xff; })) << "out was written";
  };
  for (int rung : rungs_here()) {
    const ::testing::Message what = describe(c, rung) << " (plan / run)";
    dev.poison();
    dev.run(rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> one_shot = dev.out_bytes();
    const std::vector<double> one_shot_lse = dev.got_lse();
    dev.poison();
    dev.run_planned(plan, rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(dev.out_bytes() == one_shot) << what << ": out differs from the one-shot call's";
    const std::vector<double> lse = dev.got_lse();
    int64_t differ = 0;
    for (size_t x = 0; x < lse.size(); ++x) differ += !(lse[x] == one_shot_lse[x]);
    EXPECT_EQ(differ, 0) << what << ": lse values that differ from the one-shot call's";
    dev.poison();
    dev.run_planned(plan, rung, nullptr, false);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(dev.out_bytes() == one_shot) << what << ": out without lse differs";
    Stream stream;
    Graph graph;
    dev.poison(stream.s);
    graph.capture(stream.s, [&] { dev.run_planned(plan, rung, stream.s); });
    graph.replay(stream.s);
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    EXPECT_TRUE(dev.out_bytes() == one_shot) << what << ": the captured run's replay differs";
    // The pool the run gets must hold every page the table reaches.
    dev.poison();
    expect_rejected([&] { dev.run_planned(plan, rung, nullptr, true, plan.pages_used - 1); },
                    {"batch_prefill_paged_run: argument 'k_cache'", "a pool of at least"});
    expect_untouched();
  }
  // The plan's value checks.
  PageTable bad = hs.t;
  bad.last[0] = static_cast<int>(c.page_size) + 1;
  dev.set_table(bad, c.lq);
  expect_rejected([&] { dev.plan(); }, {"batch_prefill_paged_plan: argument 'kv_last_page_len'", "kv_last_page_len[0] = 17"});
  bad = hs.t;
  bad.indices[3] = -1;
  dev.set_table(bad, c.lq);
  expect_rejected([&] { dev.plan(); }, {"batch_prefill_paged_plan: argument 'kv_indices'", "page indices >= 0", "kv_indices[3] = -1"});
  dev.set_table(hs.t, {100, 10, 0, 28});  // fine: qo_indptr non-decreasing
  EXPECT_EQ(dev.plan().max_qo_len, 100);
  dev.set_table(hs.t, c.lq);
  FLASHLAB_CUDA_CHECK(cudaMemset(static_cast<int*>(dev.qo.ptr) + 2, 0xff, 4));  // qo_indptr[2] = -1 < qo_indptr[1]
  expect_rejected([&] { dev.plan(); }, {"batch_prefill_paged_plan: argument 'qo_indptr'", "non-decreasing", "cu_seqlens[2] = -1"});
  dev.set_table(hs.t, c.lq);
  Stream stream;  // a plan reads: not under capture
  Graph graph;
  expect_rejected([&] { graph.capture(stream.s, [&] { dev.plan(stream.s); }); },
                  {"batch_prefill_paged_plan: argument 'stream'", "not being captured"});
}

// Rejections that read the device: nothing launched (out still poisoned).
TEST(PagedPrefill, RejectsBadValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2514);
  PrefillCase c;
  c.lq = {10, 20};
  c.lk = {30, 40};
  const PrefillHost hs(c, rng);
  const PrefillDevice dev(hs, hs.t.total_pages());
  const auto expect_untouched = [&] {
    const std::vector<uint8_t> after = download(dev.out.ptr, dev.out.bytes);
    EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](uint8_t x) { return x == 0xff; })) << "out was written";
  };
  dev.poison();
  expect_rejected([&] { dev.run(kPagedPrefillRungs, 15); }, {"batch_prefill_paged: argument 'max_qo_len'", "expected >= the longest sequence (20)", "got 15"});
  expect_untouched();
  dev.set_table(hs.t, {10, 21});  // qo_indptr[2] = 31 != 30 rows of q
  expect_rejected([&] { dev.run(kPagedPrefillRungs); }, {"batch_prefill_paged: argument 'qo_indptr'", "cu_seqlens[2] = 30", "got 31"});
  expect_untouched();
  dev.set_table(hs.t, {20, 10});  // fine
  PageTable bad = hs.t;
  bad.last[0] = static_cast<int>(c.page_size) + 1;
  dev.set_table(bad, {20, 10});
  expect_rejected([&] { dev.run(kPagedPrefillRungs); }, {"batch_prefill_paged: argument 'kv_last_page_len'", "kv_last_page_len[0] = 17"});
  expect_untouched();
  // Capturing without max_qo_len: the split cannot be read.
  dev.set_table(hs.t, c.lq);
  Stream stream;
  Graph graph;
  expect_rejected([&] { graph.capture(stream.s, [&] { dev.run(kPagedPrefillRungs, -1, stream.s); }); },
                  {"batch_prefill_paged: argument 'max_qo_len'", "while the stream is being captured"});
  expect_untouched();
}

}  // namespace
}  // namespace flashlab
