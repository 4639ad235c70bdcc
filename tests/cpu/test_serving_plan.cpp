// The split-KV decode planner (src/serving_plan.h): every page of every request in exactly one
// chunk, in order; chunks of chunk_pages (a request's last one shorter); an empty request one
// empty chunk; the CSR of each request's chunks; the split flag; at most max_chunks chunks; the
// start order (longest first, stable); and the chunk length the cheapest of decode_plan_cost
// over every candidate c = ceil(longest / k) whose chunks fit (brute force over all k, ties to
// the longer chunk). decode_plan_cost itself against a naive list schedule. The cases the
// planner is for (batch 1 at 128k keys, a full batch, a skewed batch) worked by hand; random
// batches; bad arguments rejected.
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

// The cost model, naively: every chunk items times, longest first, each item on the slot that
// frees first (a linear scan); past 16 items a slot, max(the longest item, the work over the
// slots rounded up).
int64_t naive_cost(const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t chunk, int64_t overhead) {
  std::vector<int64_t> lens;
  for (int64_t p : pages) {
    if (p == 0) lens.push_back(0);
    for (int64_t begin = 0; begin < p; begin += chunk) lens.push_back(std::min(chunk, p - begin));
  }
  std::sort(lens.rbegin(), lens.rend());
  if (static_cast<int64_t>(lens.size()) * items > 16 * slots) {
    int64_t work = 0;
    for (int64_t len : lens) work += (len + overhead) * items;
    return std::max(lens.front() + overhead, (work + slots - 1) / slots);
  }
  std::vector<int64_t> ends(static_cast<size_t>(std::min<int64_t>(slots, static_cast<int64_t>(lens.size()) * items)), 0);
  for (int64_t len : lens)
    for (int64_t h = 0; h < items; ++h) {
      auto slot = std::min_element(ends.begin(), ends.end());
      *slot += len + overhead;
    }
  return *std::max_element(ends.begin(), ends.end());
}

// The brute-force choice: over every k = 1 .. longest (no early exit), c = ceil(longest / k)
// whose chunks fit max_chunks, the least cost, ties to the larger c.
int64_t best_chunk(const std::vector<int64_t>& pages, int64_t items, int64_t slots, int64_t max_chunks, int64_t overhead) {
  const int64_t longest = longest_of(pages);
  if (longest == 0) return 1;
  int64_t best = 0, best_cost = std::numeric_limits<int64_t>::max(), last = 0;
  for (int64_t k = 1; k <= longest; ++k) {
    const int64_t c = (longest + k - 1) / k;
    if (c == last || chunks_for(pages, c) > max_chunks) continue;
    last = c;
    const int64_t cost = decode_plan_cost(pages, items, slots, c, overhead);
    if (cost < best_cost || (cost == best_cost && c > best)) best = c, best_cost = cost;
  }
  return best;
}

// The structure of a plan, its start order, and its chunk length the brute-force choice.
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
      if (c + 1 < last) {
        EXPECT_EQ(ch.page_end - ch.page_begin, plan.chunk_pages) << "only the last chunk is shorter";
      } else if (pages[b] > 0) {
        EXPECT_GE(ch.page_end - ch.page_begin, 1) << "the last chunk has pages";
      }
      EXPECT_LE(ch.page_end - ch.page_begin, plan.chunk_pages);
      next = ch.page_end;
    }
    EXPECT_EQ(next, pages[b]) << "request " << b << "'s pages covered";
  }
  EXPECT_EQ(plan.split, split);
  EXPECT_LE(static_cast<int64_t>(plan.chunks.size()), max_chunks);
  // The start order: a permutation of the chunks, longest first, equal lengths in chunk order.
  ASSERT_EQ(plan.order.size(), plan.chunks.size());
  std::vector<bool> seen(plan.chunks.size(), false);
  const auto len = [&](int32_t i) { return plan.chunks[static_cast<size_t>(i)].page_end - plan.chunks[static_cast<size_t>(i)].page_begin; };
  for (size_t x = 0; x < plan.order.size(); ++x) {
    const int32_t i = plan.order[x];
    ASSERT_TRUE(i >= 0 && static_cast<size_t>(i) < plan.chunks.size() && !seen[static_cast<size_t>(i)]) << "order[" << x << "] = " << i;
    seen[static_cast<size_t>(i)] = true;
    if (x > 0) {
      const int32_t prev = plan.order[x - 1];
      EXPECT_TRUE(len(prev) > len(i) || (len(prev) == len(i) && prev < i)) << "order[" << x - 1 << "] = " << prev << ", order["
                                                                           << x << "] = " << i;
    }
  }
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

