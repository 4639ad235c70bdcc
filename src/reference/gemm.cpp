#include "src/reference/gemm.h"

#include <stdexcept>

namespace flashlab::reference {

std::vector<double> gemm(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t N, int64_t K,
                         double alpha, double beta, const std::vector<double>& c_in, const std::vector<double>& bias) {
  if (static_cast<int64_t>(a.size()) != M * K || static_cast<int64_t>(b.size()) != K * N ||
      (beta != 0.0 && static_cast<int64_t>(c_in.size()) != M * N) ||
      (!bias.empty() && static_cast<int64_t>(bias.size()) != N))
    throw std::invalid_argument("reference::gemm: operand sizes do not match M, N, K");
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    double* row = &c[m * N];
    for (int64_t k = 0; k < K; ++k) {  // i-k-j order: b and c rows stream contiguously
      const double x = a[m * K + k];
      const double* brow = &b[k * N];
      for (int64_t n = 0; n < N; ++n) row[n] += x * brow[n];
    }
    for (int64_t n = 0; n < N; ++n) {
      row[n] *= alpha;
      if (beta != 0.0) row[n] += beta * c_in[m * N + n];
      if (!bias.empty()) row[n] += bias[n];
    }
  }
  return c;
}

}  // namespace flashlab::reference
