// Parameters of the elementwise family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

struct VectorAddParams {
  const void* a;  // (n,) contiguous, dtype T
  const void* b;  // (n,) contiguous, dtype T
  void* out;      // (n,) contiguous, dtype T; may alias a or b exactly
  int64_t n;      // element count, >= 1
};

}  // namespace flashlab
