// float64 references of the serving ops (include/flashlab/serving.h). Inputs already widened to
// double; outputs double.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::reference {

struct MergedStates {
  std::vector<double> v;  // (seq, nheads, headdim)
  std::vector<double> s;  // (seq, nheads); -inf where every state is -inf
};

// v: (seq, num_states, nheads, headdim), s: (seq, num_states, nheads), row-major:
//   S = log sum_i e^{s_i} (with the max subtracted first), V = sum_i v_i e^{s_i - S};
// V = 0 and S = -inf where every s_i is -inf. Throws std::invalid_argument on inconsistent sizes.
MergedStates merge_states(const std::vector<double>& v, const std::vector<double>& s, int64_t seq, int64_t num_states,
                          int64_t nheads, int64_t headdim);

}  // namespace flashlab::reference
