#include "src/reference/layernorm.h"

#include <cmath>

namespace flashlab::reference {

std::vector<double> layernorm(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, int64_t rows, int64_t hidden, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * hidden;
    double s = 0.0;
    for (int64_t c = 0; c < hidden; ++c) s += row[c];
    const double mean = s / static_cast<double>(hidden);
    double ss = 0.0;
    for (int64_t c = 0; c < hidden; ++c) ss += (row[c] - mean) * (row[c] - mean);
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + eps);
    for (int64_t c = 0; c < hidden; ++c)
      out[r * hidden + c] = (row[c] - mean) * rstd * w[c] + (b.empty() ? 0.0 : b[c]);
  }
  return out;
}

}  // namespace flashlab::reference
