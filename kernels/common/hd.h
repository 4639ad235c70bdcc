// FLASHLAB_HD marks functions that both nvcc (host and device) and a plain host compiler build.
#pragma once

#ifdef __CUDACC__
#define FLASHLAB_HD __host__ __device__
#else
#define FLASHLAB_HD
#endif

#include <type_traits>
#include <utility>

namespace flashlab::kernels {

// f(std::integral_constant<int, k>{}) for k = 0 .. N-1, in order: a loop whose index is a
// compile-time constant in the body (e.g. the count of a cp.async.wait_group).
template <typename F, int... Ks>
FLASHLAB_HD inline void static_for_impl(F&& f, std::integer_sequence<int, Ks...>) {
  (f(std::integral_constant<int, Ks>{}), ...);
}
template <int N, typename F>
FLASHLAB_HD inline void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

}  // namespace flashlab::kernels
