// merge_state / merge_states (include/flashlab/serving.h) against the float64 reference
// (src/reference/serving.h) on fresh random states, outputs poisoned (NaN) before each launch:
// every dtype, head dims 8 .. 256, 1 .. 6 states, states with s = -inf (empty segments) and rows
// where every state is -inf (V = 0, S = -inf exactly), in place. Tolerance: the kernel computes
// in fp32 from the exact input values and rounds V once: |V - ref| <= u(dtype) |ref| + 2^-20
// max|v| (fp32 weights and sums, num_states <= 6), S within 2^-20 (1 + |S|).
// Then the meaning of a merge on the device: attention_fwd over two key segments, merged, against
// the float64 attention over all the keys, within the partial outputs' own measured error plus
// one rounding of each partial output and of the result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/serving.h"
#include "src/reference/attention.h"
#include "src/reference/serving.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Random states (seq, n, nheads, d) and their s, some -inf; row 0 has every state -inf.
struct States {
  HostTensor v;
  std::vector<double> s;
};
States random_states(DType dt, int64_t seq, int64_t n, int64_t nheads, int64_t d, std::mt19937_64& rng) {
  States st{random_tensor(dt, seq * n * nheads * d, rng, -2, 2), {}};
  std::uniform_real_distribution<double> lse(-6, 6);
  std::uniform_int_distribution<int> empty(0, 4);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < nheads; ++h)
        st.s.push_back(t == 0 || empty(rng) == 0 ? -kInf : static_cast<float>(lse(rng)));
  return st;
}

std::vector<uint8_t> f32_bytes(const std::vector<double>& x) {
  std::vector<uint8_t> b(x.size() * 4);
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(x[i]);
    std::memcpy(b.data() + 4 * i, &f, 4);
  }
  return b;
}

void expect_merged(DType dt, const std::vector<double>& got_v, const std::vector<double>& got_s,
                   const reference::MergedStates& ref, double max_v, const ::testing::Message& what) {
  int64_t bad_v = 0, bad_s = 0;
  for (size_t x = 0; x < ref.v.size(); ++x)
    bad_v += !(std::fabs(got_v[x] - ref.v[x]) <= unit_roundoff(dt) * std::fabs(ref.v[x]) + std::ldexp(max_v, -20));
  for (size_t x = 0; x < ref.s.size(); ++x)
    bad_s += std::isinf(ref.s[x]) ? got_s[x] != ref.s[x] : !(std::fabs(got_s[x] - ref.s[x]) <= std::ldexp(1 + std::fabs(ref.s[x]), -20));
  EXPECT_EQ(bad_v, 0) << what << ": V elements outside the tolerance (or NaN)";
  EXPECT_EQ(bad_s, 0) << what << ": S entries outside the tolerance (-inf must match exactly)";
}

