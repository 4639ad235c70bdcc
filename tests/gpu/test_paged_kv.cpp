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
// Rung 3 (split-KV): ragged batches with a long request (32k keys) that the plan cuts, groups 1,
// 4, 8, 20, 32 (two blocks of 16 query heads), against the reference and request by request
// against rung 2; uniform inputs (q = 0, V in eighths: exact sums) whose tight tolerance sees a
// single key missed or repeated in a long split request (the random inputs' tolerance, linear in
// the length, does not); fp32 at rung 3 is rung 2, bit for bit; under CUDA-graph capture (no
// plan: whole requests); plan / run on batch 1 (split, the same bits as the one-shot call); a
// captured run replayed after the page table changed in place (re-planned, or grown without a
// new plan); the plan / run checks that need the device. An e4m3 cache (k_scale 0.5, v_scale 0.25)
// at rung 3, one-shot and plan / run, against the reference over the dequantized values (random
// codes, every non-NaN one; uniform inputs too), and its argument checks.
// Tolerance (out_tol, lse_tol): the kernels compute in fp32 from the exact stored values and
// round out once, so |out - ref| <= u(dtype) |ref| + (L + 8) 2^-23 max|v| (a sum of L fp32 terms
// whose weights sum to 1, plus the exp2 errors) + 2 ds sum_j p_j |v_j|, |lse - ref| <= (L + 8)
// 2^-23 (1 + |ref|) + ds, where ds = d 2^-23 scale max_j sum_x |q_x k_j[x]| bounds a score's
// error (a dot product of d fp32 terms); rung 3 rounds P to the dtype for its tensor-core P V:
// + u(dtype) sum_j p_j |v_j| on out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashlab/serving.h"
#include "src/reference/quant.h"
#include "tests/common/paged_cache.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;
using flashlab::testing::cache_offset;  // beside the append tests' own overload below

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

// ---- Decode: inputs, the float64 reference, the tolerance, device buffers -----------------------

struct DecodeShape {
  DType dt;
  int64_t page_size;
  KvLayout layout;
  int64_t nheads, nheads_kv, d;
};

::testing::Message describe(const DecodeShape& s) {
  return ::testing::Message() << dtype_name(s.dt) << " page_size " << s.page_size << (s.layout == KvLayout::kNHD ? " NHD" : " HND")
                              << " heads " << s.nheads << "/" << s.nheads_kv << " d " << s.d;
}

// Random multiples of 1/8 in [-1, 1] (exact in fp16 and bf16).
HostTensor random_eighths(DType dt, int64_t n, std::mt19937_64& rng) {
  HostTensor t = empty_tensor(dt, n);
  for (int64_t i = 0; i < n; ++i) store_value(t, static_cast<size_t>(i), static_cast<float>(static_cast<int>(rng() % 17) - 8) / 8.f);
  return t;
}

// Host inputs: the caches (max_pages pages of random values) and the queries. uniform: q = 0 and
// V in eighths, so that every key weighs exactly 1 and every sum of the kernels is exact (see
// out_tol): a key missed or counted twice, or read from another page, shows however long the
// request.
struct DecodeInputs {
  DecodeShape s;
  int64_t batch, max_pages;
  bool uniform;
  HostTensor q, kc, vc;
  DecodeInputs(const DecodeShape& shape, int64_t b, int64_t pages, std::mt19937_64& rng, bool uni = false)
      : s(shape), batch(b), max_pages(pages), uniform(uni),
        q(uni ? empty_tensor(s.dt, b * s.nheads * s.d) : random_tensor(s.dt, b * s.nheads * s.d, rng)),
        kc(random_tensor(s.dt, pages * s.page_size * s.nheads_kv * s.d, rng)),
        vc(uni ? random_eighths(s.dt, pages * s.page_size * s.nheads_kv * s.d, rng)
               : random_tensor(s.dt, pages * s.page_size * s.nheads_kv * s.d, rng)) {}
  std::vector<int64_t> cache_shape() const {
    return s.layout == KvLayout::kNHD ? std::vector<int64_t>{max_pages, s.page_size, s.nheads_kv, s.d}
                                      : std::vector<int64_t>{max_pages, s.nheads_kv, s.page_size, s.d};
  }
};

// The float64 reference over one page table, and what the tolerance needs.
struct DecodeRef {
  std::vector<int64_t> lens;
  std::vector<double> out, lse;  // (batch, nheads, d), (batch, nheads)
  std::vector<double> pv;        // sum_j p_j |v_j[x]| per out element
  std::vector<double> ds;        // per (request, head): d 2^-23 scale max_j sum_x |q_x k_j[x]|, a score's fp32 error bound
  double max_v = 0;
};

DecodeRef decode_reference(const DecodeInputs& in, const PageTable& t, double scale) {
  const DecodeShape& s = in.s;
  DecodeRef r;
  r.lens = t.lens;
  const int64_t nh = s.nheads, d = s.d, group = s.nheads / s.nheads_kv;
  r.out.assign(static_cast<size_t>(in.batch * nh * d), 0.0);
  r.pv = r.out;
  r.lse.assign(static_cast<size_t>(in.batch * nh), -std::numeric_limits<double>::infinity());
  r.ds.assign(static_cast<size_t>(in.batch * nh), 0.0);
  for (double x : in.vc.values) r.max_v = std::max(r.max_v, std::fabs(x));
  for (int64_t b = 0; b < in.batch; ++b) {
    const int64_t len = t.lens[static_cast<size_t>(b)];
    if (len == 0) continue;
    std::vector<size_t> row(static_cast<size_t>(len));
    std::vector<double> sc(static_cast<size_t>(len));
    for (int64_t hk = 0; hk < s.nheads_kv; ++hk) {
      for (int64_t j = 0; j < len; ++j) {
        const int64_t page = t.indices[static_cast<size_t>(t.indptr[static_cast<size_t>(b)] + j / s.page_size)];
        row[static_cast<size_t>(j)] = static_cast<size_t>(cache_offset(s.layout, s.page_size, s.nheads_kv, d, page, j % s.page_size, hk));
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const double* q = in.q.values.data() + (b * nh + h) * d;
        double m = -std::numeric_limits<double>::infinity(), abs_max = 0;
        for (int64_t j = 0; j < len; ++j) {
          const double* k = in.kc.values.data() + row[static_cast<size_t>(j)];
          double dot = 0, abs_dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += q[x] * k[x], abs_dot += std::fabs(q[x] * k[x]);
          sc[static_cast<size_t>(j)] = dot * scale, m = std::max(m, dot * scale), abs_max = std::max(abs_max, abs_dot);
        }
        double sum = 0;
        for (int64_t j = 0; j < len; ++j) sum += std::exp(sc[static_cast<size_t>(j)] - m);
        const size_t o = static_cast<size_t>((b * nh + h) * d);
        for (int64_t j = 0; j < len; ++j) {
          const double p = std::exp(sc[static_cast<size_t>(j)] - m) / sum;
          const double* v = in.vc.values.data() + row[static_cast<size_t>(j)];
          for (int64_t x = 0; x < d; ++x) r.out[o + x] += p * v[x], r.pv[o + x] += p * std::fabs(v[x]);
        }
        r.lse[static_cast<size_t>(b * nh + h)] = m + std::log(sum);
        r.ds[static_cast<size_t>(b * nh + h)] = static_cast<double>(d) * std::ldexp(1.0, -23) * scale * abs_max;
      }
    }
  }
  return r;
}

