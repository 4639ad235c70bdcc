// Attention test cases on the GPU, shared by the forward and backward tests: a case's shape and
// options, its tensors' device layouts (contiguous, padded heads, head-major; packed for varlen),
// host <-> device copies in those layouts, and the case's cu_seqlens and ALiBi slopes on the
// device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "flashlab/attention.h"
#include "flashlab/tensor.h"
#include "kernels/common/philox.cuh"
#include "src/reference/attention.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab::testing {

// Memory order of a fixed-length (batch, seq, heads, d) tensor: contiguous; heads padded by 8
// elements; or head-major storage (batch, heads, seq, d) seen as (batch, seq, heads, d).
enum class Layout { kContig, kPadded, kHeadMajor };

struct Case {
  int64_t batch = 1, h = 1, hk = 1, d = 64;
  std::vector<int64_t> lq, lk;  // per-batch lengths (all equal unless varlen)
  bool varlen = false, causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  int alibi = 0;  // 0 none, 1 (nheads,), 2 (batch, nheads)
  Layout layout = Layout::kContig;
  double range = 2.0;  // inputs uniform in [-range, range]
  bool probs = false;
  float dropout_p = 0.f;  // > 0: dropout with this seed and offset
  uint64_t seed = 0;
  uint32_t offset = 0;
};

inline Case fixed(int64_t batch, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d) {
  Case c;
  c.batch = batch, c.h = h, c.hk = hk, c.d = d;
  c.lq.assign(batch, sq);
  c.lk.assign(batch, sk);
  return c;
}

inline ::testing::Message describe(const Case& c, DType dt, int rung) {
  ::testing::Message m;
  m << dtype_name(dt) << " rung " << rung << " batch " << c.batch << " heads " << c.h << "/" << c.hk << " d " << c.d
    << " lq";
  for (int64_t x : c.lq) m << " " << x;
  m << " lk";
  for (int64_t x : c.lk) m << " " << x;
  m << (c.varlen ? " varlen" : "") << (c.causal ? " causal" : "") << " window (" << c.wl << ", " << c.wr << ")";
  if (c.softcap > 0) m << " softcap " << c.softcap;
  if (c.alibi) m << " alibi " << c.alibi;
  if (c.dropout_p > 0) m << " dropout " << c.dropout_p << " seed " << c.seed << " offset " << c.offset;
  m << " layout " << static_cast<int>(c.layout);
  return m;
}

// A device tensor of `rows` packed rows (total, heads, d) or fixed (batch, seq, heads, d) in the
// case's layout: its view and the element offset of (batch b, packed row r = cu[b] + i, head,
// column c).
struct DevTensor {
  std::vector<int64_t> shape, strides;
  int64_t elems = 0;  // storage size in elements
  int64_t offset(int64_t b, int64_t i, int64_t packed_row, int64_t head, int64_t c, bool varlen) const {
    if (varlen) return packed_row * strides[0] + head * strides[1] + c;
    return b * strides[0] + i * strides[1] + head * strides[2] + c;
  }
};

// es: bytes per element (the padding is 16 bytes).
inline DevTensor make_layout(const Case& c, int64_t total, int64_t seq, int64_t heads, int64_t es = 2) {
  DevTensor t;
  const int64_t dp = c.layout == Layout::kPadded ? c.d + 16 / es : c.d;
  if (c.varlen) {
    t.shape = {total, heads, c.d};
    t.strides = {heads * dp, dp, 1};
    t.elems = total * heads * dp;
  } else if (c.layout == Layout::kHeadMajor) {
    t.shape = {c.batch, seq, heads, c.d};
    t.strides = {heads * seq * c.d, c.d, seq * c.d, 1};
    t.elems = c.batch * heads * seq * c.d;
  } else {
    t.shape = {c.batch, seq, heads, c.d};
    t.strides = {seq * heads * dp, heads * dp, dp, 1};
    t.elems = c.batch * seq * heads * dp;
  }
  return t;
}

