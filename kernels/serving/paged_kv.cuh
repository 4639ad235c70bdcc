// The paged KV cache's append (include/flashlab/serving.h, append_paged_kv_cache): a thread per
// 16-byte vector of a new token's K and V rows (one head's head dim), looking up its page through
// the request's page table. Memory-bound: each new value read once and written once; the table
// reads (three int32 per vector) hit L1.
#pragma once

#include <cstdint>

namespace flashlab::kernels {

struct PagedKvAppendParams {
  const void *append_k, *append_v;          // (nnz, nheads_kv, headdim)
  int64_t append_row_stride, append_head_stride;  // elements (k and v alike)
  int64_t append_v_row_stride, append_v_head_stride;
  const int *batch_indices, *positions;     // (nnz,)
  void *k_cache, *v_cache;
  // Element strides of a cache's dims (page, slot, head); NHD and HND differ only in these.
  int64_t page_stride, slot_stride, head_stride;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int *kv_indices, *kv_indptr;
  int64_t nnz;
  int nheads, headdim, page_size;
};

// Grid: ceil(nnz x nheads x headdim / vector / 256) blocks of 256 threads (1-D).
template <typename T>
__global__ void paged_kv_append_kernel(const __grid_constant__ PagedKvAppendParams p) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  const int chunks = p.headdim / kVec;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.nnz * p.nheads * chunks) return;
  const int c = static_cast<int>(e % chunks);
  const int64_t th = e / chunks;
  const int h = static_cast<int>(th % p.nheads);
  const int64_t i = th / p.nheads;
  const int b = p.batch_indices[i], pos = p.positions[i];
  const int64_t page = p.kv_indices[p.kv_indptr[b] + pos / p.page_size], slot = pos % p.page_size;
  const T* k = static_cast<const T*>(p.append_k) + i * p.append_row_stride + h * p.append_head_stride + c * kVec;
  const T* v = static_cast<const T*>(p.append_v) + i * p.append_v_row_stride + h * p.append_v_head_stride + c * kVec;
  T* kc = static_cast<T*>(p.k_cache) + page * p.page_stride + slot * p.slot_stride + h * p.head_stride + c * kVec;
  T* vc = static_cast<T*>(p.v_cache) + page * p.v_page_stride + slot * p.v_slot_stride + h * p.v_head_stride + c * kVec;
  *reinterpret_cast<uint4*>(kc) = *reinterpret_cast<const uint4*>(k);
  *reinterpret_cast<uint4*>(vc) = *reinterpret_cast<const uint4*>(v);
}

}  // namespace flashlab::kernels