TEST(MergeState, RandomStatesEveryDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(301);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t d : {8, 64, 128, 256})
      for (int64_t n : {1, 2, 6}) {
        if (d * dtype_size(dt) % 16 != 0) continue;
        const int64_t seq = 37, nheads = 5;
        const States st = random_states(dt, seq, n, nheads, d, rng);
        const reference::MergedStates ref = reference::merge_states(st.v.values, st.s, seq, n, nheads, d);
        double max_v = 0;
        for (double x : st.v.values) max_v = std::max(max_v, std::fabs(x));
        const int64_t es = dtype_size(dt);
        DeviceBuffer v(st.v.bytes.size()), s(st.s.size() * 4), vo(seq * nheads * d * es), so(seq * nheads * 4);
        upload(v.ptr, st.v.bytes);
        upload(s.ptr, f32_bytes(st.s));
        const ::testing::Message what = ::testing::Message() << dtype_name(dt) << " d " << d << " states " << n;
        // merge_states on all n.
        vo.poison(), so.poison();
        merge_states(device_view(v.ptr, dt, {seq, n, nheads, d}), device_view(s.ptr, DType::kF32, {seq, n, nheads}),
                     device_view(vo.ptr, dt, {seq, nheads, d}), device_view(so.ptr, DType::kF32, {seq, nheads}));
        FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
        expect_merged(dt, decode(dt, download(vo.ptr, vo.bytes)), decode(DType::kF32, download(so.ptr, so.bytes)), ref, max_v,
                      ::testing::Message(what) << " merge_states");
        if (n != 2) continue;
        // merge_state on the same two states, given as separate (seq, nheads, d) tensors, then in place.
        std::vector<uint8_t> va, vb;
        std::vector<double> sa, sb;
        for (int64_t t = 0; t < seq; ++t) {
          const size_t row = static_cast<size_t>(nheads * d * es);
          const uint8_t* base = st.v.bytes.data() + t * 2 * row;
          va.insert(va.end(), base, base + row);
          vb.insert(vb.end(), base + row, base + 2 * row);
          for (int64_t h = 0; h < nheads; ++h) sa.push_back(st.s[(t * 2) * nheads + h]), sb.push_back(st.s[(t * 2 + 1) * nheads + h]);
        }
        DeviceBuffer dva(va.size()), dvb(vb.size()), dsa(sa.size() * 4), dsb(sb.size() * 4);
        upload(dva.ptr, va), upload(dvb.ptr, vb), upload(dsa.ptr, f32_bytes(sa)), upload(dsb.ptr, f32_bytes(sb));
        const TensorView Va = device_view(dva.ptr, dt, {seq, nheads, d}), Vb = device_view(dvb.ptr, dt, {seq, nheads, d});
        const TensorView Sa = device_view(dsa.ptr, DType::kF32, {seq, nheads}), Sb = device_view(dsb.ptr, DType::kF32, {seq, nheads});
        vo.poison(), so.poison();
        merge_state(Va, Sa, Vb, Sb, device_view(vo.ptr, dt, {seq, nheads, d}), device_view(so.ptr, DType::kF32, {seq, nheads}));
        FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
        expect_merged(dt, decode(dt, download(vo.ptr, vo.bytes)), decode(DType::kF32, download(so.ptr, so.bytes)), ref, max_v,
                      ::testing::Message(what) << " merge_state");
        merge_state(Va, Sa, Vb, Sb, Va, Sa);  // in place
        FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
        expect_merged(dt, decode(dt, download(dva.ptr, dva.bytes)), decode(DType::kF32, download(dsa.ptr, dsa.bytes)), ref,
                      max_v, ::testing::Message(what) << " merge_state in place");
      }
}

