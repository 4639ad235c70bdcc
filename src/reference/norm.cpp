#include "src/reference/norm.h"

#include <cmath>

namespace flashlab::reference {

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int64_t rows,
                            int64_t hidden, double eps, bool gemma) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * hidden;
    double ss = 0.0;
    for (int64_t c = 0; c < hidden; ++c) ss += row[c] * row[c];
    const double inv_rms = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + eps);
    for (int64_t c = 0; c < hidden; ++c) out[r * hidden + c] = row[c] * inv_rms * (gemma ? 1.0 + w[c] : w[c]);
  }
  return out;
}

}  // namespace flashlab::reference
