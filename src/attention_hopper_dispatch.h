// Internal: where rung 4's forward (src/attention_hopper_hdim.cuh) changes kernel or key-block
// width with the key length, host-visible so that tests can tell which kernels round alike:
// outputs are bit-identical between rung-4 kernels (one-CTA, persistent, paged; two or three
// consumer warpgroups) that take key blocks of the same width.
#pragma once

#include "kernels/attention/params.h"

namespace flashlab::detail {

// Keys (seqlen_k) from which head dim 128 takes 176-key blocks.
constexpr int kAttnHopperWideBlocksFrom = 8192;
// Keys (seqlen_k) up to which head dim 256 with softcap / ALiBi takes 64-key blocks (without them:
// the persistent kernel's 80).
constexpr int kAttnHopperNarrowBlocksUpTo = 512;
// Keys (seqlen_k, varlen: the longest) up to which head dims 64 and 128 take the persistent
// kernel, without a mask and causal (window_right 0): measured, interleaved timing, H100,
// 2026-11-26 evening (docs/ladder/attention.md), where it is faster than the one-CTA kernel.
// Head dim 256 (without softcap / ALiBi; 80-key blocks, one Q buffer): up to 1k keys, causal too
// (+3.4% at 512 keys, causal +2.4% at 512 and 1k; 0.5-4% slower beyond; H100, 2026-11-26, 595fb66;
// since 2026-11-27 (28) with its masked blocks peeled off, kPeelMask: +0.9..+1.3% at 512, causal
// -0.3..+1.9% at 512-1k, and 1k without a mask +2.3..+2.5% over the one-CTA kernel; f9dc46b, two runs).
template <int kHeadDim>
constexpr int kAttnHopperPersistentUpTo = kHeadDim == 128 ? 4096 : 1024;
template <int kHeadDim>
constexpr int kAttnHopperPersistentUpToCausal = kHeadDim == 128 ? 4096 : kHeadDim == 256 ? 1024 : 2048;
// Head dim 128, plain causal (no left window) without softcap / ALiBi: the persistent kernel (peeled,
// the O store waited for late, 128-key blocks) up to 8k keys, +2.1..+2.2% at 8k over the one-CTA kernel
// on 176-key blocks; at 16k 0.6% slower, and without a mask 0.6% slower at 8k (H200, 2026-11-29,
// 75a94e2, two runs; docs/ladder/attention.md).
constexpr int kAttnHopperPersistentUpToPlainCausal128 = 8192;
// Keys up to which rung 4 takes the persistent kernel at this head dim, with softcap / ALiBi
// (score_mod) or not, causal (window_right 0) or not, with a left window (window_left >= 0) or not.
template <int kHeadDim>
constexpr int attn_hopper_persistent_reach(bool score_mod, bool causal, int window_left) {
  if (kHeadDim == 128 && !score_mod && causal && window_left < 0) return kAttnHopperPersistentUpToPlainCausal128;
  return causal ? kAttnHopperPersistentUpToCausal<kHeadDim> : kAttnHopperPersistentUpTo<kHeadDim>;
}
// Keys (seqlen_k, varlen: the longest) from which head dim 128's persistent kernel without softcap /
// ALiBi splits its block loop around the masked blocks (kPeelMask): +1.0..+1.9% at 2k-4k keys, causal
// and not; -1.3..+0.8% at 512-1k (H100, 2026-11-27, 04c899d and 0ef6df2, two runs;
// docs/ladder/attention.md).
constexpr int kAttnHopperPeelFrom = 2048;
// Keys (seqlen_k) above which head dim 64, causal with a left window (window_left >= 0) without
// softcap / ALiBi, takes the persistent kernel with three consumer warpgroups on 96-key blocks (up to
// kAttnHopperPersistentUpToCausal<64>): +4.4% at 2k keys against the better of the two-warpgroup
// persistent kernel and the one-CTA three-warpgroup kernel; slower at 1k (-8%) and elsewhere
// (interleaved timing, H100, 2026-11-26, 5dcd44c; docs/ladder/attention.md). Plain causal takes the
// two-warpgroup ring with turns for the exponentials over that whole reach since 2026-11-29
// (kAttnHopperExpTurnsCausalUpTo64).
constexpr int kAttnHopperPersistentThreeAboveCausal = 1024;
constexpr int kAttnHopperPersistentThreeBlockN = 96;  // 128 spilled 48 bytes at 152 registers
// Keys (seqlen_k, varlen: the longest) up to which head dim 64's two-warpgroup persistent kernel
// (no softcap / ALiBi) takes a deeper K/V ring: without a mask four stages with its second consumer
// warpgroup three blocks behind the first (kLag), +4.6..+5.2% at 512 keys and 0.9-1.8% slower at 1k;
// causal three stages, +2.7..+3.2% at 512, level at 1k (H100, 2026-11-27, d9df084, 8c57e39 and
// 9f9694a, two runs each; docs/ladder/attention.md); causal four since the turns for the
// exponentials (kAttnHopperExpTurnsCausalUpTo64: with them +1.0..+1.5% over three at 512 keys to 2k,
// five and six stages between; H200, 2026-11-29, 8e31808, two runs).
constexpr int kAttnHopperDeepRingUpTo = 512;
constexpr int kAttnHopperDeepRingStages = 4, kAttnHopperDeepRingLag = 3, kAttnHopperDeepRingStagesCausal = 4;
// The persistent kernel's O store waited for after the next tile's first Q K^T (kStoreWaitLate),
// so that the wait does not hold the warpgroup's next product: at head dim 128 without softcap /
// ALiBi in every form (+1.6..+2.2% at 512 and 1k keys, +0.5..+1.2% at 2k-4k, causal +1.5..+3.9% at
// 512-1k), at head dim 64 on the deeper rings above kAttnHopperDeepRingUpTo keys (to the persistent
// kernel's reach there; without a mask four stages and the lag: +3% at 1k over the kernel
// without the mask code on two stages) and causal from the first key (three stages: +0.4..+0.7% at
// 512 over three without it, +1.2..+1.4% at 1k over two), and with three consumer warpgroups
// (causal 2k, +0.7..+0.8%); not on the lagging ring at 512 keys without a mask (-1.7%) (H200,
// 2026-11-28, 6017405 and 52f301c, three runs; d 128 again on an H100, b0056cb, two runs;
// docs/ladder/attention.md).
template <int kHeadDim, bool kScoreMod>
constexpr bool kAttnHopperStoreWaitLate = kHeadDim == 128 && !kScoreMod;
// Keys (seqlen_k, varlen: the longest) up to which head dim 64, plain causal (window_right 0, no left
// window) without softcap / ALiBi, takes the persistent kernel's two-warpgroup ring of
// kAttnHopperDeepRingStagesCausal stages without a lag, its two consumer warpgroups taking turns for
// their softmax's exponentials (kExpTurns, as cuDNN's fprop kernels): on three stages +1.0..+1.2% at
// 512 keys, +0.5..+0.6% at 1k over the same ring without them (H200, 2026-11-29, 4bc59e4, three runs);
// on four +2.1..+2.4% / +1.1..+1.5% over the three-stage ring without them, and at 2k +0.6..+0.7%
// over the three-warpgroup kernel (8e31808, two runs; docs/ladder/attention.md). Not without a mask,
// where the lag keeps the warpgroups apart instead (turns on the same ring without it: -0.7% at 512,
// -3.3% at 1k), nor the block loop without its intra-warpgroup overlap (cuDNN's; 2-5% slower at
// d 64, level to 5% slower at d 128).
constexpr int kAttnHopperExpTurnsCausalUpTo64 = 2048;
// Head dim 256 causal (the persistent kernel, 80-key blocks, up to 1k keys): each consumer warpgroup
// on its own blocks, its last one cut to its first 32 keys where its rows see no more of it
// (kHalfLast with kTailKeys): +1.3..+1.6% at 512 keys, +2.4..+3.0% at 1k; without a mask +0.2..+0.6%
// at 512 and 0.8% slower at 1k, not taken there (H100, 2026-11-27, 70d598a, two runs;
// docs/ladder/attention.md). The library's until 2026-11-28, when kOwnO (below) replaced it; the
// form stays for the ablation and the tests.
constexpr int kAttnHopperTailKeys256 = 32;
// Head dim 256 without softcap / ALiBi (the persistent kernel): 64-key blocks with O staged in a tile
// of its own and the Q buffer given back after each warpgroup's last Q K^T of the tile (kOwnO), so
// that the next tile's Q loads under this tile's last block and epilogue, up to 512 keys, and with
// window_right 0 (causal; plain causal also with each warpgroup on its own blocks) up to 1k: +6.3%
// at 512 keys, causal +5.2% / +3.0% at 512 / 1k; without a mask 1.6% slower at 1k (H100,
// 2026-11-28, 2dc37c7 and f3b20e0; docs/ladder/attention.md). The causal bound is the persistent
// kernel's own at head dim 256.
constexpr int kAttnHopperOwnOUpTo256 = 512, kAttnHopperOwnOUpToCausal256 = kAttnHopperPersistentUpToCausal<256>;


// Keys (seqlen_k, varlen: the longest) up to which causal FP8 without softcap / ALiBi keeps the
// two-warpgroup kernel (src/attention_hopper_hdim.cuh).
constexpr int kAttnHopperFp8TwoWarpgroupsUpToCausal = 1024;
// Keys (seqlen_k, varlen: the longest) up to which FP8 transposes V in the kernel (the producer
// warpgroup's two transposing warps) rather than in a pass before it: the kernel's transpose wins
// at 512-2k keys (+4..+20%), the pass from 4k (+4..+15% at 4k-16k without a mask, +5..+11% at
// 8k-16k causal) (bench/experiments/attention_hopper_ablation.cu --fp8, H100, 2026-11-27, a2f06b1;
// docs/ladder/attention.md). Under CUDA-graph capture without V^T's workspace ready: the kernel's.
constexpr int kAttnHopperFp8VtInKernelUpTo = 2048;

// Rung 4's split of the last, partial wave (kSplitTail, kernels/attention/04_hopper.cuh): with
// `tiles` equal tiles of n_blocks key blocks each (no mask, fixed lengths; causal takes it too,
// its tiles of up to n_blocks) on `sms` SMs, one CTA per SM, the last tiles % sms tiles run alone;
// split into k parts along the keys (k x leftover <= sms, at most kAttnSplitTailMax and n_blocks)
// they take 1 / k of a tile's time. Taken when that saves at least 2% of the whole (the parts' fp32
// O and the merge cost about 1%). splits 1: no split.
using flashlab::kAttnSplitTailMax;  // kernels/attention/params.h
struct AttnSplitTail {
  int from, splits;  // the tiles from `from` on split in `splits` parts
};
constexpr AttnSplitTail attn_hopper_split_tail(long long tiles, int sms, int n_blocks) {
  if (tiles <= 0 || sms <= 0) return {0, 1};
  const long long left = tiles % sms, waves = tiles / sms;
  if (left == 0) return {0, 1};
  long long k = sms / left;
  if (k > kAttnSplitTailMax) k = kAttnSplitTailMax;
  if (k > n_blocks) k = n_blocks;
  if (k < 2 || (1.0 - 1.0 / static_cast<double>(k)) / static_cast<double>(waves + 1) < 0.02) return {0, 1};
  return {static_cast<int>(tiles - left), static_cast<int>(k)};
}

// The persistent kernel's walk with a right mask edge (causal, a right window: a (batch, head) pair's
// tiles grow with their query block): its last pairs' tiles in rounds of one query block each, from
// the last down (HopperAttnArgs::tail_heads), so that the walk ends with short tiles instead of one
// pair's longest. As many pairs as leave their keys and values (kv_bytes a pair) in
// kAttnHopperTailL2Bytes of L2, where each round reads them again, at most kAttnHopperTailMax and the
// CTAs; 0 without a right edge. Measured (causal, H100, 2026-11-28, 6d32805; docs/ladder/attention.md):
// against the grid's order +1..+2% at 512 keys, +2..+4% at 1k, +3..+6% at 2k-4k with 16-32 pairs;
// 96-132 pairs at 512-1k keys lost up to 6% (the CTAs at work then read many pairs' keys at once),
// and footprints of 64 MB lost 9% at d 128 4k.
constexpr long long kAttnHopperTailL2Bytes = 16ll << 20;
constexpr int kAttnHopperTailMax = 32;
constexpr int attn_hopper_tail_heads(int window_right, long long kv_bytes, int ctas, long long pairs) {
  if (window_right < 0 || kv_bytes <= 0 || ctas <= 0 || pairs <= 0) return 0;
  long long g = kAttnHopperTailL2Bytes / kv_bytes;
  if (g > kAttnHopperTailMax) g = kAttnHopperTailMax;
  if (g > ctas) g = ctas;
  if (g > pairs) g = pairs;
  return g < 1 ? 1 : static_cast<int>(g);
}

// The persistent kernel's split of its last tiles (kSplitTail, kernels/attention/
// 04_hopper_persistent.cuh): `tiles` equal tiles of n_blocks key blocks each (no mask, fixed
// lengths) drawn in order by `sms` CTAs; after tiles / sms full rounds (at least one) the last
// tiles % sms run alone. Split into k parts (k at most kAttnSplitTailMax and n_blocks), they take ceil(left k /
// sms) rounds of a part, whose time is modelled as its ceil(n_blocks / k) blocks plus one block of
// fixed cost (its first Q K^T, which nothing overlaps, and its epilogue): the k of the shortest
// tail, taken when it saves at least min_saving of the whole (full rounds + 1 tiles). splits 1:
// no split (min_saving < 0: never).
constexpr AttnSplitTail attn_hopper_persistent_split_tail(long long tiles, int sms, int n_blocks, double min_saving = 0.01) {
  if (tiles <= 0 || sms <= 0 || n_blocks < 2 || min_saving < 0) return {0, 1};
  const long long left = tiles % sms, waves = tiles / sms;
  if (left == 0 || waves == 0) return {0, 1};  // under one round: every tile has an SM
  int best_k = 1;
  double best = 1.0;  // the tail unsplit: one tile
  for (int k = 2; k <= kAttnSplitTailMax && k <= n_blocks; ++k) {
    const long long rounds = (left * k + sms - 1) / sms;
    const double cost = static_cast<double>(rounds) * (static_cast<double>((n_blocks + k - 1) / k) + 1.0) / n_blocks;
    if (cost < best) best = cost, best_k = k;
  }
  if (best_k == 1 || (1.0 - best) / static_cast<double>(waves + 1) < min_saving) return {0, 1};
  return {static_cast<int>(tiles - left), best_k};
}

// The key-block width rung 4's forward takes for 16-bit inputs at this head dim, with softcap /
// ALiBi (score_mod) or not, causal (window_right 0) or not, with a left window (window_left >= 0) or
// not, over seqlen_k keys (varlen: the longest), outside a CUDA-graph capture.
constexpr int attn_hopper_key_block(int headdim, bool score_mod, bool causal, int window_left, int seqlen_k) {
  if (headdim == 64 && !score_mod && causal && window_left >= 0 && seqlen_k > kAttnHopperPersistentThreeAboveCausal &&
      seqlen_k <= kAttnHopperPersistentUpToCausal<64>)
    return kAttnHopperPersistentThreeBlockN;
  if (headdim == 128 && !score_mod && seqlen_k >= kAttnHopperWideBlocksFrom &&
      seqlen_k > attn_hopper_persistent_reach<128>(score_mod, causal, window_left))
    return 176;  // above the persistent kernel's range
  if (headdim == 256 && score_mod && seqlen_k <= kAttnHopperNarrowBlocksUpTo) return 64;
  if (headdim == 256 && !score_mod && seqlen_k <= (causal ? kAttnHopperOwnOUpToCausal256 : kAttnHopperOwnOUpTo256)) return 64;
  return attn_hopper_default_key_block(headdim);  // kernels/attention/params.h
}

}  // namespace flashlab::detail
