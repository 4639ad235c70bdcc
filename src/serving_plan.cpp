#include "src/serving_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>
#include <limits>

#include "flashlab/error.h"

namespace flashlab::detail {

namespace {

// Chunks of requests cut into `chunk`-page pieces, one for an empty request.
int64_t count_chunks(const std::vector<int64_t>& pages, int64_t chunk) {
  int64_t n = 0;
  for (int64_t p : pages) n += std::max<int64_t>(1, (p + chunk - 1) / chunk);
  return n;
}

}  // namespace

int64_t decode_plan_cost(const std::vector<int64_t>& pages, int64_t items_per_chunk, int64_t work_slots, int64_t chunk,
                         int64_t overhead_pages) {
  // Past 16 items a slot, the schedule is as good as its bound: the longest item, or the work
  // spread evenly (and simulating it would cost the host more than it saves the GPU). Counted
  // without listing the chunks (a batch of 65535 requests plans in milliseconds).
  int64_t n = 0, longest_chunk = 0, work = 0;
  for (int64_t p : pages) {
    const int64_t k = std::max<int64_t>(1, (p + chunk - 1) / chunk);
    n += k, work += p + k * overhead_pages, longest_chunk = std::max(longest_chunk, std::min(p, chunk));
  }
  if (n * items_per_chunk > 16 * work_slots) {
    const double even = std::ceil(static_cast<double>(work) * static_cast<double>(items_per_chunk) /
                                  static_cast<double>(work_slots));
    return std::max(longest_chunk + overhead_pages, static_cast<int64_t>(std::min(even, 4e18)));
  }
  // Chunk lengths, longest first: a request's full chunks, then its remainder.
  std::vector<int64_t> lens;
  for (int64_t p : pages) {
    for (int64_t q = p / chunk; q > 0; --q) lens.push_back(chunk);
    if (p % chunk != 0 || p == 0) lens.push_back(p % chunk);
  }
  std::sort(lens.begin(), lens.end(), std::greater<>());
  // List scheduling: each item on the slot that frees first (a min-heap of slot end times; the
  // slots never used stay at 0, so only min(slots, items) are kept).
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> ends;
  int64_t makespan = 0;
  for (int64_t len : lens)
    for (int64_t h = 0; h < items_per_chunk; ++h) {
      int64_t start = 0;
      if (static_cast<int64_t>(ends.size()) >= work_slots) start = ends.top(), ends.pop();
      const int64_t end = start + len + overhead_pages;
      ends.push(end);
      makespan = std::max(makespan, end);
    }
  return makespan;
}

DecodePlan plan_decode(const std::vector<int64_t>& pages, int64_t items_per_chunk, int64_t work_slots, int64_t max_chunks,
                       int64_t overhead_pages) {
  constexpr const char* op = "plan_decode";
  const auto batch = static_cast<int64_t>(pages.size());
  FLASHLAB_CHECK(items_per_chunk >= 1 && items_per_chunk <= (int64_t{1} << 31), op,
                 ": argument 'items_per_chunk': expected 1 .. 2^31, got ", items_per_chunk);
  FLASHLAB_CHECK(work_slots >= 1 && work_slots <= (int64_t{1} << 31), op, ": argument 'work_slots': expected 1 .. 2^31, got ",
                 work_slots);
  FLASHLAB_CHECK(max_chunks >= batch && max_chunks <= std::numeric_limits<int32_t>::max(), op,
                 ": argument 'max_chunks': expected the batch size (", batch, ") .. 2^31 - 1, got ", max_chunks);
  FLASHLAB_CHECK(overhead_pages >= 0 && overhead_pages <= (int64_t{1} << 31), op,
                 ": argument 'overhead_pages': expected 0 .. 2^31, got ", overhead_pages);
  int64_t longest = 0;
  for (int64_t p : pages) {
    FLASHLAB_CHECK(p >= 0 && p <= std::numeric_limits<int32_t>::max(), op,
                   ": argument 'pages': expected page counts in 0 .. 2^31 - 1, got ", p);
    longest = std::max(longest, p);
  }
  DecodePlan plan;
  // k = 1 (whole requests) always fits; shorter chunks while they do (the loop ends by
  // max_chunks: the longest request alone makes about k chunks).
  int64_t best = std::max<int64_t>(longest, 1);
  int64_t best_cost = decode_plan_cost(pages, items_per_chunk, work_slots, best, overhead_pages);
  for (int64_t k = 2; k <= longest; ++k) {
    const int64_t c = (longest + k - 1) / k;
    if (c == (longest + k - 2) / (k - 1)) continue;  // the same chunk as k - 1
    if (count_chunks(pages, c) > max_chunks) break;  // only grows as c shrinks
    const int64_t cost = decode_plan_cost(pages, items_per_chunk, work_slots, c, overhead_pages);
    if (cost < best_cost) best = c, best_cost = cost;
  }
  plan.chunk_pages = best;
  plan.request_chunks.reserve(pages.size() + 1);
  plan.request_chunks.push_back(0);
  for (size_t b = 0; b < pages.size(); ++b) {
    const int64_t p = pages[b];
    if (p == 0) plan.chunks.push_back({static_cast<int32_t>(b), 0, 0});
    for (int64_t begin = 0; begin < p; begin += plan.chunk_pages)
      plan.chunks.push_back({static_cast<int32_t>(b), static_cast<int32_t>(begin),
                             static_cast<int32_t>(std::min(p, begin + plan.chunk_pages))});
    plan.request_chunks.push_back(static_cast<int32_t>(plan.chunks.size()));
    plan.split = plan.split || plan.request_chunks[b + 1] - plan.request_chunks[b] > 1;
  }
  plan.order.resize(plan.chunks.size());
  std::iota(plan.order.begin(), plan.order.end(), 0);
  std::stable_sort(plan.order.begin(), plan.order.end(), [&](int32_t a, int32_t b) {
    return plan.chunks[a].page_end - plan.chunks[a].page_begin > plan.chunks[b].page_end - plan.chunks[b].page_begin;
  });
  return plan;
}

}  // namespace flashlab::detail
