// The split-KV decode planner (src/serving_plan.h): every page of every request in exactly one
// chunk, chunks of one length (the last of a request shorter), the work items (chunks x KV heads)
// within the work slots whenever whole requests fit, and the chunk the shortest that does (one
// page shorter would not fit); no split when even whole requests do not fit; empty requests get
// one empty chunk; bad arguments rejected.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "flashlab/error.h"
#include "src/serving_plan.h"

namespace flashlab {
namespace {

using detail::DecodePlan;
using detail::plan_decode;

int64_t items_for(const std::vector<int64_t>& pages, int64_t heads, int64_t chunk) {
  int64_t n = 0;
  for (int64_t p : pages) n += p == 0 ? 1 : (p + chunk - 1) / chunk;
  return n * heads;
}

void expect_valid(const std::vector<int64_t>& pages, int64_t heads, int64_t slots, const DecodePlan& plan) {
  ASSERT_EQ(plan.request_chunks.size(), pages.size() + 1);
  EXPECT_EQ(plan.request_chunks.front(), 0);
  EXPECT_EQ(static_cast<size_t>(plan.request_chunks.back()), plan.chunks.size());
  bool split = false;
  for (size_t b = 0; b < pages.size(); ++b) {
    int64_t next = 0;  // the chunks of request b tile [0, pages[b]) in order
    const int32_t first = plan.request_chunks[b], last = plan.request_chunks[b + 1];
    ASSERT_GE(last - first, 1) << "request " << b;
    split = split || last - first > 1;
    for (int32_t c = first; c < last; ++c) {
      const auto& ch = plan.chunks[c];
      EXPECT_EQ(ch.request, static_cast<int32_t>(b));
      EXPECT_EQ(ch.page_begin, next);
      EXPECT_LE(ch.page_end - ch.page_begin, plan.chunk_pages);
      if (c + 1 < last) EXPECT_EQ(ch.page_end - ch.page_begin, plan.chunk_pages) << "only the last chunk is shorter";
      next = ch.page_end;
    }
    EXPECT_EQ(next, pages[b]) << "request " << b << "'s pages covered";
  }
  EXPECT_EQ(plan.split, split);
  const int64_t n = items_for(pages, heads, plan.chunk_pages);
  EXPECT_EQ(n, static_cast<int64_t>(plan.chunks.size()) * heads);
  int64_t longest = 0;
  for (int64_t p : pages) longest = std::max(longest, p);
  if (items_for(pages, heads, std::max<int64_t>(longest, 1)) <= slots) {
    EXPECT_LE(n, slots) << "fits in the slots";
    if (plan.chunk_pages > 1) EXPECT_GT(items_for(pages, heads, plan.chunk_pages - 1), slots) << "the shortest chunk that fits";
  } else {
    EXPECT_EQ(plan.chunk_pages, std::max<int64_t>(longest, 1)) << "no split when whole requests do not fit";
    EXPECT_FALSE(plan.split);
  }
}

TEST(DecodePlan, OneLongRequestSplitsAcrossTheSlots) {
  // Batch 1, 128k tokens in 16-token pages = 8192 pages, 8 KV heads, 132 SMs x 2 slots.
  const std::vector<int64_t> pages = {8192};
  const DecodePlan plan = plan_decode(pages, 8, 264);
  expect_valid(pages, 8, 264, plan);
  EXPECT_TRUE(plan.split);
  // 8 heads x ceil(8192 / c) <= 264 needs at most 33 chunks: c >= 8192 / 33 = 248.2, so 249
  // (248 pages would make 34 chunks, 272 items).
  EXPECT_EQ(plan.chunk_pages, 249);
  EXPECT_EQ(plan.chunks.size(), 33u);
}

TEST(DecodePlan, RandomBatches) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> len(0, 2048), count(1, 70);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> pages(static_cast<size_t>(count(rng)));
    for (int64_t& p : pages) p = len(rng) % (trial % 3 == 0 ? 5 : 2049);  // some batches of tiny requests
    const int64_t heads = 1 + trial % 8, slots = 1 + trial * 7 % 600;
    SCOPED_TRACE(trial);
    expect_valid(pages, heads, slots, plan_decode(pages, heads, slots));
  }
}

TEST(DecodePlan, EdgeCases) {
  expect_valid({}, 4, 100, plan_decode({}, 4, 100));          // an empty batch
  expect_valid({0, 0}, 2, 1, plan_decode({0, 0}, 2, 1));       // no KV at all: one empty chunk each
  expect_valid({5, 0, 3}, 1, 100, plan_decode({5, 0, 3}, 1, 100));
  const DecodePlan one = plan_decode({5, 0, 3}, 1, 100);
  EXPECT_EQ(one.chunk_pages, 1);                                  // plenty of slots: one page per chunk
  const DecodePlan min4 = plan_decode({5, 0, 3}, 1, 100, 4);
  EXPECT_EQ(min4.chunk_pages, 4);                                 // but not under the minimum
  const DecodePlan none = plan_decode({100, 100, 100}, 8, 10);    // 24 items > 10 slots: no split
  EXPECT_EQ(none.chunk_pages, 100);
  EXPECT_FALSE(none.split);
  EXPECT_THROW(plan_decode({1}, 0, 10), Error);
  EXPECT_THROW(plan_decode({1}, 1, 0), Error);
  EXPECT_THROW(plan_decode({1}, 1, 10, 0), Error);
  EXPECT_THROW(plan_decode({-1}, 1, 10), Error);
}

}  // namespace
}  // namespace flashlab