// The tolerance of out element i and of lse (b, h) = i / d. Every rung computes in fp32 from the
// exact stored values and rounds out once: u(dtype) |ref| + (L + 8) 2^-23 max|v| (a sum of L fp32
// terms whose weights sum to 1, plus the exp2 errors), and the scores' dot products of d fp32
// terms err by up to ds, moving out by up to 2 ds sum_j p_j |v_j|. Rung 3 (tensor cores) also
// rounds P to the dtype for P V: + u(dtype) sum_j p_j |v_j|.
// Uniform inputs: every score 0, every weight exactly 1, every sum exact (integers and eighths
// below 2^24 x 2^-3); what rounds is a chunk's division, the log2 / exp2 of the chunks' lse in the
// merge (weights off by a few 2^-22) and out's rounding: u(dtype) |ref| + 2^-16 max|v|, and
// 1e-5 on lse (= ln L; a key more or less moves it by 1 / L >= 3e-5 up to 32k keys).
double out_tol(const DecodeInputs& in, const DecodeRef& r, size_t i, bool tensor_cores) {
  const size_t bh = i / static_cast<size_t>(in.s.d);
  const int64_t len = r.lens[bh / static_cast<size_t>(in.s.nheads)];
  const double u = unit_roundoff(in.s.dt);
  if (in.uniform) return u * std::fabs(r.out[i]) + std::ldexp(1.0, -16) * r.max_v;
  return u * std::fabs(r.out[i]) + (len + 8) * std::ldexp(1.0, -23) * r.max_v + 2 * r.ds[bh] * r.pv[i] +
         (tensor_cores ? u * r.pv[i] : 0.0);
}
double lse_tol(const DecodeInputs& in, const DecodeRef& r, size_t bh) {
  if (in.uniform) return 1e-5;
  const int64_t len = r.lens[bh / static_cast<size_t>(in.s.nheads)];
  return (len + 8) * std::ldexp(1.0, -23) * (1 + std::fabs(r.lse[bh])) + r.ds[bh];
}

// Elements outside the tolerance (NaN fails), per request; an empty request's lse must be -inf.
struct DecodeErrors {
  std::vector<int64_t> out, lse;
  int64_t total_out() const { return std::accumulate(out.begin(), out.end(), int64_t{0}); }
  int64_t total_lse() const { return std::accumulate(lse.begin(), lse.end(), int64_t{0}); }
  int64_t first_bad() const {
    for (size_t b = 0; b < out.size(); ++b)
      if (out[b] + lse[b] > 0) return static_cast<int64_t>(b);
    return -1;
  }
};
DecodeErrors decode_errors(const DecodeInputs& in, const DecodeRef& r, bool tensor_cores, const std::vector<double>& got,
                           const std::vector<double>* got_lse) {
  DecodeErrors e{std::vector<int64_t>(static_cast<size_t>(in.batch), 0), std::vector<int64_t>(static_cast<size_t>(in.batch), 0)};
  const size_t per_request = static_cast<size_t>(in.s.nheads * in.s.d);
  for (size_t i = 0; i < r.out.size(); ++i)
    e.out[i / per_request] += !(std::fabs(got[i] - r.out[i]) <= out_tol(in, r, i, tensor_cores));
  if (got_lse != nullptr)
    for (size_t bh = 0; bh < r.lse.size(); ++bh) {
      const double g = (*got_lse)[bh];
      const bool ok = std::isinf(r.lse[bh]) ? g == r.lse[bh] : std::fabs(g - r.lse[bh]) <= lse_tol(in, r, bh);
      e.lse[bh / static_cast<size_t>(in.s.nheads)] += !ok;
    }
  return e;
}

void expect_matches(const DecodeInputs& in, const DecodeRef& r, bool tensor_cores, const std::vector<double>& got,
                    const std::vector<double>* got_lse, const ::testing::Message& what) {
  const DecodeErrors e = decode_errors(in, r, tensor_cores, got, got_lse);
  EXPECT_EQ(e.total_out(), 0) << what << ": out elements outside the tolerance, first in request " << e.first_bad();
  EXPECT_EQ(e.total_lse(), 0) << what << ": lse outside the tolerance, first in request " << e.first_bad();
}

// Device buffers of a decode: the inputs, the page table (room for table_cap pages, rewritten in
// place by set_table) and the outputs.
struct DecodeDevice {
  const DecodeInputs& in;
  int64_t table_cap;
  DeviceBuffer q, kc, vc, ind, ptr, last, out, lse;
  DecodeDevice(const DecodeInputs& inputs, int64_t cap)
      : in(inputs), table_cap(std::max<int64_t>(cap, 1)), q(inputs.q.bytes.size()), kc(inputs.kc.bytes.size()),
        vc(inputs.vc.bytes.size()), ind(static_cast<size_t>(table_cap) * 4), ptr(static_cast<size_t>(inputs.batch + 1) * 4),
        last(static_cast<size_t>(std::max<int64_t>(inputs.batch, 1)) * 4), out(inputs.q.bytes.size()),
        lse(static_cast<size_t>(std::max<int64_t>(inputs.batch * inputs.s.nheads, 1)) * 4) {
    upload(q.ptr, in.q.bytes);
    upload(kc.ptr, in.kc.bytes);
    upload(vc.ptr, in.vc.bytes);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before work on other streams
  }
  // The table's arrays, copied on `stream` (waited for).
  void set_table(const PageTable& t, cudaStream_t stream = nullptr) const {
    ASSERT_LE(t.total_pages(), table_cap);
    const std::vector<uint8_t> i = int32_bytes(t.indices), p = int32_bytes(t.indptr), l = int32_bytes(t.last);
    if (!i.empty()) FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ind.ptr, i.data(), i.size(), cudaMemcpyHostToDevice, stream));
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ptr.ptr, p.data(), p.size(), cudaMemcpyHostToDevice, stream));
    if (!l.empty()) FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(last.ptr, l.data(), l.size(), cudaMemcpyHostToDevice, stream));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  void poison(cudaStream_t stream = nullptr) const {
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xff, out.bytes, stream));
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(lse.ptr, 0xff, lse.bytes, stream));
  }
  TensorView qv() const { return device_view(q.ptr, in.s.dt, {in.batch, in.s.nheads, in.s.d}); }
  TensorView kv() const { return device_view(kc.ptr, in.kc.dtype, in.cache_shape()); }  // s.dt, or e4m3
  TensorView vv() const { return device_view(vc.ptr, in.vc.dtype, in.cache_shape()); }
  TensorView indv() const { return device_view(ind.ptr, DType::kI32, {table_cap}); }
  TensorView ptrv() const { return device_view(ptr.ptr, DType::kI32, {in.batch + 1}); }
  TensorView lastv() const { return device_view(last.ptr, DType::kI32, {in.batch}); }
  TensorView outv() const { return device_view(out.ptr, in.s.dt, {in.batch, in.s.nheads, in.s.d}); }
  TensorView lsev() const { return device_view(lse.ptr, DType::kF32, {in.batch, in.s.nheads}); }
  void paged(int rung, bool with_lse, float scale = 0.f, cudaStream_t stream = nullptr, float k_scale = 1.f,
             float v_scale = 1.f) const {
    const TensorView l = lsev();
    batch_decode_paged(qv(), kv(), vv(), indv(), ptrv(), lastv(), outv(), with_lse ? &l : nullptr, in.s.layout, scale, stream, rung,
                       k_scale, v_scale);
  }
  void run(const DecodePlanInfo& plan, const TensorView& ws, bool with_lse, float scale = 0.f, cudaStream_t stream = nullptr,
           float k_scale = 1.f, float v_scale = 1.f) const {
    const TensorView l = lsev();
    batch_decode_run(plan, ws, qv(), kv(), vv(), indv(), ptrv(), lastv(), outv(), with_lse ? &l : nullptr, in.s.layout, scale, stream,
                     k_scale, v_scale);
  }
  std::vector<uint8_t> out_bytes() const { return download(out.ptr, out.bytes); }
  std::vector<uint8_t> lse_bytes() const { return download(lse.ptr, lse.bytes); }
  std::vector<double> got() const { return decode(in.s.dt, out_bytes()); }
  std::vector<double> got_lse() const { return decode(DType::kF32, lse_bytes()); }
};

bool all_poisoned(const std::vector<uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t x) { return x == 0xff; });
}

// A host int32 view (the plan's kv_indptr_host).
TensorView host_view(std::vector<int>& v) { return TensorView(v.data(), DType::kI32, {static_cast<int64_t>(v.size())}, kCpu); }

// A plan's workspace.
struct Workspace {
  DeviceBuffer buf;
  int64_t bytes;
  explicit Workspace(int64_t n) : buf(static_cast<size_t>(n)), bytes(n) {
    buf.poison();
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());  // before a plan's copy on another stream
  }
  TensorView view() const { return device_view(buf.ptr, DType::kU8, {bytes}); }
};

// Plans the decode of table t on the host (as the one-shot call does from its device read).
DecodePlanInfo plan_for(const DecodeShape& s, PageTable& t, const Workspace& ws, cudaStream_t stream = nullptr,
                        DType kv_dtype = DType::kBF16) {
  return batch_decode_plan(host_view(t.indptr), s.page_size, s.nheads, s.nheads_kv, s.d, ws.view(), stream, kv_dtype);
}

