// RoPE (apply_rope_pos_ids, the Llama 3.1 variant, apply_rope_with_cos_sin_cache), every rung,
// against the float64 reference on fresh random inputs, outputs poisoned before each launch.
//
// The naive computation the tolerance is measured against is the same maths in fp32: the fp32
// angle float(pos) * inv_freq_f32 (inv_freq_f32 from kernels/rope/params.h, the value every
// rung uses), cos/sin of that angle rounded to fp32, the rotation in fp32, one rounding to the
// dtype. At position 1M the fp32 angle alone is off by up to ~0.03 rad, and that error is what
// fp32 RoPE has; a kernel with a fast, range-limited sine would fail here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "flashlab/rope.h"
#include "kernels/rope/params.h"
#include "src/reference/rope.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct Case {
  int64_t nnz, hq, hk, hd;
  int rd;
  bool interleave = false;
  bool in_place = false;
  int64_t token_pad = 0;  // extra elements between tokens (strided token dim)
  bool pos_i64 = false;
  bool llama31 = false;
  int64_t max_pos = 1 << 20;
  bool cache = false;
};

::testing::Message describe(DType dt, const Case& c, int rung) {
  return ::testing::Message() << "rope " << dtype_name(dt) << " nnz " << c.nnz << " heads " << c.hq << "/" << c.hk
                              << " head_dim " << c.hd << " rotary_dim " << c.rd
                              << (c.interleave ? " gptj" : " neox") << (c.in_place ? " in-place" : "") << " pad "
                              << c.token_pad << (c.pos_i64 ? " int64" : " int32") << (c.llama31 ? " llama31" : "")
                              << (c.cache ? " cache" : "") << " max_pos " << c.max_pos << " rung " << rung;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// (nnz, heads, hd) host values <-> a device buffer with token stride heads * hd + pad.
void upload_tokens(const DeviceBuffer& buf, const HostTensor& t, int64_t nnz, int64_t row, int64_t stride) {
  const int es = dtype_size(t.dtype);
  buf.poison();
  FLASHLAB_CUDA_CHECK(cudaMemcpy2D(buf.ptr, stride * es, t.bytes.data(), row * es, row * es, nnz, cudaMemcpyHostToDevice));
}
std::vector<double> download_tokens(const DeviceBuffer& buf, DType dt, int64_t nnz, int64_t row, int64_t stride) {
  const int es = dtype_size(dt);
  std::vector<uint8_t> bytes(nnz * row * es);
  FLASHLAB_CUDA_CHECK(cudaMemcpy2D(bytes.data(), row * es, buf.ptr, stride * es, row * es, nnz, cudaMemcpyDeviceToHost));
  return decode(dt, bytes);
}

// The fp32 computation, rounded once to dt; cs(t, i) gives the fp32 (cos, sin).
template <typename CosSin>
std::vector<double> naive_rope(DType dt, const std::vector<double>& x, int64_t nnz, int64_t heads, int64_t hd, int rd,
                               bool interleave, CosSin cs) {
  std::vector<double> out(x);
  for (int64_t t = 0; t < nnz; ++t)
    for (int i = 0; i < rd / 2; ++i) {
      float c, s;
      cs(t, i, c, s);
      const int64_t d0 = interleave ? 2 * i : i, d1 = interleave ? 2 * i + 1 : i + rd / 2;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t b = (t * heads + h) * hd;
        const float x0 = static_cast<float>(x[b + d0]), x1 = static_cast<float>(x[b + d1]);
        out[b + d0] = round_to(dt, x0 * c - x1 * s);
        out[b + d1] = round_to(dt, x1 * c + x0 * s);
      }
    }
  return out;
}

