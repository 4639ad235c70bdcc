// float64 references of the softmax family (inputs already widened to double).
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// Per row of x, row-major (rows, cols): softmax: exp(x - m) / s; log_softmax: x - m - log(s),
// m = max of the row, s = sum of exp(x - m). -inf entries give 0 / -inf; a row of only -inf
// (fully masked) gives 0s / -infs (DESIGN.md: masked rows never produce NaN).
std::vector<double> softmax(const std::vector<double>& x, int64_t rows, int64_t cols, bool log);

}  // namespace flashlab::reference
