// Parameters of the reduce family. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// One pass of a sum: in (n,) -> out (one value per block, or per warp for rung 4).
struct SumPassParams {
  const void* in;  // (n,) contiguous, dtype T
  int64_t n;       // element count, >= 1
  float* out;      // (gridDim.x,) partial sums, or (1,) in the last pass
};

// One-pass grid reduction (rung 6): partials and a counter live in a workspace that the host
// keeps per (device, stream); the counter is zero on entry and the last block leaves it zero.
struct SumOnePassParams {
  const void* in;         // (n,) contiguous, dtype T
  int64_t n;              // element count, >= 1
  float* out;             // (1,) fp32
  float* partials;        // (gridDim.x,) scratch
  unsigned int* counter;  // (1,) blocks done; zero on entry and on exit
};

struct RowSumParams {
  const void* in;      // (rows, cols), dtype T, unit column stride
  int64_t rows, cols;  // >= 1 each
  int64_t row_stride;  // elements between rows, >= cols
  float* out;          // (rows,) fp32
};

// Extra state of the split row_sum: each row is cut into `splits` chunks of `chunk` elements.
struct RowSumSplit {
  int64_t splits;         // chunks per row, >= 2
  int64_t chunk;          // elements per chunk (the last chunk of a row may be shorter or empty)
  float* partials;        // (rows, splits) scratch
  unsigned int* counters; // (rows,) chunks done per row; zero on entry and on exit
};

}  // namespace flashlab
