#include "src/serving_plan.h"

#include <algorithm>
#include <limits>

#include "flashlab/error.h"

namespace flashlab::detail {

namespace {

// Work items with chunks of `chunk` pages: nheads_kv x sum of ceil(pages / chunk), one for an
// empty request; saturates at `cap + 1` (only "fits or not" matters past it).
int64_t items(const std::vector<int64_t>& pages, int64_t nheads_kv, int64_t chunk, int64_t cap) {
  int64_t n = 0;
  for (int64_t p : pages) {
    n += std::max<int64_t>(1, (p + chunk - 1) / chunk);
    if (n > cap / nheads_kv) return cap + 1;
  }
  return n * nheads_kv;
}

}  // namespace

DecodePlan plan_decode(const std::vector<int64_t>& pages, int64_t nheads_kv, int64_t work_slots, int64_t min_chunk_pages) {
  constexpr const char* op = "plan_decode";
  FLASHLAB_CHECK(nheads_kv >= 1, op, ": argument 'nheads_kv': expected >= 1, got ", nheads_kv);
  FLASHLAB_CHECK(work_slots >= 1, op, ": argument 'work_slots': expected >= 1, got ", work_slots);
  FLASHLAB_CHECK(min_chunk_pages >= 1, op, ": argument 'min_chunk_pages': expected >= 1, got ", min_chunk_pages);
  FLASHLAB_CHECK(pages.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), op,
                 ": argument 'pages': expected at most 2^31 - 1 requests, got ", pages.size());
  int64_t longest = 0;
  for (int64_t p : pages) {
    FLASHLAB_CHECK(p >= 0 && p <= std::numeric_limits<int32_t>::max(), op,
                   ": argument 'pages': expected page counts in 0 .. 2^31 - 1, got ", p);
    longest = std::max(longest, p);
  }
  DecodePlan plan;
  // The shortest chunk that fits: items() does not increase with the chunk, so bisect over
  // [min_chunk_pages, longest]; none fits -> the longest request's length (one chunk each).
  int64_t lo = min_chunk_pages, hi = std::max(longest, min_chunk_pages);
  if (items(pages, nheads_kv, hi, work_slots) > work_slots) {
    lo = hi;
  } else {
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (items(pages, nheads_kv, mid, work_slots) <= work_slots) hi = mid;
      else lo = mid + 1;
    }
  }
  plan.chunk_pages = lo;
  plan.request_chunks.reserve(pages.size() + 1);
  plan.request_chunks.push_back(0);
  for (size_t b = 0; b < pages.size(); ++b) {
    const int64_t p = pages[b];
    if (p == 0) plan.chunks.push_back({static_cast<int32_t>(b), 0, 0});
    for (int64_t begin = 0; begin < p; begin += plan.chunk_pages)
      plan.chunks.push_back({static_cast<int32_t>(b), static_cast<int32_t>(begin),
                             static_cast<int32_t>(std::min(p, begin + plan.chunk_pages))});
    FLASHLAB_CHECK(plan.chunks.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), op,
                   ": more than 2^31 - 1 chunks");
    plan.request_chunks.push_back(static_cast<int32_t>(plan.chunks.size()));
    plan.split = plan.split || plan.request_chunks[b + 1] - plan.request_chunks[b] > 1;
  }
  return plan;
}

}  // namespace flashlab::detail