void check_rope(DType dt, const Case& c, int rung, std::mt19937_64& rng) {
  const auto what = describe(dt, c, rung);
  const int es = dtype_size(dt);
  const int64_t qrow = c.hq * c.hd, krow = c.hk * c.hd, qs = qrow + c.token_pad, ks = krow + c.token_pad;
  const auto q = random_tensor(dt, c.nnz * qrow, rng, -2.0, 2.0), k = random_tensor(dt, c.nnz * krow, rng, -2.0, 2.0);
  std::uniform_int_distribution<int64_t> pd(0, c.max_pos - 1);
  std::vector<int64_t> pos(c.nnz);
  for (auto& p : pos) p = pd(rng);
  pos[0] = c.max_pos - 1;  // the largest position always
  DeviceBuffer dq(c.nnz * qs * es), dk(c.nnz * ks * es), dqo(c.nnz * qs * es), dko(c.nnz * ks * es);
  DeviceBuffer dpos(c.nnz * 8);
  upload_tokens(dq, q, c.nnz, qrow, qs);
  upload_tokens(dk, k, c.nnz, krow, ks);
  dqo.poison();
  dko.poison();
  if (c.pos_i64) {
    FLASHLAB_CUDA_CHECK(cudaMemcpy(dpos.ptr, pos.data(), c.nnz * 8, cudaMemcpyHostToDevice));
  } else {
    std::vector<int32_t> p32(pos.begin(), pos.end());
    FLASHLAB_CUDA_CHECK(cudaMemcpy(dpos.ptr, p32.data(), c.nnz * 4, cudaMemcpyHostToDevice));
  }
  const Device gpu{DeviceType::kCUDA, 0};
  const TensorView qv(dq.ptr, dt, {c.nnz, c.hq, c.hd}, {qs, c.hd, 1}, gpu), kv(dk.ptr, dt, {c.nnz, c.hk, c.hd}, {ks, c.hd, 1}, gpu);
  const TensorView qov(c.in_place ? dq.ptr : dqo.ptr, dt, {c.nnz, c.hq, c.hd}, {qs, c.hd, 1}, gpu),
      kov(c.in_place ? dk.ptr : dko.ptr, dt, {c.nnz, c.hk, c.hd}, {ks, c.hd, 1}, gpu);
  const TensorView pv(dpos.ptr, c.pos_i64 ? DType::kI64 : DType::kI32, {c.nnz}, gpu);

  std::vector<double> ref_q, ref_k, naive_q, naive_k;
  if (c.cache) {
    // cache rows of fp32 cos/sin at every position; reference and naive read the same values.
    std::vector<float> cache(c.max_pos * c.rd);
    std::vector<double> cache64(cache.size());
    for (int64_t p = 0; p < c.max_pos; ++p)
      for (int i = 0; i < c.rd / 2; ++i) {
        const double a = p * std::pow(1e4, -2.0 * i / c.rd);
        cache[p * c.rd + i] = static_cast<float>(std::cos(a));
        cache[p * c.rd + c.rd / 2 + i] = static_cast<float>(std::sin(a));
      }
    for (size_t i = 0; i < cache.size(); ++i) cache64[i] = cache[i];
    DeviceBuffer dc(cache.size() * 4);
    FLASHLAB_CUDA_CHECK(cudaMemcpy(dc.ptr, cache.data(), cache.size() * 4, cudaMemcpyHostToDevice));
    apply_rope_with_cos_sin_cache(qv, kv, qov, kov, pv, TensorView(dc.ptr, DType::kF32, {c.max_pos, c.rd}, gpu),
                                  c.interleave, nullptr, rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    ref_q = reference::rope_cos_sin_cache(q.values, pos, c.nnz, c.hq, c.hd, c.interleave, cache64, c.rd);
    ref_k = reference::rope_cos_sin_cache(k.values, pos, c.nnz, c.hk, c.hd, c.interleave, cache64, c.rd);
    auto cs = [&](int64_t t, int i, float& co, float& si) {
      co = cache[pos[t] * c.rd + i];
      si = cache[pos[t] * c.rd + c.rd / 2 + i];
    };
    naive_q = naive_rope(dt, q.values, c.nnz, c.hq, c.hd, c.rd, c.interleave, cs);
    naive_k = naive_rope(dt, k.values, c.nnz, c.hk, c.hd, c.rd, c.interleave, cs);
  } else {
    RopeOptions o;
    o.rotary_dim = c.rd;
    o.interleave = c.interleave;
    o.rope_theta = c.llama31 ? 5e5f : 1e4f;
    o.rope_scale = c.llama31 ? 1.f : 2.f;
    o.llama31 = c.llama31;
    apply_rope_pos_ids(qv, kv, qov, kov, pv, o, nullptr, rung);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    reference::RopeFreqRef rf;
    rf.theta = o.rope_theta;
    rf.scale = o.rope_scale;
    rf.llama31 = c.llama31;
    std::vector<double> inv(c.rd / 2);
    for (int i = 0; i < c.rd / 2; ++i) inv[i] = reference::rope_inv_freq(rf, i, c.rd);
    ref_q = reference::rope(q.values, pos, c.nnz, c.hq, c.hd, c.rd, c.interleave, inv);
    ref_k = reference::rope(k.values, pos, c.nnz, c.hk, c.hd, c.rd, c.interleave, inv);
    const RopeFreq kf{o.rope_theta, o.rope_scale, o.llama31, o.llama31_factor, o.low_freq_factor, o.high_freq_factor,
                      static_cast<double>(o.old_context_len)};
    auto cs = [&](int64_t t, int i, float& co, float& si) {
      const float a = static_cast<float>(pos[t]) * rope_inv_freq(kf, i, c.rd);
      co = static_cast<float>(std::cos(static_cast<double>(a)));
      si = static_cast<float>(std::sin(static_cast<double>(a)));
    };
    naive_q = naive_rope(dt, q.values, c.nnz, c.hq, c.hd, c.rd, c.interleave, cs);
    naive_k = naive_rope(dt, k.values, c.nnz, c.hk, c.hd, c.rd, c.interleave, cs);
  }
  const auto got_q = download_tokens(c.in_place ? dq : dqo, dt, c.nnz, qrow, qs);
  const auto got_k = download_tokens(c.in_place ? dk : dko, dt, c.nnz, krow, ks);
  expect_within_tolerance(got_q, naive_q, ref_q, unit_roundoff(dt) * max_abs(ref_q), ::testing::Message(what) << " (q)");
  expect_within_tolerance(got_k, naive_k, ref_k, unit_roundoff(dt) * max_abs(ref_k), ::testing::Message(what) << " (k)");
  // Dims past rotary_dim are the input's bits, copied or left alone.
  for (int64_t e = 0; e < c.nnz * qrow; ++e)
    if (e % c.hd >= c.rd && got_q[e] != q.values[e]) {
      ADD_FAILURE() << what << ": q tail element " << e << " changed";
      break;
    }
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(Rope, RungsLayoutsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(51);
  for (DType dt : kDtypes)
    for (int rung = 1; rung <= kRopeRungs; ++rung)
      for (bool interleave : {false, true})
        for (int64_t nnz : {1, 7, 1000})
          for (int64_t hd : {64, 128, 256}) {
            check_rope(dt, {nnz, 32, 8, hd, static_cast<int>(hd), interleave}, rung, rng);
            check_rope(dt, {nnz, 4, 2, hd, static_cast<int>(hd / 2), interleave}, rung, rng);  // rotary_dim < head_dim
          }
}

TEST(Rope, InPlaceStridedPositionsLlama31) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(52);
  for (DType dt : kDtypes)
    for (int rung = 1; rung <= kRopeRungs; ++rung)
      for (bool interleave : {false, true}) {
        Case c{7, 32, 8, 128, 64, interleave};
        c.in_place = true;
        check_rope(dt, c, rung, rng);
        c.in_place = false;
        c.token_pad = 3 * 128;  // token stride of a fused qkv-like buffer
        check_rope(dt, c, rung, rng);
        c.token_pad = 1;  // odd: off 16-byte boundaries, rung 2 takes rung 1's path
        check_rope(dt, c, rung, rng);
        c.token_pad = 0;
        c.pos_i64 = true;
        check_rope(dt, c, rung, rng);
        c.llama31 = true;
        check_rope(dt, c, rung, rng);
        c.in_place = true;
        check_rope(dt, c, rung, rng);
        Case small{1000, 32, 8, 128, 128, interleave};
        small.max_pos = 4096;  // short contexts too
        check_rope(dt, small, rung, rng);
        Case odd{33, 3, 1, 96, 34, interleave};  // rotary_dim 34: not whole vectors
        check_rope(dt, odd, rung, rng);
      }
}

TEST(Rope, CosSinCache) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(53);
  for (DType dt : kDtypes)
    for (int rung = 1; rung <= kRopeRungs; ++rung)
      for (bool interleave : {false, true})
        for (bool in_place : {false, true}) {
          Case c{1000, 32, 8, 128, 128, interleave, in_place};
          c.cache = true;
          c.max_pos = 8192;
          c.pos_i64 = true;
          check_rope(dt, c, rung, rng);
          Case part{7, 4, 2, 256, 64, interleave, in_place};
          part.cache = true;
          part.max_pos = 100;
          check_rope(dt, part, rung, rng);
        }
}

}  // namespace
}  // namespace flashlab