inline std::vector<int64_t> prefix(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu{0};
  for (int64_t x : lens) cu.push_back(cu.back() + x);
  return cu;
}

// Bytes of a device tensor from packed host values (total, heads, d); padding poisoned.
inline std::vector<uint8_t> scatter(const HostTensor& packed, const DevTensor& t, const Case& c, const std::vector<int64_t>& cu,
                             int64_t heads) {
  const int64_t es = dtype_size(packed.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(std::max<int64_t>(t.elems, 1) * es), 0xff);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < cu[b + 1] - cu[b]; ++i)
      for (int64_t hh = 0; hh < heads; ++hh)
        std::memcpy(out.data() + t.offset(b, i, cu[b] + i, hh, 0, c.varlen) * es,
                    packed.bytes.data() + ((cu[b] + i) * heads + hh) * c.d * es, static_cast<size_t>(c.d * es));
  return out;
}

inline std::vector<double> gather(const std::vector<double>& dev, const DevTensor& t, const Case& c, const std::vector<int64_t>& cu,
                           int64_t heads) {
  std::vector<double> out(static_cast<size_t>(cu.back() * heads * c.d));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < cu[b + 1] - cu[b]; ++i)
      for (int64_t hh = 0; hh < heads; ++hh)
        for (int64_t x = 0; x < c.d; ++x)
          out[((cu[b] + i) * heads + hh) * c.d + x] = dev[t.offset(b, i, cu[b] + i, hh, x, c.varlen)];
  return out;
}

// A case's cu_seqlens (int32, batch + 1) and ALiBi slopes (fp32, (nheads,) or (batch, nheads)) on
// the device, and their views.
struct CaseAux {
  const Case& c;
  DeviceBuffer cuq, cuk, slopes;
  CaseAux(const Case& c_, const std::vector<int64_t>& cu_q32, const std::vector<int64_t>& cu_k32, const std::vector<double>& s)
      : c(c_), cuq(cu_q32.size() * 4), cuk(cu_k32.size() * 4), slopes(std::max<size_t>(s.size(), 1) * 4) {
    const std::vector<int> q32(cu_q32.begin(), cu_q32.end()), k32(cu_k32.begin(), cu_k32.end());
    const std::vector<float> f32(s.begin(), s.end());
    FLASHLAB_CUDA_CHECK(cudaMemcpy(cuq.ptr, q32.data(), q32.size() * 4, cudaMemcpyHostToDevice));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(cuk.ptr, k32.data(), k32.size() * 4, cudaMemcpyHostToDevice));
    if (!f32.empty()) FLASHLAB_CUDA_CHECK(cudaMemcpy(slopes.ptr, f32.data(), f32.size() * 4, cudaMemcpyHostToDevice));
  }
  TensorView cu_q() const { return device_view(cuq.ptr, DType::kI32, {c.batch + 1}); }
  TensorView cu_k() const { return device_view(cuk.ptr, DType::kI32, {c.batch + 1}); }
  TensorView alibi_slopes() const {
    return c.alibi == 2 ? device_view(slopes.ptr, DType::kF32, {c.batch, c.h}) : device_view(slopes.ptr, DType::kF32, {c.h});
  }
};

inline void expect_no_nan(const std::vector<double>& v, const ::testing::Message& what) {
  const auto n = std::count_if(v.begin(), v.end(), [](double x) { return std::isnan(x); });
  EXPECT_EQ(n, 0) << what << ": NaN in the output";
}

