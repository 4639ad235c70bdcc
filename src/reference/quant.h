// float64 references of the quantize family (inputs already widened to double).
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// v rounded to the e4m3 grid (3 mantissa bits, exponent bias 7, subnormal step 2^-9), to nearest
// even, saturating to +-448 (cvt.rn.satfinite); NaN stays NaN.
double round_e4m3(double v);
// v clamped to [-127, 127] and rounded half to even (NaN -> -127, as fmaxf then cvt.rni).
double round_int8(double v);
// The value of an e4m3 code (0x7f / 0xff: NaN).
double decode_e4m3(uint8_t code);

// Scales of x (rows, cols) row-major: max(absmax, tiny) / qmax per row (rows values) or over the
// whole tensor (one value), in double.
std::vector<double> quant_scales(const std::vector<double>& x, int64_t rows, int64_t cols, bool per_tensor,
                                 double qmax, double tiny);

// q[r, c] = round_F(fl32(fl32(x[r, c]) / scale)) with the given fp32 scales (rows values, or one
// for per_tensor): the quotient is the IEEE fp32 division the kernels do, so the codes match
// them bit for bit; the rounding to e4m3 (e4m3 = true) or int8 is exact.
std::vector<double> quantize_with_scales(const std::vector<double>& x, int64_t rows, int64_t cols,
                                         const std::vector<float>& scales, bool e4m3);

// out[r, c] = q[r, c] * scale[r] (or scale[0] when scales has one value), exact in double.
std::vector<double> dequantize(const std::vector<double>& q, int64_t rows, int64_t cols,
                               const std::vector<double>& scales);

}  // namespace flashlab::reference
