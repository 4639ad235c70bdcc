// append_paged_kv_cache (include/flashlab/serving.h) on the device: random batches whose page
// tables take pages from a shuffled pool, each request appending its last tokens (decode: one;
// prefill/append: several); the whole cache, pre-filled with random bytes, must equal the host's
// scatter of the same tokens byte for byte (the appended slots written, every other byte kept).
// Page sizes 1, 16, 64, layouts NHD and HND, fp32 / fp16 / bf16, K/V rows strided as slices of a
// packed QKV tensor. Then the checks that read the int32 arrays: each bad value rejected with its
// argument named, nothing launched, the cache unchanged.
// batch_decode_paged (every rung) against a float64 reference over the same page table: GQA, page
// sizes 1, 16, 64, both layouts, groups 1, 2, 3, 4, 5, 6, 8, 9, 12 (rung 2's head chunks), head
// dims 32, 64, 96, 128, 192, 256, requests of 0 .. 1000 keys; outputs poisoned (NaN) first.
// Tolerance: the kernel computes in fp32 from the exact stored values and rounds out once, so
// |out - ref| <= u(dtype) |ref| + (L + 8) 2^-23 max|v| (a sum of L fp32 terms whose weights
// sum to 1, plus the exp2 errors), |lse - ref| <= (L + 8) 2^-23 (1 + |ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashlab/serving.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

