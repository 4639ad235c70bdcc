// Rung 4's split of the last, partial wave (src/attention_hopper_dispatch.h,
// attn_hopper_split_tail): the tiles from `from` on are exactly the leftover tiles % sms; the
// parts per tile are sms / leftover capped at kAttnSplitTailMax and at the key blocks; no split
// where nothing is left over, where one part would do, or where the saving is under 2% of the
// time; the benchmark's FP8 shapes (16k tokens, 16 heads, 192-row tiles, 132 SMs) worked by hand.
// The kernels' outputs with the split: tests/gpu/test_attention.cpp (Attention.Fp8SplitTail).
#include <gtest/gtest.h>

#include "src/attention_hopper_dispatch.h"

namespace flashlab {
namespace {

using detail::attn_hopper_split_tail;
using detail::AttnSplitTail;
using detail::kAttnSplitTailMax;

void expect_plan(long long tiles, int sms, int n_blocks, AttnSplitTail want) {
  const AttnSplitTail got = attn_hopper_split_tail(tiles, sms, n_blocks);
  EXPECT_EQ(got.splits, want.splits) << tiles << " tiles, " << sms << " SMs, " << n_blocks << " key blocks";
  if (want.splits > 1) EXPECT_EQ(got.from, want.from) << tiles << " tiles, " << sms << " SMs, " << n_blocks << " key blocks";
}

TEST(AttentionSplitTail, BenchmarkShapes) {
  // 8k keys, batch 2: 43 query blocks of 192 rows x 16 heads x 2 = 1376 tiles = 10 x 132 + 56:
  // 56 tiles left, 132 / 56 = 2 parts each (the last wave half a tile long instead of a whole).
  expect_plan(1376, 132, 64, {1320, 2});
  // 16k keys, batch 1: 86 x 16 = 1376 tiles too, 128 key blocks.
  expect_plan(1376, 132, 128, {1320, 2});
  // 2k keys, batch 8: 11 x 16 x 8 = 1408 = 10 x 132 + 88: 132 / 88 = 1 part, no split.
  expect_plan(1408, 132, 16, {0, 1});
}

TEST(AttentionSplitTail, Parts) {
  expect_plan(10 * 132, 132, 64, {0, 1});   // every wave full
  expect_plan(48, 132, 8, {0, 2});          // one partial wave: 132 / 48 = 2
  expect_plan(16, 132, 64, {0, kAttnSplitTailMax});  // 132 / 16 = 8, capped
  expect_plan(16, 132, 3, {0, 3});          // capped at the key blocks
  expect_plan(16, 132, 1, {0, 1});          // one key block: nothing to split
  expect_plan(132 + 30, 132, 64, {132, 4}); // 30 left: 4 parts (120 CTAs)
  expect_plan(132 + 60, 132, 64, {132, 2}); // 60 left: 2 parts
  expect_plan(132 + 67, 132, 64, {0, 1});   // 67 left: 132 / 67 = 1
}

TEST(AttentionSplitTail, SavingAtLeastTwoPercent) {
  // 2 parts save half of the last of waves + 1 tile times: 0.5 / 25 = 2% at 24 full waves, 0.5 /
  // 26 < 2% at 25.
  expect_plan(24 * 132 + 66, 132, 64, {24 * 132, 2});
  expect_plan(25 * 132 + 66, 132, 64, {0, 1});
}

TEST(AttentionSplitTail, DegenerateArguments) {
  expect_plan(0, 132, 64, {0, 1});
  expect_plan(100, 0, 64, {0, 1});
  expect_plan(100, 132, 0, {0, 1});
}

}  // namespace
}  // namespace flashlab
