// append_paged_kv_cache, batch_decode_paged, the decode's plan / run and batch_prefill_paged
// (include/flashlab/serving.h):
// every host-side rejection that comes before a CUDA call (message names the argument, what was
// expected and what was given; nothing launched), on fake device tensors. The checks that need
// the device (the int32 arrays' values, the workspace's size against the device's capacity, the
// host kv_indptr's values): tests/gpu/test_paged_kv.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/serving.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::gpu;
using testing::gpu_strided;
constexpr DType kBf = DType::kBF16, kI32 = DType::kI32;
enum Slot { kAk = 1, kAv, kBi, kPos, kKc, kVc, kInd, kPtr, kLast, kWs };

// A valid call: 5 new tokens of 4 KV heads x 128 into an NHD cache of 32 pages of 16 tokens, a
// batch of 3 requests.
struct Call {
  TensorView ak = gpu(kBf, {5, 4, 128}, kAk), av = gpu(kBf, {5, 4, 128}, kAv);
  TensorView bi = gpu(kI32, {5}, kBi), pos = gpu(kI32, {5}, kPos);
  TensorView kc = gpu(kBf, {32, 16, 4, 128}, kKc), vc = gpu(kBf, {32, 16, 4, 128}, kVc);
  TensorView ind = gpu(kI32, {40}, kInd), ptr = gpu(kI32, {4}, kPtr), last = gpu(kI32, {3}, kLast);
  KvLayout layout = KvLayout::kNHD;
  void run() const { append_paged_kv_cache(ak, av, bi, pos, kc, vc, ind, ptr, last, layout); }
};

void rejected(const Call& c, const std::vector<std::string>& pieces) {
  testing::expect_rejected([&] { c.run(); }, pieces);
}

TEST(PagedKvValidation, Tensors) {
  const std::string op = "append_paged_kv_cache: argument ";
  {
    Call c;
    c.layout = static_cast<KvLayout>(7);
    rejected(c, {op + "'layout'", "expected NHD or HND", "got 7"});
  }
  {
    Call c;
    c.kc = gpu(kBf, {32, 16, 4}, kKc);
    rejected(c, {op + "'k_cache'", "expected 4 dims"});
  }
  {
    Call c;
    c.vc = gpu(DType::kF16, {32, 16, 4, 128}, kVc);
    rejected(c, {op + "'v_cache'", "dtype"});
  }
  {
    Call c;
    c.vc = gpu(kBf, {32, 8, 4, 128}, kVc);
    rejected(c, {op + "'v_cache'", "shape"});
  }
  {
    Call c;
    c.kc = gpu(kBf, {32, 0, 4, 128}, kKc), c.vc = gpu(kBf, {32, 0, 4, 128}, kVc);
    rejected(c, {op + "'k_cache'", "expected page_size >= 1", "got [32, 0, 4, 128]"});
  }
  {
    Call c;
    c.kc = gpu(DType::kI8, {32, 16, 4, 128}, kKc);
    rejected(c, {op + "'k_cache'", "dtype"});
  }
  {
    Call c;
    c.kc = gpu(kBf, {32, 16, 4, 12}, kKc), c.vc = gpu(kBf, {32, 16, 4, 12}, kVc);
    rejected(c, {op + "'k_cache'", "multiple of 8", "got 12"});
  }
  {
    Call c;
    c.kc = gpu_strided(kBf, {32, 16, 4, 128}, {8192, 512, 128, 2}, kKc);
    rejected(c, {op + "'k_cache'", "expected unit stride in the last dim"});
  }
  {
    Call c;
    c.kc = gpu_strided(kBf, {32, 16, 4, 128}, {8196, 516, 129, 1}, kKc);
    rejected(c, {op + "'k_cache'", "strides that are multiples of 8"});
  }
  {
    Call c;
    c.ak = gpu(kBf, {5, 4, 128}, kAk, 8);
    rejected(c, {op + "'append_k'", "aligned"});
  }
  {
    Call c;
    c.ak = gpu(kBf, {5, 2, 128}, kAk);
    rejected(c, {op + "'append_k'", "expected shape [5, 4, 128]", "got [5, 2, 128]"});
  }
  {
    Call c;  // HND: the heads are dim 1 of the cache
    c.layout = KvLayout::kHND;
    rejected(c, {op + "'append_k'", "expected shape [5, 16, 128]"});
  }
  {
    Call c;
    c.av = gpu(DType::kF16, {5, 4, 128}, kAv);
    rejected(c, {op + "'append_v'", "dtype"});
  }
  {
    Call c;
    c.av = gpu(kBf, {6, 4, 128}, kAv);
    rejected(c, {op + "'append_v'", "expected shape [5, 4, 128]"});
  }
  {
    Call c;
    c.bi = gpu(DType::kI64, {5}, kBi);
    rejected(c, {op + "'batch_indices'", "dtype"});
  }
  {
    Call c;
    c.pos = gpu(kI32, {4}, kPos);
    rejected(c, {op + "'positions'", "expected shape [5]", "got [4]"});
  }
  {
    Call c;
    c.ind = gpu(kI32, {40, 1}, kInd);
    rejected(c, {op + "'kv_indices'", "expected 1 dims"});
  }
  {
    Call c;
    c.ptr = gpu(kI32, {3}, kPtr);
    rejected(c, {op + "'kv_indptr'", "expected shape [4]", "got [3]"});
  }
  {
    Call c;
    c.last = TensorView(testing::fake(0, kLast), kI32, {3}, testing::kCpu);
    rejected(c, {op + "'kv_last_page_len'", "CUDA"});
  }
  {
    Call c;
    c.vc = gpu(kBf, {32, 16, 4, 128}, kKc);  // the same memory as k_cache
    rejected(c, {op + "'v_cache'", "disjoint from 'k_cache'"});
  }
  {
    Call c;  // half a page after k_cache: elements shared
    c.vc = gpu(kBf, {32, 16, 4, 128}, kKc, 16 * 4 * 128);
    rejected(c, {op + "'v_cache'", "disjoint from 'k_cache'", "a partial overlap"});
  }
  {
    Call c;
    c.ak = gpu(kBf, {5, 4, 128}, kKc, 1024);  // inside k_cache
    rejected(c, {op + "'k_cache'", "append_k"});
  }
  {
    Call c;
    c.ind = gpu(kI32, {40}, kVc);  // the page table inside v_cache
    rejected(c, {op + "'v_cache'", "kv_indices"});
  }
}

