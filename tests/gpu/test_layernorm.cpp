// LayerNorm, every rung, against the float64 reference on fresh random inputs with outputs
// poisoned before each launch; with and without bias, strided rows, in place, and rows with a
// large common offset (mean 1000, std 1) where E[x^2] - E[x]^2 in fp32 would lose the variance.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashlab/layernorm.h"
#include "src/reference/layernorm.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

struct Shape {
  int64_t rows, hidden, stride;  // stride: elements between rows of input/out
};

// The naive computation of the same function in fp32 on the host: two-pass mean and variance
// with sequential fp32 sums over the stored inputs, then the output rounded once to dt.
std::vector<double> naive_layernorm(DType dt, const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>& b, int64_t rows, int64_t hidden, float eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * hidden;
    float s = 0.f;
    for (int64_t c = 0; c < hidden; ++c) s += static_cast<float>(row[c]);
    const float mean = s / static_cast<float>(hidden);
    float ss = 0.f;
    for (int64_t c = 0; c < hidden; ++c) {
      const float d = static_cast<float>(row[c]) - mean;
      ss += d * d;
    }
    const float rstd = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
    for (int64_t c = 0; c < hidden; ++c) {
      const float y = (static_cast<float>(row[c]) - mean) * rstd * static_cast<float>(w[c]) +
                      (b.empty() ? 0.f : static_cast<float>(b[c]));
      out[r * hidden + c] = round_to(dt, y);
    }
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct Case {
  bool bias = true, in_place = false;
  double mean = 0.0;  // common offset of the inputs (std about 1 either way)
};

void check_layernorm(DType dt, Shape s, int rung, Case k, std::mt19937_64& rng) {
  const float eps = 1e-5f;
  const auto x = random_tensor(dt, s.rows * s.hidden, rng, k.mean - 1.7, k.mean + 1.7);
  const auto w = random_tensor(dt, s.hidden, rng, 0.5, 1.5);
  const auto b = random_tensor(dt, s.hidden, rng, -0.5, 0.5);
  const size_t bytes = static_cast<size_t>(s.rows * s.stride) * dtype_size(dt);
  DeviceBuffer dx(bytes), dout(bytes), dw(s.hidden * dtype_size(dt)), db(s.hidden * dtype_size(dt));
  upload_rows(dx, x, s.rows, s.hidden, s.stride);
  upload(dw.ptr, w.bytes);
  upload(db.ptr, b.bytes);
  dout.poison();
  const Device gpu{DeviceType::kCUDA, 0};
  TensorView xv(dx.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu);
  TensorView ov(k.in_place ? dx.ptr : dout.ptr, dt, {s.rows, s.hidden}, {s.stride, 1}, gpu);
  layernorm(xv, device_view(dw.ptr, dt, {s.hidden}), k.bias ? device_view(db.ptr, dt, {s.hidden}) : TensorView{}, ov,
            eps, nullptr, rung);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = download_rows(k.in_place ? dx : dout, dt, s.rows, s.hidden, s.stride);
  const std::vector<double> bias = k.bias ? b.values : std::vector<double>{};
  const auto ref = reference::layernorm(x.values, w.values, bias, s.rows, s.hidden, eps);
  const auto naive = naive_layernorm(dt, x.values, w.values, bias, s.rows, s.hidden, eps);
  expect_within_tolerance(got, naive, ref, unit_roundoff(dt) * max_abs(ref),
                          ::testing::Message() << "layernorm " << dtype_name(dt) << " " << s.rows << "x" << s.hidden
                                               << " stride " << s.stride << " rung " << rung
                                               << (k.bias ? "" : " no-bias") << (k.in_place ? " in-place" : "")
                                               << " mean " << k.mean);
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

std::vector<Shape> shapes() {
  return {{1, 1, 1},        {7, 8, 8},          {99, 111, 111},     {3, 500, 512},   {16, 4096, 4096},
          {5, 4097, 4097},  {4, 8192, 8200},    {2, 16384, 16384},  {2, 40000, 40000},  // past the register path
          {1000, 64, 64},   {33, 256, 259}};   // odd row stride: off 16-byte boundaries -> rung 2 path
}

TEST(LayerNorm, AllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (DType dt : kDtypes)
    for (const Shape& s : shapes())
      for (int rung = 1; rung <= kLayerNormRungs; ++rung) check_layernorm(dt, s, rung, Case{}, rng);
}

TEST(LayerNorm, NoBiasAndInPlace) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(32);
  for (DType dt : kDtypes)
    for (int rung = 1; rung <= kLayerNormRungs; ++rung) {
      check_layernorm(dt, {9, 4096, 4096}, rung, Case{/*bias=*/false}, rng);
      check_layernorm(dt, {3, 40000, 40000}, rung, Case{/*bias=*/false}, rng);
      check_layernorm(dt, {9, 2048, 2056}, rung, Case{true, /*in_place=*/true}, rng);
      check_layernorm(dt, {2, 20000, 20008}, rung, Case{true, /*in_place=*/true}, rng);
    }
}

// Inputs around 1000 with std about 1: the variance is 10^-6 of E[x^2], so a one-pass
// E[x^2] - E[x]^2 in fp32 would return noise (or a negative variance). Every rung must match
// the reference as closely as the naive two-pass computation does.
TEST(LayerNorm, LargeCommonOffset) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(33);
  const std::vector<Shape> offset_shapes = {{16, 1024, 1024}, {16, 4096, 4096}, {4, 8192, 8200}, {2, 16384, 16384},
                                            {2, 40000, 40000}, {8, 4104, 4111}};
  for (DType dt : kDtypes)
    for (const Shape& s : offset_shapes)
      for (int rung = 1; rung <= kLayerNormRungs; ++rung) check_layernorm(dt, s, rung, Case{true, false, 1000.0}, rng);
}

}  // namespace
}  // namespace flashlab
