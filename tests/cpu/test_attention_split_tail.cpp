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

// The persistent kernel's rule (attn_hopper_persistent_split_tail): k parts of the left tiles take
// ceil(left k / sms) rounds of (ceil(n_blocks / k) + 1) / n_blocks tiles; the shortest tail, if it
// saves min_saving of the full rounds + 1.
void expect_persistent(long long tiles, int sms, int n_blocks, AttnSplitTail want, double min_saving = 0.01) {
  const AttnSplitTail got = detail::attn_hopper_persistent_split_tail(tiles, sms, n_blocks, min_saving);
  EXPECT_EQ(got.splits, want.splits) << tiles << " tiles, " << sms << " SMs, " << n_blocks << " key blocks";
  if (want.splits > 1) EXPECT_EQ(got.from, want.from) << tiles << " tiles, " << sms << " SMs, " << n_blocks << " key blocks";
}

TEST(AttentionSplitTail, PersistentBenchmarkShapes) {
  // d 64, 512 keys: 4 query blocks x 32 heads x batch 32 = 4096 = 31 x 132 + 4; 4 parts of 1 block
  // take (1 + 1) / 4 of a tile: 0.5 / 32 saved.
  expect_persistent(4096, 132, 4, {4092, 4});
  // d 64, 1k keys (8 blocks): 4 parts of 2 blocks, 3 / 8 of a tile.
  expect_persistent(4096, 132, 8, {4092, 4});
  // d 128, 2k keys: 2048 = 15 x 132 + 68, 16 blocks: 3 parts (204 > 132: two rounds of 7 / 16)
  // save 0.125 / 16 < 1%: no split; with any saving, 3 parts.
  expect_persistent(2048, 132, 16, {0, 1});
  expect_persistent(2048, 132, 16, {1980, 3}, 0.0);
  // d 128, 4k keys (32 blocks): 3 parts, two rounds of 12 / 32: 0.25 / 16 saved.
  expect_persistent(2048, 132, 32, {1980, 3});
  // d 128, 512 keys (4 blocks): every split costs as much as the whole tile or more.
  expect_persistent(2048, 132, 4, {0, 1}, 0.0);
}

TEST(AttentionSplitTail, PersistentParts) {
  expect_persistent(10 * 132, 132, 64, {0, 1});  // every round full
  expect_persistent(135, 132, 8, {132, 4});      // 3 left: 4 parts in one round
  expect_persistent(135, 132, 3, {132, 3});      // capped at the key blocks
  expect_persistent(135, 132, 1, {0, 1});        // one key block: nothing to split
  expect_persistent(40, 132, 8, {0, 1});         // under one round: no split
  expect_persistent(0, 132, 8, {0, 1});
  expect_persistent(100, 0, 8, {0, 1});
}

// The walk's tail (attn_hopper_tail_heads): none without a right mask edge; with one, as many (batch,
// head) pairs as leave their keys and values in kAttnHopperTailL2Bytes (16 MB), at most
// kAttnHopperTailMax (32), the CTAs and the pairs there are; at least one.
TEST(AttentionSplitTail, WalkTailPairs) {
  using detail::attn_hopper_tail_heads;
  using detail::kAttnHopperTailL2Bytes;
  const auto kv = [](long long keys, long long d) { return keys * d * 2 * 2; };  // bf16 K and V of a pair
  EXPECT_EQ(attn_hopper_tail_heads(-1, kv(512, 64), 132, 1024), 0);  // no right edge (no mask, a left window)
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(512, 64), 132, 1024), 32);  // 128 KB a pair: 128 fit, at most 32
  EXPECT_EQ(attn_hopper_tail_heads(40, kv(512, 64), 132, 1024), 32);  // a right window
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(2048, 256), 132, 64), kAttnHopperTailL2Bytes / kv(2048, 256));  // 2 MB: 8
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(2048, 256), 132, 64), 8);
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(1024, 128), 132, 256), 32);  // 512 KB: 32
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(16384, 128), 132, 16), 2);  // 8 MB a pair
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(512, 64), 16, 1024), 16);  // the CTAs
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(512, 64), 132, 20), 20);  // every pair
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(1 << 20, 256), 132, 4), 1);  // a pair larger than the budget: one
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(512, 64), 0, 20), 0);
  EXPECT_EQ(attn_hopper_tail_heads(0, kv(512, 64), 132, 0), 0);
}

}  // namespace
}  // namespace flashlab
