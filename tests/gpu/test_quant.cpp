// Quantize / dequantize, every rung, against the float64 reference on fresh random inputs with
// outputs poisoned before each launch (q: NaN for e4m3, -128 for int8, which is never produced;
// scales: NaN).
//
// What must hold: scales within 1 ulp of fp32 of the float64 max(absmax, tiny) / qmax; the codes
// equal, exactly, the reference's rounding of the kernel's own fp32 quotient x / scale (the
// kernel's fp32 scale and an IEEE fp32 division, which the host reproduces bit for bit: so no
// boundary case needs slack); dequantize(quantize(x)) within half a quantization step of x.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "flashlab/quant.h"
#include "src/reference/quant.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

constexpr double kTiny = 1e-12f;  // kQuantTinyAbsmax as the kernels see it (an fp32 value)

struct Shape {
  int64_t rows, cols, stride;  // stride: elements between rows of input and q
};

// Row r: all zero when r % 5 == 1 (rows > 1), values up to +-2000 (beyond e4m3's 448) when
// r % 5 == 2, else uniform in [-2, 2]; stored in dt.
HostTensor make_input(DType dt, Shape s, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  HostTensor t = empty_tensor(dt, s.rows * s.cols);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) {
      const double mag = s.rows > 1 && r % 5 == 1 ? 0.0 : r % 5 == 2 ? 2000.0 : 2.0;
      store_value(t, static_cast<size_t>(r * s.cols + c), static_cast<float>(mag * unit(rng)));
    }
  return t;
}

std::vector<double> decode_codes(DType fmt, const std::vector<uint8_t>& codes) {
  std::vector<double> v(codes.size());
  for (size_t i = 0; i < codes.size(); ++i)
    v[i] = fmt == DType::kE4M3 ? reference::decode_e4m3(codes[i]) : static_cast<double>(static_cast<int8_t>(codes[i]));
  return v;
}

// One quantization step of the format at the quotient v (the spacing of the grid around v).
double step_at(DType fmt, double v) {
  if (fmt == DType::kI8) return 1.0;
  int e = 0;
  std::frexp(std::fabs(v), &e);
  return std::ldexp(1.0, std::max(e - 1, -6) - 3);
}

void check_quant(DType dt, DType fmt, bool per_tensor, Shape s, int rung, std::mt19937_64& rng) {
  const ::testing::Message what = ::testing::Message()
                                  << "quantize " << dtype_name(dt) << "->" << dtype_name(fmt)
                                  << (per_tensor ? " per-tensor " : " per-token ") << s.rows << "x" << s.cols
                                  << " stride " << s.stride << " rung " << rung;
  const int es = dtype_size(dt);
  const auto x = make_input(dt, s, rng);
  const int64_t nscales = per_tensor ? 1 : s.rows;
  DeviceBuffer dx(s.rows * s.stride * es), dq(s.rows * s.stride), ds(nscales * sizeof(float)),
      dout(s.rows * s.cols * sizeof(float));
  dx.poison();
  upload_row_bytes(dx.ptr, x.bytes.data(), s.rows, s.cols * es, s.stride * es);
  FLASHLAB_CUDA_CHECK(cudaMemset(dq.ptr, fmt == DType::kE4M3 ? 0xff : 0x80, dq.bytes));
  ds.poison();
  dout.poison();
  const Device g{DeviceType::kCUDA, 0};
  const TensorView xv(dx.ptr, dt, {s.rows, s.cols}, {s.stride, 1}, g), qv(dq.ptr, fmt, {s.rows, s.cols}, {s.stride, 1}, g);
  const TensorView sv = device_view(ds.ptr, DType::kF32, {nscales});
  quantize(xv, qv, sv, per_tensor ? QuantScheme::kPerTensor : QuantScheme::kPerToken, nullptr, rung);
  dequantize(qv, sv, device_view(dout.ptr, DType::kF32, {s.rows, s.cols}));
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  // Scales: within 1 ulp of fp32 of the float64 reference, never 0 or NaN.
  std::vector<float> scales(nscales);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(scales.data(), ds.ptr, nscales * sizeof(float), cudaMemcpyDeviceToHost));
  const double qmax = fmt == DType::kE4M3 ? 448.0 : 127.0;
  const auto ref_scales = reference::quant_scales(x.values, s.rows, s.cols, per_tensor, qmax, kTiny);
  for (int64_t i = 0; i < nscales; ++i) {
    const float rf = static_cast<float>(ref_scales[i]);
    const double ulp = std::nextafter(rf, INFINITY) - rf;
    ASSERT_TRUE(std::isfinite(scales[i]) && scales[i] > 0) << what << ": scale " << i << " = " << scales[i];
    ASSERT_LE(std::fabs(scales[i] - ref_scales[i]), ulp) << what << ": scale " << i;
  }

  // Codes: exactly the reference's rounding of the kernel's own fp32 quotient.
  const auto got = decode_codes(fmt, download_row_bytes(dq.ptr, s.rows, s.cols, s.stride));
  const auto ref = reference::quantize_with_scales(x.values, s.rows, s.cols, scales, fmt == DType::kE4M3);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == ref[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  ASSERT_EQ(bad, 0) << what << ": " << bad << " codes differ; first at " << first << ": got "
                    << (first >= 0 ? got[first] : 0) << ", reference " << (first >= 0 ? ref[first] : 0) << ", x "
                    << (first >= 0 ? x.values[first] : 0);

  // Round trip: |dequantize(q) - x| <= half a step at x / scale (plus fp32 rounding of q * scale).
  std::vector<uint8_t> ob(s.rows * s.cols * sizeof(float));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(ob.data(), dout.ptr, ob.size(), cudaMemcpyDeviceToHost));
  const auto back = decode(DType::kF32, ob);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.cols; ++c) {
      const int64_t i = r * s.cols + c;
      const double sc = scales[per_tensor ? 0 : r];
      const double v = static_cast<float>(x.values[i]) / static_cast<float>(sc);
      const double bound = 0.5 * step_at(fmt, v) * sc * (1 + 1e-6) + std::fabs(x.values[i]) * 0x1p-23;
      ASSERT_LE(std::fabs(back[i] - x.values[i]), bound)
          << what << ": round trip at (" << r << ", " << c << "): x " << x.values[i] << ", back " << back[i];
    }
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const DType kFormats[] = {DType::kE4M3, DType::kI8};

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (int64_t rows : {1, 7, 99})
    for (int64_t cols : {1, 7, 111, 4096, 4097, 8192}) v.push_back({rows, cols, cols});
  v.push_back({16384, 8, 8});
  v.push_back({16384, 64, 64});
  v.push_back({33, 4096, 4104});  // strided rows, still 16-byte aligned
  v.push_back({33, 512, 515});    // odd row stride: off the vector alignment -> rung 1's path
  v.push_back({5, 16384, 16384}); // bf16/fp16 rung 2 limit; fp32 past it -> rung 1's path
  return v;
}