// batch_decode_paged: 3 requests of 8 query heads x 128 over the NHD cache of Call (4 KV heads).
struct Decode {
  Call c;
  TensorView q = gpu(kBf, {3, 8, 128}, kAk), out = gpu(kBf, {3, 8, 128}, kAv), lse = gpu(DType::kF32, {3, 8}, kBi);
  const TensorView* lse_ptr = &lse;
  float scale = 0.f;
  int rung = kPagedDecodeRungs;
  void run() const {
    batch_decode_paged(q, c.kc, c.vc, c.ind, c.ptr, c.last, out, lse_ptr, c.layout, scale, nullptr, rung);
  }
};

void rejected(const Decode& d, const std::vector<std::string>& pieces) {
  testing::expect_rejected([&] { d.run(); }, pieces);
}

TEST(PagedKvValidation, Decode) {
  const std::string op = "batch_decode_paged: argument ";
  {
    Decode d;
    d.rung = 4;
    rejected(d, {"batch_decode_paged: argument 'rung'", "expected 1..3", "got 4"});
  }
  {
    Decode d;
    d.rung = 0;
    rejected(d, {"batch_decode_paged: argument 'rung'", "expected 1..3", "got 0"});
  }
  {
    Decode d;
    d.q = gpu(kBf, {3, 8, 64}, kAk);
    rejected(d, {op + "'q'", "expected shape [3, 8, 128]", "got [3, 8, 64]"});
  }
  {
    Decode d;
    d.q = gpu(kBf, {2, 8, 128}, kAk);  // 2 queries for 3 requests
    rejected(d, {op + "'q'", "expected shape [3, 8, 128]"});
  }
  {
    Decode d;
    d.q = gpu(kBf, {3, 6, 128}, kAk), d.out = gpu(kBf, {3, 6, 128}, kAv), d.lse = gpu(DType::kF32, {3, 6}, kBi);
    rejected(d, {op + "'q'", "nheads (dim 1) a multiple of the cache's KV heads (4)", "got 6"});
  }
  {
    Decode d;  // head dim 8: a whole 16-byte vector, but not a multiple of 32
    d.c.kc = gpu(kBf, {32, 16, 4, 8}, kKc), d.c.vc = gpu(kBf, {32, 16, 4, 8}, kVc);
    d.q = gpu(kBf, {3, 8, 8}, kAk), d.out = gpu(kBf, {3, 8, 8}, kAv);
    rejected(d, {op + "'q'", "32, 64, 96, 128, 192 or 256", "got 8"});
  }
  {
    Decode d;
    d.q = gpu(DType::kF16, {3, 8, 128}, kAk);
    rejected(d, {op + "'q'", "dtype"});
  }
  {
    Decode d;
    d.out = gpu(kBf, {3, 8, 128}, kAk);  // the same memory as q
    rejected(d, {op + "'out'", "disjoint from 'q'"});
  }
  {
    Decode d;
    d.lse = gpu(DType::kF32, {3, 4}, kBi);
    rejected(d, {op + "'lse'", "expected shape [3, 8]"});
  }
  {
    Decode d;
    d.lse = gpu(DType::kF32, {3, 8}, kAv, 256);  // inside out
    rejected(d, {op + "'lse'", "out"});
  }
  {
    Decode d;
    d.scale = INFINITY;
    rejected(d, {op + "'softmax_scale'", "expected a finite value"});
  }
  {
    Decode d;
    d.c.layout = static_cast<KvLayout>(2);
    rejected(d, {op + "'layout'", "expected NHD or HND"});
  }
}