void check_decode_on(int rung, DType dt, int64_t page_size, KvLayout layout, int64_t nheads, int64_t nheads_kv, int64_t d,
                     const std::vector<int64_t>& lens, std::mt19937_64& rng) {
  const DecodeShape s{dt, page_size, layout, nheads, nheads_kv, d};
  const int64_t batch = static_cast<int64_t>(lens.size()), pages = pages_for(lens, page_size);
  PageTable t(page_size, pages + 3, lens.size(), rng);  // pages no request owns stay unread
  t.grow(lens);
  const DecodeInputs in(s, batch, pages + 3, rng);
  const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(d)));
  const DecodeDevice dev(in, pages);
  dev.set_table(t);
  dev.poison();
  dev.paged(rung, true);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> got_lse = dev.got_lse();
  expect_matches(in, ref, rung == 3 && dt != DType::kF32, dev.got(), &got_lse, describe(s) << " rung " << rung);
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

// ---- Decode rung 3: split-KV, plan / run, CUDA graphs ------------------------------------------

// A ragged batch at rung 3 against the reference, and request by request against rung 2 (the
// simpler kernel: splitting must not move a result by more than the two tolerances); lse =
// nullptr gives the same out, bit for bit, and leaves lse alone. split: whether the plan the call
// makes from its read of the page table (batch_decode_plan's, from the same page counts) must cut
// a request (1), must not (0), or either (-1).
struct SplitCase {
  DecodeShape s;
  std::vector<int64_t> lens;
  int split = -1;
  float scale = 0.f;
};

void check_split(const SplitCase& c, std::mt19937_64& rng) {
  const DecodeShape& s = c.s;
  const auto batch = static_cast<int64_t>(c.lens.size());
  const int64_t pages = pages_for(c.lens, s.page_size);
  const ::testing::Message what = describe(s) << " batch " << batch;
  PageTable t(s.page_size, pages + 3, c.lens.size(), rng);
  t.grow(c.lens);
  const DecodeInputs in(s, batch, pages + 3, rng);
  const DecodeRef ref = decode_reference(in, t, c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(s.d)));
  const DecodeDevice dev(in, pages);
  dev.set_table(t);

  dev.poison();
  dev.paged(2, true, c.scale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> out2 = dev.got(), lse2 = dev.got_lse();
  expect_matches(in, ref, false, out2, &lse2, ::testing::Message(what) << " rung 2");

  dev.poison();
  dev.paged(3, true, c.scale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> bytes3 = dev.out_bytes();
  const std::vector<double> out3 = decode(s.dt, bytes3), lse3 = dev.got_lse();
  expect_matches(in, ref, true, out3, &lse3, ::testing::Message(what) << " rung 3");

  const size_t per_request = static_cast<size_t>(s.nheads * s.d);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t bad = 0, bad_lse = 0;
    for (size_t i = static_cast<size_t>(b) * per_request; i < static_cast<size_t>(b + 1) * per_request; ++i)
      bad += !(std::fabs(out3[i] - out2[i]) <= out_tol(in, ref, i, true) + out_tol(in, ref, i, false));
    for (size_t bh = static_cast<size_t>(b * s.nheads); bh < static_cast<size_t>((b + 1) * s.nheads); ++bh)
      bad_lse += std::isinf(lse2[bh]) ? !(lse3[bh] == lse2[bh]) : !(std::fabs(lse3[bh] - lse2[bh]) <= 2 * lse_tol(in, ref, bh));
    EXPECT_EQ(bad, 0) << what << ": request " << b << " (" << c.lens[static_cast<size_t>(b)] << " keys): rung 3's out vs rung 2's";
    EXPECT_EQ(bad_lse, 0) << what << ": request " << b << " (" << c.lens[static_cast<size_t>(b)] << " keys): rung 3's lse vs rung 2's";
  }

  dev.poison();
  dev.paged(3, false, c.scale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(dev.out_bytes() == bytes3) << what << ": lse = nullptr changed out";
  EXPECT_TRUE(all_poisoned(dev.lse_bytes())) << what << ": lse = nullptr, yet lse was written";

  if (c.split >= 0) {
    const Workspace ws(batch_decode_workspace_bytes(batch, s.nheads, s.nheads_kv, s.d, 0));
    const DecodePlanInfo info = plan_for(s, t, ws);
    EXPECT_EQ(info.split, c.split == 1) << what << ": " << info.chunks << " chunks of " << info.chunk_pages << " pages";
  }
}

TEST(PagedDecode, SplitMatchesTheReferenceAndRung2) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(815);
  using L = std::vector<int64_t>;
  constexpr KvLayout N = KvLayout::kNHD, H = KvLayout::kHND;
  constexpr DType bf = DType::kBF16, fp = DType::kF16;
  const SplitCase cases[] = {
      // One long request among short ones (0 keys: out 0, lse -inf; one key; around a tile of 64).
      {{bf, 16, N, 32, 8, 128}, {0, 1, 17, 63, 64, 65, 3000, 32768}, 1},
      {{fp, 16, H, 32, 1, 128}, {65, 32768, 0, 1}, 1, 0.05f},  // group 32: two blocks of 16 query heads; a given scale
      // Head dims, groups, page sizes, layouts, over ragged batches of a few thousand keys.
      {{bf, 1, N, 4, 4, 32}, {0, 1, 17, 63, 64, 65, 2000}},
      {{fp, 64, H, 32, 4, 64}, {17, 0, 2500, 1, 64, 65, 63}},
      {{bf, 16, H, 8, 2, 96}, {63, 64, 65, 1, 0, 3000}},
      {{fp, 1, N, 16, 2, 192}, {1, 17, 2000, 0, 65}},
      {{bf, 64, N, 32, 1, 256}, {0, 65, 1, 2048, 17}},
      {{fp, 16, H, 4, 1, 256}, {3000, 1, 0, 64}},
      {{bf, 1, H, 64, 2, 128}, {63, 1, 1500, 0}},
      {{fp, 16, N, 40, 2, 32}, {17, 1000, 0, 65}},  // group 20: blocks of 16 and 4
      {{bf, 16, N, 8, 8, 64}, {0, 1, 17, 63, 64, 65, 4000}},
      {{bf, 16, N, 8, 2, 64}, {0, 0, 0}},  // no keys at all
      {{fp, 64, N, 8, 2, 128}, L(300, 64), 0},  // a page a request: nothing to cut, no merge
      // Rung 3's TMA boxes (16-bit caches, head dims a multiple of 64): 8 boxes a tile (page 8),
      // 2 (page 32), a tile within a page (pages of 128 and 256: the box at slot 0, 64, ...), three
      // column boxes (d 192); requests ending inside a box and before unloaded boxes.
      {{bf, 8, N, 32, 8, 128}, {0, 1, 17, 63, 64, 65, 3000}},
      {{fp, 32, H, 8, 2, 192}, {17, 0, 1000, 65, 33}},
      {{bf, 128, H, 16, 2, 128}, {1, 63, 64, 65, 127, 128, 129, 2000}},
      {{fp, 256, N, 8, 1, 64}, {1, 255, 256, 257, 1500}},
  };
  for (const SplitCase& c : cases) check_split(c, rng);
}

// NaN (all-ones bytes: NaN in fp16, bf16 and e4m3) in the cache bytes of every slot no key of the
// table owns (a last page's tail, pages no request uses); the reference's values are untouched.
// Returns the number of such slots.
int64_t nan_in_unowned_slots(DecodeInputs& in, const PageTable& t) {
  const DecodeShape& s = in.s;
  const auto es = static_cast<size_t>(dtype_size(in.kc.dtype));
  std::vector<char> owned(static_cast<size_t>(in.max_pages * s.page_size), 0);
  for (size_t b = 0; b < t.lens.size(); ++b)
    for (int64_t j = 0; j < t.lens[b]; ++j)
      owned[static_cast<size_t>(t.pages[b][static_cast<size_t>(j / s.page_size)] * s.page_size + j % s.page_size)] = 1;
  int64_t unowned = 0;
  for (int64_t page = 0; page < in.max_pages; ++page)
    for (int64_t slot = 0; slot < s.page_size; ++slot) {
      if (owned[static_cast<size_t>(page * s.page_size + slot)]) continue;
      ++unowned;
      for (int64_t hk = 0; hk < s.nheads_kv; ++hk) {
        const auto at = static_cast<size_t>(cache_offset(s.layout, s.page_size, s.nheads_kv, s.d, page, slot, hk)) * es;
        const auto end = at + static_cast<size_t>(s.d) * es;
        std::fill(in.kc.bytes.begin() + static_cast<std::ptrdiff_t>(at), in.kc.bytes.begin() + static_cast<std::ptrdiff_t>(end), uint8_t{0xff});
        std::fill(in.vc.bytes.begin() + static_cast<std::ptrdiff_t>(at), in.vc.bytes.begin() + static_cast<std::ptrdiff_t>(end), uint8_t{0xff});
      }
    }
  return unowned;
}

