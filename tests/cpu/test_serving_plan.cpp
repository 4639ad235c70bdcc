// The split-KV decode planner (src/serving_plan.h): every page of every request in exactly one
// chunk, in order; chunks of chunk_pages (a request's last one shorter); an empty request one
// empty chunk; the CSR of each request's chunks; the split flag; at most max_chunks chunks; and
// the chunk length the cheapest of decode_plan_cost over every candidate c = ceil(longest / k)
// whose chunks fit (brute force over all k, ties to the longer chunk). The cases the planner is
// for (batch 1 at 128k keys, a full batch, a skewed batch) checked by hand; random batches; bad
// arguments rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashlab/error.h"
#include "src/serving_plan.h"

namespace flashlab {
namespace {

using detail::decode_plan_cost;
using detail::DecodePlan;
using detail::plan_decode;

int64_t longest_of(const std::vector<int64_t>& pages) {
  int64_t longest = 0;
  for (int64_t p : pages) longest = std::max(longest, p);
  return longest;
}

// Chunks of `chunk` pages (one for an empty request).
int64_t chunks_for(const std::vector<int64_t>& pages, int64_t chunk) {
  int64_t n = 0;
  for (int64_t p : pages) n += p == 0 ? 1 : (p + chunk - 1) / chunk;
  return n;
}

// The brute-force choice: over every k = 1 .. longest (no early exit), c = ceil(longest / k)
// whose chunks fit max_chunks, the least cost, ties to the larger c.
int64_t best_chunk(const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t max_chunks, int64_t overhead) {
  const int64_t longest = longest_of(pages);
  if (longest == 0) return 1;
  int64_t best = 0;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int64_t k = 1; k <= longest; ++k) {
    const int64_t c = (longest + k - 1) / k;
    if (chunks_for(pages, c) > max_chunks) continue;
    const double cost = decode_plan_cost(pages, items, slots, c, overhead);
    if (cost < best_cost || (cost == best_cost && c > best)) best = c, best_cost = cost;
  }
  return best;
}

// The structure of a plan, and its chunk length the brute-force choice.
void expect_valid(const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t max_chunks, int64_t overhead,
                  const DecodePlan& plan) {
  ASSERT_EQ(plan.request_chunks.size(), pages.size() + 1);
  EXPECT_EQ(plan.request_chunks.front(), 0);
  EXPECT_EQ(static_cast<size_t>(plan.request_chunks.back()), plan.chunks.size());
  ASSERT_GE(plan.chunk_pages, 1);
  bool split = false;
  for (size_t b = 0; b < pages.size(); ++b) {
    const int32_t first = plan.request_chunks[b], last = plan.request_chunks[b + 1];
    ASSERT_LE(first, last) << "request " << b;
    ASSERT_LE(static_cast<size_t>(last), plan.chunks.size()) << "request " << b;
    EXPECT_EQ(last - first, pages[b] == 0 ? 1 : (pages[b] + plan.chunk_pages - 1) / plan.chunk_pages) << "request " << b;
    split = split || last - first > 1;
    int64_t next = 0;  // request b's chunks tile [0, pages[b]) in order
    for (int32_t c = first; c < last; ++c) {
      const detail::DecodeChunk& ch = plan.chunks[c];
      EXPECT_EQ(ch.request, static_cast<int32_t>(b));
      EXPECT_EQ(ch.page_begin, next) << "request " << b << " chunk " << c - first;
      if (c + 1 < last) EXPECT_EQ(ch.page_end - ch.page_begin, plan.chunk_pages) << "only the last chunk is shorter";
      else if (pages[b] > 0) EXPECT_GE(ch.page_end - ch.page_begin, 1) << "the last chunk has pages";
      EXPECT_LE(ch.page_end - ch.page_begin, plan.chunk_pages);
      next = ch.page_end;
    }
    EXPECT_EQ(next, pages[b]) << "request " << b << "'s pages covered";
  }
  EXPECT_EQ(plan.split, split);
  EXPECT_LE(static_cast<int64_t>(plan.chunks.size()), max_chunks);
  const int64_t want = best_chunk(pages, items, slots, max_chunks, overhead);
  EXPECT_EQ(plan.chunk_pages, want) << "cost " << decode_plan_cost(pages, items, slots, plan.chunk_pages, overhead)
                                    << " vs the brute force's " << decode_plan_cost(pages, items, slots, want, overhead);
}

DecodePlan checked_plan(const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t max_chunks,
                        int64_t overhead) {
  const DecodePlan plan = plan_decode(pages, items, slots, max_chunks, overhead);
  expect_valid(pages, items, slots, max_chunks, overhead, plan);
  return plan;
}

// The cost model's two terms, by hand.
TEST(DecodePlan, CostIsTheLongerOfTheLongestChunkAndTheSpreadWork) {
  // Pages {10, 3}, chunk 4: chunks 3 + 1, the longest 4 pages + 2 overhead = 6; the work
  // 5 items x (13 pages + 2 x 4 chunks) = 105 over 20 slots -> ceil(5.25) = 6.
  EXPECT_EQ(decode_plan_cost({10, 3}, 5, 20, 4, 2), 6.0);
  EXPECT_EQ(decode_plan_cost({10, 3}, 5, 10, 4, 2), 11.0);   // the work: ceil(10.5)
  EXPECT_EQ(decode_plan_cost({10, 3}, 1, 100, 20, 0), 10.0); // a chunk longer than the longest: the longest
  EXPECT_EQ(decode_plan_cost({0, 0}, 1, 1, 1, 3), 6.0);      // empty requests: one chunk each, overhead only
}

TEST(DecodePlan, OneLongRequestSplitsAcrossTheGpu) {
  // Batch 1, 128k keys in 16-key pages = 8192 pages, 8 KV heads (8 items a chunk), 132 SMs x 2
  // slots = 264, room for 1 + 2 x 33 = 67 chunks, an item's fixed cost 4 pages.
  // cost(c) = max(c + 4, ceil(8 (8192 + 4 n) / 264)) with n = ceil(8192 / c) chunks:
  //   k = 1: c = 8192, cost 8196 (one item per head: 8 SMs busy);
  //   k = 32: c = 256, max(260, ceil(66560 / 264 = 252.1) = 253) = 260;
  //   k = 33: c = ceil(8192 / 33) = 249 (33 chunks: 33 x 8 = 264 items, the whole GPU once),
  //           max(253, ceil(66592 / 264 = 252.2) = 253) = 253;
  //   k = 34 .. 39: c = 241 .. 211, the work still ceil(<= 66784 / 264 = 252.97) = 253: ties;
  //   k = 40: the work ceil(66816 / 264 = 253.1) = 254, growing from there (k <= 67 fit).
  // The least cost is 253, first reached (the longest chunk) at c = 249.
  const std::vector<int64_t> pages = {8192};
  const DecodePlan plan = checked_plan(pages, 8, 264, 67, 4);
  EXPECT_TRUE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 249);
  EXPECT_EQ(plan.chunks.size(), 33u);
  EXPECT_EQ(plan.chunks.back().page_begin, 32 * 249);
  EXPECT_EQ(plan.chunks.back().page_end, 8192);  // 224 pages
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 249, 4), 253.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 256, 4), 260.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 211, 4), 253.0);  // k = 39: a tie, the shorter chunk loses
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 205, 4), 254.0);  // k = 40
}

