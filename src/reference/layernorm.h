// float64 reference of the LayerNorm family (inputs already widened to double).
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// out[r, c] = (x[r, c] - mean_r) / sqrt(var_r + eps) * w[c] + b[c], with mean_r and the biased
// variance var_r over row r (two passes in float64); b empty means no bias. x row-major (rows, hidden).
std::vector<double> layernorm(const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b, int64_t rows, int64_t hidden, double eps);

}  // namespace flashlab::reference
