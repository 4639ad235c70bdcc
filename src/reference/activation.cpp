#include "src/reference/activation.h"

#include <cmath>

namespace flashlab::reference {

double silu(double x) {
  // 1 + exp(-x) overflows to inf for x < -709: x / inf = -0, the right limit.
  return x / (1.0 + std::exp(-x));
}

// 1 + erf(z) = erfc(-z): no cancellation for negative x, so the tiny values there stay accurate.
double gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

// 1 + tanh(z) = 2 / (1 + exp(-2z)): the same value, without the cancellation for negative z.
double gelu_tanh(double x) {
  const double z = std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * z));
}

double activation(Act act, double x) {
  switch (act) {
    case Act::kSilu: return silu(x);
    case Act::kGelu: return gelu(x);
    case Act::kGeluTanh: return gelu_tanh(x);
  }
  return NAN;
}

std::vector<double> act_and_mul(Act act, const std::vector<double>& x, int64_t rows, int64_t d) {
  std::vector<double> out(static_cast<size_t>(rows * d));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) out[r * d + c] = activation(act, x[r * 2 * d + c]) * x[r * 2 * d + d + c];
  return out;
}

}  // namespace flashlab::reference
