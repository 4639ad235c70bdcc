// IntDivisor (kernels/common/divide.cuh) against / and % over dividends 0 .. 2^31 - 1 (every one
// below 2^20, then the ends and random ones) for divisors 1 .. 300, powers of two and large ones.
// RowDivisor against __fdiv_rn, bit for bit: random dividends over
// the whole fp32 range (random bit patterns: subnormals, inf, NaN included), dividends near the
// quantization grid (|x| <= absmax, the case the quantize kernels run), and divisors from tiny
// to huge, including the ones outside the fast path's range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/divide.cuh"
#include "tests/common/gpu_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

__global__ void divide_kernel(const float* x, int n, float d, uint32_t* fast, uint32_t* ieee) {
  const kernels::RowDivisor div(d);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    fast[i] = __float_as_uint(div(x[i]));
    ieee[i] = __float_as_uint(__fdiv_rn(x[i], d));
  }
}

TEST(RowDivisor, MatchesIeeeDivisionBitForBit) {
  SKIP_WITHOUT_GPU();
  constexpr int kN = 1 << 20;
  std::mt19937 rng(7);
  std::vector<float> x(kN);
  std::uniform_real_distribution<float> grid(-1.f, 1.f);
  const std::vector<float> divisors = {1e-12f / 448.f, 1e-12f / 127.f, 0x1p-61f, 0x1p-60f, 1.f / 448.f, 1.f / 127.f,
                                       0.3f,           1.f,            3.f,       448.f,     0x1p60f,     0x1p61f,
                                       1e30f};
  DeviceBuffer dx(kN * sizeof(float)), dfast(kN * sizeof(uint32_t)), dieee(kN * sizeof(uint32_t));
  std::vector<uint32_t> fast(kN), ieee(kN);
  for (float d : divisors) {
    for (int i = 0; i < kN; ++i) {
      if (i % 2 == 0) {  // any bit pattern
        const uint32_t bits = rng();
        std::memcpy(&x[i], &bits, sizeof(float));
      } else {  // |x| <= 127 d or 448 d: quotients in the quantization range
        x[i] = grid(rng) * d * (i % 4 == 1 ? 127.f : 448.f);
      }
    }
    x[1] = 0.f;
    x[3] = -0.f;
    x[5] = INFINITY;
    x[7] = -INFINITY;
    x[9] = NAN;
    FLASHLAB_CUDA_CHECK(cudaMemcpy(dx.ptr, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    divide_kernel<<<256, 256>>>(static_cast<const float*>(dx.ptr), kN, d, static_cast<uint32_t*>(dfast.ptr),
                                static_cast<uint32_t*>(dieee.ptr));
    FLASHLAB_CUDA_CHECK(cudaGetLastError());
    FLASHLAB_CUDA_CHECK(cudaMemcpy(fast.data(), dfast.ptr, kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    FLASHLAB_CUDA_CHECK(cudaMemcpy(ieee.data(), dieee.ptr, kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    int mismatches = 0;
    for (int i = 0; i < kN; ++i) {
      const bool both_nan = std::isnan(x[i] / d) && (fast[i] & 0x7fffffffu) > 0x7f800000u &&
                            (ieee[i] & 0x7fffffffu) > 0x7f800000u;  // NaN payloads may differ
      if (fast[i] != ieee[i] && !both_nan && mismatches++ < 5)
        ADD_FAILURE() << "d = " << d << ", x = " << x[i] << ": RowDivisor 0x" << std::hex << fast[i]
                      << ", __fdiv_rn 0x" << ieee[i] << std::dec;
    }
    EXPECT_EQ(mismatches, 0) << "d = " << d;
  }
}

// Per divisor d[j], kPer dividends x[j * kPer + i]: both quotients, bit patterns out.
__global__ void divide_many_kernel(const float* d, const float* x, int n, int per, uint32_t* fast, uint32_t* ieee) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float div = d[i / per];
    fast[i] = __float_as_uint(kernels::RowDivisor(div)(x[i]));
    ieee[i] = __float_as_uint(__fdiv_rn(x[i], div));
  }
}

// The reciprocal's accuracy depends on the divisor's mantissa: 2^17 random divisors of the
// form the quantize kernels use (absmax / 448 or / 127, absmax over 2^-40 .. 2^40), 16 dividends
// each in [-absmax, absmax].
TEST(RowDivisor, ManyDivisorsMatchIeeeDivision) {
  SKIP_WITHOUT_GPU();
  constexpr int kDivisors = 1 << 17, kPer = 16, kN = kDivisors * kPer;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-40.f, 40.f), unit(-1.f, 1.f);
  std::vector<float> d(kDivisors), x(kN);
  for (int j = 0; j < kDivisors; ++j) {
    const float absmax = std::exp2(exponent(rng));
    d[j] = absmax / (j % 2 ? 127.f : 448.f);
    for (int i = 0; i < kPer; ++i) x[j * kPer + i] = unit(rng) * absmax;
  }
  DeviceBuffer dd(kDivisors * sizeof(float)), dx(kN * sizeof(float)), dfast(kN * sizeof(uint32_t)),
      dieee(kN * sizeof(uint32_t));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dd.ptr, d.data(), kDivisors * sizeof(float), cudaMemcpyHostToDevice));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dx.ptr, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  divide_many_kernel<<<512, 256>>>(static_cast<const float*>(dd.ptr), static_cast<const float*>(dx.ptr), kN, kPer,
                                   static_cast<uint32_t*>(dfast.ptr), static_cast<uint32_t*>(dieee.ptr));
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  std::vector<uint32_t> fast(kN), ieee(kN);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(fast.data(), dfast.ptr, kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(ieee.data(), dieee.ptr, kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  int mismatches = 0;
  for (int i = 0; i < kN; ++i)
    if (fast[i] != ieee[i] && mismatches++ < 5)
      ADD_FAILURE() << "d = " << d[i / kPer] << ", x = " << x[i] << ": RowDivisor 0x" << std::hex << fast[i]
                    << ", __fdiv_rn 0x" << ieee[i] << std::dec;
  EXPECT_EQ(mismatches, 0);
}

// Per divisor d[j]: the dividends x[0 .. n), quotient and remainder.
__global__ void int_divide_kernel(const uint32_t* d, int nd, const uint32_t* x, int n, uint32_t* bad) {
  for (int j = blockIdx.y; j < nd; j += gridDim.y) {
    const kernels::IntDivisor div(d[j]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
      const uint32_t q = div.div(x[i]), r = div.mod(x[i], q);
      if (q != x[i] / d[j] || r != x[i] % d[j]) atomicAdd(bad + j, 1u);
    }
  }
}

TEST(IntDivisor, MatchesIntegerDivision) {
  SKIP_WITHOUT_GPU();
  std::vector<uint32_t> d;
  for (uint32_t v = 1; v <= 300; ++v) d.push_back(v);
  for (uint32_t v : {512u, 1000u, 4096u, 65535u, 65536u, 1000003u, 0x7fffffffu, 0x80000000u}) d.push_back(v);
  std::vector<uint32_t> x;
  for (uint32_t v = 0; v < (1u << 20); ++v) x.push_back(v);
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 20); ++i) x.push_back(rng() & 0x7fffffffu);
  for (uint32_t v = 0; v < 4096; ++v) x.push_back(0x7fffffffu - v);
  DeviceBuffer dd(d.size() * 4), dx(x.size() * 4), dbad(d.size() * 4);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dd.ptr, d.data(), d.size() * 4, cudaMemcpyHostToDevice));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dx.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  FLASHLAB_CUDA_CHECK(cudaMemset(dbad.ptr, 0, d.size() * 4));
  int_divide_kernel<<<dim3(256, 64), 256>>>(static_cast<const uint32_t*>(dd.ptr), static_cast<int>(d.size()),
                                            static_cast<const uint32_t*>(dx.ptr), static_cast<int>(x.size()),
                                            static_cast<uint32_t*>(dbad.ptr));
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  std::vector<uint32_t> bad(d.size());
  FLASHLAB_CUDA_CHECK(cudaMemcpy(bad.data(), dbad.ptr, d.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < d.size(); ++j) EXPECT_EQ(bad[j], 0u) << "d = " << d[j];
}

}  // namespace
}  // namespace flashlab