// Attention over keys [0, k1) and [k1, sk) by attention_fwd (the automatic rung), merged, against
// the float64 attention over [0, sk).
TEST(MergeState, SplitAttentionMergesToTheWhole) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(302);
  const DType dt = DType::kBF16;
  const int64_t sq = 33, sk = 300, k1 = 117, h = 4, d = 128;
  const HostTensor q = random_tensor(dt, sq * h * d, rng, -2, 2), k = random_tensor(dt, sk * h * d, rng, -2, 2),
                   v = random_tensor(dt, sk * h * d, rng, -1, 1);
  const int64_t es = dtype_size(dt);
  DeviceBuffer dq(q.bytes.size()), dk(k.bytes.size()), dv(v.bytes.size()), o2(2 * sq * h * d * es), lse(2 * h * sq * 4),
      vo(sq * h * d * es), so(sq * h * 4);
  upload(dq.ptr, q.bytes), upload(dk.ptr, k.bytes), upload(dv.ptr, v.bytes);
  const auto segment = [&](int part, int64_t k0, int64_t kn) {
    const TensorView lse_v = device_view(static_cast<char*>(lse.ptr) + part * h * sq * 4, DType::kF32, {1, h, sq});
    AttnFwdOptions opt;
    opt.softmax_lse = &lse_v;
    attention_fwd(device_view(dq.ptr, dt, {1, sq, h, d}), device_view(static_cast<char*>(dk.ptr) + k0 * h * d * es, dt, {1, kn, h, d}),
                  device_view(static_cast<char*>(dv.ptr) + k0 * h * d * es, dt, {1, kn, h, d}),
                  device_view(static_cast<char*>(o2.ptr) + part * sq * h * d * es, dt, {1, sq, h, d}), nullptr,
                  kAttnFwdRungAuto, opt);
  };
  segment(0, 0, k1);
  segment(1, k1, sk - k1);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // lse comes as (1, nheads, sq); merge_state takes (sq, nheads).
  const std::vector<double> lse_hs = decode(DType::kF32, download(lse.ptr, lse.bytes));
  std::vector<double> sa(sq * h), sb(sq * h);
  for (int64_t t = 0; t < sq; ++t)
    for (int64_t hh = 0; hh < h; ++hh) sa[t * h + hh] = lse_hs[hh * sq + t], sb[t * h + hh] = lse_hs[h * sq + hh * sq + t];
  DeviceBuffer dsa(sa.size() * 4), dsb(sb.size() * 4);
  upload(dsa.ptr, f32_bytes(sa)), upload(dsb.ptr, f32_bytes(sb));
  vo.poison(), so.poison();
  merge_state(device_view(o2.ptr, dt, {sq, h, d}), device_view(dsa.ptr, DType::kF32, {sq, h}),
              device_view(static_cast<char*>(o2.ptr) + sq * h * d * es, dt, {sq, h, d}), device_view(dsb.ptr, DType::kF32, {sq, h}),
              device_view(vo.ptr, dt, {sq, h, d}), device_view(so.ptr, DType::kF32, {sq, h}));
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  // References: each segment and the whole.
  reference::AttnRefArgs a;
  a.nheads = a.nheads_kv = h, a.headdim = d, a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.cu_seqlens_q = {0, sq};
  const auto ref_over = [&](int64_t k0, int64_t kn) {
    reference::AttnRefArgs b = a;
    b.cu_seqlens_k = {0, kn};
    const auto rows = [&](const HostTensor& x) {
      return std::vector<double>(x.values.begin() + k0 * h * d, x.values.begin() + (k0 + kn) * h * d);
    };
    return reference::attention_fwd(q.values, rows(k), rows(v), b);
  };
  const reference::AttnRefResult ra = ref_over(0, k1), rb = ref_over(k1, sk - k1), whole = ref_over(0, sk);
  // The partial outputs' own error (kernel vs float64), measured.
  const std::vector<double> parts = decode(dt, download(o2.ptr, o2.bytes));
  double part_err = 0, max_o = 0;
  for (int64_t x = 0; x < sq * h * d; ++x) {
    part_err = std::max({part_err, std::fabs(parts[x] - ra.out[x]), std::fabs(parts[sq * h * d + x] - rb.out[x])});
    max_o = std::max({max_o, std::fabs(ra.out[x]), std::fabs(rb.out[x])});
  }
  // Merged = sum of weights (summing to 1) times the partial outputs as stored, rounded once:
  // error <= part_err + u max|o| (the result's rounding) + fp32 terms.
  const double bound = part_err + unit_roundoff(dt) * max_o + std::ldexp(max_o, -20);
  const std::vector<double> got = decode(dt, download(vo.ptr, vo.bytes)), got_s = decode(DType::kF32, download(so.ptr, so.bytes));
  double worst = 0;
  for (size_t x = 0; x < got.size(); ++x) worst = std::max(worst, std::isnan(got[x]) ? kInf : std::fabs(got[x] - whole.out[x]));
  EXPECT_LE(worst, bound) << "merged output vs the whole attention (partial outputs' own error " << part_err << ")";
  // S = log(e^{s_a} + e^{s_b}) moves by at most the larger error of s_a, s_b (measured), plus fp32.
  double worst_s = 0, part_s_err = 0, max_s = 0;
  for (int64_t x = 0; x < sq * h; ++x)
    part_s_err = std::max({part_s_err, std::fabs(lse_hs[x] - ra.lse[x]), std::fabs(lse_hs[h * sq + x] - rb.lse[x])});
  for (int64_t t = 0; t < sq; ++t)
    for (int64_t hh = 0; hh < h; ++hh) {
      worst_s = std::max(worst_s, std::fabs(got_s[t * h + hh] - whole.lse[hh * sq + t]));
      max_s = std::max(max_s, std::fabs(whole.lse[hh * sq + t]));
    }
  EXPECT_LE(worst_s, part_s_err + std::ldexp(1 + max_s, -20)) << "merged lse vs the whole attention's (segments' own lse error "
                                                              << part_s_err << ")";
}

}  // namespace
}  // namespace flashlab
