// Division by one divisor shared by many dividends: RowDivisor (a row's quantization scale),
// correctly rounded like __fdiv_rn but with the reciprocal taken once; IntDivisor (a page size),
// the integer quotient by a multiply-high. Unit-tested in tests/gpu/test_divide.cu (against
// __fdiv_rn bit for bit, and against / and %).
#pragma once

#include <cstdint>

namespace flashlab::kernels {

// x / d correctly rounded (the value of __fdiv_rn(x, d)) with d's reciprocal computed once:
// y0 = rcp.approx(d), y = y0 + y0 (1 - d y0) (one Newton step), then per x: q = x y,
// r = x - q d (exact in an FMA), q + r y rounded once. This is div.rn.f32's own fast path
// (SASS: MUFU.RCP, 5 FFMA); it is correctly rounded when nothing under- or overflows, which
// the ranges below guarantee (|x|, d in [2^-60, 2^60]: quotient and remainder stay normal);
// anything else (0, tiny, huge, inf, NaN) takes the full __fdiv_rn.
struct RowDivisor {
  float d, y;
  bool fast;  // d in the fast path's range
  __device__ __forceinline__ explicit RowDivisor(float divisor) : d(divisor) {
    float y0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(d));
    y = __fmaf_rn(y0, __fmaf_rn(-d, y0, 1.f), y0);
    fast = d >= 0x1p-60f && d <= 0x1p60f;
  }
  __device__ __forceinline__ float operator()(float x) const {
    const float ax = fabsf(x);
    if (!fast || !(ax >= 0x1p-60f && ax <= 0x1p60f)) return __fdiv_rn(x, d);
    const float q = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-q, d, x), y, q);
  }
};

// n / d and n % d for 0 <= n < 2^31 and a divisor 1 <= d <= 2^31 set on the host: with
// l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(n, m) + n) >> l (the
// round-up method of Granlund and Montgomery; the sum stays below 2^32 for n < 2^31). Three
// instructions instead of the ~20 of an integer division by a runtime value.
struct IntDivisor {
  uint32_t d = 1, magic = 1, shift = 0;
  IntDivisor() = default;
  __host__ __device__ explicit IntDivisor(uint32_t divisor) : d(divisor) {
    while (shift < 31 && (1u << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  // A divisor whose magic and shift were computed elsewhere (the host, into kernel parameters).
  __host__ __device__ static IntDivisor of(uint32_t divisor, uint32_t magic, uint32_t shift) {
    IntDivisor x;
    x.d = divisor, x.magic = magic, x.shift = shift;
    return x;
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, magic) + n) >> shift; }
  __device__ __forceinline__ uint32_t mod(uint32_t n, uint32_t q) const { return n - q * d; }  // q = div(n)
};

}  // namespace flashlab::kernels
