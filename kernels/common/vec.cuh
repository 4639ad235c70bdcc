// 16-byte vector loads and stores, and the split of a range into an unaligned head, a 16-byte
// aligned vector body and a tail.
//
// A warp that issues one 16-byte access per thread moves 512 contiguous bytes per instruction:
// four times fewer load/store instructions than 4-byte accesses for the same bytes, which is
// what lets a memory-bound kernel keep enough bytes in flight to reach the bandwidth roofline.
#pragma once

#include <cstdint>

namespace flashlab::kernels {

inline constexpr int kVecBytes = 16;

// kVecBytes of T, loaded and stored as one 128-bit access.
template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kN = kVecBytes / sizeof(T);
  T v[kN];
};

// Plain coherent 128-bit load (LDG.E.128). Measured alternatives (H100, 2^28 elements, see
// docs/ladder/elementwise.md): the read-only path ld.global.nc is as fast but lets the compiler
// hoist stores above later loads (it assumes no aliasing: half the bytes in flight, and wrong
// for in-place calls); evict-first ld.global.cs / last-use ld.global.lu cost 3-4% of bandwidth.
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  const int4 raw = *reinterpret_cast<const int4*>(p);
  return *reinterpret_cast<const Vec<T>*>(&raw);
}

// Streaming store (evict-first): the output is not read again by this kernel.
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& v) {
  __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
}

// Plain (write-back) store. Measured where it wins: fused_add_rmsnorm at 16384 x 4096 bf16
// (H100, bench/experiments/rmsnorm_sweep.cu) 0.1836 ms with it against 0.1856 ms with store_vec.
template <typename T>
__device__ __forceinline__ void store_vec_wb(T* p, const Vec<T>& v) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&v);
}

// Elements before the first kVecBytes-aligned element of p, clamped to n.
template <typename T>
__host__ __device__ __forceinline__ int64_t vec_head(const T* p, int64_t n) {
  const auto mis = reinterpret_cast<uintptr_t>(p) % kVecBytes;
  const int64_t head = mis == 0 ? 0 : static_cast<int64_t>((kVecBytes - mis) / sizeof(T));
  return head < n ? head : n;
}

}  // namespace flashlab::kernels
