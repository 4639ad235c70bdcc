// Copying a block of keys from a paged KV cache into shared memory with cp.async (the paged
// prefill: forward rung 3 for every block; rung 4 for a request's last block and for page sizes
// its TMA boxes cannot tile). 128 threads copy kRows keys x kChunks 16-byte chunks: kTPR adjacent
// threads per row (128 / kRows where that divides the row's chunks, else 1), thread t taking row
// t / kTPR and every kTPR-th chunk from t % kTPR; keys past the request's end are zero-filled.
// Each thread looks its row's page up once per block and walks the row from one pointer, the
// chunks at constant offsets (~3 instructions a copy). The two layouts before it, measured in
// rung 4's producer (H100, 8 x 2k causal, docs/ladder/attention.md, batch prefill): a page
// lookup before every 16-byte copy, 0.36x the contiguous kernel; a lookup per lane shared by
// shuffles, 0.49x; this one 0.52x: for rung 4 the copies themselves were the limit, and whole
// blocks now come by TMA.
#pragma once

#include <cstdint>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/divide.cuh"

namespace flashlab::kernels {

template <int kRows, int kChunks>
struct PagedRowCopy {
  static constexpr int kTPR = 128 % kRows == 0 && kChunks % (128 / kRows) == 0 ? 128 / kRows : 1;  // threads per row
  static constexpr int kPerThread = kChunks / kTPR;                                                  // copies per thread
  static_assert(kRows * kTPR <= 128, "at most one row per thread");

  int row, part;            // this thread's row (>= kRows: none) and first chunk
  int page = 0, slot = 0;   // its page and slot; page 0 (any valid address) past the request's end
  bool in = false;          // the row holds a key of the request (else zero-filled)

  // Thread t's row: key key0 + t / kTPR of a request of len keys, pages its page table.
  __device__ __forceinline__ PagedRowCopy(const int* pages, IntDivisor page_size, int key0, int len) {
    const int t = threadIdx.x % 128;
    row = t / kTPR, part = t % kTPR;
    const uint32_t key = static_cast<uint32_t>(key0 + row);
    in = row < kRows && static_cast<int>(key) < len;
    if (in) {
      const uint32_t q = page_size.div(key);
      page = pages[q], slot = static_cast<int>(page_size.mod(key, q));
    }
  }

  // Issues this thread's copies from `base` (the pool at the KV head; page / slot strides in
  // elements, below 2^31); dst_offset(row, col) is the byte offset of element (row, col) in the tile.
  template <typename T, typename DstOffset>
  __device__ __forceinline__ void copy(unsigned char* dst, const T* base, int page_stride, int slot_stride,
                                       DstOffset dst_offset) const {
    if (row >= kRows) return;
    const T* src = base + static_cast<int64_t>(page) * page_stride + (slot * slot_stride + part * 8);
    constexpr int kUnroll = kPerThread > 16 ? 4 : kPerThread;  // 32 copies unrolled (head dim 256) spilled rung 4's producer
#pragma unroll kUnroll
    for (int j = 0; j < kPerThread; ++j) {
      const int c = part + kTPR * j;
      cp_async_16(dst + dst_offset(row, c * 8), src + kTPR * 8 * j, in ? 16 : 0);
    }
  }
};

}  // namespace flashlab::kernels