// batch_decode_run under a plan of Decode's shape (3 requests, 8 / 4 heads, d 128, pages of 16),
// made by hand: the checks of the plan against the call come before any CUDA call.
struct RunCall {
  Decode d;
  DecodePlanInfo plan = make_plan();
  TensorView ws = gpu(DType::kU8, {1 << 20}, kWs);
  static DecodePlanInfo make_plan() {
    DecodePlanInfo p;
    p.batch = 3, p.nheads = 8, p.nheads_kv = 4, p.headdim = 128, p.page_size = 16, p.device = 0;
    p.capacity = 100, p.chunks = 3, p.chunk_pages = 2;
    return p;
  }
  void run() const {
    batch_decode_run(plan, ws, d.q, d.c.kc, d.c.vc, d.c.ind, d.c.ptr, d.c.last, d.out, d.lse_ptr, d.c.layout, d.scale);
  }
};

void rejected(const RunCall& r, const std::vector<std::string>& pieces) {
  testing::expect_rejected([&] { r.run(); }, pieces);
}

TEST(PagedKvValidation, DecodeRun) {
  const std::string op = "batch_decode_run: argument ";
  const std::string shape = "expected the shape of the call (batch 3, nheads 8, nheads_kv 4, headdim 128, page_size 16)";
  {
    RunCall r;  // a plan of another batch
    r.plan.batch = 2;
    rejected(r, {op + "'plan'", shape, "got a plan for (2, 8, 4, 128, 16)"});
  }
  {
    RunCall r;  // of other query heads
    r.plan.nheads = 16;
    rejected(r, {op + "'plan'", "got a plan for (3, 16, 4, 128, 16)"});
  }
  {
    RunCall r;  // of other KV heads
    r.plan.nheads_kv = 2;
    rejected(r, {op + "'plan'", "got a plan for (3, 8, 2, 128, 16)"});
  }
  {
    RunCall r;  // of another head dim
    r.plan.headdim = 64;
    rejected(r, {op + "'plan'", "got a plan for (3, 8, 4, 64, 16)"});
  }
  {
    RunCall r;  // of another page size
    r.plan.page_size = 64;
    rejected(r, {op + "'plan'", "got a plan for (3, 8, 4, 128, 64)"});
  }
  {
    RunCall r;  // a default (empty) plan
    r.plan = DecodePlanInfo{};
    rejected(r, {op + "'plan'", "got a plan for (0, 0, 0, 0, 0)"});
  }
  {
    RunCall r;
    r.plan.device = 1;
    rejected(r, {op + "'q'", "the plan's device cuda:1", "got cuda:0"});
  }
  {
    RunCall r;  // rung 3 only: no fp32
    r.d.c.kc = gpu(DType::kF32, {32, 16, 4, 128}, kKc), r.d.c.vc = gpu(DType::kF32, {32, 16, 4, 128}, kVc);
    r.d.q = gpu(DType::kF32, {3, 8, 128}, kAk), r.d.out = gpu(DType::kF32, {3, 8, 128}, kAv);
    rejected(r, {op + "'q'", "expected fp16 or bf16 (decode rung 3)", "got fp32"});
  }
  {
    RunCall r;  // the decode's own checks come first
    r.d.q = gpu(kBf, {3, 8, 64}, kAk);
    rejected(r, {op + "'q'", "expected shape [3, 8, 128]"});
  }
  {
    RunCall r;
    r.d.lse = gpu(DType::kF32, {3, 4}, kBi);
    rejected(r, {op + "'lse'", "expected shape [3, 8]"});
  }
}