TEST(DecodePlan, AFullBatchIsNotSplit) {
  // 64 requests of 256 pages (4k keys), 8 items a chunk, 264 slots, room for 64 + 66 = 130
  // chunks, overhead 4:
  //   c = 256: 64 chunks, max(260, ceil(8 (16384 + 4 x 64) / 264 = 504.2) = 505) = 505;
  //   c = 128: 128 chunks, max(132, ceil(8 (16384 + 4 x 128) / 264) = 512) = 512: the same
  //            work plus more overhead, and the GPU was already full;
  //   c = 86: 192 chunks > 130: no room.
  const std::vector<int64_t> pages(64, 256);
  const DecodePlan plan = checked_plan(pages, 8, 264, 130, 4);
  EXPECT_FALSE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 256);
  EXPECT_EQ(plan.chunks.size(), 64u);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 256, 4), 505.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 128, 4), 512.0);
}

TEST(DecodePlan, ASkewedBatchSplitsItsLongRequest) {
  // One request of 2048 pages and 63 of 1, 8 items a chunk, 264 slots, room for 64 + 66 = 130
  // chunks, overhead 4; 2111 pages in all. With the long request in n chunks of c pages,
  // cost = max(c + 4, ceil(8 (2111 + 4 (n + 63)) / 264)):
  //   whole (c = 2048): max(2052, 72) = 2052 (the long request alone on 8 SMs);
  //   c = 74 (n = 28): max(78, ceil(19800 / 264 = 75.0) = 75) = 78;
  //   c = 71 (n = 29): max(75, ceil(19832 / 264 = 75.1) = 76) = 76;
  //   c = 69 .. 57 (n = 30 .. 36): the work still 76, ties; n >= 37 (c <= 56): the work 77 and up.
  // The least cost 76, first at c = 71: the long request in 29 chunks, the others whole.
  std::vector<int64_t> pages(64, 1);
  pages[0] = 2048;
  const DecodePlan plan = checked_plan(pages, 8, 264, 130, 4);
  EXPECT_TRUE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 71);
  EXPECT_EQ(plan.request_chunks[1] - plan.request_chunks[0], 29);
  for (size_t b = 1; b < pages.size(); ++b) EXPECT_EQ(plan.request_chunks[b + 1] - plan.request_chunks[b], 1);
  EXPECT_EQ(plan.chunks.size(), 29u + 63u);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 2048, 4), 2052.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 74, 4), 78.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 71, 4), 76.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 57, 4), 76.0);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 56, 4), 77.0);
}

