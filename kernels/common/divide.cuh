// Division by one divisor shared by many dividends (a row's quantization scale), correctly
// rounded like __fdiv_rn but with the reciprocal taken once. Unit-tested in
// tests/gpu/test_divide.cu against __fdiv_rn, bit for bit.
#pragma once

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

}  // namespace flashlab::kernels
