#include "src/serving_plan.h"

#include <algorithm>
#include <cmath>
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

double decode_plan_cost(const std::vector<int64_t>& pages, int64_t items_per_chunk, int64_t work_slots, int64_t chunk,
                        int64_t overhead_pages) {
  int64_t longest = 0, total = 0;
  for (int64_t p : pages) longest = std::max(longest, p), total += p;
  const double work = static_cast<double>(items_per_chunk) *
                      static_cast<double>(total + overhead_pages * count_chunks(pages, chunk));
  return std::max(static_cast<double>(std::min(chunk, longest) + overhead_pages),
                  std::ceil(work / static_cast<double>(work_slots)));
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
  double best_cost = decode_plan_cost(pages, items_per_chunk, work_slots, best, overhead_pages);
  for (int64_t k = 2; k <= longest; ++k) {
    const int64_t c = (longest + k - 1) / k;
    if (c == (longest + k - 2) / (k - 1)) continue;  // the same chunk as k - 1
    if (count_chunks(pages, c) > max_chunks) break;  // only grows as c shrinks
    const double cost = decode_plan_cost(pages, items_per_chunk, work_slots, c, overhead_pages);
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
  return plan;
}

}  // namespace flashlab::detail
