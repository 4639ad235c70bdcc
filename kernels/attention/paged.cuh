// Copying a block of keys from a paged KV cache into shared memory (the paged prefill: forward
// rungs 3 and 4 with p.kv_indptr set). 128 threads (4 warps) copy kRows keys x kChunks 16-byte
// chunks; thread t = 32 w + l takes chunk l % kChunks of rows w R + l / kChunks + 4 R i (pass i,
// R = 32 / kChunks rows per warp instruction), so each warp touches kRows / 4 rows. Rather than
// look a row's page up in every pass (a dependent global load before each copy: the first
// version did, and rung 4's producer ran at a third of the contiguous kernel's speed), lane m of
// each warp looks up its warp's m-th row once per block and the pass fetches the (page, slot)
// pair it needs with two shuffles.
#pragma once

#include <cstdint>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/divide.cuh"

namespace flashlab::kernels {

template <int kRows, int kChunks>
struct PagedBlockCopy {
  static constexpr int kR = 32 / kChunks;                // rows per warp instruction
  static constexpr int kPasses = kRows * kChunks / 128;  // copies per thread
  static_assert(32 % kChunks == 0, "head dims 64, 128, 256: whole rows per warp instruction");
  static_assert(kRows % (4 * kR) == 0 && kRows / 4 <= 32, "whole passes; a warp's rows fit its lanes");

  int page = -1, slot = 0;  // this lane's row of its warp: page index (-1 past the request's end), slot

  // Lane m's row: the m-th row of this warp, key key0 + row of a request of len keys.
  __device__ __forceinline__ void lookup(const int* pages, IntDivisor page_size, int key0, int len) {
    const int warp = (threadIdx.x / 32) % 4, m = threadIdx.x % 32;
    const int row = (m / kR) * 4 * kR + warp * kR + m % kR;
    const uint32_t key = static_cast<uint32_t>(key0 + row);
    page = -1;
    if (m < kRows / 4 && static_cast<int>(key) < len) {
      const uint32_t q = page_size.div(key);
      page = pages[q], slot = static_cast<int>(page_size.mod(key, q));
    }
  }

  // Issues this thread's copies from `base` (the pool at the KV head; page / slot strides in
  // elements, below 2^31: 32-bit, as the producer's 24 registers need); dst_offset(row, col) is the byte offset of element (row, col) of the tile. Rows
  // past the end are zero-filled. All 32 lanes of the warp must call it (shuffles).
  // kUnroll: passes unrolled (rung 4's producer has 24 registers).
  template <int kUnroll, typename T, typename DstOffset>
  __device__ __forceinline__ void copy(unsigned char* dst, const T* base, int page_stride, int slot_stride,
                                       DstOffset dst_offset) const {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, c = lane % kChunks;
#pragma unroll kUnroll
    for (int i = 0; i < kPasses; ++i) {
      const int src_lane = i * kR + lane / kChunks;
      const int pg = __shfl_sync(0xffffffffu, page, src_lane), sl = __shfl_sync(0xffffffffu, slot, src_lane);
      const T* src = pg >= 0 ? base + static_cast<int64_t>(pg) * page_stride + (sl * slot_stride + c * 8) : base;
      cp_async_16(dst + dst_offset(i * 4 * kR + warp * kR + lane / kChunks, c * 8), src, pg >= 0 ? 16 : 0);
    }
  }
};

}  // namespace flashlab::kernels
