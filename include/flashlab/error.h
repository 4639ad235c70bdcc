// flashlab::Error and the checks every public entry uses.
//
// Every message names the op, the argument, what was expected and what was given, e.g.
//   vector_add: argument 'b': expected shape [1024] (same as 'a'), got [1000]
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace flashlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_cuda_error(int code, const char* what, const char* file, int line);

}  // namespace detail

// Throws flashlab::Error built from the streamed message parts when `cond` is false.
#define FLASHLAB_CHECK(cond, ...)                                             \
  do {                                                                        \
    if (!(cond)) throw ::flashlab::Error(::flashlab::detail::concat(__VA_ARGS__)); \
  } while (0)

// Checks a cudaError_t-returning call.
#define FLASHLAB_CUDA_CHECK(call)                                                          \
  do {                                                                                     \
    const int flashlab_err_ = static_cast<int>(call);                                      \
    if (flashlab_err_ != 0)                                                                \
      ::flashlab::detail::throw_cuda_error(flashlab_err_, #call, __FILE__, __LINE__);       \
  } while (0)

}  // namespace flashlab