// A kernel's lse against the reference's (both (nheads, total_q) here): -inf must match exactly
// (rows that see no key), the rest within the rule (2x the naive error + 1e-5 (1 + max|lse|)).
inline void expect_lse_matches(std::vector<double> lse, std::vector<double> lse_ref, std::vector<double> lse_naive,
                               const ::testing::Message& what) {
  int64_t inf_mismatch = 0;
  double max_lse = 0;
  for (size_t x = 0; x < lse.size(); ++x) {
    if (std::isinf(lse_ref[x]) || std::isinf(lse[x])) {
      inf_mismatch += lse[x] != lse_ref[x];
      lse[x] = lse_ref[x] = lse_naive[x] = 0;
    }
    max_lse = std::max(max_lse, std::fabs(lse_ref[x]));
  }
  EXPECT_EQ(inf_mismatch, 0) << what << ": lse rows where exactly one of kernel and reference is -inf";
  expect_no_nan(lse, what);
  expect_within_tolerance(lse, lse_naive, lse_ref, 1e-5 * (1 + max_lse), ::testing::Message(what) << " (lse)");
}

// The case's ALiBi slopes, fp32 values in [0.01, 0.5): none, (nheads,) or (batch, nheads).
inline std::vector<double> random_slopes(const Case& c, std::mt19937_64& rng) {
  std::vector<double> slopes;
  std::uniform_real_distribution<double> slope(0.01, 0.5);
  for (int64_t n = 0; n < (c.alibi == 2 ? c.batch * c.h : c.alibi == 1 ? c.h : 0); ++n)
    slopes.push_back(static_cast<float>(slope(rng)));
  return slopes;
}

// The case's dropout mask, (batch, nheads, max_sq, max_sk), 1 where kept: the draws the kernels
// make (kernels/common/philox.cuh, the same functions on the host), on each batch's own rows and
// keys (0 past its lengths).
inline std::vector<uint8_t> dropout_keep(const Case& c) {
  const int64_t max_sq = *std::max_element(c.lq.begin(), c.lq.end()), max_sk = *std::max_element(c.lk.begin(), c.lk.end());
  std::vector<uint8_t> keep(static_cast<size_t>(c.batch * c.h * max_sq * max_sk), 0);
  const uint32_t threshold = kernels::dropout_threshold(c.dropout_p);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t i = 0; i < c.lq[b]; ++i)
        for (int64_t j = 0; j < c.lk[b]; ++j) {
          const uint32_t draw = kernels::dropout_draw(c.seed, c.offset, static_cast<uint32_t>(b), static_cast<uint32_t>(h),
                                                      static_cast<uint32_t>(c.h), static_cast<uint32_t>(i), static_cast<uint32_t>(j));
          keep[((b * c.h + h) * max_sq + i) * max_sk + j] = draw >= threshold;
        }
  return keep;
}

// The reference's arguments for the case (scale: the float the kernels use for the default).
inline reference::AttnRefArgs ref_args(const Case& c, const std::vector<int64_t>& cuq, const std::vector<int64_t>& cuk,
                                       const std::vector<double>& slopes) {
  reference::AttnRefArgs args;
  args.batch = c.batch, args.nheads = c.h, args.nheads_kv = c.hk, args.headdim = c.d;
  args.cu_seqlens_q = cuq, args.cu_seqlens_k = cuk;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  args.causal = c.causal, args.window_left = c.wl, args.window_right = c.wr, args.softcap = c.softcap;
  args.alibi_slopes = slopes;
  if (c.dropout_p > 0) args.dropout_p = c.dropout_p, args.dropout_keep = dropout_keep(c);
  return args;
}

// The case's options (mask, softcap, slopes when it has them, varlen offsets when varlen) and
// the lse; the views must outlive `opt`.
inline void set_case_options(AttnFwdOptions& opt, const Case& c, const TensorView& cu_q, const TensorView& cu_k,
                             const TensorView& slopes, const TensorView& lse, int64_t max_sq, int64_t max_sk) {
  opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr, opt.softcap = c.softcap;
  if (c.alibi) opt.alibi_slopes = &slopes;
  if (c.varlen) opt.cu_seqlens_q = &cu_q, opt.cu_seqlens_k = &cu_k, opt.max_seqlen_q = max_sq, opt.max_seqlen_k = max_sk;
  opt.softmax_lse = &lse;
  opt.dropout_p = c.dropout_p, opt.dropout_seed = c.seed, opt.dropout_offset = c.offset;
}

}  // namespace flashlab::testing
