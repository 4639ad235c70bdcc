// Checks shared by the paged KV cache's ops (include/flashlab/serving.h): the append
// (src/paged_kv.cu) and the batch decode (src/paged_decode.cu).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "flashlab/serving.h"
#include "flashlab/validate.h"

namespace flashlab::detail {

// int32 index arrays: CUDA, on `ref`'s device, 1-D contiguous.
void check_index(const check::Arg& a, const check::Arg& ref);

// The caches: rank 4, one dtype (fp32 / fp16 / bf16, or e4m3 with `fp8_ok`: the decode) and
// shape, page_size >= 1; their dims by layout.
struct CacheDims {
  int64_t max_pages, page_size, nheads, d;
};
CacheDims check_cache(const check::Arg& Kc, const check::Arg& Vc, KvLayout layout, bool fp8_ok = false);

// The page table's tensors (host checks): int32, 1-D, kv_indptr (batch + 1,) for kv_last_page_len
// (batch,); returns batch.
int64_t check_table(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, const check::Arg& ref);

// The page table's values (read from the device, waiting for `stream`): kv_indptr from 0 and
// non-decreasing, page indices in [0, max_pages), kv_last_page_len in [1, page_size] (0 without
// pages), requests shorter than 2^31 tokens. Returns each request's KV length.
std::vector<int64_t> check_table_values(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, int64_t batch,
                                        const CacheDims& c, cudaStream_t stream);

// The same checks on values already on the host (ptr, last, ind: the three arrays' contents);
// max_pages < 0: page indices only checked >= 0. *max_index (when given): the largest page index
// the table uses (-1: none).
std::vector<int64_t> check_table_host_values(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last,
                                             const std::vector<int>& ptr, const std::vector<int>& last,
                                             const std::vector<int>& ind, int64_t batch, int64_t page_size,
                                             int64_t max_pages, int64_t* max_index);

// Element strides (page, slot, head) of a cache in `layout`.
void cache_strides(const TensorView& t, KvLayout layout, int64_t& page, int64_t& slot, int64_t& head);

// Outputs written by a kernel: disjoint from every input.
void check_outputs_disjoint(std::initializer_list<const check::Arg*> outs, std::initializer_list<const check::Arg*> ins);

}  // namespace flashlab::detail