TEST(DecodePlan, CostIsTheListScheduleOfTheItems) {
  // Pages {10, 3}, chunk 4: chunks of 4, 4, 3, 2 pages, 5 items each (+ 2 overhead): 20 items.
  EXPECT_EQ(decode_plan_cost({10, 3}, 5, 20, 4, 2), 6);   // 20 slots: all at once, the longest 4 + 2
  EXPECT_EQ(decode_plan_cost({10, 3}, 5, 10, 4, 2), 11);  // 10 slots: the two 4s (6), then the 3 and the 2 (+ 5)
  EXPECT_EQ(decode_plan_cost({10, 3}, 1, 100, 20, 0), 10); // a chunk longer than the longest: whole requests
  EXPECT_EQ(decode_plan_cost({0, 0}, 1, 1, 1, 3), 6);      // empty requests: one item each, overhead only
  // Past 16 items a slot: max(the longest item, the work over the slots): 3 x 8 = 24 items on
  // one slot, 8 x 300 pages.
  EXPECT_EQ(decode_plan_cost({100, 100, 100}, 8, 1, 100, 0), 2400);
  EXPECT_EQ(decode_plan_cost({1000}, 20, 1, 1000, 5), 20100);  // 20 items on one slot: 20 x 1005
  // Against the naive schedule on random small cases.
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> pages(1 + rng() % 12);
    for (int64_t& p : pages) p = static_cast<int64_t>(rng() % (trial % 2 == 0 ? 40 : 400));
    const int64_t items = 1 + static_cast<int64_t>(rng() % 8), slots = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t chunk = 1 + static_cast<int64_t>(rng() % std::max<int64_t>(longest_of(pages), 1)),
                  overhead = static_cast<int64_t>(rng() % 6);
    EXPECT_EQ(decode_plan_cost(pages, items, slots, chunk, overhead), naive_cost(pages, items, slots, chunk, overhead))
        << "trial " << trial << ": items " << items << " slots " << slots << " chunk " << chunk << " overhead " << overhead;
  }
}

TEST(DecodePlan, OneLongRequestSplitsAcrossTheGpu) {
  // Batch 1, 128k keys in 16-key pages = 8192 pages, 8 KV heads (8 items a chunk), 132 SMs x 2
  // slots = 264, room for 1 + 2 x 33 = 67 chunks, an item's fixed cost 4 pages. n = ceil(8192 / c)
  // chunks, 8n items:
  //   n <= 33 (8n <= 264): every item starts at once, cost c + 4, the least at c = 249 (k = 33,
  //     33 chunks: 32 of 249 + one of 224, 264 items, the whole GPU once): 253; c = 256: 260;
  //   n = 34 (c = 241): 272 items, 8 of them (the last chunk, 239 + 4) wait for the first to
  //     end: 245 + 243 = 488; more chunks: more waves (c = 125, 66 chunks: two of 129: 258).
  const std::vector<int64_t> pages = {8192};
  const DecodePlan plan = checked_plan(pages, 8, 264, 67, 4);
  EXPECT_TRUE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 249);
  EXPECT_EQ(plan.chunks.size(), 33u);
  EXPECT_EQ(plan.chunks.back().page_begin, 32 * 249);
  EXPECT_EQ(plan.chunks.back().page_end, 8192);
  EXPECT_EQ(plan.order.back(), 32);  // the short last chunk starts last
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 8192, 4), 8196);  // whole: 8 SMs busy
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 256, 4), 260);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 249, 4), 253);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 241, 4), 488);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 125, 4), 258);
}

TEST(DecodePlan, AFullBatchIsNotSplit) {
  // 64 requests of 256 pages (4k keys), 8 items a chunk, 264 slots, room for 64 + 66 = 130
  // chunks, overhead 4:
  //   c = 256: 512 items of 260: 264 at once, then 248: 520;
  //   c = 128: 1024 items of 132: waves of 264, 264, 264, 232: 528 (the same work, more
  //            overhead, and the GPU was already full);
  //   c = 86: 192 chunks > 130: no room.
  const std::vector<int64_t> pages(64, 256);
  const DecodePlan plan = checked_plan(pages, 8, 264, 130, 4);
  EXPECT_FALSE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 256);
  EXPECT_EQ(plan.chunks.size(), 64u);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 256, 4), 520);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 128, 4), 528);
}

