// Shared test helpers: random inputs, bf16 on the host, tolerance per DESIGN.md.
//
// Tolerance: the error of an output against the float64 reference must be at most
// 2 x (error of the same computation done naively in the output's dtype) + a rounding floor.
// NaN never passes, so outputs poisoned with NaN before a launch prove every element was written.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include "flashlab/tensor.h"

namespace flashlab::testing {

// ---- bf16 on the host (round to nearest even), enough for building inputs and naive results.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// fp16 through cuda_fp16.h's host conversions (round to nearest even).
inline uint16_t f32_to_f16_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float f16_bits_to_f32(uint16_t b) {
  __half h;
  std::memcpy(&h, &b, 2);
  return __half2float(h);
}
inline double round_to(DType dt, double x) {
  const float f = static_cast<float>(x);
  if (dt == DType::kBF16) return bf16_bits_to_f32(f32_to_bf16_bits(f));
  if (dt == DType::kF16) return f16_bits_to_f32(f32_to_f16_bits(f));
  return f;
}
// Unit roundoff of a dtype: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16.
inline double unit_roundoff(DType dt) {
  return std::ldexp(1.0, dt == DType::kBF16 ? -8 : dt == DType::kF16 ? -11 : -24);
}

// Half the spacing of the dtype's subnormals: the rounding error of a correctly rounded result
// that lands below the normal range (relative bounds do not hold there).
inline double subnormal_half_step(DType dt) {
  return std::ldexp(1.0, dt == DType::kBF16 ? -134 : dt == DType::kF16 ? -25 : -150);
}

// A host tensor: values as the kernel reads them (already rounded to dtype), plus raw bytes.
struct HostTensor {
  DType dtype;
  std::vector<double> values;   // exact values of the stored elements
  std::vector<uint8_t> bytes;   // storage in dtype
};

// Element i of t becomes f rounded to t's dtype (bytes and exact value both).
inline void store_value(HostTensor& t, size_t i, float f) {
  if (t.dtype == DType::kBF16 || t.dtype == DType::kF16) {
    const uint16_t b = t.dtype == DType::kBF16 ? f32_to_bf16_bits(f) : f32_to_f16_bits(f);
    std::memcpy(t.bytes.data() + 2 * i, &b, 2);
    t.values[i] = t.dtype == DType::kBF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
  } else {
    std::memcpy(t.bytes.data() + 4 * i, &f, 4);
    t.values[i] = f;
  }
}

inline HostTensor empty_tensor(DType dt, int64_t n) {
  return HostTensor{dt, std::vector<double>(static_cast<size_t>(n)),
                    std::vector<uint8_t>(static_cast<size_t>(n) * dtype_size(dt))};
}

// The given values, rounded to dt.
inline HostTensor make_tensor(DType dt, const std::vector<double>& values) {
  HostTensor t = empty_tensor(dt, static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) store_value(t, i, static_cast<float>(values[i]));
  return t;
}

inline HostTensor random_tensor(DType dt, int64_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  HostTensor t = empty_tensor(dt, n);
  for (int64_t i = 0; i < n; ++i) store_value(t, static_cast<size_t>(i), static_cast<float>(dist(rng)));
  return t;
}

inline std::vector<double> decode(DType dt, const std::vector<uint8_t>& bytes) {
  const size_t n = bytes.size() / dtype_size(dt);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::kBF16 || dt == DType::kF16) {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = dt == DType::kBF16 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
    } else {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      out[i] = f;
    }
  }
  return out;
}

inline double max_abs_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double e = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;  // NaN never passes
    e = std::max(e, std::fabs(got[i] - ref[i]));
  }
  return e;
}

// Asserts err(got) <= 2 * err(naive) + floor, all against ref; names the case on failure.
inline void expect_within_tolerance(const std::vector<double>& got, const std::vector<double>& naive,
                                    const std::vector<double>& ref, double floor, const ::testing::Message& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double err = max_abs_err(got, ref), err_naive = max_abs_err(naive, ref);
  const double allowed = 2.0 * err_naive + floor;
  EXPECT_LE(err, allowed) << what << ": max |got - ref| = " << err << ", naive error " << err_naive
                          << ", floor " << floor;
}

// Sequential fp32 summation, the naive computation the sum kernels are held against.
inline double naive_sum_f32(const std::vector<double>& x, size_t begin, size_t end) {
  float s = 0.f;
  for (size_t i = begin; i < end; ++i) s += static_cast<float>(x[i]);
  return s;
}

}  // namespace flashlab::testing
