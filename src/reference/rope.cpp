#include "src/reference/rope.h"

#include <cmath>

namespace flashlab::reference {

double rope_inv_freq(const RopeFreqRef& f, int i, int rotary_dim) {
  const double base = std::pow(f.theta, -2.0 * i / rotary_dim);
  if (!f.llama31) return base / f.scale;
  const double kPi = 3.14159265358979323846;
  const double wavelen = 2.0 * kPi / base;
  const double high_freq_wavelen = f.old_context_len / f.high_freq_factor;
  const double low_freq_wavelen = f.old_context_len / f.low_freq_factor;
  if (wavelen < high_freq_wavelen) return base;
  if (wavelen > low_freq_wavelen) return base / f.factor;
  const double s = (f.old_context_len / wavelen - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  return (1.0 - s) * base / f.factor + s * base;
}

namespace {

// Turns every head by cs(t, i) = (cos, sin) of token t, pair i.
template <typename CosSin>
std::vector<double> rotate_all(const std::vector<double>& x, int64_t nnz, int64_t heads, int64_t head_dim,
                               int rotary_dim, bool interleave, CosSin cs) {
  std::vector<double> out(x);
  const int half = rotary_dim / 2;
  for (int64_t t = 0; t < nnz; ++t)
    for (int i = 0; i < half; ++i) {
      double c, s;
      cs(t, i, c, s);
      const int64_t d0 = interleave ? 2 * i : i, d1 = interleave ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (t * heads + h) * head_dim;
        const double x0 = x[base + d0], x1 = x[base + d1];
        out[base + d0] = x0 * c - x1 * s;
        out[base + d1] = x1 * c + x0 * s;
      }
    }
  return out;
}

}  // namespace

std::vector<double> rope(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t nnz, int64_t heads,
                         int64_t head_dim, int rotary_dim, bool interleave, const std::vector<double>& inv_freq) {
  return rotate_all(x, nnz, heads, head_dim, rotary_dim, interleave, [&](int64_t t, int i, double& c, double& s) {
    const double a = static_cast<double>(pos[t]) * inv_freq[i];
    c = std::cos(a);
    s = std::sin(a);
  });
}

std::vector<double> rope_cos_sin_cache(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t nnz,
                                       int64_t heads, int64_t head_dim, bool interleave,
                                       const std::vector<double>& cache, int rotary_dim) {
  return rotate_all(x, nnz, heads, head_dim, rotary_dim, interleave, [&](int64_t t, int i, double& c, double& s) {
    c = cache[pos[t] * rotary_dim + i];
    s = cache[pos[t] * rotary_dim + rotary_dim / 2 + i];
  });
}

}  // namespace flashlab::reference