// Rung 3 (one-shot and plan / run) over inputs with NaN in the unowned slots, against the reference.
void check_unowned_slots_unread(DecodeInputs& in, PageTable& t, float k_scale, float v_scale, const ::testing::Message& what) {
  const DecodeShape& s = in.s;
  const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
  ASSERT_GT(nan_in_unowned_slots(in, t), 0) << what;
  const DecodeDevice dev(in, t.total_pages());
  dev.set_table(t);
  dev.poison();
  dev.paged(3, true, 0.f, nullptr, k_scale, v_scale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> lse = dev.got_lse();
  expect_matches(in, ref, true, dev.got(), &lse, ::testing::Message(what) << " rung 3, NaN in unowned slots");
  const Workspace ws(batch_decode_workspace_bytes(in.batch, s.nheads, s.nheads_kv, s.d, 0));
  const DecodePlanInfo info = plan_for(s, t, ws, nullptr, in.kc.dtype == DType::kE4M3 ? DType::kE4M3 : DType::kBF16);
  dev.poison();
  dev.run(info, ws.view(), true, 0.f, nullptr, k_scale, v_scale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> lse_run = dev.got_lse();
  expect_matches(in, ref, true, dev.got(), &lse_run, ::testing::Message(what) << " plan / run, NaN in unowned slots");
}

// n request lengths cycling through no keys, partial tiles and pages, and 2300 keys (the
// producer's page registers refilled every 32 boxes at 8, 4, 2 and 1 boxes a tile).
std::vector<int64_t> mixed_lengths(int n) {
  const int64_t pattern[] = {0, 1, 17, 63, 64, 65, 130, 700, 2300};
  std::vector<int64_t> l;
  for (int i = 0; i < n; ++i) l.push_back(pattern[i % 9]);
  return l;
}

// Rung 3 with more items than resident blocks (16-bit caches by TMA on sm_90: the persistent
// kernel, 1 block an SM at d 128, each block claiming items one after another, its stage ring, Q
// buffers and item metadata carried across them; else several waves), items of different
// lengths (no keys, partial tiles and pages, and 2300 keys: the producer's page registers
// refilled every 32 boxes at 8, 4, 2 and 1 boxes a tile — pages of 8, 16, 32, 64), head blocks
// of 16 and 4 query heads (group 20); then the same tables with NaN in every slot no key owns,
// one-shot and plan / run.
TEST(PagedDecode, ManyItemsInWaves) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(831);
  const SplitCase cases[] = {
      {{DType::kBF16, 16, KvLayout::kNHD, 32, 8, 128}, mixed_lengths(72)},  // 576 items
      {{DType::kF16, 16, KvLayout::kHND, 40, 2, 64}, mixed_lengths(150)},   // 600 items, group 20
      {{DType::kBF16, 32, KvLayout::kHND, 16, 4, 256}, mixed_lengths(72)},  // 288 items
      {{DType::kF16, 8, KvLayout::kNHD, 8, 2, 128}, mixed_lengths(72)},     // 144 items, 8 boxes a tile
      {{DType::kBF16, 64, KvLayout::kHND, 32, 8, 64}, mixed_lengths(150)},  // 1200 items, a box a tile
  };
  for (const SplitCase& c : cases) {
    check_split(c, rng);
    const DecodeShape& s = c.s;
    const int64_t pages = pages_for(c.lens, s.page_size);
    PageTable t(s.page_size, pages + 3, c.lens.size(), rng);
    t.grow(c.lens);
    DecodeInputs in(s, static_cast<int64_t>(c.lens.size()), pages + 3, rng);
    check_unowned_slots_unread(in, t, 1.f, 1.f, describe(s) << " many items");
  }
}

// Slots no key of the table owns hold NaN in K and V: they must not reach the output. Rung 3's TMA
// path loads whole pages (boxes) and clears V's rows past a chunk's end (P is 0 there, but 0 x NaN
// is NaN); the cp.async path (page size 1) never reads them.
TEST(PagedDecode, SlotsPastTheEndDoNotReachTheOutput) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(819);
  constexpr KvLayout N = KvLayout::kNHD, H = KvLayout::kHND;
  constexpr DType bf = DType::kBF16, fp = DType::kF16;
  const DecodeShape shapes[] = {{bf, 16, N, 32, 8, 128}, {fp, 16, H, 8, 2, 64}, {bf, 8, H, 8, 2, 256},
                                {fp, 128, N, 16, 2, 128}, {bf, 32, N, 8, 1, 192}, {bf, 1, N, 8, 2, 128}};
  const std::vector<int64_t> lens = {1, 17, 63, 64, 65, 1000, 0, 130};
  for (const DecodeShape& s : shapes) {
    const int64_t pages = pages_for(lens, s.page_size);
    PageTable t(s.page_size, pages + 3, lens.size(), rng);
    t.grow(lens);
    DecodeInputs in(s, static_cast<int64_t>(lens.size()), pages + 3, rng);
    check_unowned_slots_unread(in, t, 1.f, 1.f, describe(s));
  }
}

// A pool of no pages and requests of no keys (a server before its first token): out 0, lse -inf,
// at a shape whose caches would take the TMA path (which needs a page to map, so this one does not).
TEST(PagedDecode, EmptyPoolOfEmptyRequests) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(825);
  for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
    const DecodeShape s{DType::kBF16, 16, layout, 32, 8, 128};
    const std::vector<int64_t> lens = {0, 0, 0};
    PageTable t(s.page_size, 0, lens.size(), rng);
    t.grow(lens);
    const DecodeInputs in(s, static_cast<int64_t>(lens.size()), 0, rng);
    const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
    const DecodeDevice dev(in, 0);
    dev.set_table(t);
    dev.poison();
    dev.paged(3, true);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> lse = dev.got_lse();
    expect_matches(in, ref, true, dev.got(), &lse, describe(s) << " rung 3, no pages");
    const Workspace ws(batch_decode_workspace_bytes(static_cast<int64_t>(lens.size()), s.nheads, s.nheads_kv, s.d, 0));
    const DecodePlanInfo info = plan_for(s, t, ws);
    dev.poison();
    dev.run(info, ws.view(), true);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> lse_run = dev.got_lse();
    expect_matches(in, ref, true, dev.got(), &lse_run, describe(s) << " plan / run, no pages");
  }
}

// Uniform inputs (q = 0, V in eighths: exact sums) over long requests cut into many chunks, with
// pages not a multiple of the chunk, a last page partly filled: rungs 2 and 3 give the mean of
// exactly the request's keys (out to a few fp32 roundings, lse = ln L to 1e-5).
TEST(PagedDecode, SplitCoversEveryKeyOnce) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(821);
  const std::pair<DecodeShape, std::vector<int64_t>> cases[] = {
      {{DType::kBF16, 16, KvLayout::kNHD, 16, 4, 128}, {32768 + 5, 12000, 1, 0, 3000, 64, 65}},
      {{DType::kF16, 1, KvLayout::kHND, 16, 2, 64}, {20001, 0, 7, 4096}},
      {{DType::kBF16, 64, KvLayout::kHND, 8, 1, 256}, {30000 + 63, 1, 130}},
      {{DType::kF16, 16, KvLayout::kNHD, 40, 2, 96}, {12345, 16, 17}},
  };
  for (const auto& [s, lens] : cases) {
    const int64_t pages = pages_for(lens, s.page_size);
    PageTable t(s.page_size, pages + 3, lens.size(), rng);
    t.grow(lens);
    const DecodeInputs in(s, static_cast<int64_t>(lens.size()), pages + 3, rng, true);
    const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
    const DecodeDevice dev(in, pages);
    dev.set_table(t);
    for (int rung : {2, 3}) {
      dev.poison();
      dev.paged(rung, true);
      FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<double> got_lse = dev.got_lse();
      expect_matches(in, ref, rung == 3, dev.got(), &got_lse, describe(s) << " uniform, rung " << rung);
    }
    const Workspace ws(batch_decode_workspace_bytes(static_cast<int64_t>(lens.size()), s.nheads, s.nheads_kv, s.d, 0));
    EXPECT_TRUE(plan_for(s, t, ws).split) << describe(s);
  }
}

