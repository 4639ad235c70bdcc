// float64 CPU references: the oracle of every test. Inputs are given already widened to
// double (the exact values the kernel reads); outputs are double.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

std::vector<double> vector_add(const std::vector<double>& a, const std::vector<double>& b);
double sum(const std::vector<double>& x);  // compensated (Neumaier) summation in double
std::vector<double> row_sum(const std::vector<double>& x, int64_t rows, int64_t cols);
double pipeline_poly(double t);  // p of kernels/streams/pipeline_math.h
double pipeline_f(double x);     // f of kernels/streams/pipeline_math.h
std::vector<double> pipeline_f(const std::vector<double>& x);

}  // namespace flashlab::reference