TEST(PagedKvValidation, DecodePlan) {
  const std::string op = "batch_decode_plan: argument ";
  int32_t host[4] = {0, 1, 3, 3};
  const TensorView ptr(host, kI32, {4}, testing::kCpu), ws = gpu(DType::kU8, {1 << 20}, kWs);
  const auto plan = [&](const TensorView& p, int64_t page_size, int64_t nheads, int64_t nheads_kv, int64_t d,
                        const TensorView& w, const std::vector<std::string>& pieces) {
    testing::expect_rejected([&] { batch_decode_plan(p, page_size, nheads, nheads_kv, d, w); }, pieces);
  };
  plan(gpu(kI32, {4}, kPtr), 16, 8, 4, 128, ws, {op + "'kv_indptr_host'", "a host tensor (cpu or cuda_host)", "got cuda:0"});
  plan(TensorView(host, DType::kI64, {2}, testing::kCpu), 16, 8, 4, 128, ws, {op + "'kv_indptr_host'", "dtype int32"});
  plan(TensorView(host, kI32, {2, 2}, testing::kCpu), 16, 8, 4, 128, ws, {op + "'kv_indptr_host'", "1 dims"});
  plan(TensorView(host, kI32, {2}, {2}, testing::kCpu), 16, 8, 4, 128, ws, {op + "'kv_indptr_host'", "contiguous"});
  plan(TensorView(host, kI32, {0}, testing::kCpu), 16, 8, 4, 128, ws, {op + "'kv_indptr_host'", "(batch + 1,) values"});
  plan(ptr, 0, 8, 4, 128, ws, {op + "'page_size'", "expected >= 1", "got 0"});
  plan(ptr, 16, 8, 4, 128, TensorView(testing::fake(0, kWs), DType::kU8, {1 << 20}, testing::kCpu),
       {op + "'workspace'", "expected a CUDA tensor", "got cpu"});
  // The shape's checks (batch_decode_workspace_bytes'), before the device's.
  plan(ptr, 16, 6, 4, 128, ws, {"batch_decode_workspace_bytes: argument 'nheads'", "multiple of nheads_kv (4)", "got 6"});
  plan(ptr, 16, 8, 0, 128, ws, {"batch_decode_workspace_bytes: argument 'nheads_kv'", "got 0"});
  plan(ptr, 16, 8, 4, 100, ws, {"batch_decode_workspace_bytes: argument 'headdim'", "got 100"});
}

