#include "src/reference/quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashlab::reference {

double round_e4m3(double v) {
  if (std::isnan(v)) return v;
  const double a = std::fabs(v);
  if (a >= 448.0) return std::copysign(448.0, v);
  int e = 0;
  std::frexp(a, &e);                                  // a = m * 2^e, m in [0.5, 1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, -6) - 3);  // normals: 2^(exp - 3); subnormals 2^-9
  const double r = std::nearbyint(a / quantum) * quantum;           // the default mode: to nearest even
  return std::copysign(std::min(r, 448.0), v);
}

double round_int8(double v) { return std::nearbyint(std::fmin(std::fmax(v, -127.0), 127.0)); }

double decode_e4m3(uint8_t code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return sign ? -mag : mag;
}

std::vector<double> quant_scales(const std::vector<double>& x, int64_t rows, int64_t cols, bool per_tensor,
                                 double qmax, double tiny) {
  std::vector<double> amax(per_tensor ? 1 : rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double& m = amax[per_tensor ? 0 : r];
      m = std::fmax(m, std::fabs(x[r * cols + c]));
    }
  for (double& m : amax) m = std::max(m, tiny) / qmax;
  return amax;
}

std::vector<double> quantize_with_scales(const std::vector<double>& x, int64_t rows, int64_t cols,
                                         const std::vector<float>& scales, bool e4m3) {
  std::vector<double> q(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scales[scales.size() == 1 ? 0 : r];
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(x[r * cols + c]) / s;  // IEEE fp32 division, as the kernels
      q[r * cols + c] = e4m3 ? round_e4m3(v) : round_int8(v);
    }
  }
  return q;
}

std::vector<double> dequantize(const std::vector<double>& q, int64_t rows, int64_t cols,
                               const std::vector<double>& scales) {
  std::vector<double> out(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = q[r * cols + c] * scales[scales.size() == 1 ? 0 : r];
  return out;
}

}  // namespace flashlab::reference
