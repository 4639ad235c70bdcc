// Quantize family: bad input through the public C++ API on a machine with no GPU (each call
// throws flashlab::Error naming the argument and launches nothing), and the float64 reference's
// e4m3 / int8 rounding against known values and cuda_fp8.h's host conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_fp8.h>

#include "flashlab/quant.h"
#include "flashlab/validate.h"
#include "src/reference/quant.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::gpu;
using testing::gpu_strided;
using testing::kGpu;

TEST(QuantizeValidation, BadInputs) {
  const auto x = gpu(DType::kBF16, {4, 64}, 1), q = gpu(DType::kE4M3, {4, 64}, 2), s = gpu(DType::kF32, {4}, 3);
  const auto pt = QuantScheme::kPerToken;
  expect_rejected([&] { quantize(x, gpu(DType::kBF16, {4, 64}, 2), s, pt); },
                  {"quantize", "argument 'out'", "expected dtype e4m3 or int8", "got bf16"});
  expect_rejected([&] { quantize(x, gpu(DType::kE5M2, {4, 64}, 2), s, pt); },
                  {"argument 'out'", "expected dtype e4m3 or int8", "got e5m2"});
  expect_rejected([&] { quantize(x, q, gpu(DType::kF32, {3}, 3), pt); },
                  {"argument 'scales'", "expected shape [4]", "got [3]"});
  expect_rejected([&] { quantize(x, q, s, QuantScheme::kPerTensor); },
                  {"argument 'scales'", "expected shape [1]", "got [4]"});
  expect_rejected([&] { quantize(x, q, gpu(DType::kBF16, {4}, 3), pt); },
                  {"argument 'scales'", "expected dtype fp32", "got bf16"});
  expect_rejected([&] { quantize(x, q, gpu_strided(DType::kF32, {4}, {2}, 3), pt); },
                  {"argument 'scales'", "expected a contiguous tensor"});
  expect_rejected([&] { quantize(x, q, TensorView(testing::fake(0, 3), DType::kF32, {4}, Device{}), pt); },
                  {"argument 'scales'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { quantize(TensorView(x.data, DType::kBF16, {4, 64}, Device{}), q, s, pt); },
                  {"argument 'input'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { quantize(gpu(DType::kBF16, {0, 64}, 1), gpu(DType::kE4M3, {0, 64}, 2), gpu(DType::kF32, {0}, 3), pt); },
                  {"argument 'input'", "expected at least one element"});
  expect_rejected([&] { quantize(gpu(DType::kI8, {4, 64}, 1), q, s, pt); },
                  {"argument 'input'", "expected dtype fp32 or fp16 or bf16", "got int8"});
  expect_rejected([&] { quantize(gpu(DType::kBF16, {256}, 1), gpu(DType::kE4M3, {256}, 2), s, pt); },
                  {"argument 'input'", "expected 2 dims", "got 1 dims"});
  expect_rejected([&] { quantize(x, gpu(DType::kI8, {4, 32}, 2), s, pt); },
                  {"argument 'out'", "expected shape [4, 64] (same as 'input')", "got [4, 32]"});
  expect_rejected([&] { quantize(gpu(DType::kF32, {4, 64}, 1, 2), gpu(DType::kE4M3, {4, 64}, 2), s, pt); },
                  {"argument 'input'", "expected a data pointer aligned to 4 bytes", "offset 2"});
  expect_rejected([&] { quantize(x, gpu(DType::kE4M3, {4, 64}, 1), s, pt); },
                  {"argument 'out'", "expected memory disjoint from 'input'"});
  expect_rejected([&] { quantize(x, q, gpu(DType::kF32, {4}, 3, 2), pt); },
                  {"argument 'scales'", "expected a data pointer aligned to 4 bytes"});
  expect_rejected([&] { quantize(x, q, gpu(DType::kF32, {4}, 2, 16), pt); },
                  {"argument 'scales'", "expected memory disjoint from 'out'", "got a partial overlap"});
  TensorView overlapping_rows(x.data, DType::kBF16, {4, 64}, {32, 1}, kGpu);
  expect_rejected([&] { quantize(overlapping_rows, q, s, pt); },
                  {"argument 'input'", "row stride", "got row stride 32 for cols 64"});
  expect_rejected([&] { quantize(x, gpu_strided(DType::kE4M3, {4, 64}, {1, 4}, 2), s, pt); },
                  {"argument 'out'", "expected unit stride in the last dim"});
  expect_rejected([&] { quantize(x, q, s, pt, nullptr, 3); }, {"argument 'rung'", "expected 1..2", "got 3"});
  expect_rejected([&] { quantize(x, q, s, static_cast<QuantScheme>(7)); },
                  {"argument 'scheme'", "expected per_token or per_tensor", "got 7"});
}

TEST(DequantizeValidation, BadInputs) {
  const auto q = gpu(DType::kI8, {8, 128}, 1), s = gpu(DType::kF32, {8}, 2), out = gpu(DType::kF16, {8, 128}, 3);
  expect_rejected([&] { dequantize(gpu(DType::kF16, {8, 128}, 1), s, out); },
                  {"dequantize", "argument 'q'", "expected dtype e4m3 or int8", "got fp16"});
  expect_rejected([&] { dequantize(q, gpu(DType::kF32, {4}, 2), out); },
                  {"argument 'scales'", "expected shape [8] (per token) or [1] (per tensor)", "got [4]"});
  expect_rejected([&] { dequantize(q, gpu(DType::kF16, {8}, 2), out); },
                  {"argument 'scales'", "expected dtype fp32", "got fp16"});
  expect_rejected([&] { dequantize(q, s, gpu(DType::kE4M3, {8, 128}, 3)); },
                  {"argument 'out'", "expected dtype fp32 or fp16 or bf16", "got e4m3"});
  expect_rejected([&] { dequantize(q, s, gpu(DType::kF16, {8, 127}, 3)); },
                  {"argument 'out'", "expected shape [8, 128] (same as 'q')", "got [8, 127]"});
  expect_rejected([&] { dequantize(TensorView(q.data, DType::kI8, {8, 128}, Device{}), s, out); },
                  {"argument 'q'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { dequantize(q, s, gpu(DType::kF16, {8, 128}, 3, 1)); },
                  {"argument 'out'", "expected a data pointer aligned to 2 bytes"});
  expect_rejected([&] { dequantize(gpu(DType::kI8, {8, 0}, 1), s, gpu(DType::kF16, {8, 0}, 3)); },
                  {"argument 'q'", "expected at least one element"});
}

// ---- the reference's rounding

TEST(QuantReference, E4M3KnownValues) {
  using reference::round_e4m3;
  EXPECT_EQ(round_e4m3(0.0), 0.0);
  EXPECT_EQ(round_e4m3(1.0), 1.0);
  EXPECT_EQ(round_e4m3(1.0625), 1.0);    // halfway between 1 and 1.125: to even (1.000)
  EXPECT_EQ(round_e4m3(1.1875), 1.25);   // halfway between 1.125 and 1.25: to even (1.010)
  EXPECT_EQ(round_e4m3(1.07), 1.125);
  EXPECT_EQ(round_e4m3(-3.3), -3.25);
  EXPECT_EQ(round_e4m3(17.0), 16.0);     // step 2 in [16, 32): 17 ties to 16 (even)
  EXPECT_EQ(round_e4m3(19.0), 20.0);     // 19 ties to 20 (even mantissa)
  EXPECT_EQ(round_e4m3(448.0), 448.0);
  EXPECT_EQ(round_e4m3(449.0), 448.0);   // saturation, not inf/NaN
  EXPECT_EQ(round_e4m3(1e6), 448.0);
  EXPECT_EQ(round_e4m3(-1e30), -448.0);
  EXPECT_EQ(round_e4m3(std::ldexp(1.0, -9)), std::ldexp(1.0, -9));     // smallest subnormal
  EXPECT_EQ(round_e4m3(std::ldexp(1.0, -10)), 0.0);                    // half of it: ties to 0
  EXPECT_EQ(round_e4m3(std::ldexp(3.0, -10)), std::ldexp(2.0, -9));    // 1.5 x 2^-9 ties to 2 x 2^-9
  EXPECT_EQ(round_e4m3(std::ldexp(7.5, -9)), std::ldexp(1.0, -6));     // top subnormal rounds up to min normal
  EXPECT_TRUE(std::isnan(round_e4m3(NAN)));
}

TEST(QuantReference, E4M3DecodeEveryCode) {
  int finite = 0;
  for (int code = 0; code < 256; ++code) {
    const double v = reference::decode_e4m3(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    ++finite;
    EXPECT_EQ(reference::round_e4m3(v), v) << "code " << code;  // every finite code is on the grid
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(reference::decode_e4m3(0x7e), 448.0);
  EXPECT_EQ(reference::decode_e4m3(0xfe), -448.0);
  EXPECT_EQ(reference::decode_e4m3(0x01), std::ldexp(1.0, -9));
}

// The reference against cuda_fp8.h's own (host) conversion on many fp32 values, ties included.
TEST(QuantReference, E4M3MatchesCudaFp8) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> mag(-14.0, 10.0);
  std::vector<float> vals;
  for (int i = 0; i < 200000; ++i) vals.push_back(static_cast<float>((i % 2 ? -1 : 1) * std::exp2(mag(rng))));
  for (int code = 0; code < 126; ++code) {  // midpoints between neighbouring finite codes: the ties
    const double lo = reference::decode_e4m3(static_cast<uint8_t>(code)), hi = reference::decode_e4m3(static_cast<uint8_t>(code + 1));
    vals.push_back(static_cast<float>((lo + hi) / 2));
    vals.push_back(-static_cast<float>((lo + hi) / 2));
  }
  for (float v : {448.f, 456.f, 464.f, 470.f, 1e9f, -500.f}) vals.push_back(v);
  for (float v : vals) {
    const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    ASSERT_EQ(reference::decode_e4m3(code), reference::round_e4m3(v)) << "v = " << v;
  }
}

TEST(QuantReference, Int8RoundHalfEvenAndClamp) {
  using reference::round_int8;
  EXPECT_EQ(round_int8(0.5), 0.0);
  EXPECT_EQ(round_int8(1.5), 2.0);
  EXPECT_EQ(round_int8(2.5), 2.0);
  EXPECT_EQ(round_int8(-2.5), -2.0);
  EXPECT_EQ(round_int8(-3.5), -4.0);
  EXPECT_EQ(round_int8(2.4999), 2.0);
  EXPECT_EQ(round_int8(126.5), 126.0);
  EXPECT_EQ(round_int8(127.4), 127.0);
  EXPECT_EQ(round_int8(200.0), 127.0);
  EXPECT_EQ(round_int8(-1e9), -127.0);  // symmetric: -128 is never produced
}

TEST(QuantReference, ScalesAndQuantize) {
  // Row 0 holds values beyond the e4m3 range, row 1 is all zero (scale tiny / qmax, q = 0).
  const std::vector<double> x{1000.0, -500.0, 250.0, 0.0, 0.0, 0.0};
  const auto s = reference::quant_scales(x, 2, 3, false, 448.0, 1e-12);
  EXPECT_DOUBLE_EQ(s[0], 1000.0 / 448.0);
  EXPECT_DOUBLE_EQ(s[1], 1e-12 / 448.0);
  const std::vector<float> s32{static_cast<float>(s[0]), static_cast<float>(s[1])};
  const auto q = reference::quantize_with_scales(x, 2, 3, s32, true);
  EXPECT_EQ(q[0], 448.0);
  EXPECT_EQ(q[1], -224.0);
  EXPECT_EQ(q[2], 112.0);
  EXPECT_EQ(q[3], 0.0);
  const auto st = reference::quant_scales(x, 2, 3, true, 127.0, 1e-12);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_DOUBLE_EQ(st[0], 1000.0 / 127.0);
  const auto qi = reference::quantize_with_scales(x, 2, 3, {static_cast<float>(st[0])}, false);
  EXPECT_EQ(qi[0], 127.0);
  EXPECT_EQ(qi[2], 32.0);   // 31.75
  const auto back = reference::dequantize(q, 2, 3, s);
  EXPECT_DOUBLE_EQ(back[0], 1000.0);
}

}  // namespace
}  // namespace flashlab
