// RMSNorm and fused add RMSNorm, every rung, against the float64 reference on fresh random
// inputs with outputs poisoned before each launch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashlab/norm.h"
#include "src/reference/norm.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct Shape {
  int64_t rows, hidden, stride;  // stride: elements between rows of input/out/residual
};

// fp32 computation of the same function on the host, rounded once to dt: the "naive" error.
std::vector<double> naive_rmsnorm(DType dt, const std::vector<double>& x, const std::vector<double>& w, int64_t rows,
                                  int64_t hidden, float eps, bool gemma) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    float ss = 0.f;
    for (int64_t c = 0; c < hidden; ++c) ss += static_cast<float>(x[r * hidden + c]) * static_cast<float>(x[r * hidden + c]);
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
    for (int64_t c = 0; c < hidden; ++c) {
      const float wc = gemma ? 1.f + static_cast<float>(w[c]) : static_cast<float>(w[c]);
      out[r * hidden + c] = round_to(dt, static_cast<float>(x[r * hidden + c]) * inv * wc);
    }
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

void check_rmsnorm(DType dt, Shape s, int rung, bool gemma, bool in_place, std::mt19937_64& rng) {
  const float eps = 1e-5f;
  const auto x = random_tensor(dt, s.rows * s.hidden, rng, -2.0, 2.0);
  const auto w = random_tensor(dt, s.hidden, rng, 0.5, 1.5);
  const size_t bytes = static_cast<size_t>(s.rows * s.stride) * dtype_size(dt);
  DeviceBuffer dx(bytes), dout(bytes), dw(s.hidden * dtype_size(dt));
  upload_rows(dx, x, s.rows, s.hidden, s.stride);
  upload(dw.ptr, w.bytes);
  dout.poison();
  const Device gpu{DeviceType::kCUDA, 0};
  TensorView xv(dx.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu);
  TensorView ov(in_place ? dx.ptr : dout.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu);
  rmsnorm(xv, device_view(dw.ptr, dt, {s.hidden}), ov, eps, gemma, nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = download_rows(in_place ? dx : dout, dt, s.rows, s.hidden, s.stride);
  const auto ref = reference::rmsnorm(x.values, w.values, s.rows, s.hidden, eps, gemma);
  const auto naive = naive_rmsnorm(dt, x.values, w.values, s.rows, s.hidden, eps, gemma);
  expect_within_tolerance(got, naive, ref, unit_roundoff(dt) * max_abs(ref),
                          ::testing::Message() << "rmsnorm " << dtype_name(dt) << " " << s.rows << "x" << s.hidden
                                               << " stride " << s.stride << " rung " << rung
                                               << (gemma ? " gemma" : "") << (in_place ? " in-place" : ""));
}

void check_fused(DType dt, Shape s, int rung, bool gemma, std::mt19937_64& rng) {
  const float eps = 1e-6f;
  const auto in = random_tensor(dt, s.rows * s.hidden, rng, -1.0, 1.0);
  const auto res = random_tensor(dt, s.rows * s.hidden, rng, -1.0, 1.0);
  const auto w = random_tensor(dt, s.hidden, rng, -0.5, 0.5);
  const size_t bytes = static_cast<size_t>(s.rows * s.stride) * dtype_size(dt);
  DeviceBuffer din(bytes), dres(bytes), dw(s.hidden * dtype_size(dt));
  upload_rows(din, in, s.rows, s.hidden, s.stride);
  upload_rows(dres, res, s.rows, s.hidden, s.stride);
  upload(dw.ptr, w.bytes);
  const Device gpu{DeviceType::kCUDA, 0};
  fused_add_rmsnorm(TensorView(din.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu),
                    TensorView(dres.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu),
                    device_view(dw.ptr, dt, {s.hidden}), eps, gemma, nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const ::testing::Message what = ::testing::Message() << "fused_add_rmsnorm " << dtype_name(dt) << " " << s.rows << "x"
                                                       << s.hidden << " stride " << s.stride << " rung " << rung
                                                       << (gemma ? " gemma" : "");
  // residual = round(input + residual)
  std::vector<double> sum_ref(in.values.size()), sum_naive(in.values.size()), stored(in.values.size());
  for (size_t i = 0; i < sum_ref.size(); ++i) {
    sum_ref[i] = in.values[i] + res.values[i];
    sum_naive[i] = round_to(dt, static_cast<float>(in.values[i]) + static_cast<float>(res.values[i]));
    stored[i] = round_to(dt, sum_ref[i]);
  }
  expect_within_tolerance(download_rows(dres, dt, s.rows, s.hidden, s.stride), sum_naive, sum_ref,
                          unit_roundoff(dt) * max_abs(sum_ref),
                          ::testing::Message(what) << " (residual)");
  // input = rmsnorm(stored residual)
  const auto ref = reference::rmsnorm(stored, w.values, s.rows, s.hidden, eps, gemma);
  const auto naive = naive_rmsnorm(dt, stored, w.values, s.rows, s.hidden, eps, gemma);
  expect_within_tolerance(download_rows(din, dt, s.rows, s.hidden, s.stride), naive, ref,
                          unit_roundoff(dt) * max_abs(ref),
                          ::testing::Message(what) << " (output)");
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

std::vector<Shape> shapes() {
  return {{1, 1, 1},        {7, 8, 8},          {99, 111, 111},     {3, 500, 512},   {16, 4096, 4096},
          {5, 4097, 4097},  {4, 8192, 8200},    {2, 16384, 16384},  {2, 40000, 40000},  // past the register path
          {1000, 64, 64},   {33, 256, 259}};   // odd row stride: off 16-byte boundaries -> rung 2 path
}

TEST(RmsNorm, AllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  for (DType dt : kDtypes)
    for (const Shape& s : shapes())
      for (int rung = 1; rung <= kRmsNormRungs; ++rung) check_rmsnorm(dt, s, rung, /*gemma=*/false, false, rng);
}

TEST(RmsNorm, GemmaAndInPlace) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(22);
  for (DType dt : kDtypes)
    for (int rung : {1, 2, 4}) {
      check_rmsnorm(dt, {9, 4096, 4096}, rung, /*gemma=*/true, false, rng);
      check_rmsnorm(dt, {9, 2048, 2056}, rung, false, /*in_place=*/true, rng);
    }
}

TEST(FusedAddRmsNorm, RungsShapesDtypesGemma) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  for (DType dt : kDtypes)
    for (const Shape& s : shapes())
      for (int rung = 2; rung <= kRmsNormRungs; ++rung)
        for (bool gemma : {false, true}) check_fused(dt, s, rung, gemma, rng);
}

}  // namespace
}  // namespace flashlab
