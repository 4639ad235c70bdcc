// float64 references of the RoPE family (inputs already widened to double).
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

// Frequency settings, as flashlab::RopeOptions (include/flashlab/rope.h) in double.
struct RopeFreqRef {
  double theta = 1e4, scale = 1.0;
  bool llama31 = false;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, old_context_len = 8192.0;
};

// inv_freq of pair i (0 <= i < rotary_dim / 2): theta^(-2i/rd) / scale, or with llama31 Meta's
// piecewise rule on the wavelength w = 2pi / theta^(-2i/rd): w < old/high keeps it,
// w > old/low divides it by factor, between them interpolates with
// s = (old / w - low) / (high - low): (1 - s) f / factor + s f.
double rope_inv_freq(const RopeFreqRef& f, int i, int rotary_dim);

// x: (nnz, heads, head_dim) row-major; pos: (nnz,). Pair i of each head (NeoX: dims i,
// i + rd/2; interleave: 2i, 2i + 1) turned by angle pos * inv_freq[i]:
// (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin); dims [rd, head_dim) unchanged.
std::vector<double> rope(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t nnz, int64_t heads,
                         int64_t head_dim, int rotary_dim, bool interleave, const std::vector<double>& inv_freq);

// The same with cos/sin from a table: cache (max_pos, rotary_dim), row p = (cos[0..rd/2), sin[0..rd/2)).
std::vector<double> rope_cos_sin_cache(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t nnz,
                                       int64_t heads, int64_t head_dim, bool interleave,
                                       const std::vector<double>& cache, int rotary_dim);

}  // namespace flashlab::reference