TEST(DecodePlan, ASkewedBatchSplitsItsLongRequest) {
  // One request of 2048 pages and 63 of 1, 8 items a chunk, 264 slots, room for 64 + 66 = 130
  // chunks, overhead 4. Whole: 2048 + 4 = 2052 (the long request alone on 8 SMs). Cut in n
  // chunks of c: 8n long items start at once, the 504 one-page items (5 each) fill the other
  // 264 - 8n slots and then the freed ones:
  //   c = 74 (n = 28: 27 x 74 + 50): the long items end at 78, the short ones before: 78;
  //   c = 67 (n = 31: 30 x 67 + 38): 240 items end at 71, 8 at 42; the 16 free slots start
  //           15 short items each by 71, the 8 freed at 42 6 each: the other 216 start at 71: 76;
  //   c = 64 (n = 32): 256 long items (68) leave 8 slots, 112 short items by 68, the other 392
  //           in two rounds after: 78; c = 61 (n = 34: 33 x 61 + 35): 264 items fill the GPU,
  //           the remainder's 8 (39) wait for them: 65 + 39 = 104.
  // The least cost 76 at c = 67: the long request in 31 chunks, the others whole.
  std::vector<int64_t> pages(64, 1);
  pages[0] = 2048;
  const DecodePlan plan = checked_plan(pages, 8, 264, 130, 4);
  EXPECT_TRUE(plan.split);
  EXPECT_EQ(plan.chunk_pages, 67);
  EXPECT_EQ(plan.request_chunks[1] - plan.request_chunks[0], 31);
  for (size_t b = 1; b < pages.size(); ++b) EXPECT_EQ(plan.request_chunks[b + 1] - plan.request_chunks[b], 1);
  EXPECT_EQ(plan.chunks.size(), 31u + 63u);
  EXPECT_EQ(plan.order[30], 30);  // the long request's full chunks, then its 38-page remainder, then the rest
  EXPECT_EQ(plan.order[31], 31);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 2048, 4), 2052);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 74, 4), 78);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 67, 4), 76);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 64, 4), 78);
  EXPECT_EQ(decode_plan_cost(pages, 8, 264, 61, 4), 104);
}

TEST(DecodePlan, RandomBatches) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> len(0, 4096), count(1, 70), slots(1, 600), items(1, 16), overhead(0, 8);
  int splits = 0;
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<int64_t> pages(static_cast<size_t>(count(rng)));
    const int64_t cap = trial % 3 == 0 ? 5 : trial % 3 == 1 ? 300 : 4097;  // tiny, mixed, long requests
    for (int64_t& p : pages) p = len(rng) % cap;
    if (trial % 7 == 0) pages[0] = 0;
    const int64_t batch = static_cast<int64_t>(pages.size()), it = items(rng), sl = slots(rng), ov = overhead(rng);
    // The run's capacity (the batch plus two waves of chunks), or tighter, or looser.
    const int64_t max_chunks =
        trial % 4 == 0 ? batch : trial % 4 == 1 ? batch + 2 * ((sl + it - 1) / it) : batch + static_cast<int64_t>(rng() % 3000);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": batch " << batch << " items " << it << " slots " << sl
                                      << " max_chunks " << max_chunks << " overhead " << ov);
    const DecodePlan plan = checked_plan(pages, it, sl, max_chunks, ov);
    if (max_chunks == batch) EXPECT_FALSE(plan.split) << "no room for a split";
    splits += plan.split;
  }
  EXPECT_GT(splits, 20) << "the random batches hardly split: the test covers little";
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
  EXPECT_EQ(mixed.order, (std::vector<int32_t>{0, 1, 2, 3, 4, 6, 7, 8, 5}));  // the empty chunk last
  EXPECT_TRUE(mixed.split);
  const DecodePlan tight = checked_plan({5, 0, 3}, 1, 100, 3, 0);  // no room beyond one chunk a request
  EXPECT_EQ(tight.chunk_pages, 5);
  EXPECT_FALSE(tight.split);
  // The slots already full with the request's items: another chunk only adds its overhead
  // (c = 100: 4 items of 1100 on 4 slots; c = 50: 8 items of 1050, two waves: 2100).
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
  checked_plan({1 << 16}, 1, 1 << 16, 1 << 17, 2);  // a long request, many slots
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
