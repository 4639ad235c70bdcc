#include "src/reference/reference.h"

#include <cmath>

#include "kernels/streams/pipeline_math.h"  // same polynomial as the kernel

namespace flashlab::reference {

std::vector<double> vector_add(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

double sum(const std::vector<double>& x) {
  // Neumaier's compensated sum: exact to a few ulps of double, whatever the order.
  double s = 0.0, c = 0.0;
  for (double v : x) {
    const double t = s + v;
    c += std::fabs(s) >= std::fabs(v) ? (s - t) + v : (v - t) + s;
    s = t;
  }
  return s + c;
}

std::vector<double> row_sum(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out[r] = sum(std::vector<double>(x.begin() + r * cols, x.begin() + (r + 1) * cols));
  return out;
}

double pipeline_poly(double t) {
  double y = 0.0;
  for (int k = kPipelinePolyDegree; k >= 0; --k) y = y * -t + 1.0 / (k + 2);
  return y;
}

double pipeline_f(double x) {
  double acc = 0.0;
  for (int j = 1; j <= kPipelineTerms; ++j) acc += pipeline_poly(x * j / kPipelineTerms);
  return acc / kPipelineTerms;
}

std::vector<double> pipeline_f(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = pipeline_f(x[i]);
  return y;
}

}  // namespace flashlab::reference