// fp32 has no rung 3: the call runs rung 2, the same bits.
TEST(PagedDecode, Fp32AtRung3RunsRung2) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(816);
  const std::pair<DecodeShape, std::vector<int64_t>> cases[] = {
      {{DType::kF32, 16, KvLayout::kNHD, 32, 8, 128}, {0, 1, 17, 65, 3000}},
      {{DType::kF32, 1, KvLayout::kHND, 8, 1, 64}, {64, 2, 0}},
  };
  for (const auto& [s, lens] : cases) {
    const int64_t pages = pages_for(lens, s.page_size);
    PageTable t(s.page_size, pages + 3, lens.size(), rng);
    t.grow(lens);
    const DecodeInputs in(s, static_cast<int64_t>(lens.size()), pages + 3, rng);
    const DecodeDevice dev(in, pages);
    dev.set_table(t);
    dev.poison();
    dev.paged(2, true);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> out2 = dev.out_bytes(), lse2 = dev.lse_bytes();
    dev.poison();
    const int64_t launches = check::launch_count();
    dev.paged(3, true);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(check::launch_count() - launches, 1) << describe(s);
    EXPECT_TRUE(dev.out_bytes() == out2) << describe(s) << ": out";
    EXPECT_TRUE(dev.lse_bytes() == lse2) << describe(s) << ": lse";
    const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
    const std::vector<double> got_lse = decode(DType::kF32, lse2);
    expect_matches(in, ref, false, decode(s.dt, out2), &got_lse, describe(s));
  }
}

// A non-default stream and a CUDA graph around one library call.
// Captured, batch_decode_paged cannot read the page table to plan: one item per request, whole,
// one launch (no merge); replays are correct, a long request included.
TEST(PagedDecode, Rung3UnderGraphCapture) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(817);
  // The capture's items in static order (no workspace for claim counts): 8 requests (32 items,
  // fewer than the persistent kernel's blocks), then 72 and 150 (576 and 600 items: each block
  // runs several, every gridDim.x-th, its Q buffers and metadata alternating; group 20's head
  // blocks of 16 and 4).
  const std::pair<DecodeShape, std::vector<int64_t>> cases[] = {
      {{DType::kBF16, 16, KvLayout::kNHD, 16, 4, 128}, {0, 1, 17, 63, 64, 65, 3000, 8192}},
      {{DType::kBF16, 16, KvLayout::kNHD, 32, 8, 128}, mixed_lengths(72)},
      {{DType::kF16, 16, KvLayout::kHND, 40, 2, 64}, mixed_lengths(150)},
  };
  for (const auto& [s, lens] : cases) {
    const int64_t pages = pages_for(lens, s.page_size);
    PageTable t(s.page_size, pages + 3, lens.size(), rng);
    t.grow(lens);
    const DecodeInputs in(s, static_cast<int64_t>(lens.size()), pages + 3, rng);
    const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
    const DecodeDevice dev(in, pages);
    const Stream st;
    dev.set_table(t, st.s);
    Graph g;
    const int64_t launches = check::launch_count();
    g.capture(st.s, [&] { dev.paged(3, true, 0.f, st.s); });
    EXPECT_EQ(check::launch_count() - launches, 1) << "captured: one launch, no merge";
    EXPECT_EQ(g.nodes(), 1u);
    for (int replay = 0; replay < 2; ++replay) {
      dev.poison(st.s);
      g.replay(st.s);
      const std::vector<double> got_lse = dev.got_lse();
      expect_matches(in, ref, true, dev.got(), &got_lse, describe(s) << " " << lens.size() << " requests, replay " << replay);
    }
  }
}

// Plan / run on batch 1 with one long request: the plan cuts it (split, chunks within the
// capacity, covering its pages), run() matches the reference (random or uniform inputs), lse =
// nullptr gives the same out, and the one-shot call (planned from its device read) gives the
// same bits.
void check_plan_run(const DecodeShape& s, int64_t len, bool uniform, std::mt19937_64& rng) {
  const int64_t pages = pages_for({len}, s.page_size);
  const ::testing::Message what = describe(s) << " " << len << " keys" << (uniform ? " (uniform)" : "");
  PageTable t(s.page_size, pages + 3, 1, rng);
  t.grow({len});
  const DecodeInputs in(s, 1, pages + 3, rng, uniform);
  const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(static_cast<double>(s.d)));
  const DecodeDevice dev(in, pages);
  dev.set_table(t);
  const int64_t bytes = batch_decode_workspace_bytes(1, s.nheads, s.nheads_kv, s.d, 0);
  EXPECT_GT(bytes, 0);
  const Workspace ws(bytes);
  const DecodePlanInfo info = plan_for(s, t, ws);
  EXPECT_EQ(info.batch, 1);
  EXPECT_EQ(info.nheads, s.nheads);
  EXPECT_EQ(info.nheads_kv, s.nheads_kv);
  EXPECT_EQ(info.headdim, s.d);
  EXPECT_EQ(info.page_size, s.page_size);
  EXPECT_EQ(info.device, 0);
  EXPECT_TRUE(info.split) << what;
  EXPECT_GT(info.chunks, 1) << what;
  EXPECT_LE(info.chunks, info.capacity) << what;
  EXPECT_LT(info.chunk_pages * (info.chunks - 1), pages) << what;
  EXPECT_GE(info.chunk_pages * info.chunks, pages) << what;

  dev.poison();
  dev.run(info, ws.view(), true);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> out = dev.out_bytes(), lse = dev.lse_bytes();
  const std::vector<double> got_lse = decode(DType::kF32, lse);
  expect_matches(in, ref, true, decode(s.dt, out), &got_lse, ::testing::Message(what) << " run");

  dev.poison();
  dev.run(info, ws.view(), false);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(dev.out_bytes() == out) << what << ": lse = nullptr changed out";
  EXPECT_TRUE(all_poisoned(dev.lse_bytes())) << what << ": lse = nullptr, yet lse was written";

  dev.poison();
  dev.paged(3, true);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(dev.out_bytes() == out) << what << ": batch_decode_paged's out differs from the plan / run's";
  EXPECT_TRUE(dev.lse_bytes() == lse) << what << ": batch_decode_paged's lse differs from the plan / run's";
}

TEST(PagedDecode, PlanRunSplitsALongRequest) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(818);
  check_plan_run({DType::kBF16, 16, KvLayout::kNHD, 32, 8, 128}, 16384 + 7, false, rng);
  check_plan_run({DType::kF16, 64, KvLayout::kHND, 8, 1, 64}, 32768 + 5, true, rng);
}

