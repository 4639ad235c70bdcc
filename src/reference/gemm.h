// float64 reference of the GEMM (include/flashlab/gemm.h). Inputs are given already widened to
// double (the exact values the kernel reads), row-major; the output is double.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// a: (M, K), b: (K, N), c_in: (M, N) or empty (beta unused), bias: (N,) or empty.
// Returns (M, N) alpha * a @ b + beta * c_in + bias, accumulated in double.
std::vector<double> gemm(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t N, int64_t K,
                         double alpha = 1.0, double beta = 0.0, const std::vector<double>& c_in = {},
                         const std::vector<double>& bias = {});

}  // namespace flashlab::reference