std::vector<uint8_t> int32_bytes(const std::vector<int>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A batch on the device: the page table, the new tokens (K and V rows inside a packed
// (nnz, 2 + extra heads, ...) buffer: strided rows) and the caches.
struct PagedCase {
  DType dt;
  int64_t page_size, nheads, d, max_pages;
  KvLayout layout;
  std::vector<int64_t> lens, appended;  // per request: KV length after the append, tokens appended
};

struct PagedRun {
  std::vector<int> indptr, indices, last, bi, pos;
  std::vector<uint8_t> k_cache, v_cache, k_new, v_new;  // cache bytes before; new rows (nnz, nheads, d) packed
};

// The host's reference: where token (b, j), head h, element x of the cache lives, in elements.
int64_t cache_offset(const PagedCase& c, int64_t page, int64_t slot, int64_t h) {
  return c.layout == KvLayout::kNHD ? ((page * c.page_size + slot) * c.nheads + h) * c.d
                                    : ((page * c.nheads + h) * c.page_size + slot) * c.d;
}

PagedRun make_run(const PagedCase& c, std::mt19937_64& rng) {
  PagedRun r;
  std::vector<int> pool(static_cast<size_t>(c.max_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  r.indptr.push_back(0);
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int64_t pages = (c.lens[b] + c.page_size - 1) / c.page_size;
    for (int64_t x = 0; x < pages; ++x) r.indices.push_back(pool.at(r.indices.size()));
    r.indptr.push_back(static_cast<int>(r.indices.size()));
    r.last.push_back(static_cast<int>(pages > 0 ? c.lens[b] - (pages - 1) * c.page_size : 0));
    for (int64_t j = c.lens[b] - c.appended[b]; j < c.lens[b]; ++j) r.bi.push_back(static_cast<int>(b)), r.pos.push_back(static_cast<int>(j));
  }
  // Tokens in a shuffled order (the kernel must not assume them sorted).
  std::vector<size_t> order(r.bi.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> bi, pos;
  for (size_t i : order) bi.push_back(r.bi[i]), pos.push_back(r.pos[i]);
  r.bi = bi, r.pos = pos;
  const int64_t es = dtype_size(c.dt), cache_bytes = c.max_pages * c.page_size * c.nheads * c.d * es;
  r.k_cache = random_bytes(static_cast<size_t>(cache_bytes), rng), r.v_cache = random_bytes(static_cast<size_t>(cache_bytes), rng);
  const size_t new_bytes = r.bi.size() * static_cast<size_t>(c.nheads * c.d * es);
  r.k_new = random_bytes(new_bytes, rng), r.v_new = random_bytes(new_bytes, rng);
  return r;
}

// Device buffers of a run and the views of one call.
struct DeviceRun {
  const PagedCase& c;
  int64_t nnz, row_elems;  // K at head 0, V at head nheads of a packed row of 2 nheads + 1 heads
  DeviceBuffer packed, kc, vc, indptr, indices, last, bi, pos;
  DeviceRun(const PagedCase& cs, const PagedRun& r)
      : c(cs), nnz(static_cast<int64_t>(r.bi.size())), row_elems((2 * cs.nheads + 1) * cs.d),
        packed(std::max<size_t>(static_cast<size_t>(nnz * row_elems * dtype_size(cs.dt)), 16)), kc(r.k_cache.size()),
        vc(r.v_cache.size()), indptr(r.indptr.size() * 4), indices(std::max<size_t>(r.indices.size(), 1) * 4),
        last(std::max<size_t>(r.last.size(), 1) * 4), bi(std::max<size_t>(r.bi.size(), 1) * 4), pos(std::max<size_t>(r.pos.size(), 1) * 4) {
    const int64_t es = dtype_size(c.dt), head_bytes = c.nheads * c.d * es;
    packed.poison();
    if (nnz > 0) {
      upload_row_bytes(packed.ptr, r.k_new.data(), nnz, head_bytes, row_elems * es);
      upload_row_bytes(packed.at(static_cast<size_t>(head_bytes)), r.v_new.data(), nnz, head_bytes, row_elems * es);
    }
    upload(kc.ptr, r.k_cache);
    upload(vc.ptr, r.v_cache);
    upload(indptr.ptr, int32_bytes(r.indptr));
    if (!r.indices.empty()) upload(indices.ptr, int32_bytes(r.indices));
    upload(last.ptr, int32_bytes(r.last));
    if (nnz > 0) upload(bi.ptr, int32_bytes(r.bi)), upload(pos.ptr, int32_bytes(r.pos));
  }
  void run(const PagedRun& r) const {
    const int64_t es = dtype_size(c.dt);
    const std::vector<int64_t> cache_shape = c.layout == KvLayout::kNHD ? std::vector<int64_t>{c.max_pages, c.page_size, c.nheads, c.d}
                                                                        : std::vector<int64_t>{c.max_pages, c.nheads, c.page_size, c.d};
    const TensorView k(packed.ptr, c.dt, {nnz, c.nheads, c.d}, {row_elems, c.d, 1}, kGpu),
        v(packed.at(static_cast<size_t>(c.nheads * c.d * es)), c.dt, {nnz, c.nheads, c.d}, {row_elems, c.d, 1}, kGpu);
    const int64_t batch = static_cast<int64_t>(r.last.size());
    append_paged_kv_cache(k, v, device_view(bi.ptr, DType::kI32, {nnz}), device_view(pos.ptr, DType::kI32, {nnz}),
                          device_view(kc.ptr, c.dt, cache_shape), device_view(vc.ptr, c.dt, cache_shape),
                          device_view(indices.ptr, DType::kI32, {static_cast<int64_t>(std::max<size_t>(r.indices.size(), 1))}),
                          device_view(indptr.ptr, DType::kI32, {batch + 1}), device_view(last.ptr, DType::kI32, {batch}),
                          c.layout);
  }
};

void check_case(const PagedCase& c, std::mt19937_64& rng) {
  const PagedRun r = make_run(c, rng);
  const DeviceRun dev(c, r);
  dev.run(r);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // The reference: the same scatter on the host.
  std::vector<uint8_t> want_k = r.k_cache, want_v = r.v_cache;
  const int64_t es = dtype_size(c.dt), row = c.d * es;
  for (size_t i = 0; i < r.bi.size(); ++i) {
    const int b = r.bi[i], j = r.pos[i];
    const int64_t page = r.indices[static_cast<size_t>(r.indptr[b] + j / c.page_size)], slot = j % c.page_size;
    for (int64_t h = 0; h < c.nheads; ++h) {
      const size_t src = (i * c.nheads + h) * row, dst = static_cast<size_t>(cache_offset(c, page, slot, h) * es);
      std::copy_n(r.k_new.begin() + src, row, want_k.begin() + dst);
      std::copy_n(r.v_new.begin() + src, row, want_v.begin() + dst);
    }
  }
  const ::testing::Message what = ::testing::Message() << dtype_name(c.dt) << " page_size " << c.page_size << " nheads "
                                                       << c.nheads << " d " << c.d << (c.layout == KvLayout::kNHD ? " NHD" : " HND");
  EXPECT_TRUE(download(dev.kc.ptr, dev.kc.bytes) == want_k) << what << ": k_cache";
  EXPECT_TRUE(download(dev.vc.ptr, dev.vc.bytes) == want_v) << what << ": v_cache";
}

TEST(PagedKv, AppendMatchesTheHostScatter) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(811);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t page_size : {1, 16, 64})
      for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
        PagedCase c{dt, page_size, 4, dt == DType::kF32 ? 64 : 128, 0, layout, {}, {}};
        // Decode (one token each), prefill (the whole request), empty requests, lengths on and
        // off page boundaries.
        c.lens = {1, 17, 0, 64, 200, 33, 5};
        c.appended = {1, 1, 0, 64, 9, 33, 2};
        int64_t pages = 0;
        for (int64_t l : c.lens) pages += (l + page_size - 1) / page_size;
        c.max_pages = pages + 7;  // pages no request owns stay untouched
        check_case(c, rng);
      }
  PagedCase wide{DType::kBF16, 16, 8, 256, 64, KvLayout::kNHD, {300, 1, 40}, {3, 1, 40}};  // GQA-sized heads, d 256
  check_case(wide, rng);
  PagedCase none{DType::kBF16, 16, 2, 64, 8, KvLayout::kHND, {20, 3}, {0, 0}};  // nothing appended: the cache as it was
  check_case(none, rng);
}

// The value checks: each reading of the int32 arrays that breaks the page table's contract.
TEST(PagedKv, RejectsBadTableValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(812);
  const PagedCase c{DType::kBF16, 16, 2, 64, 16, KvLayout::kNHD, {20, 33, 0}, {2, 1, 0}};
  const PagedRun good = make_run(c, rng);
  const std::string op = "append_paged_kv_cache: argument ";
  const auto rejected = [&](const PagedRun& bad, const std::vector<std::string>& pieces) {
    const DeviceRun dev(c, bad);
    expect_rejected([&] { dev.run(bad); }, pieces);
    EXPECT_TRUE(download(dev.kc.ptr, dev.kc.bytes) == bad.k_cache) << pieces[0] << ": the cache changed";
  };
  PagedRun r = good;
  r.indptr[0] = 1;
  rejected(r, {op + "'kv_indptr'", "expected kv_indptr[0] = 0", "got kv_indptr[0] = 1"});
  r = good;
  std::swap(r.indptr[1], r.indptr[2]);
  rejected(r, {op + "'kv_indptr'", "non-decreasing"});
  r = good;
  r.last[0] = 17;
  rejected(r, {op + "'kv_last_page_len'", "[1, page_size = 16]", "kv_last_page_len[0] = 17"});
  r = good;
  r.last[2] = 1;  // request 2 has no pages
  rejected(r, {op + "'kv_last_page_len'", "0 for a request without pages"});
  r = good;
  r.indices[1] = 16;
  rejected(r, {op + "'kv_indices'", "page indices in [0, 16)", "kv_indices[1] = 16"});
  r = good;
  r.indices[0] = -1;
  rejected(r, {op + "'kv_indices'", "kv_indices[0] = -1"});
  r = good;
  r.bi[0] = 3;
  rejected(r, {op + "'batch_indices'", "requests in [0, 3)", "batch_indices[0] = 3"});
  r = good;
  r.pos[0] = r.bi[0] == 0 ? 20 : 33;  // one past the request's length
  rejected(r, {op + "'positions'", "inside the request's KV length"});
  r = good;
  r.pos[0] = -1;
  rejected(r, {op + "'positions'", "positions[0] = -1"});
}

void check_decode_on(int rung, DType dt, int64_t page_size, KvLayout layout, int64_t nheads, int64_t nheads_kv, int64_t d,
                     const std::vector<int64_t>& lens, std::mt19937_64& rng) {
  const PagedCase c{dt, page_size, nheads_kv, d, 0, layout, lens, std::vector<int64_t>(lens.size(), 0)};
  int64_t pages = 0;
  for (int64_t l : lens) pages += (l + page_size - 1) / page_size;
  PagedCase cs = c;
  cs.max_pages = pages + 3;
  const PagedRun r = make_run(cs, rng);  // the page table (its random cache bytes are not used)
  const int64_t batch = static_cast<int64_t>(lens.size()), cache_n = cs.max_pages * page_size * nheads_kv * d;
  const HostTensor kc = random_tensor(dt, cache_n, rng), vc = random_tensor(dt, cache_n, rng);
  const HostTensor q = random_tensor(dt, batch * nheads * d, rng);
  DeviceBuffer bq(q.bytes.size()), bk(kc.bytes.size()), bv(vc.bytes.size()), bo(q.bytes.size()), blse(batch * nheads * 4),
      bind(std::max<size_t>(r.indices.size(), 1) * 4), bptr(r.indptr.size() * 4), blast(r.last.size() * 4);
  upload(bq.ptr, q.bytes);
  upload(bk.ptr, kc.bytes);
  upload(bv.ptr, vc.bytes);
  if (!r.indices.empty()) upload(bind.ptr, int32_bytes(r.indices));
  upload(bptr.ptr, int32_bytes(r.indptr));
  upload(blast.ptr, int32_bytes(r.last));
  bo.poison();
  blse.poison();
  const std::vector<int64_t> cache_shape = layout == KvLayout::kNHD ? std::vector<int64_t>{cs.max_pages, page_size, nheads_kv, d}
                                                                    : std::vector<int64_t>{cs.max_pages, nheads_kv, page_size, d};
  const TensorView lse = device_view(blse.ptr, DType::kF32, {batch, nheads});
  batch_decode_paged(device_view(bq.ptr, dt, {batch, nheads, d}), device_view(bk.ptr, dt, cache_shape),
                     device_view(bv.ptr, dt, cache_shape),
                     device_view(bind.ptr, DType::kI32, {static_cast<int64_t>(std::max<size_t>(r.indices.size(), 1))}),
                     device_view(bptr.ptr, DType::kI32, {batch + 1}), device_view(blast.ptr, DType::kI32, {batch}),
                     device_view(bo.ptr, dt, {batch, nheads, d}), &lse, layout, 0.f, nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> got = decode(dt, download(bo.ptr, bo.bytes)), got_lse = decode(DType::kF32, download(blse.ptr, blse.bytes));
  double max_v = 0;
  for (double x : vc.values) max_v = std::max(max_v, std::fabs(x));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  int64_t bad = 0, bad_lse = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < nheads; ++h) {
      const int64_t hk = h / (nheads / nheads_kv), len = lens[b];
      std::vector<double> sc(static_cast<size_t>(len));
      double m = -std::numeric_limits<double>::infinity();
      const auto at = [&](int64_t j, int64_t x) {
        const int64_t page = r.indices[static_cast<size_t>(r.indptr[b] + j / page_size)];
        return static_cast<size_t>(cache_offset(cs, page, j % page_size, hk) + x);
      };
      for (int64_t j = 0; j < len; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += q.values[static_cast<size_t>((b * nheads + h) * d + x)] * kc.values[at(j, x)];
        sc[j] = dot * scale, m = std::max(m, sc[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += std::exp(sc[j] - m);
      const double tol = (len + 8) * std::ldexp(1.0, -23);
      for (int64_t x = 0; x < d; ++x) {
        double o = 0;
        for (int64_t j = 0; j < len; ++j) o += std::exp(sc[j] - m) / sum * vc.values[at(j, x)];
        const double g = got[static_cast<size_t>((b * nheads + h) * d + x)];
        bad += !(std::fabs(g - o) <= unit_roundoff(dt) * std::fabs(o) + tol * max_v);  // NaN fails too
      }
      const double ref_lse = len > 0 ? m + std::log(sum) : -std::numeric_limits<double>::infinity();
      const double gl = got_lse[static_cast<size_t>(b * nheads + h)];
      bad_lse += len > 0 ? !(std::fabs(gl - ref_lse) <= tol * (1 + std::fabs(ref_lse))) : !(gl == ref_lse);
    }
  const ::testing::Message what = ::testing::Message() << "rung " << rung << " " << dtype_name(dt) << " page_size " << page_size
                                                       << " heads " << nheads << "/" << nheads_kv << " d " << d;
  EXPECT_EQ(bad, 0) << what << ": out elements outside the tolerance";
  EXPECT_EQ(bad_lse, 0) << what << ": lse outside the tolerance";
}

// Every rung.
void check_decode(DType dt, int64_t page_size, KvLayout layout, int64_t nheads, int64_t nheads_kv, int64_t d,
                  const std::vector<int64_t>& lens, std::mt19937_64& rng) {
  for (int rung = 1; rung <= kPagedDecodeRungs; ++rung) check_decode_on(rung, dt, page_size, layout, nheads, nheads_kv, d, lens, rng);
}

TEST(PagedDecode, MatchesTheReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(813);
  const std::vector<int64_t> lens = {0, 1, 17, 64, 300, 1000};  // an empty request: out 0, lse -inf
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND})
    for (int64_t page_size : {1, 16}) check_decode(DType::kBF16, page_size, layout, 8, 2, 128, lens, rng);
  check_decode(DType::kF16, 16, KvLayout::kNHD, 4, 4, 64, lens, rng);   // MHA
  check_decode(DType::kF32, 64, KvLayout::kHND, 8, 1, 256, lens, rng);  // MQA, d 256
  check_decode(DType::kBF16, 16, KvLayout::kNHD, 4, 2, 96, {5, 40}, rng);
  // Rung 2's head chunks: a group of 6 (one chunk of 8, 6 used), of 12 (8 + 4), of 3 (4, 3 used).
  check_decode(DType::kF16, 16, KvLayout::kHND, 12, 2, 64, {3, 100, 0}, rng);
  check_decode(DType::kBF16, 1, KvLayout::kNHD, 12, 1, 192, {7, 65}, rng);
  check_decode(DType::kBF16, 16, KvLayout::kNHD, 6, 2, 32, {33, 1}, rng);
  check_decode(DType::kBF16, 16, KvLayout::kNHD, 5, 1, 128, {50}, rng);  // one chunk of 8, 5 used
  check_decode(DType::kF16, 16, KvLayout::kHND, 9, 1, 64, {20, 2}, rng);  // chunks 8 + 1
}

// The decode checks the page table's values as the append does (one shared function): one bad
// value, rejected before any launch, out untouched.
TEST(PagedDecode, RejectsBadTableValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(814);
  const PagedCase c{DType::kBF16, 16, 2, 64, 16, KvLayout::kNHD, {20, 33}, {0, 0}};
  PagedRun r = make_run(c, rng);
  r.last[1] = 0;  // request 1 has pages
  const DeviceRun dev(c, r);
  DeviceBuffer q(2 * 4 * 64 * 2), out(2 * 4 * 64 * 2);
  FLASHLAB_CUDA_CHECK(cudaMemset(q.ptr, 0, q.bytes));
  out.poison();
  const std::vector<int64_t> cache_shape = {c.max_pages, c.page_size, c.nheads, c.d};
  expect_rejected(
      [&] {
        batch_decode_paged(device_view(q.ptr, c.dt, {2, 4, 64}), device_view(dev.kc.ptr, c.dt, cache_shape),
                           device_view(dev.vc.ptr, c.dt, cache_shape),
                           device_view(dev.indices.ptr, DType::kI32, {static_cast<int64_t>(r.indices.size())}),
                           device_view(dev.indptr.ptr, DType::kI32, {3}), device_view(dev.last.ptr, DType::kI32, {2}),
                           device_view(out.ptr, c.dt, {2, 4, 64}));
      },
      {"batch_decode_paged: argument 'kv_last_page_len'", "kv_last_page_len[1] = 0"});
  const std::vector<uint8_t> after = download(out.ptr, out.bytes);
  EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](uint8_t x) { return x == 0xff; })) << "out was written";
}

}  // namespace
}  // namespace flashlab
