// float64 references of the RMSNorm family (inputs already widened to double).
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// out[r, c] = x[r, c] / sqrt(mean_c x[r, c]^2 + eps) * (gemma ? 1 + w[c] : w[c]); x row-major (rows, hidden).
std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int64_t rows,
                            int64_t hidden, double eps, bool gemma);

}  // namespace flashlab::reference