// A decode step captured once (batch_decode_run), replayed after the page table's contents
// changed in place: new lengths re-planned into the same workspace; grown requests without a new
// plan (a request's last chunk runs to its end: tokens in its last page, a new page, a first
// page); short requests re-planned without a split (the captured merge then has nothing to do).
// Uniform inputs: every key of the grown requests must count exactly once.
TEST(PagedDecode, GraphReplaysNewPlansAndGrownRequests) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(819);
  const DecodeShape s{DType::kBF16, 16, KvLayout::kNHD, 16, 4, 128};
  const int64_t batch = 4, max_pages = 1400;
  const DecodeInputs in(s, batch, max_pages, rng, true);  // uniform: a key missed or repeated shows
  const DecodeDevice dev(in, max_pages);
  const Stream st;
  const Workspace ws(batch_decode_workspace_bytes(batch, s.nheads, s.nheads_kv, s.d, 0));
  Graph g;
  // Twice each: the persistent kernel's claim counts in the workspace are back at 0 after a launch
  // (else the second replay's blocks would find the items claimed, and out keep its poison).
  const auto replay = [&](const PageTable& t, const char* phase) {
    const DecodeRef ref = decode_reference(in, t, 1.0 / std::sqrt(128.0));
    for (int again = 0; again < 2; ++again) {
      dev.poison(st.s);
      g.replay(st.s);
      const std::vector<double> got_lse = dev.got_lse();
      expect_matches(in, ref, true, dev.got(), &got_lse, describe(s) << " " << phase << " replay " << again);
    }
  };

  PageTable t1(s.page_size, max_pages, batch, rng);
  t1.grow({5000, 0, 17, 300});
  dev.set_table(t1, st.s);
  const DecodePlanInfo info1 = plan_for(s, t1, ws, st.s);
  EXPECT_TRUE(info1.split);
  const int64_t launches = check::launch_count();
  g.capture(st.s, [&] { dev.run(info1, ws.view(), true, 0.f, st.s); });
  EXPECT_EQ(check::launch_count() - launches, 2) << "the chunks and the merge, whatever the plan";
  EXPECT_EQ(g.nodes(), 2u);
  replay(t1, "the captured plan");

  PageTable t2(s.page_size, max_pages, batch, rng);  // other lengths, other pages, the same buffers
  t2.grow({100, 20000, 1, 0});
  dev.set_table(t2, st.s);
  const DecodePlanInfo info2 = plan_for(s, t2, ws, st.s);
  EXPECT_TRUE(info2.split);
  EXPECT_EQ(info2.capacity, info1.capacity);
  replay(t2, "re-planned");

  // No new plan: request 0 gains 6 tokens in its last page (100 -> 106), request 1 a page
  // (20000 = 1250 full pages -> 20001), request 2 16 tokens over a new page (1 -> 17), request 3
  // its first page (0 -> 5).
  t2.grow({106, 20001, 17, 5});
  dev.set_table(t2, st.s);
  replay(t2, "grown since the plan");

  PageTable t3(s.page_size, max_pages, batch, rng);
  t3.grow({3, 1, 0, 16});  // a page at most: nothing to cut
  dev.set_table(t3, st.s);
  const DecodePlanInfo info3 = plan_for(s, t3, ws, st.s);
  EXPECT_FALSE(info3.split) << info3.chunks << " chunks of " << info3.chunk_pages << " pages";
  replay(t3, "re-planned without a split");
}

// The checks of plan / run that need the device (the workspace's size for this device, the host
// kv_indptr's values, the page table's): each rejected with its argument named, nothing
// launched, out and lse untouched, a rejected plan leaving the workspace as it was.
TEST(PagedDecode, PlanRunRejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(820);
  const DecodeShape s{DType::kBF16, 16, KvLayout::kNHD, 8, 2, 64};
  PageTable t(s.page_size, 16, 2, rng);
  t.grow({20, 33});
  const DecodeInputs in(s, 2, 16, rng);
  const DecodeDevice dev(in, 16);
  dev.set_table(t);
  dev.poison();
  const int64_t bytes = batch_decode_workspace_bytes(2, 8, 2, 64, 0);
  const Workspace ws(bytes), other(32 << 20);  // other: room for the other shapes' plans
  const DecodePlanInfo info = plan_for(s, t, ws);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> planned = download(ws.buf.ptr, ws.buf.bytes);
  const auto untouched = [&](const std::string& what) {
    EXPECT_TRUE(all_poisoned(dev.out_bytes())) << what << ": out was written";
    EXPECT_TRUE(all_poisoned(dev.lse_bytes())) << what << ": lse was written";
    EXPECT_TRUE(download(ws.buf.ptr, ws.buf.bytes) == planned) << what << ": the workspace changed";
  };

  const std::string run = "batch_decode_run: argument ";
  const auto run_rejected = [&](const DecodePlanInfo& plan, const TensorView& w, const std::vector<std::string>& pieces) {
    expect_rejected([&] { dev.run(plan, w, true); }, pieces);
    untouched(pieces[0]);
  };
  const std::string at_least = "expected at least " + std::to_string(bytes) + " bytes (batch_decode_workspace_bytes)";
  run_rejected(info, device_view(ws.buf.ptr, DType::kU8, {bytes - 1}), {run + "'workspace'", at_least, "got " + std::to_string(bytes - 1) + " bytes"});
  run_rejected(info, device_view(ws.buf.ptr, DType::kI32, {bytes / 4}), {run + "'workspace'", "dtype uint8", "got int32"});
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  run_rejected(info, TensorView(host.data(), DType::kU8, {bytes}, kCpu), {run + "'workspace'", "a CUDA tensor"});
  run_rejected(info, device_view(other.buf.at(8), DType::kU8, {bytes}), {run + "'workspace'", "aligned to 16 bytes"});
  run_rejected(info, device_view(ws.buf.ptr, DType::kU8, {1, bytes}), {run + "'workspace'", "1 dims"});
  {
    DecodePlanInfo p = info;
    p.capacity += 1;
    run_rejected(p, ws.view(), {run + "'plan'", "capacity"});
  }
  // A workspace another plan wrote since (two wrappers sharing one), or never planned into:
  // rejected by the plan id in its header, nothing launched.
  {
    const Workspace second(bytes);
    const DecodePlanInfo a = plan_for(s, t, second), b = plan_for(s, t, second);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_NE(a.id, b.id);
    expect_rejected([&] { dev.run(a, second.view(), true); },
                    {run + "'workspace'", "the metadata of this plan (id " + std::to_string(a.id), "got plan id " + std::to_string(b.id)});
    const Workspace fresh(bytes);
    expect_rejected([&] { dev.run(info, fresh.view(), true); }, {run + "'workspace'", "the metadata of this plan"});
    untouched("another plan's workspace");
  }
  // Plans of another batch, head count, page size (made by batch_decode_plan).
  std::vector<int> three = {0, 1, 2, 3};
  const DecodePlanInfo batch3 = batch_decode_plan(host_view(three), 16, 8, 2, 64, other.view());
  run_rejected(batch3, other.view(), {run + "'plan'", "(batch 2, nheads 8, nheads_kv 2, headdim 64, page_size 16)",
                                      "got a plan for (3, 8, 2, 64, 16)"});
  const DecodePlanInfo heads16 = batch_decode_plan(host_view(t.indptr), 16, 16, 2, 64, other.view());
  run_rejected(heads16, other.view(), {run + "'plan'", "got a plan for (2, 16, 2, 64, 16)"});
  const DecodePlanInfo kv4 = batch_decode_plan(host_view(t.indptr), 16, 8, 4, 64, other.view());
  run_rejected(kv4, other.view(), {run + "'plan'", "got a plan for (2, 8, 4, 64, 16)"});
  const DecodePlanInfo page64 = batch_decode_plan(host_view(t.indptr), 64, 8, 2, 64, other.view());
  run_rejected(page64, other.view(), {run + "'plan'", "got a plan for (2, 8, 2, 64, 64)"});
  // The workspace holding out (or out inside it).
  expect_rejected(
      [&] {
        const TensorView l = dev.lsev();
        batch_decode_run(info, ws.view(), dev.qv(), dev.kv(), dev.vv(), dev.indv(), dev.ptrv(), dev.lastv(),
                         device_view(ws.buf.at(256), s.dt, {2, 8, 64}), &l, s.layout);
      },
      {run + "'workspace'", "disjoint from 'out'"});
  untouched("workspace over out");
  // The page table's values, read by run() too.
  {
    PageTable bad = t;
    bad.last[1] = 0;  // request 1 has pages
    dev.set_table(bad);
    run_rejected(info, ws.view(), {run + "'kv_last_page_len'", "kv_last_page_len[1] = 0"});
    dev.set_table(t);
  }

  const std::string plan = "batch_decode_plan: argument ";
  const auto plan_rejected = [&](const TensorView& ptr, int64_t page_size, const TensorView& w,
                                 const std::vector<std::string>& pieces) {
    expect_rejected([&] { batch_decode_plan(ptr, page_size, 8, 2, 64, w); }, pieces);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    untouched(pieces[0]);
  };
  plan_rejected(host_view(t.indptr), 16, device_view(ws.buf.ptr, DType::kU8, {bytes - 16}), {plan + "'workspace'", at_least});
  plan_rejected(host_view(t.indptr), 16, device_view(ws.buf.ptr, DType::kI32, {bytes / 4}), {plan + "'workspace'", "dtype uint8"});
  plan_rejected(host_view(t.indptr), 16, device_view(ws.buf.at(8), DType::kU8, {bytes - 16}), {plan + "'workspace'", "aligned"});
  plan_rejected(dev.ptrv(), 16, ws.view(), {plan + "'kv_indptr_host'", "a host tensor (cpu or cuda_host)", "got cuda:0"});
  std::vector<int> down = {0, 5, 3};
  plan_rejected(host_view(down), 16, ws.view(), {plan + "'kv_indptr_host'", "non-decreasing values", "kv_indptr[2] = 3 < kv_indptr[1] = 5"});
  std::vector<int> offset = {2, 3, 4};
  plan_rejected(host_view(offset), 16, ws.view(), {plan + "'kv_indptr_host'", "expected kv_indptr[0] = 0", "got kv_indptr[0] = 2"});
  std::vector<int> huge(65537, 0);
  plan_rejected(host_view(huge), 16, ws.view(), {"batch_decode_workspace_bytes: argument 'batch'", "got 65536"});

  // A plan on a stream being captured: its copy from host memory would become a graph node that
  // reads a freed buffer at replay; rejected, the graph left empty.
  {
    cudaStream_t st = nullptr;
    FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FLASHLAB_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    expect_rejected([&] { batch_decode_plan(host_view(t.indptr), 16, 8, 2, 64, ws.view(), st); },
                    {plan + "'stream'", "being captured"});
    cudaGraph_t g = nullptr;
    FLASHLAB_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    size_t nodes = 1;
    FLASHLAB_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    EXPECT_EQ(nodes, 0u) << "nothing captured";
    FLASHLAB_CUDA_CHECK(cudaGraphDestroy(g));
    FLASHLAB_CUDA_CHECK(cudaStreamDestroy(st));
    untouched("plan under capture");
  }

  // Pinned host memory is a host tensor too: the same plan, the same workspace bytes.
  void* pinned = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMallocHost(&pinned, t.indptr.size() * 4));
  std::memcpy(pinned, t.indptr.data(), t.indptr.size() * 4);
  const DecodePlanInfo again = batch_decode_plan(
      TensorView(pinned, DType::kI32, {static_cast<int64_t>(t.indptr.size())}, Device{DeviceType::kCUDAHost, 0}), 16, 8, 2, 64,
      ws.view());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  cudaFreeHost(pinned);
  EXPECT_EQ(again.chunks, info.chunks);
  EXPECT_EQ(again.chunk_pages, info.chunk_pages);
  EXPECT_EQ(again.split, info.split);
  // The same bytes but the header's plan id (bytes 8-11: a new id per plan).
  std::vector<uint8_t> replanned = download(ws.buf.ptr, ws.buf.bytes);
  int32_t id = 0;
  std::memcpy(&id, replanned.data() + 8, 4);
  EXPECT_EQ(id, again.id);
  std::memcpy(replanned.data() + 8, planned.data() + 8, 4);
  EXPECT_TRUE(replanned == planned) << "a plan from pinned memory differs";
}

