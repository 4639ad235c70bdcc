// Parameters of the GEMM ladder. Host and device both include this.
#pragma once

#include <cstdint>

namespace flashlab {

// C[m, n] = alpha * sum_k A[m, k] B[k, n] + beta * C[m, n] + bias[n].
// Element (m, k) of A is a[m * a_row + k * a_col]: row-major A has (a_row, a_col) = (lda, 1),
// column-major (transposed) A has (1, lda). Same for B with (k, n).
struct GemmParams {
  const void* a;
  const void* b;
  void* c;              // (M, N), c[m * ldc + n]
  const void* bias;     // (N,) or nullptr
  int M, N, K;          // >= 1
  int64_t a_row, a_col; // element strides of A along m and k: one of them is 1
  int64_t b_row, b_col; // element strides of B along k and n: one of them is 1
  int64_t ldc;          // >= N
  float alpha, beta;
};

}  // namespace flashlab
