#include "src/reference/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashlab::reference {

std::vector<double> softmax(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * cols;
    double* y = out.data() + r * cols;
    double m = -kInf;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
    if (m == -kInf) {  // fully masked
      for (int64_t c = 0; c < cols; ++c) y[c] = log ? -kInf : 0.0;
      continue;
    }
    double s = 0.0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(row[c] - m);
    const double log_s = std::log(s);
    for (int64_t c = 0; c < cols; ++c) y[c] = log ? (row[c] - m) - log_s : std::exp(row[c] - m) / s;
  }
  return out;
}

}  // namespace flashlab::reference