TEST(DecodePlan, RandomBatches) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> len(0, 4096), count(1, 70), slots(1, 600), items(1, 16), overhead(0, 8);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> pages(static_cast<size_t>(count(rng)));
    const int64_t cap = trial % 3 == 0 ? 5 : trial % 3 == 1 ? 300 : 4097;  // tiny, mixed, long requests
    for (int64_t& p : pages) p = len(rng) % cap;
    if (trial % 7 == 0) pages[0] = 0;
    const int64_t batch = static_cast<int64_t>(pages.size()), it = items(rng), sl = slots(rng), ov = overhead(rng);
    // The run's capacity (the batch plus two waves of items) or tighter or looser.
    const int64_t max_chunks =
        trial % 4 == 0 ? batch : trial % 4 == 1 ? batch + 2 * ((sl + it - 1) / it) : batch + static_cast<int64_t>(rng() % 5000);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": batch " << batch << " items " << it << " slots " << sl
                                      << " max_chunks " << max_chunks << " overhead " << ov);
    const DecodePlan plan = checked_plan(pages, it, sl, max_chunks, ov);
    if (max_chunks == batch) EXPECT_FALSE(plan.split) << "no room for a split";
  }
}

TEST(DecodePlan, EdgeCases) {
  const DecodePlan none = checked_plan({}, 4, 100, 0, 0);  // an empty batch
  EXPECT_TRUE(none.chunks.empty());
  EXPECT_FALSE(none.split);
  const DecodePlan empty = checked_plan({0, 0}, 2, 1, 2, 1);  // no KV at all: one empty chunk each
  ASSERT_EQ(empty.chunks.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(empty.chunks[b].request, b);
    EXPECT_EQ(empty.chunks[b].page_begin, 0);
    EXPECT_EQ(empty.chunks[b].page_end, 0);
  }
  EXPECT_FALSE(empty.split);
  const DecodePlan mixed = checked_plan({5, 0, 3}, 1, 100, 100, 0);  // plenty of slots, no overhead: one page a chunk
  EXPECT_EQ(mixed.chunk_pages, 1);
  EXPECT_EQ(mixed.chunks.size(), 9u);
  EXPECT_EQ(mixed.request_chunks, (std::vector<int32_t>{0, 5, 6, 9}));
  EXPECT_TRUE(mixed.split);
  const DecodePlan tight = checked_plan({5, 0, 3}, 1, 100, 3, 0);  // no room beyond one chunk a request
  EXPECT_EQ(tight.chunk_pages, 5);
  EXPECT_FALSE(tight.split);
  // The slots already full with the request's items: another chunk only adds its overhead
  // (c = 100: max(1100, 4 x 1100 / 4) = 1100; c = 50: max(1050, 4 x 2100 / 4) = 2100).
  const DecodePlan full = checked_plan({100}, 4, 4, 200, 1000);
  EXPECT_EQ(full.chunk_pages, 100);
  EXPECT_FALSE(full.split);
  // One slot, no overhead: every chunk length costs the same work (2400): the tie goes to the
  // longest chunk, no merge.
  const DecodePlan tie = checked_plan({100, 100, 100}, 8, 1, 1000, 0);
  EXPECT_EQ(decode_plan_cost({100, 100, 100}, 8, 1, 100, 0), decode_plan_cost({100, 100, 100}, 8, 1, 50, 0));
  EXPECT_EQ(tie.chunk_pages, 100);
  EXPECT_FALSE(tie.split);
  checked_plan({1}, 1, 1, 1, 0);
  checked_plan({int64_t{1} << 20}, 1, 1 << 20, 1 << 21, 2);  // a long request, many slots
}

TEST(DecodePlan, RejectsBadArguments) {
  const auto rejected = [](const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t max_chunks,
                           int64_t overhead, const std::string& arg) {
    try {
      plan_decode(pages, items, slots, max_chunks, overhead);
      ADD_FAILURE() << "expected flashlab::Error naming '" << arg << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("plan_decode: argument '" + arg + "'"), std::string::npos) << e.what();
    }
  };
  rejected({1}, 0, 10, 1, 0, "items_per_chunk");
  rejected({1}, -3, 10, 1, 0, "items_per_chunk");
  rejected({1}, 1, 0, 1, 0, "work_slots");
  rejected({1, 2}, 1, 10, 1, 0, "max_chunks");  // fewer than the batch
  rejected({1}, 1, 10, 0, 0, "max_chunks");
  rejected({4, -1}, 1, 10, 2, 0, "pages");
  rejected({1}, 1, 10, 1, -1, "overhead_pages");
}

}  // namespace
}  // namespace flashlab