TEST(Quantize, PerTokenAllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (DType dt : kDtypes)
    for (DType fmt : kFormats)
      for (const Shape& s : shapes())
        for (int rung = 1; rung <= kQuantRungs; ++rung) check_quant(dt, fmt, false, s, rung, rng);
}

TEST(Quantize, PerTensorAllRungsShapesDtypes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(32);
  for (DType dt : kDtypes)
    for (DType fmt : kFormats)
      for (const Shape& s : shapes())
        for (int rung = 1; rung <= kQuantRungs; ++rung) check_quant(dt, fmt, true, s, rung, rng);
}

// Per tensor on many rows: the grid-wide absmax runs on many blocks; the counter must come back
// to zero, so a second call (and one on an all-zero tensor) must be right too.
TEST(Quantize, PerTensorRepeatedAndAllZero) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(33);
  for (int rep = 0; rep < 3; ++rep) check_quant(DType::kBF16, DType::kE4M3, true, {4096, 4096, 4096}, 2, rng);
  DeviceBuffer dx(64 * 256 * 2), dq(64 * 256), ds(4);
  FLASHLAB_CUDA_CHECK(cudaMemset(dx.ptr, 0, dx.bytes));
  ds.poison();
  quantize(device_view(dx.ptr, DType::kBF16, {64, 256}), device_view(dq.ptr, DType::kI8, {64, 256}),
           device_view(ds.ptr, DType::kF32, {1}), QuantScheme::kPerTensor);
  float scale = 0;
  FLASHLAB_CUDA_CHECK(cudaMemcpy(&scale, ds.ptr, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(scale, static_cast<float>(1e-12f / 127.f));
  for (uint8_t b : download(dq.ptr, dq.bytes)) ASSERT_EQ(b, 0);
}

// Dequantize to every output dtype, strided, per token and per tensor, against q * scale.
TEST(Dequantize, DtypesStridesSchemes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(34);
  for (DType dt : kDtypes)
    for (DType fmt : kFormats)
      for (bool per_tensor : {false, true})
        for (Shape s : {Shape{7, 111, 111}, Shape{99, 4096, 4096}, Shape{9, 4096, 4100}, Shape{3, 24, 29}}) {
          std::vector<uint8_t> codes(s.rows * s.cols);
          for (auto& b : codes) {
            b = static_cast<uint8_t>(rng());
            if (fmt == DType::kE4M3 && (b & 0x7f) == 0x7f) b = 0x7e;  // no NaN codes
          }
          const int64_t ns = per_tensor ? 1 : s.rows;
          std::vector<float> scales(ns);
          for (auto& f : scales) f = static_cast<float>(std::ldexp(1.0 + (rng() % 1000) / 1000.0, -(int)(rng() % 8)));
          const int es = dtype_size(dt);
          DeviceBuffer dq(s.rows * s.stride), ds(ns * 4), dout(s.rows * s.stride * es);
          upload_row_bytes(dq.ptr, codes.data(), s.rows, s.cols, s.stride);
          FLASHLAB_CUDA_CHECK(cudaMemcpy(ds.ptr, scales.data(), ns * 4, cudaMemcpyHostToDevice));
          dout.poison();
          const Device g{DeviceType::kCUDA, 0};
          dequantize(TensorView(dq.ptr, fmt, {s.rows, s.cols}, {s.stride, 1}, g), device_view(ds.ptr, DType::kF32, {ns}),
                     TensorView(dout.ptr, dt, {s.rows, s.cols}, {s.stride, 1}, g));
          FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = decode(dt, download_row_bytes(dout.ptr, s.rows, s.cols * es, s.stride * es));
          const auto ref = reference::dequantize(decode_codes(fmt, codes), s.rows, s.cols,
                                                 std::vector<double>(scales.begin(), scales.end()));
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_LE(std::fabs(got[i] - ref[i]), std::max(2 * unit_roundoff(dt) * std::fabs(ref[i]), subnormal_half_step(dt)))
                << "dequantize " << dtype_name(fmt) << "->" << dtype_name(dt) << (per_tensor ? " per-tensor " : " ")
                << s.rows << "x" << s.cols << " stride " << s.stride << " at " << i;
        }
}

}  // namespace
}  // namespace flashlab
