// Rung 3 — vector add for any length and any (element-aligned) pointers.
//
// Changes from rung 2: the range is split as head | body | tail. The head is the elements
// before the first 16-byte boundary (at most Vec<T>::kN - 1), the body is rung 2's vector loop
// over whole aligned vectors, the tail is what is left (< Vec<T>::kN). Head and tail are done
// with scalar accesses by the first threads of block 0, so they cost one extra predicated
// instruction per thread, not a second launch.
// The body needs a, b and out to share one offset modulo 16 bytes (true for tensors from any
// allocator, and for slices at one offset); when they do not, no common split exists and the
// whole range takes rung 1's scalar loop.
#pragma once

#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/elementwise/01_grid_stride.cuh"
#include "kernels/elementwise/02_vec16.cuh"
#include "kernels/elementwise/params.h"

namespace flashlab::kernels {

template <typename T>
__global__ void __launch_bounds__(kVectorAddThreads)
    vector_add_vec16_tail_kernel(const __grid_constant__ VectorAddParams p) {
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const int64_t head = vec_head(a, p.n);
  const int64_t nvec = (p.n - head) / Vec<T>::kN;
  const int64_t body_end = head + nvec * Vec<T>::kN;
  const int64_t tail = p.n - body_end;
  if (blockIdx.x == 0 && threadIdx.x < head + tail) {  // head + tail < 2 * Vec<T>::kN <= blockDim
    const int64_t i = threadIdx.x < head ? threadIdx.x : body_end + (threadIdx.x - head);
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
  vector_add_vec_body(a + head, b + head, out + head, nvec);
}

// True when a, b and out can share one head/body/tail split.
template <typename T>
__host__ __device__ inline bool vector_add_same_alignment(const VectorAddParams& p) {
  const auto ma = reinterpret_cast<uintptr_t>(p.a) % kVecBytes;
  return reinterpret_cast<uintptr_t>(p.b) % kVecBytes == ma &&
         reinterpret_cast<uintptr_t>(p.out) % kVecBytes == ma;
}

}  // namespace flashlab::kernels
