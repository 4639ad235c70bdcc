#include "src/reference/serving.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace flashlab::reference {

MergedStates merge_states(const std::vector<double>& v, const std::vector<double>& s, int64_t seq, int64_t num_states,
                          int64_t nheads, int64_t headdim) {
  if (seq < 0 || num_states < 1 || nheads < 0 || headdim < 1 ||
      static_cast<int64_t>(s.size()) != seq * num_states * nheads ||
      static_cast<int64_t>(v.size()) != seq * num_states * nheads * headdim)
    throw std::invalid_argument("merge_states: inconsistent sizes");
  constexpr double kInf = std::numeric_limits<double>::infinity();
  MergedStates r{std::vector<double>(static_cast<size_t>(seq * nheads * headdim), 0.0),
                 std::vector<double>(static_cast<size_t>(seq * nheads), -kInf)};
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t h = 0; h < nheads; ++h) {
      const auto s_at = [&](int64_t i) { return s[(t * num_states + i) * nheads + h]; };
      double m = -kInf;
      for (int64_t i = 0; i < num_states; ++i) m = std::max(m, s_at(i));
      if (m == -kInf) continue;  // no visible key in any segment: V = 0, S = -inf
      double sum = 0;
      for (int64_t i = 0; i < num_states; ++i) sum += std::exp(s_at(i) - m);
      const double S = m + std::log(sum);
      r.s[t * nheads + h] = S;
      for (int64_t i = 0; i < num_states; ++i) {
        const double w = std::exp(s_at(i) - S);
        for (int64_t c = 0; c < headdim; ++c)
          r.v[(t * nheads + h) * headdim + c] += w * v[((t * num_states + i) * nheads + h) * headdim + c];
      }
    }
  return r;
}

}  // namespace flashlab::reference
