// The split-KV planner of the batch decode (issue 8; used by the decode rung that splits long
// requests, flash-decoding style): on the host, once per batch shape, it cuts every request's KV
// pages into chunks of one common length so that the (request, chunk, KV head) work items fill
// the GPU in one wave, then the chunks' partial states are merged (merge_states) per request.
#pragma once

#include <cstdint>
#include <vector>

namespace flashlab::detail {

struct DecodeChunk {
  int32_t request;               // index in the batch
  int32_t page_begin, page_end;  // the request's pages [page_begin, page_end) (empty for a request with no KV)
};

struct DecodePlan {
  int64_t chunk_pages = 0;              // pages per chunk (the last chunk of a request may be shorter)
  std::vector<DecodeChunk> chunks;      // by request, then chunk; each runs for every KV head
  std::vector<int32_t> request_chunks;  // (batch + 1,) CSR offsets of each request's chunks in `chunks`
  bool split = false;                   // some request has more than one chunk (a merge is needed)
};

// pages[b]: request b's number of KV pages (>= 0). work_slots: the work items that run at once
// (SMs x resident blocks per SM), >= 1; nheads_kv >= 1: each chunk is one item per KV head.
// Picks the shortest chunk (in pages, >= min_chunk_pages) whose items, nheads_kv x sum_b
// ceil(pages[b] / chunk) (a request with no pages: one empty chunk), fit in work_slots; when even
// whole requests do not fit, chunk = the longest request (no split). Throws flashlab::Error on
// invalid arguments.
DecodePlan plan_decode(const std::vector<int64_t>& pages, int64_t nheads_kv, int64_t work_slots,
                       int64_t min_chunk_pages = 1);

}  // namespace flashlab::detail