// ---- Decode rung 3 with an FP8 (e4m3) KV cache -------------------------------------------------

// n random e4m3 codes: bytes the codes, values their exact values times `scale` (the dequantized
// cache: logits read k_scale K, the output v_scale V; exact, the scales being powers of two).
// Every code but the NaNs (0x7f, 0xff): |code| up to 448, subnormals and -0 included; eighths:
// only the codes of k / 8, |k| <= 8 (uniform inputs: exact sums, as random_eighths).
HostTensor random_e4m3_cache(int64_t n, double scale, bool eighths, std::mt19937_64& rng) {
  std::vector<uint8_t> codes;
  double value[256];
  for (int c = 0; c < 256; ++c) {
    const double v = reference::decode_e4m3(static_cast<uint8_t>(c));
    value[c] = v * scale;
    if (!std::isnan(v) && (!eighths || (std::fabs(v) <= 1 && v * 8 == std::round(v * 8)))) codes.push_back(static_cast<uint8_t>(c));
  }
  // Eight random bytes a draw (the long requests' caches hold tens of millions of codes); byte x
  // < the largest multiple of the code count picks codes[x % count], each code equally likely.
  const size_t count = codes.size(), below = 256 / count * count;
  HostTensor t = empty_tensor(DType::kE4M3, n);
  for (size_t i = 0; i < t.bytes.size();)
    for (uint64_t bits = rng(), b = 0; b < 8 && i < t.bytes.size(); ++b, bits >>= 8) {
      const auto x = static_cast<size_t>(bits & 0xff);
      if (x >= below) continue;
      t.bytes[i] = codes[x % count];
      t.values[i] = value[t.bytes[i]];
      ++i;
    }
  return t;
}

// Decode inputs over an e4m3 cache: q random in s.dt (uniform: q = 0 and V in eighths, see
// DecodeInputs), K and V random codes; kc / vc hold the codes' bytes (what the device reads) and
// the scaled values (what decode_reference and the tolerance read).
DecodeInputs fp8_inputs(const DecodeShape& s, int64_t batch, int64_t pages, double k_scale, double v_scale, bool uniform,
                        std::mt19937_64& rng) {
  DecodeInputs in(s, batch, 0, rng, uniform);  // no 16-bit cache: replaced below
  const int64_t n = pages * s.page_size * s.nheads_kv * s.d;
  in.max_pages = pages;
  in.kc = random_e4m3_cache(n, k_scale, false, rng);
  in.vc = random_e4m3_cache(n, v_scale, uniform, rng);
  return in;
}

// A ragged batch over an e4m3 cache against the float64 reference over the dequantized values:
// batch_decode_paged (rung 3), then plan / run (planned for e4m3: the same plan, so the same bits;
// and planned for a 16-bit cache: another chunking, still correct). Tolerance: rung 3's
// (out_tol with tensor cores): the kernel's mma runs in fp16 (q converted, exact for |q| >= 2^-17;
// K, V exact; P rounded to fp16: u = 2^-11 <= u(dtype)), so u(dtype) sum_j p_j |v_j| bounds P's
// rounding. scale 0: 1 / sqrt(d), logits of K's full e4m3 range spread by ~30 (a few keys take
// the weight); 0.004: ~1 (many keys count).
struct Fp8Case {
  DecodeShape s;
  std::vector<int64_t> lens;
  float scale = 0.f;
  bool uniform = false;
};

void check_fp8(const Fp8Case& c, std::mt19937_64& rng) {
  constexpr float kKScale = 0.5f, kVScale = 0.25f;
  const DecodeShape& s = c.s;
  const auto batch = static_cast<int64_t>(c.lens.size());
  const int64_t pages = pages_for(c.lens, s.page_size);
  const ::testing::Message what = describe(s) << " e4m3 cache, batch " << batch << ", softmax_scale " << c.scale
                                              << (c.uniform ? " (uniform)" : "");
  PageTable t(s.page_size, pages + 3, c.lens.size(), rng);  // pages no request owns stay unread
  t.grow(c.lens);
  const DecodeInputs in = fp8_inputs(s, batch, pages + 3, kKScale, kVScale, c.uniform, rng);
  const DecodeRef ref = decode_reference(in, t, c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(s.d)));
  const DecodeDevice dev(in, pages);
  dev.set_table(t);

  dev.poison();
  dev.paged(3, true, c.scale, nullptr, kKScale, kVScale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> out = dev.out_bytes(), lse = dev.lse_bytes();
  const std::vector<double> got_lse = decode(DType::kF32, lse);
  expect_matches(in, ref, true, decode(s.dt, out), &got_lse, ::testing::Message(what) << " batch_decode_paged");

  const Workspace ws(batch_decode_workspace_bytes(batch, s.nheads, s.nheads_kv, s.d, 0));
  const DecodePlanInfo info = plan_for(s, t, ws, nullptr, DType::kE4M3);
  if (*std::max_element(c.lens.begin(), c.lens.end()) >= 16384) {
    EXPECT_TRUE(info.split) << what << ": " << info.chunks << " chunks of " << info.chunk_pages << " pages";
  }
  dev.poison();
  dev.run(info, ws.view(), true, c.scale, nullptr, kKScale, kVScale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> run_lse = dev.got_lse();
  expect_matches(in, ref, true, dev.got(), &run_lse, ::testing::Message(what) << " plan / run");
  EXPECT_TRUE(dev.out_bytes() == out) << what << ": plan / run's out differs from batch_decode_paged's (the same plan)";
  EXPECT_TRUE(dev.lse_bytes() == lse) << what << ": plan / run's lse differs from batch_decode_paged's (the same plan)";

  const DecodePlanInfo info16 = plan_for(s, t, ws, nullptr, DType::kBF16);
  dev.poison();
  dev.run(info16, ws.view(), true, c.scale, nullptr, kKScale, kVScale);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> run16_lse = dev.got_lse();
  expect_matches(in, ref, true, dev.got(), &run16_lse,
                 ::testing::Message(what) << " plan / run, planned for a 16-bit cache (" << info16.chunks << " chunks)");
}

TEST(PagedDecode, Fp8CacheMatchesTheDequantizedReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(822);
  // A long request (split) among short ones: 0 keys (out 0, lse -inf), 1, a page + 1, a tile + 1.
  const std::vector<int64_t> lens = {0, 1, 17, 20000 + 3, 65};
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t d : {64, 128})
      for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
        const float scale = (dt == DType::kBF16) == (layout == KvLayout::kNHD) ? 0.f : 0.004f;  // each dtype, d, layout: both
        check_fp8({{dt, 16, layout, 32, 8, d}, lens, scale}, rng);
      }
  check_fp8({{DType::kF16, 16, KvLayout::kNHD, 8, 8, 128}, {65, 0, 3000, 1, 17}, 0.004f}, rng);  // MHA
  // Uniform (q = 0, V in eighths): every key weighs 1, the sums are exact: a key of the long
  // request missed or repeated shows.
  check_fp8({{DType::kBF16, 16, KvLayout::kHND, 32, 8, 64}, {17, 20000 + 5, 1, 0, 65}, 0.f, true}, rng);
  // The TMA path's other boxes (head dim 128): 8 a tile (page 8), a tile within a page (page 128).
  check_fp8({{DType::kF16, 8, KvLayout::kNHD, 32, 8, 128}, {0, 1, 17, 70, 2000}, 0.f}, rng);
  check_fp8({{DType::kBF16, 128, KvLayout::kHND, 16, 2, 128}, {1, 63, 64, 65, 129, 3000}, 0.004f}, rng);
}

