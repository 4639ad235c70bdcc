// The split-KV planner of the batch decode (issue 8; decode rung 3, flash-decoding style): on
// the host, once per batch shape, it cuts every request's KV pages into chunks of one common
// length, chosen so that the (chunk x KV head) work items finish soonest on the GPU's work
// slots; the chunks' partial states are then merged per request.
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
  std::vector<int32_t> order;           // chunk indices, longest first (stable): the order to start them in
};

// pages[b]: request b's number of KV pages (>= 0). items_per_chunk >= 1: the work items of one
// chunk (its KV heads x query-head blocks). work_slots >= 1: the items that run at once (SMs x
// resident blocks per SM). max_chunks >= the batch size: the most chunks allowed (the run's
// grid). overhead_pages >= 0: an item's fixed cost (start, first loads, its share of the merge)
// in pages.
// The chunk length c (a request of p pages: max(1, ceil(p / c)) chunks, an empty request one
// empty chunk) minimizes the estimated time: the items (each chunk items_per_chunk times, its
// pages + overhead_pages long) started longest first, each on the slot that frees first (what
// the GPU's block scheduler does with a grid in that order; past 16 items a slot, the bound
// max(longest item, total / slots) instead); candidates c = ceil(longest / k),
// k = 1, 2, ... while the chunks fit in max_chunks (ties: the longer chunk, fewer merges).
// Throws flashlab::Error on invalid arguments.
DecodePlan plan_decode(const std::vector<int64_t>& pages, int64_t items_per_chunk, int64_t work_slots, int64_t max_chunks,
                       int64_t overhead_pages = 0);

// The estimate above for chunk length c, in pages (exposed for the tests).
int64_t decode_plan_cost(const std::vector<int64_t>& pages, int64_t items_per_chunk, int64_t work_slots, int64_t chunk,
                         int64_t overhead_pages);

}  // namespace flashlab::detail
