// float64 references of the gated activations (include/flashlab/activation.h). Inputs are given
// already widened to double (the exact values the kernel reads); outputs are double.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

enum class Act { kSilu, kGelu, kGeluTanh };

double silu(double x);       // x / (1 + exp(-x))
double gelu(double x);       // x/2 (1 + erf(x / sqrt 2))
double gelu_tanh(double x);  // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
double activation(Act act, double x);

// x: (rows, 2d) row-major, gate = x[r, 0:d], up = x[r, d:2d] -> (rows, d) act(gate) * up.
std::vector<double> act_and_mul(Act act, const std::vector<double>& x, int64_t rows, int64_t d);

}  // namespace flashlab::reference