// NaN codes in the unowned slots of an e4m3 cache (the TMA path at head dim 128, cp.async at 64).
TEST(PagedDecode, Fp8SlotsPastTheEndDoNotReachTheOutput) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(824);
  const std::vector<int64_t> lens = {1, 17, 63, 64, 65, 1000, 0, 130};
  for (const DecodeShape& s : {DecodeShape{DType::kBF16, 16, KvLayout::kNHD, 32, 8, 128},
                               DecodeShape{DType::kF16, 64, KvLayout::kHND, 8, 2, 128},
                               DecodeShape{DType::kBF16, 16, KvLayout::kHND, 8, 2, 64}}) {
    const int64_t pages = pages_for(lens, s.page_size);
    PageTable t(s.page_size, pages + 3, lens.size(), rng);
    t.grow(lens);
    DecodeInputs in = fp8_inputs(s, static_cast<int64_t>(lens.size()), pages + 3, 0.5, 0.25, false, rng);
    check_unowned_slots_unread(in, t, 0.5f, 0.25f, describe(s) << " e4m3 cache");
  }
}

// An e4m3 cache's argument checks: rungs 1-2 (no e4m3 kernel), scales not positive and finite,
// scales other than 1 with a 16-bit cache, a 32-bit query; each rejected with its argument named,
// nothing launched, out, lse and the workspace untouched.
TEST(PagedDecode, Fp8CacheRejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(823);
  const DecodeShape s{DType::kBF16, 16, KvLayout::kNHD, 8, 2, 64};
  PageTable t(s.page_size, 16, 2, rng);
  t.grow({20, 33});
  const DecodeInputs in8 = fp8_inputs(s, 2, 16, 0.5, 0.25, false, rng), in16(s, 2, 16, rng);
  const DecodeDevice dev8(in8, 16), dev16(in16, 16);
  dev8.set_table(t);
  dev16.set_table(t);
  const Workspace ws(batch_decode_workspace_bytes(2, 8, 2, 64, 0));
  const DecodePlanInfo info = plan_for(s, t, ws, nullptr, DType::kE4M3);
  dev8.poison();
  dev16.poison();
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> planned = download(ws.buf.ptr, ws.buf.bytes);
  const auto untouched = [&](const std::string& what) {
    for (const DecodeDevice* dev : {&dev8, &dev16}) {
      EXPECT_TRUE(all_poisoned(dev->out_bytes())) << what << ": out was written";
      EXPECT_TRUE(all_poisoned(dev->lse_bytes())) << what << ": lse was written";
    }
    EXPECT_TRUE(download(ws.buf.ptr, ws.buf.bytes) == planned) << what << ": the workspace changed";
  };
  const std::string paged = "batch_decode_paged: ", run = "batch_decode_run: ";

  for (int rung : {1, 2}) {
    expect_rejected([&] { dev8.paged(rung, true, 0.f, nullptr, 0.5f, 0.25f); },
                    {paged + "argument 'k_cache'", "e4m3 caches: rung 3", "got e4m3"});
    untouched("e4m3 at rung " + std::to_string(rung));
  }
  for (float bad : {0.f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::string what = "scale " + std::to_string(bad);
    expect_rejected([&] { dev8.paged(3, true, 0.f, nullptr, bad, 0.25f); },
                    {paged + "argument 'k_scale'", "expected a positive finite value"});
    expect_rejected([&] { dev8.paged(3, true, 0.f, nullptr, 0.5f, bad); },
                    {paged + "argument 'v_scale'", "expected a positive finite value"});
    expect_rejected([&] { dev8.run(info, ws.view(), true, 0.f, nullptr, bad, 0.25f); },
                    {run + "argument 'k_scale'", "expected a positive finite value"});
    expect_rejected([&] { dev8.run(info, ws.view(), true, 0.f, nullptr, 0.5f, bad); },
                    {run + "argument 'v_scale'", "expected a positive finite value"});
    untouched(what);
  }
  expect_rejected([&] { dev8.paged(3, true, 0.f, nullptr, -0.5f, 0.25f); }, {paged + "argument 'k_scale'", "got -0.5"});
  untouched("k_scale -0.5");

  // Scales are for e4m3 caches: a 16-bit cache takes 1 and 1.
  const std::string ones = "arguments 'k_scale', 'v_scale': expected 1 for a bf16 cache";
  expect_rejected([&] { dev16.paged(3, true, 0.f, nullptr, 0.5f, 0.25f); }, {paged + ones, "got 0.5, 0.25"});
  expect_rejected([&] { dev16.paged(2, true, 0.f, nullptr, 1.f, 0.25f); }, {paged + ones, "got 1, 0.25"});
  const DecodePlanInfo info16 = plan_for(s, t, ws, nullptr);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> planned16 = download(ws.buf.ptr, ws.buf.bytes);
  expect_rejected([&] { dev16.run(info16, ws.view(), true, 0.f, nullptr, 0.5f, 1.f); }, {run + ones, "got 0.5, 1"});
  EXPECT_TRUE(download(ws.buf.ptr, ws.buf.bytes) == planned16) << "scales with a 16-bit cache: the workspace changed";
  for (const DecodeDevice* dev : {&dev8, &dev16}) {
    EXPECT_TRUE(all_poisoned(dev->out_bytes())) << "scales with a 16-bit cache: out was written";
    EXPECT_TRUE(all_poisoned(dev->lse_bytes())) << "scales with a 16-bit cache: lse was written";
  }

  // An e4m3 cache takes fp16 / bf16 queries only.
  DeviceBuffer q32(2 * 8 * 64 * 4), out32(2 * 8 * 64 * 4);
  FLASHLAB_CUDA_CHECK(cudaMemset(q32.ptr, 0, q32.bytes));
  out32.poison();
  expect_rejected(
      [&] {
        batch_decode_paged(device_view(q32.ptr, DType::kF32, {2, 8, 64}), dev8.kv(), dev8.vv(), dev8.indv(), dev8.ptrv(),
                           dev8.lastv(), device_view(out32.ptr, DType::kF32, {2, 8, 64}), nullptr, s.layout, 0.f, nullptr, 3,
                           0.5f, 0.25f);
      },
      {paged + "argument 'q'", "got fp32"});
  EXPECT_TRUE(all_poisoned(download(out32.ptr, out32.bytes))) << "an fp32 query: out was written";
}

}  // namespace
}  // namespace flashlab