TEST(PagedKvValidation, DecodeWorkspaceBytes) {
  const std::string op = "batch_decode_workspace_bytes: argument ";
  const auto bytes = [](int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t d, const std::vector<std::string>& pieces) {
    testing::expect_rejected([&] { batch_decode_workspace_bytes(batch, nheads, nheads_kv, d, 0); }, pieces);
  };
  bytes(65536, 8, 4, 128, {op + "'batch'", "0 .. 65535", "got 65536"});
  bytes(-1, 8, 4, 128, {op + "'batch'", "got -1"});
  bytes(3, 8, 0, 128, {op + "'nheads_kv'", "got 0"});
  bytes(3, 12, 8, 128, {op + "'nheads'", "a multiple of nheads_kv (8)", "got 12"});
  bytes(3, -4, 4, 128, {op + "'nheads'", "got -4"});
  bytes(3, 0, 4, 128, {op + "'nheads'", "at least 1", "got 0"});  // (divided by zero once)
  bytes(3, 8, 4, 160, {op + "'headdim'", "32, 64, 96, 128, 192 or 256", "got 160"});
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// batch_prefill_paged: 3 requests, 30 packed queries of 8 heads x 128, over Call's NHD cache.
struct Prefill {
  Call c;
  TensorView q = gpu(kBf, {30, 8, 128}, kAk), out = gpu(kBf, {30, 8, 128}, kAv), lse = gpu(DType::kF32, {30, 8}, kBi);
  TensorView qo = gpu(kI32, {4}, kPos);
  const TensorView* lse_ptr = &lse;
  PagedPrefillOptions opt;
  int64_t max_qo_len = -1;
  int rung = kPagedPrefillRungs;
  void run() const {
    batch_prefill_paged(q, qo, c.kc, c.vc, c.ind, c.ptr, c.last, out, lse_ptr, c.layout, opt, max_qo_len, nullptr, rung);
  }
};

void rejected(const Prefill& p, const std::vector<std::string>& pieces) {
  testing::expect_rejected([&] { p.run(); }, pieces);
}

TEST(PagedKvValidation, Prefill) {
  const std::string op = "batch_prefill_paged: argument ";
  {
    Prefill p;
    p.rung = 3;
    rejected(p, {op + "'rung'", "expected 1..2", "got 3"});
  }
  {
    Prefill p;
    p.qo = gpu(kI32, {3}, kPos);
    rejected(p, {op + "'qo_indptr'", "expected shape [4]", "got [3]"});
  }
  {
    Prefill p;
    p.qo = gpu(DType::kI64, {4}, kPos);
    rejected(p, {op + "'qo_indptr'", "dtype"});
  }
  {
    Prefill p;  // fp32: the tensor-core rungs take 16-bit inputs
    p.c.kc = gpu(DType::kF32, {32, 16, 4, 128}, kKc), p.c.vc = gpu(DType::kF32, {32, 16, 4, 128}, kVc);
    p.q = gpu(DType::kF32, {30, 8, 128}, kAk), p.out = gpu(DType::kF32, {30, 8, 128}, kAv);
    rejected(p, {op + "'q'", "dtype", "fp32"});
  }
  {
    Prefill p;
    p.q = gpu(DType::kF16, {30, 8, 128}, kAk);
    rejected(p, {op + "'q'", "dtype"});
  }
  {
    Prefill p;  // head dim 96: rung 3 and 4 have it, the paged kernels are built for 64, 128, 256
    p.c.kc = gpu(kBf, {32, 16, 4, 96}, kKc), p.c.vc = gpu(kBf, {32, 16, 4, 96}, kVc);
    p.q = gpu(kBf, {30, 8, 96}, kAk), p.out = gpu(kBf, {30, 8, 96}, kAv);
    rejected(p, {op + "'q'", "64, 128 or 256", "got 96"});
  }
  {
    Prefill p;
    p.q = gpu(kBf, {30, 6, 128}, kAk), p.out = gpu(kBf, {30, 6, 128}, kAv), p.lse = gpu(DType::kF32, {30, 6}, kBi);
    rejected(p, {op + "'q'", "a multiple of the cache's KV heads (4)", "got 6"});
  }
  {
    Prefill p;
    p.out = gpu(kBf, {30, 8, 64}, kAv);
    rejected(p, {op + "'out'", "expected shape [30, 8, 128]"});
  }
  {
    Prefill p;
    p.out = gpu(kBf, {30, 8, 128}, kAk);  // the same memory as q
    rejected(p, {op + "'out'", "disjoint from 'q'"});
  }
  {
    Prefill p;
    p.lse = gpu(DType::kF32, {8, 30}, kBi);  // (nheads, total_q): the prefill's is (total_q, nheads)
    rejected(p, {op + "'lse'", "expected shape [30, 8]", "got [8, 30]"});
  }
  {
    Prefill p;
    p.lse = gpu(DType::kF32, {30, 8}, kPos);  // over qo_indptr
    rejected(p, {op + "'lse'", "qo_indptr"});
  }
  {
    Prefill p;
    p.opt.window_left = -2;
    rejected(p, {op + "'window_left'", "expected >= -1", "got -2"});
  }
  {
    Prefill p;
    p.opt.softcap = -1.f;
    rejected(p, {op + "'softcap'", "expected a finite value >= 0", "got -1"});
  }
  {
    Prefill p;
    p.opt.softmax_scale = INFINITY;
    rejected(p, {op + "'softmax_scale'", "expected a finite value"});
  }
  {
    Prefill p;
    p.max_qo_len = -2;
    rejected(p, {op + "'max_qo_len'", "got -2"});
  }
  {
    Prefill p;  // q strides no TMA can walk: a broadcast head dim of stride 0
    p.q = TensorView(testing::fake(0, kAk), kBf, {30, 8, 128}, {128, 0, 1}, testing::kGpu);
    rejected(p, {op + "'q'", "positive strides on every dim of size > 1 for rung 2"});
  }
  {
    Prefill p;
    p.c.layout = static_cast<KvLayout>(2);
    rejected(p, {op + "'layout'", "expected NHD or HND"});
  }
  {
    Prefill p;  // a key's offset in its page, slot x slot stride (32-bit in the kernels), past 2^31
    p.c.kc = TensorView(testing::fake(0, kWs), kBf, {32, 16, 4, 128}, {4 * 128, 150'000'000, 128, 1}, testing::kGpu);
    rejected(p, {op + "'k_cache'", "(page_size - 1) x slot stride + head dim are below 2^31", "at page_size 16"});
  }
  {
    Prefill p;  // pages in reverse order (a negative page stride): no TMA map for rung 2, rung 1 takes it
    const int64_t page = 16 * 4 * 128;
    p.c.vc = TensorView(testing::fake(31 * page * 2, kVc), kBf, {32, 16, 4, 128}, {-page, 4 * 128, 128, 1}, testing::kGpu);
    rejected(p, {op + "'v_cache'", "positive strides on every dim of size > 1 for rung 2"});
    p.rung = 1;  // past every host check: the device guard's first CUDA call
    if (!has_gpu()) testing::expect_rejected([&] { p.run(); }, {"CUDA error"});
  }
}

// batch_prefill_paged_run: Prefill's call under a plan that matches it (the index tensors'
// addresses, 3 requests, 30 rows, pages of 16, 32 pages in the pool).
struct PrefillRun {
  Prefill p;
  PrefillPlanInfo plan = [this] {
    PrefillPlanInfo x;
    x.batch = 3, x.total_q = 30, x.max_qo_len = 12, x.page_size = 16, x.kv_pages = 40, x.pages_used = 32, x.device = 0;
    x.qo_indptr = reinterpret_cast<uint64_t>(p.qo.data), x.kv_indices = reinterpret_cast<uint64_t>(p.c.ind.data);
    x.kv_indptr = reinterpret_cast<uint64_t>(p.c.ptr.data), x.kv_last_page_len = reinterpret_cast<uint64_t>(p.c.last.data);
    return x;
  }();
  void run() const {
    batch_prefill_paged_run(plan, p.q, p.qo, p.c.kc, p.c.vc, p.c.ind, p.c.ptr, p.c.last, p.out, p.lse_ptr, p.c.layout, p.opt,
                            nullptr, p.rung);
  }
};

TEST(PagedKvValidation, PrefillRun) {
  const std::string op = "batch_prefill_paged_run: argument ";
  const auto rejected = [](const PrefillRun& r, const std::vector<std::string>& pieces) {
    testing::expect_rejected([&] { r.run(); }, pieces);
  };
  {
    PrefillRun r;  // the tensors' own checks first, named by the run
    r.p.q = gpu(kBf, {30, 8, 64}, kAk);
    rejected(r, {op + "'q'", "expected shape [30, 8, 128]"});
  }
  {
    PrefillRun r;
    r.p.c.ind = gpu(kI32, {40}, kPos, 64);  // another tensor than the one planned
    rejected(r, {op + "'kv_indices'", "the tensor the plan read", "got address 0x"});
  }
  {
    PrefillRun r;
    r.plan.kv_last_page_len += 16;
    rejected(r, {op + "'kv_last_page_len'", "the tensor the plan read"});
  }
  {
    PrefillRun r;
    r.plan.batch = 2;
    rejected(r, {op + "'kv_last_page_len'", "the plan's batch of 2", "got 3"});
  }
  {
    PrefillRun r;
    r.plan.total_q = 31;
    rejected(r, {op + "'q'", "the plan's 31 rows", "got 30"});
  }
  {
    PrefillRun r;
    r.plan.kv_pages = 41;
    rejected(r, {op + "'kv_indices'", "at least the plan's 41 pages", "got 40"});
  }
  {
    PrefillRun r;
    r.plan.page_size = 64;
    rejected(r, {op + "'k_cache'", "the plan's page size 64", "got 16"});
  }
  {
    PrefillRun r;  // the table reaches page 32 of a pool of 32
    r.plan.pages_used = 33;
    rejected(r, {op + "'k_cache'", "a pool of at least 33 pages", "got 32 pages"});
  }
  {
    PrefillRun r;
    r.plan.device = 1;
    rejected(r, {op + "'plan'", "expected a plan of q's device (0)", "got one of device 1"});
  }
  if (!has_gpu()) {
    PrefillRun r;  // the plan matches: past every host check, the device guard's first CUDA call
    testing::expect_rejected([&] { r.run(); }, {"CUDA error"});
  }
}

TEST(PagedKvValidation, PrefillPlan) {
  const std::string op = "batch_prefill_paged_plan: argument ";
  const Prefill p;
  const auto plan = [&](const TensorView& qo, const TensorView& ind, int64_t page_size, const std::vector<std::string>& pieces) {
    testing::expect_rejected([&] { batch_prefill_paged_plan(qo, ind, p.c.ptr, p.c.last, page_size); }, pieces);
  };
  plan(gpu(kI32, {3}, kPos), p.c.ind, 16, {op + "'qo_indptr'", "expected shape [4]", "got [3]"});
  plan(gpu(DType::kI64, {4}, kPos), p.c.ind, 16, {op + "'qo_indptr'", "dtype"});
  plan(p.qo, gpu(kI32, {8, 5}, kInd), 16, {op + "'kv_indices'", "1 dims"});
  plan(TensorView(testing::fake(0, kPos), kI32, {4}, testing::kCpu), p.c.ind, 16,
       {op + "'kv_indices'", "expected a tensor on cpu (as 'qo_indptr')", "got cuda:0"});
  plan(p.qo, p.c.ind, 0, {op + "'page_size'", "expected a value in [1, 2^31)", "got 0"});
  if (!has_gpu()) plan(p.qo, p.c.ind, 16, {"CUDA error"});  // past every host check: the device guard
}

// The plan's value checks, on host tensors (read directly): what it finds, and each rejection.
TEST(PagedKvValidation, PrefillPlanOfHostTables) {
  const std::string op = "batch_prefill_paged_plan: argument ";
  struct Table {
    std::vector<int> qo{0, 5, 5, 17}, ptr{0, 2, 2, 5}, last{3, 0, 16}, ind{7, 0, 4, 31, 2, 99};
    PrefillPlanInfo plan(int64_t page_size = 16) {
      const auto host = [](std::vector<int>& v) { return TensorView(v.data(), kI32, {static_cast<int64_t>(v.size())}, testing::kCpu); };
      return batch_prefill_paged_plan(host(qo), host(ind), host(ptr), host(last), page_size);
    }
  };
  Table t;
  const PrefillPlanInfo plan = t.plan();
  EXPECT_EQ(plan.batch, 3);
  EXPECT_EQ(plan.total_q, 17);
  EXPECT_EQ(plan.max_qo_len, 12);
  EXPECT_EQ(plan.page_size, 16);
  EXPECT_EQ(plan.kv_pages, 5);
  EXPECT_EQ(plan.pages_used, 32);  // index 99 lies past kv_indptr[3] = 5: not read
  EXPECT_EQ(plan.device, -1);
  EXPECT_EQ(plan.kv_indices, reinterpret_cast<uint64_t>(t.ind.data()));
  // The plan of Table{} changed by `change`: rejected with `pieces`.
  const auto rejected = [&](const std::function<void(Table&)>& change, const std::vector<std::string>& pieces,
                            int64_t page_size = 16) {
    Table bad;
    change(bad);
    testing::expect_rejected([&] { bad.plan(page_size); }, pieces);
  };
  rejected([](Table& x) { x.last[0] = 17; },
           {op + "'kv_last_page_len'", "values in [1, page_size = 16]", "kv_last_page_len[0] = 17"});
  rejected([](Table&) {}, {op + "'kv_last_page_len'", "values in [1, page_size = 8]", "kv_last_page_len[2] = 16"}, 8);
  rejected([](Table& x) { x.last[1] = 1; },
           {op + "'kv_last_page_len'", "0 for a request without pages", "kv_last_page_len[1] = 1"});
  rejected([](Table& x) { x.ind[3] = -2; }, {op + "'kv_indices'", "page indices >= 0", "kv_indices[3] = -2"});
  rejected([](Table& x) { x.ptr = {0, 2, 1, 5}; },
           {op + "'kv_indptr'", "non-decreasing", "kv_indptr[2] = 1 < kv_indptr[1] = 2"});
  rejected([](Table& x) { x.ptr = {1, 2, 2, 5}; }, {op + "'kv_indptr'", "kv_indptr[0] = 0", "got kv_indptr[0] = 1"});
  rejected([](Table& x) { x.ptr = {0, 2, 2, 7}; }, {op + "'kv_indices'", "at least kv_indptr[3] = 7 pages", "got 6"});
  rejected([](Table& x) { x.qo = {0, 5, 4, 17}; },
           {op + "'qo_indptr'", "non-decreasing", "cu_seqlens[2] = 4 < cu_seqlens[1] = 5"});
  rejected([](Table& x) { x.qo = {2, 5, 5, 17}; }, {op + "'qo_indptr'", "cu_seqlens[0] = 0", "got cu_seqlens[0] = 2"});
}

// Valid calls pass every host check: on a machine without a GPU the first CUDA call then fails.
TEST(PagedKvValidation, ValidCallsPassTheHostChecks) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present: the fake pointers would reach it";
  const auto passes = [](const Call& c) {
    const int64_t launches = check::launch_count();
    try {
      c.run();
      ADD_FAILURE() << "expected a CUDA error on a machine without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA error"), std::string::npos) << e.what();
    }
    EXPECT_EQ(check::launch_count(), launches);
  };
  passes(Call{});
  Call hnd;
  hnd.layout = KvLayout::kHND;
  hnd.kc = gpu(kBf, {32, 4, 16, 128}, kKc), hnd.vc = gpu(kBf, {32, 4, 16, 128}, kVc);
  passes(hnd);
  Call f32;
  f32.ak = gpu(DType::kF32, {5, 4, 4}, kAk), f32.av = gpu(DType::kF32, {5, 4, 4}, kAv);
  f32.kc = gpu(DType::kF32, {32, 1, 4, 4}, kKc), f32.vc = gpu(DType::kF32, {32, 1, 4, 4}, kVc);  // page size 1
  passes(f32);
  Call none;  // no new tokens
  none.ak = gpu(kBf, {0, 4, 128}, kAk), none.av = gpu(kBf, {0, 4, 128}, kAv);
  none.bi = gpu(kI32, {0}, kBi), none.pos = gpu(kI32, {0}, kPos);
  passes(none);
  // One (max_pages, 2, page_size, heads, d) tensor: k = t[:, 0], v = t[:, 1] interleave page by
  // page without sharing an element (their address ranges overlap).
  Call one;
  const int64_t page = 16 * 4 * 128;
  one.kc = TensorView(testing::fake(0, kKc), kBf, {32, 16, 4, 128}, {2 * page, 4 * 128, 128, 1}, testing::kGpu);
  one.vc = TensorView(testing::fake(page * 2, kKc), kBf, {32, 16, 4, 128}, {2 * page, 4 * 128, 128, 1}, testing::kGpu);
  passes(one);
  Prefill pf;  // past every host check: the device guard's first CUDA call
  testing::expect_rejected([&] { pf.run(); }, {"CUDA error"});
  Decode d;
  testing::expect_rejected([&] { d.run(); }, {"CUDA error"});  // past every host check: the device read
  d.lse_ptr = nullptr;
  testing::expect_rejected([&] { d.run(); }, {"CUDA error"});
  RunCall r;  // the plan matches the call: on to the device's capacity
  testing::expect_rejected([&] { r.run(); }, {"CUDA error"});
  int32_t host[4] = {0, 1, 3, 3};
  testing::expect_rejected(
      [&] { batch_decode_plan(TensorView(host, kI32, {4}, testing::kCpu), 16, 8, 4, 128, r.ws); }, {"CUDA error"});
  testing::expect_rejected([&] { batch_decode_workspace_bytes(3, 8, 4, 128, 0); }, {"CUDA error"});
}

}  // namespace
}  // namespace flashlab
