// Rung 4 with a persistent, dynamic tile scheduler: the library's rung 4 for short and medium key
// sequences at head dims 64, 128 and 256 (src/attention_hopper_hdim.cuh: up to 1k keys at d 64, 2k
// causal; up to 4k at d 128, causal too; at d 256 without softcap / ALiBi up to 1k, causal too).
// Measured against the one-CTA-per-tile kernels by
// bench/experiments/attention_hopper_ablation.cu --sweep / --sweep64 (H100, 2026-11-26, cafac17: d
// 128 +22% / +10% / +4.8% / +1.4% at 512 / 1k / 2k / 4k keys without a mask, causal +26% / +18% /
// +9% / +4%; from 8k 4-6% slower (causal: equal at 8k, 4% slower at 16k); d 64 against three
// consumer warpgroups +14% /
// +3.7% at 512 / 1k, causal +38% / +26% / +1.9% at 512 / 1k / 2k) and held to it bit for bit by
// tests/gpu/test_attention_persistent.cu. Before its block loop's wgmma descriptors and mask test
// were warp-uniform (9b51b81, cafac17) it lost from 2k keys on. The kernel of
// kernels/attention/04_hopper.cuh (16-bit, not paged, two or three consumer warpgroups,
// intra-warpgroup overlap on, pingpong on but at d 64 with two; the same block steps, hopper_attn_*) with
// one change of structure:
//   - One CTA per SM (grid = min(tiles, SMs)) walks tiles (128-row query block, head, batch) in
//     the library's order (query blocks fastest, from the last: the longest causal rows first;
//     then heads, then batches; the last args.tail_heads (batch, head) pairs in rounds of one query
//     block, so that a causal walk ends with short tiles: hopper_attn_walk_tile). CTA c starts with
//     tile c; every next tile comes from a counter in
//     global memory (atomicAdd by the producer thread), so a
//     CTA that drew short tiles draws more: the static striding of a80b187 (tile c, c + #CTAs, ...)
//     left CTAs with long causal tiles behind (16k causal 599 -> 417 TFLOP/s). The counter and a
//     count of CTAs done live in the library's zero-filled counters workspace; the last CTA to
//     finish its walk zeroes both for the next launch.
//   - The producer runs ahead across tiles: it hands each tile to the consumers through a Q
//     buffer (the tile index in tile_of[] and, kSharedTile, its coordinates in tile_info[]; Q's
//     bytes on q_full), two Q buffers where they fit
//     (head dims <= 128), so the next tile's Q and first K/V blocks load while this tile computes
//     and stores its output; with one, the next Q waits for this tile's epilogue. A tile index of
//     -1 ends the walk. The K/V ring's stage and phase counters run on across tiles.
//   - A Q buffer goes back to the producer (q_empty, an arrive per consumer thread) once the
//     consumers' O rows in it have been read out (TMA store read, or the varlen copy).
// Why it was expected to pay: a non-persistent CTA loads Q and its first K/V block before any math and
// stores O after the last (one CTA per SM: nothing overlaps them); at 512-1k keys that is a large
// part of a CTA's life (rung 4 reaches 373 / 530 TFLOP/s there against 596-615 at 2k-16k).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/04_hopper.cuh"

namespace flashlab::kernels {

// kStages_: K/V buffers in the ring (the library kernel's 2 by default). kConsumers_: consumer
// warpgroups, 2 or 3 (HopperAttnTraits; three get 152 registers each here, the producer 40-48).
// kOwnO_: a staging tile for O of its own, one warpgroup's 64 rows (attn_hopper_persistent_kernel's
// kOwnO), after the K/V ring.
template <int kHeadDim, bool kScoreMod, int kBlockN = 0, int kStages_ = 2, int kConsumers_ = 2, bool kSumByMma_ = false,
          bool kOwnO_ = false>
struct HopperAttnPersistentTraits : HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, 2, kConsumers_, kSumByMma_> {
  using Base = HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, 2, kConsumers_, kSumByMma_>;
  static constexpr int kStages = kStages_;
  static constexpr int kOBytes = kOwnO_ ? Base::kBoxes * 64 * 128 : 0;
  static constexpr int kRingBytes = kStages * (Base::kKBytes + Base::kVBytes) + kOBytes;
  // Q buffers: two where they fit next to the K/V ring (and O's tile), else one.
  static constexpr int kQStages = 2 * Base::kQBytes + kRingBytes + 1024 <= 227 * 1024 ? 2 : 1;
  static constexpr int kSmemBytes = kQStages * Base::kQBytes + kRingBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "the shared memory of one block on sm_90");
};

// Pingpong turns in the persistent kernel (kPingpong): off at head dim 64 with two consumer
// warpgroups, where each warpgroup issuing its GEMMs when ready measured faster (H100, 2026-11-26,
// a1e15da, --persistent-pingpong: +2.3% / +4.4% at 512 / 1k keys, causal +4.1% / +5.7%; the one-CTA
// kernel's ablation had shown the same at d 64, 3-4%); at d 128 and with three warpgroups within 1%.
template <int kHeadDim, int kConsumers>
constexpr bool kAttnPersistentPingpongDefault = !(kHeadDim == 64 && kConsumers == 2);

// The right mask edge of query row `row`: the keys it sees lie below min(sk, row + diag +
// window_right + 1).
__device__ __forceinline__ int64_t attn_right_edge(int64_t row, int sk, const AttnScoreMod& mod) {
  int64_t right = sk;
  if (mod.window_right >= 0) {
    const int64_t diag_right = row + mod.diag + mod.window_right + 1;
    if (diag_right < right) right = diag_right;
  }
  return right;
}

// kPeelMask's range: blocks i in [lo, hi) (lo >= 1, lo <= hi; n_begin + i absolute) of a warpgroup
// whose first row is wg_row0 need no mask of hopper_attn_softmax_max's test: key block n needs the
// right one when (n + 1) kN > the first row's right edge, the left one when n kN < wg_row0 + 63 +
// diag - window_left.
struct NoMaskRange {
  int lo, hi;
};
template <int kN>
__device__ __forceinline__ NoMaskRange no_mask_range(int wg_row0, int n_begin, int n_blocks, int sk, const AttnScoreMod& mod) {
  const int64_t right = attn_right_edge(wg_row0, sk, mod);  // keys below this index are unmasked on the right
  const int64_t n_right = right > 0 ? right / kN : 0;  // blocks n < n_right need no right mask
  int64_t n_left = 0;                                  // blocks n >= n_left need no left mask
  if (mod.window_left >= 0) {
    const int64_t left = static_cast<int64_t>(wg_row0) + 63 + mod.diag - mod.window_left;
    n_left = left > 0 ? (left + kN - 1) / kN : 0;
  }
  int64_t lo = n_left - n_begin, hi = n_right - n_begin;
  lo = lo < 1 ? 1 : lo > n_blocks ? n_blocks : lo;
  hi = hi > n_blocks ? n_blocks : hi < lo ? lo : hi;
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

// kHalfLast's blocks of a warpgroup whose first row is wg_row0, out of its tile's n_blocks from
// block n_begin: the first n of them may hold a key one of its rows sees, the rest hold none
// (n = n_blocks where its rows see no key at all: the tile's own handling of rows with no key); of
// the last of those, only the first kPart keys are seen (half; kPart < kN, a whole number of k16
// steps: kN / 2 or the kernel's kTailKeys). For the causal diagonal of a tile of 128 rows on 128-key
// blocks, the first warpgroup's last block is half; with three
// warpgroups on 96-key blocks, the first's last block is not seen at all.
struct WgBlocks {
  int n;
  bool half;
};
template <int kN, int kPart>
__device__ __forceinline__ WgBlocks wg_blocks(int wg_row0, int n_begin, int n_blocks, int sk, const AttnScoreMod& mod) {
  // Keys from the last row's right edge on are masked for every row of the warpgroup.
  const int64_t right = attn_right_edge(static_cast<int64_t>(wg_row0) + 63, sk, mod);
  const int64_t seen = right - static_cast<int64_t>(n_begin) * kN;  // from the tile's first key
  if (seen <= 0) return {n_blocks, false};
  const int64_t n = (seen + kN - 1) / kN < n_blocks ? (seen + kN - 1) / kN : n_blocks;
  return {static_cast<int>(n), kPart < kN && seen - (n - 1) * kN <= kPart};
}

// Grid: min(tiles, SMs) CTAs (1-D), Tr::kThreads threads, Tr::kSmemBytes dynamic shared memory;
// tiles: the work items, m_blocks x nheads x batch (kSplitTail: split_from + the tiles after it x
// splits); counters[0] (the next item - gridDim.x), counters[1] (CTAs done) and, kSplitTail, one per
// split tile and consumer warpgroup after them zero at launch, and left zero.
// kCarryTurns: the pingpong turns run on across tiles (the second warpgroup's last GEMM of a tile
// lets the first start its next tile, whose Q and first K block are already loaded, under the
// second's epilogue); false: they restart at each tile (the first warpgroup's next tile waits
// for the second's epilogue).
// kStoreWait false: a timing probe (wrong output: the next Q load may land before the TMA store of
// O has read the buffer): the epilogue's thread 0 does not wait for the store's reads.
// kDirectO: each consumer thread gives the tile's Q buffer back as soon as its last Q K^T product is
// done (before the last block's softmax and P V), and the epilogue stores O from registers to
// global memory (hopper_attn_normalize_o's kDirectStore) instead of through the buffer and a TMA
// store: with one Q buffer (head dim 256) the next tile's Q then loads under this tile's last block
// and epilogue instead of after them. kEarlyQProbe (a timing probe, wrong output): Q given back as
// with kDirectO, O still staged in the buffer and TMA-stored (what the early Q load alone is worth).
// kStageO (two consumer warpgroups, pingpong turns): Q given back as with kDirectO, and O staged for
// its TMA store in the last key block's K/V stage instead: warpgroup 0's rows in its K buffer once
// warpgroup 1's last Q K^T is done, 1's rows in its V buffer once 0's last P V is done (each a named
// barrier the other arrives on without waiting); that buffer goes back to the producer (k_empty or
// v_empty: the stager's arrives come after the store has read it). The next tile's first block
// loads into the other stage meanwhile.

// kSplitTail (an ablation: 3-8% slower than the unsplit kernel where it splits, H100, 2026-11-27,
// docs/ladder/attention.md; fixed lengths, no mask; kSharedTile): the walk's work items past args.split_from
// are parts of its last tiles, split along the keys (HopperAttnArgs: item split_from + u is part
// u % splits of tile split_from + u / splits; tiles = split_from + (tiles left) x splits items).
// A part's warpgroup writes its O / l and LSE in fp32 to its unit's part_o / part_lse rows
// (hopper_attn_store_part), then counts itself done on its (tile, warpgroup) counter in
// counters[2 ..]; the last of the tile's parts to finish merges the parts' rows into o and lse
// (hopper_attn_merge_row) and sets the counter back to zero. The persistent walk otherwise ends
// with the last (tiles % CTAs) tiles running alone on as many SMs.

// kNoMask (fixed lengths, no causal / window, seqlen_k a multiple of kBlockN, no softcap / ALiBi:
// the launcher's check): no block needs a mask; the softmax has no mask test or pass, the epilogue
// no varlen copy.

// kPeelMask: the block loop split in three, the blocks that need no mask (the middle ones: the
// causal diagonal, a window's edges and the last keys lie at either end) in a loop without the mask
// code (as kNoMask), the others in loops with it. Same outputs.

// kHalfLast: each consumer warpgroup runs only its own blocks of the tile (wg_blocks): the blocks
// after them, which hold no key its rows see, are waited for and given back without math (an
// empty pingpong turn each), and where only the first half of its last block is seen, that block's
// softmax and P V take its first kN / 2 keys (its Q K^T the whole block; kN / 2 a whole number of
// k16 steps, else no part block); kTailKeys > 0: the first kTailKeys keys instead, where its rows see
// no more of it (e.g. 32 of 80 at 512 keys, head dim 256).
// Same outputs (the skipped products add exact zeros).

// kLag > 0 (two consumer warpgroups without pingpong turns; kLag < kStages): the second warpgroup
// starts its walk once the first has issued the products of the walk's block kLag (or begun its
// second tile), so that one's tile boundary (first block without overlap, epilogue) falls under the
// other's block loop rather than both at once; nothing holds the offset afterwards but the K/V ring.

// kOwnO (two consumer warpgroups, one Q buffer: head dim 256): each consumer thread gives the tile's
// Q buffer back once its last Q K^T product is done (as kDirectO), so that the next tile's Q loads
// under this tile's last block and epilogue, and O is staged for its TMA store in a tile of its own
// (Tr::kOBytes: one warpgroup's 64 rows, after the K/V ring) that the two warpgroups take in turn,
// warpgroup 0's rows, then 1's, in every tile (o_free[c]: an arrive per thread of the other
// warpgroup once its store has read the tile; mbarriers rather than named barriers, whose
// bar.arrive orders the reads too but which compute-sanitizer's racecheck reports as hazards).
// Room for it: 64-key blocks at head dim 256 (64 + 2 x 64 + 32 KB).

// kStmatrix: the epilogue writes O to its staging tile by stmatrix (hopper_attn_normalize_o); by default
// only in the lagging form (kLag > 0).

// kStoreWaitLate (two Q buffers, the library's epilogue): the thread that issues a warpgroup's TMA
// store of O does not wait for the store to read the Q buffer before going on; it waits, and gives
// the buffer back, once it has issued the next tile's first Q K^T (or at its next epilogue, or at
// the walk's end), so that the wait runs under that product instead of holding the warpgroup's
// next wgmma (whose issue needs all four warps) and, with pingpong turns, the other warpgroup's
// turn. The producer needs the buffer only for the tile after next.

// kExpTurns (two consumer warpgroups without pingpong turns around their GEMMs, no lag): turns around
// the softmax's exponentials instead (cuDNN's fprop kernels take them so, read off their SASS on an
// H200, 2026-11-29): each warpgroup computes its rows' max, then waits for the other's exponentials
// to be done (named barrier 1 + cw) before its own, and lets the other go after them (2 - cw). The
// two warpgroups' softmaxes alternate, so that one's products run under the other's exponentials.
// kSerial: the block loop without intra-warpgroup overlap (S_i = Q K_i^T, its softmax, O += P_i V_i,
// each waited for before the next), as cuDNN's; with kExpTurns the other warpgroup's products fill
// the gaps.

// kSharedTile: the producer publishes each tile's coordinates, key range and score modifiers in
// shared memory beside its Q buffer; false: every consumer warp recomputes them from the tile
// index (two integer divisions, the batch's row offsets, the key range: ~310 instructions per
// warp and tile, 10% of a tile's instructions at 512 keys). Off at d 128 with softcap / ALiBi,
// where the consumers' 224 registers (the producer then needs 48) spilled 44 bytes.
template <typename T, int kHeadDim, bool kScoreMod, int kBlockNArg = 0, bool kCarryTurns = true,
          bool kSharedTile = (kHeadDim < 128 || !kScoreMod), int kStagesArg = 2,
          bool kLazyRescale = kAttnLazyRescaleDefault<T, kHeadDim>, int kConsumers = 2,
          bool kTreeReduce = kAttnTreeReduceDefault<T, kHeadDim>, bool kPingpong = kAttnPersistentPingpongDefault<kHeadDim, kConsumers>,
          bool kStoreWait = true, bool kDirectO = false, bool kEarlyQProbe = false, bool kStageO = false, bool kSumByMma = false,
          bool kSplitTail = false, bool kNoMask = false, bool kPeelMask = false, bool kHalfLast = false, int kLag = 0,
          int kTailKeys = 0, bool kOwnO = false, bool kStmatrix = (kLag > 0), bool kStoreWaitLate = false, bool kExpTurns = false,
          bool kSerial = false>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    attn_hopper_persistent_kernel(const __grid_constant__ HopperAttnArgs args, int* counters, int tiles) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma, TMA and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  static_assert(sizeof(T) == 2, "16-bit inputs (the FP8 path is the library kernel's only)");
  // Head dim 256: one Q buffer (two do not fit beside the K/V ring), the producer at 56 registers
  // (kProducerRegs).
  static_assert(kHeadDim <= 128 || kHeadDim == 256, "head dims up to 128, and 256");
  using Tr = HopperAttnPersistentTraits<kHeadDim, kScoreMod, kBlockNArg, kStagesArg, kConsumers, kSumByMma, kOwnO>;
  static_assert(!kStageO || (kConsumers == 2 && kPingpong && kStoreWait && !kDirectO && !kEarlyQProbe && Tr::kBlockN >= 64),
                "O staged in a K/V stage: two consumer warpgroups taking turns, each's 64 rows within a K or V buffer");
  // kStageO's named barriers (after the pingpong turns' 1 .. kConsumers and the epilogues'): K of the
  // last block read by warpgroup 1 (0 waits), V of the last block read by warpgroup 0 (1 waits).
  constexpr int kLastKRead = 1 + 2 * kConsumers, kLastVRead = 2 + 2 * kConsumers;
  static_assert(!kSplitTail || (kSharedTile && !kDirectO && !kEarlyQProbe && !kStageO),
                "split tail parts: the tile published in shared memory, the library's epilogue");
  static_assert(!kOwnO || (kConsumers == 2 && kStoreWait && !kDirectO && !kEarlyQProbe && !kStageO && !kSplitTail),
                "O's own staging tile: two consumer warpgroups, the TMA store waited for");
  constexpr bool kEarlyQ = kDirectO || kEarlyQProbe || kStageO || kOwnO;  // Q given back after the last Q K^T
  static_assert(!kHalfLast || ((!kEarlyQ || kOwnO) && !kSplitTail && !kNoMask && (kCarryTurns || !kPingpong)),
                "a warpgroup's own blocks: the library's epilogue or kOwnO's, the turns carried across tiles");
  static_assert(kLag == 0 || (kConsumers == 2 && !kPingpong && !kStageO && !kHalfLast && kLag < kStagesArg),
                "a lag between two consumer warpgroups without turns, within the K/V ring (kHalfLast's skipped blocks "
                "would wait for the second warpgroup's releases before the first lets it start)");
  static_assert(!kExpTurns || (kConsumers == 2 && !kPingpong && kLag == 0 && !kStageO),
                "turns around the exponentials: two consumer warpgroups, no turns around the GEMMs (barriers 1, 2), no lag");
  static_assert(!kSerial || (!kPeelMask && !kHalfLast && !kSumByMma && !kEarlyQ),
                "the serial block loop: one loop over the tile's whole blocks, the rows' sums in fp32, Q given back at the epilogue");
  constexpr int kLagBar = 3 + 2 * kConsumers;  // after kStageO's named barriers
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages, kQStages = Tr::kQStages;
  static_assert(!kStoreWaitLate || (kQStages == 2 && kStoreWait && !kEarlyQ),
                "the O store's wait after the next tile's first Q K^T: two Q buffers, the library's epilogue");
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t q_full[kQStages], q_empty[kQStages], k_full[kStages], k_empty[kStages], v_full[kStages],
      v_empty[kStages];
  __shared__ uint64_t o_free[2];  // kOwnO: O's staging tile free for warpgroup 0 / 1
  unsigned char* smem = align_smem<1024>(smem_raw);
  unsigned char* sq_all = smem;                        // (kQStages, kBoxes x 128 rows): Q, later O
  unsigned char* sk = sq_all + kQStages * Tr::kQBytes; // (kStages, kBoxes x kN rows)
  unsigned char* sv = sk + kStages * Tr::kKBytes;      // (kStages, kBoxes x kN rows)
  unsigned char* so = sv + kStages * Tr::kVBytes;      // kOwnO: (kBoxes x 64 rows), a warpgroup's O
  const AttnFwdParams& p = args.p;
  const bool varlen = !kNoMask && p.cu_seqlens_q != nullptr;  // kNoMask: fixed lengths

  // Work item `item`: tile `item` of the walk (hopper_attn_walk_tile), or with kSplitTail
  // from args.split_from on a part of a tile (unit >= 0: its rows of part_o / part_lse). False for
  // a tile past its batch's rows (varlen).
  struct Tile {
    int m0, h, b, hk, n_begin, n_blocks, unit;
    AttnBatch sb;
    AttnScoreMod mod;
  };
  __shared__ int tile_of[kQStages];  // the tile whose Q buffer this is (-1: no more tiles)
  __shared__ Tile tile_info[kQStages];  // kSharedTile: that tile (tile_at's result)
  const auto tile_at = [&](int item, Tile& w) {
    int tile = item, part = 0;
    w.unit = -1;
    if constexpr (kSplitTail)
      if (item >= args.split_from) {
        w.unit = item - args.split_from;
        tile = args.split_from + w.unit / args.splits, part = w.unit % args.splits;
      }
    const HopperAttnTile tc = hopper_attn_walk_tile(tile, args.m_blocks, p.nheads, p.nheads * p.batch, args.tail_heads);
    w.h = tc.h, w.b = tc.b, w.m0 = tc.mb * kM;
    w.sb = attn_batch(p, w.b);
    if (w.m0 >= w.sb.sq) return false;
    w.hk = w.h / (p.nheads / p.nheads_kv);
    w.mod = attn_score_mod(p, w.b, w.h, w.sb);
    const int rows_hi = w.sb.sq - w.m0 < kM ? w.sb.sq : w.m0 + kM;
    const AttnKeyRange kr = attn_key_range(w.m0, rows_hi, w.sb.sk, w.mod.diag, w.mod.window_left, w.mod.window_right);
    w.n_begin = kr.lo / kN;
    w.n_blocks = kr.hi > kr.lo ? (kr.hi + kN - 1) / kN - w.n_begin : 0;
    if constexpr (kSplitTail)
      if (w.unit >= 0) {  // blocks [n part / splits, n (part + 1) / splits) of the tile's n
        const int lo = w.n_blocks * part / args.splits, hi = w.n_blocks * (part + 1) / args.splits;
        w.n_begin += lo, w.n_blocks = hi - lo;
      }
    return true;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQStages; ++s) {
      mbarrier_init(&q_full[s], 1);   // the producer's arrive (+ Q's bytes)
      mbarrier_init(&q_empty[s], 128 * kConsumers);  // every consumer thread, after its last access to the buffer
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], 4 * kConsumers);  // one arrive per consumer warp
      mbarrier_init(&v_empty[s], 4 * kConsumers);
    }
    if constexpr (kOwnO)
      for (int c = 0; c < 2; ++c) mbarrier_init(&o_free[c], 128);  // every thread of the other warpgroup
    fence_barrier_init();
  }
  __shared__ uint32_t turn_zero;  // kExpTurns: a 0 the exponentials' offsets load after their turn's wait
  if (kExpTurns && threadIdx.x == 0) turn_zero = 0;
  __shared__ alignas(256) uint32_t ones[kSumByMma ? 64 : 1];  // kSumByMma: hopper_attn_fill_ones
  if constexpr (kSumByMma) hopper_attn_fill_ones<T>(ones);
  __syncthreads();

  // Registers per thread: the producer 40 (the library's producer has 24; the tile walk's state
  // spilled at 24 and 32; with kSharedTile's stores 48; at d 256, 4-16 bytes spilled at 48: 56),
  // the consumers the rest: 40 x 128 + 232 x 256 = 64,512, 48 (56) x 128 + 224 x 256 = 63,488
  // (64,512), three consumers 152 each, of the 65,536-register file.
  // kSplitTail's work items spilled 12 bytes in the producer at 48 (d 128): 56, beside the same 224.
  constexpr int kProducerRegs = kHeadDim == 256 || kSplitTail ? 56 : kSharedTile ? 48 : 40;
  constexpr int kConsumerRegs = kConsumers == 3 ? 152 : kSharedTile || kHeadDim == 256 ? 224 : 232;
  // setmaxnreg moves registers between the warpgroups of the CTA's launch allocation (the launch
  // bound's registers a thread, a multiple of 8: 168 x 384 = 64,512 with two consumers) and cannot
  // take more: a split of all 65,536 with two consumers (a producer at 64 beside 224, 5b9635a) hung
  // in the consumers' setmaxnreg.inc.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= (65536 / Tr::kThreads / 8 * 8) * Tr::kThreads,
                "the registers of the launch");
  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // producer: one thread hands out tiles and loads their Q, K and V
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    prefetch_tensor_map(&args.q);
    prefetch_tensor_map(&args.k);
    prefetch_tensor_map(&args.v);
    int qt = 0, it = 0;  // tiles handed out, K/V blocks loaded
    int tile = static_cast<int>(blockIdx.x);
    while (true) {
      Tile w;
      while (tile < tiles && !tile_at(tile, w)) tile = static_cast<int>(gridDim.x) + atomicAdd(counters, 1);
      const int qs = qt % kQStages;
      mbarrier_wait(&q_empty[qs], ((qt / kQStages) & 1) ^ 1);  // a fresh barrier passes parity 1
      ++qt;
      if (tile >= tiles) {
        tile_of[qs] = -1;
        mbarrier_arrive(&q_full[qs]);
        // This CTA's last draw is done (the loop's exit depended on its value); the last CTA to
        // get here leaves the counters zero for the next launch. The fences order each CTA's
        // draws before its count, and every count before the reset (the atomics are relaxed).
        __threadfence();
        if (atomicAdd(counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
          __threadfence();
          atomicExch(counters, 0);
          atomicExch(counters + 1, 0);
        }
        break;
      }
      tile_of[qs] = tile;  // published by the arrive (release) below
      if constexpr (kSharedTile) tile_info[qs] = w;
      const int qb = varlen ? 0 : w.b;  // batch coordinate (varlen: rows are packed, batch 1)
      if (w.n_blocks > 0) {
        unsigned char* sq = sq_all + qs * Tr::kQBytes;
        mbarrier_arrive_expect_tx(&q_full[qs], Tr::kQBytes);
#pragma unroll
        for (int x = 0; x < Tr::kBoxes; ++x)
          tma_load_4d(sq + x * kM * 128, &args.q, x * Tr::kBoxCols, static_cast<int>(w.sb.q_row0) + w.m0, w.h, qb, &q_full[qs]);
      } else {
        mbarrier_arrive(&q_full[qs]);  // no key: the consumers write O = 0 without reading Q
      }
      const int k_row = static_cast<int>(w.sb.k_row0);
      for (int i = 0; i < w.n_blocks; ++i, ++it) {
        const int s = it % kStages;
        const uint32_t phase = (it / kStages) & 1;
        const int row = k_row + (w.n_begin + i) * kN;
        mbarrier_wait(&k_empty[s], phase ^ 1);
        mbarrier_arrive_expect_tx(&k_full[s], Tr::kKBytes);
#pragma unroll
        for (int x = 0; x < Tr::kBoxes; ++x)
          tma_load_4d(sk + s * Tr::kKBytes + x * kN * 128, &args.k, x * Tr::kBoxCols, row, w.hk, qb, &k_full[s]);
        mbarrier_wait(&v_empty[s], phase ^ 1);
        mbarrier_arrive_expect_tx(&v_full[s], Tr::kVBytes);
#pragma unroll
        for (int x = 0; x < Tr::kBoxes; ++x)
          tma_load_4d(sv + s * Tr::kVBytes + x * kN * 128, &args.v, x * Tr::kBoxCols, row, w.hk, qb, &v_full[s]);
      }
      tile = static_cast<int>(gridDim.x) + atomicAdd(counters, 1);
    }
    return;
  }

  // Consumers: warpgroup cw = 0 .. kConsumers - 1 computes query rows [m0 + 64 cw, m0 + 64 cw + 64)
  // of each tile.
  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;
  const int t128 = threadIdx.x - 128 * wg;
  const int warp = t128 / 32, lane = t128 % 32;
  const int g = lane / 4, t = lane % 4;

  float o[kHeadDim / 2];         // O accumulator: d[4 j + 2 r + c] = row row0 + 8 r, column 8 j + 2 t + c
  float s[kN / 2];               // S, then P in fp32, same layout with key columns
  uint32_t pa[Tr::kPvSteps][4];  // P as the register A operand of P V, one k-step per entry
  float row_max[2], row_sum[2];  // log2 units; partial sums
  float lsum[4];                 // kSumByMma: a block's row sums (m64n8: rows g, g + 8 at lsum[0], lsum[2])
  const auto add_sums = [&](const float (&factor)[2]) { hopper_attn_add_sums<Tr>(row_sum, lsum, factor); };
  constexpr float kOne[2] = {1.f, 1.f};
  // Pingpong turns as in attn_hopper_kernel: warpgroup cw issues GEMMs after a sync on barrier
  // 1 + cw, then lets the other go with an arrive on its barrier. Both warpgroups take
  // n_blocks + 1 turns per tile, so the turns alternate across tiles too. kCarryTurns: the second
  // warpgroup lets the first go once, at the start of the walk, and its last arrive (the walk's
  // last turn) is matched by the first warpgroup's sync when the walk ends. Else per tile: the
  // second starts by letting the first go and skips its final arrive.
  // kPingpong false: no turns, each warpgroup issues its GEMMs when it is ready.
  const auto turn_begin = [&] {
    if constexpr (kPingpong) named_barrier_sync(1 + cw, 256);
  };
  const auto turn_end = [&](bool last) {
    if constexpr (kPingpong)
      if (kCarryTurns || !(last && cw == kConsumers - 1)) named_barrier_arrive(hopper_attn_next_turn_barrier<kConsumers>(cw), 256);
  };
  if constexpr (kPingpong && kCarryTurns)
    if (cw == kConsumers - 1) named_barrier_arrive(1, 256);  // the first warpgroup goes first
  // kExpTurns: the turns around the exponentials run on across tiles and the walk (both warpgroups
  // take one a block); the second lets the first go once, and the first matches the second's last
  // arrive when the walk ends.
  if constexpr (kExpTurns)
    if (cw == 1) named_barrier_arrive(1, 256);
  const auto release = [&](uint64_t* bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };

  int qt = 0, it = 0;  // tiles and K/V blocks consumed so far
  // kStoreWaitLate: the Q buffer whose O store this thread (t128 0) issued and has not waited for (-1: none).
  int store_pending = -1;
  const auto settle_store = [&] {
    if constexpr (kStoreWaitLate)
      if (store_pending >= 0) {
        tma_store_wait_all<true>();
        mbarrier_arrive(&q_empty[store_pending]);
        store_pending = -1;
      }
  };
  bool lag_pending = kLag > 0 && cw == 0;  // kLag: the first warpgroup has not let the second start yet
  const auto lag_release = [&] {
    if constexpr (kLag > 0)
      if (lag_pending) {
        named_barrier_arrive(kLagBar, 256);
        lag_pending = false;
      }
  };
  while (true) {
    const int qs = qt % kQStages;
    if constexpr (kLag > 0) {
      if (cw == 1 && qt == 0) named_barrier_sync(kLagBar, 256);
      if (qt == 1) lag_release();  // the first warpgroup's second tile (or the end of a one-tile walk)
    }
    mbarrier_wait(&q_full[qs], (qt / kQStages) & 1);
    ++qt;
    const int tile = *static_cast<volatile int*>(&tile_of[qs]);
    if (tile < 0) {
      // The second warpgroup's last arrive, unmatched otherwise (no turn at all: its first).
      if constexpr ((kPingpong && kCarryTurns) || kExpTurns)
        if (cw == 0) named_barrier_sync(1, 256);
      settle_store();
      lag_release();  // kLag: a walk without a tile (varlen: every tile drawn past its batch's rows)
      break;
    }
    Tile w;
    if constexpr (kSharedTile) w = tile_info[qs];
    else tile_at(tile, w);  // a tile the producer handed out lies in its batch's rows
    // Warp-uniform copies (lane 0's; loads from shared memory are not known uniform to the compiler)
    // of what the block loop reads: the block count (the K/V ring's stage addresses, hence the
    // wgmma descriptors) and the mask test's operands (else computed per thread, with a divergent
    // branch, every block).
    w.n_blocks = __shfl_sync(0xffffffffu, w.n_blocks, 0);
    w.sb.sk = __shfl_sync(0xffffffffu, w.sb.sk, 0);
    w.mod.diag = __shfl_sync(0xffffffffu, w.mod.diag, 0);
    w.mod.window_left = p.window_left, w.mod.window_right = p.window_right;
    const AttnBatch& sb = w.sb;
    const AttnScoreMod& mod = w.mod;
    const int n_begin = __shfl_sync(0xffffffffu, w.n_begin, 0), n_blocks = w.n_blocks;  // (the mask test's, uniform)
    const int wg_row0 = __shfl_sync(0xffffffffu, w.m0 + 64 * cw, 0);  // first query row of this warpgroup (uniform)
    const int row0 = wg_row0 + warp * 16 + g;      // this thread's rows: row0, row0 + 8
    const float scale_log2 = mod.scale * kLog2e, slope_log2 = mod.slope * kLog2e;
    unsigned char* sq = sq_all + qs * Tr::kQBytes;
    const uint32_t q_base = __shfl_sync(0xffffffffu, smem_u32(sq) + cw * 64 * 128, 0);  // this warpgroup's 64 rows of each Q box
    // The block steps of attn_hopper_kernel (04_hopper.cuh) on this tile; V's k-steps of 16 rows,
    // 64-column boxes kN rows apart.
    // keys: a std::integral_constant, the block's keys taken (Full; kHalfLast: Half, its first half).
    using Full = std::integral_constant<int, kN>;
    constexpr int kPart = kTailKeys > 0 ? kTailKeys : kN % 32 == 0 ? kN / 2 : kN;  // keys of a part block
    static_assert(kPart % 16 == 0 && kPart <= kN, "a part block of whole k16 steps");
    using Half = std::integral_constant<int, kPart>;
    // (Q K^T: always the whole block, hopper_attn_gemm_qk's note.)
    const auto gemm_qk = [&](int stage) { hopper_attn_gemm_qk<T, Tr>(s, q_base, smem_u32(sk + stage * Tr::kKBytes)); };
    const auto gemm_pv = [&](int stage, auto keys) {
      hopper_attn_gemm_pv<T, Tr, true, decltype(keys)::value>(o, pa, smem_u32(sv + stage * Tr::kVBytes), 16 * 128, kN * 128, lsum,
                                                             smem_u32(ones));
    };
    // no_mask (std::true_type): a block known to need no mask (kNoMask, kPeelMask's middle loop).
    // kExpTurns: the exponentials in this warpgroup's turn; before_exp() (e.g. O's rescale) runs
    // between the max and the turn's wait.
    const auto softmax = [&](int n, float (&rescale)[2], auto no_mask, auto keys, auto&& before_exp) {
      constexpr bool kNm = kNoMask || decltype(no_mask)::value;
      constexpr int kKeys = decltype(keys)::value;
      float off[2];
      hopper_attn_softmax_max<Tr, kLazyRescale, kTreeReduce, kNm, kKeys>(s, row_max, off, rescale, n, mod, sb.sk, wg_row0, row0, t,
                                                                         scale_log2, slope_log2);
      before_exp();
      // A barrier orders memory, not registers: ptxas moves the exponentials above a bar.sync that
      // nothing they read depends on (SASS). So their offsets add a zero loaded from shared memory
      // after the wait (a load stays after it), and the arrive's barrier index adds the row sums
      // (which every exponential feeds) masked by that zero. ptxas places the wait itself after the
      // max's first comparison, so the turn holds the rest of the max too (d 64, SASS at 8e31808).
      // Two other placements measured slower (docs/ladder/attention.md): the wait pinned after the
      // max and the rescale factors (063f6b6, -8%), and before the max with the rescale factors'
      // exponentials in the turn (1fd0c77, -6%).
      uint32_t zero = 0;
      if constexpr (kExpTurns) {
        named_barrier_sync(1 + cw, 256);
        asm volatile("ld.volatile.shared.u32 %0, [%1];\n" : "=r"(zero) : "r"(smem_u32(&turn_zero)));
        off[0] += __uint_as_float(zero), off[1] += __uint_as_float(zero);
      }
      hopper_attn_softmax_exp<Tr, kTreeReduce, kKeys>(s, row_sum, off, rescale, scale_log2);
      if constexpr (kExpTurns)
        named_barrier_arrive(2 - cw + static_cast<int>((__float_as_uint(row_sum[0]) | __float_as_uint(row_sum[1])) & zero), 256);
    };
    const auto nothing = [] {};
    const auto convert_p = [&](auto keys) { hopper_attn_convert_p<T, Tr, decltype(keys)::value>(s, pa); };
#pragma unroll
    for (int e = 0; e < kHeadDim / 2; ++e) o[e] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    // kEarlyQ: the epilogue's tile, read before the Q buffer (and its tile entries) goes back.
    Tile e;
    const auto give_back_q = [&] {
      if constexpr (kSharedTile) e = tile_info[qs];
      else tile_at(tile, e);
      mbarrier_arrive(&q_empty[qs]);
    };
    // A Q K^T product of K/V stage `stage` done (`last`: the warpgroup's last of the tile; kHalfLast: of
    // its own blocks, the tile's last otherwise): its K buffer goes back
    // (kStageO: warpgroup 0's last one only after its O store, warpgroup 1 tells 0 it has read it),
    // and with kEarlyQ the Q buffer after the last.
    const auto qk_done = [&](int stage, bool last) {
      if (!kStageO || !last || cw == 1) release(&k_empty[stage]);
      if (kStageO && last && cw == 1) named_barrier_arrive(kLastKRead, 256);
      if (kEarlyQ && last) give_back_q();
    };
    if constexpr (kSerial) {
      // kSerial: each block's Q K^T, softmax and P V in turn, each product waited for at once; O's
      // rescale (from the second block on) between the max and the exponentials.
      float rescale[2];
      for (int i = 0; i < n_blocks; ++i) {
        const int cur = it + i, st = cur % kStages;
        const uint32_t phase = (cur / kStages) & 1;
        mbarrier_wait(&k_full[st], phase);
        gemm_qk(st);
        if (i == 0) settle_store();  // kStoreWaitLate: the last tile's O store, under this product
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        qk_done(st, i == n_blocks - 1);
        softmax(n_begin + i, rescale, std::false_type{}, Full{}, [&] {
          if (i > 0) hopper_attn_rescale_o<Tr, kLazyRescale>(o, rescale);
        });
        convert_p(Full{});
        mbarrier_wait(&v_full[st], phase);
        gemm_pv(st, Full{});
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&v_empty[st]);
      }
      it += n_blocks;
    } else if (n_blocks > 0) {
      if (kPingpong && !kCarryTurns && cw == kConsumers - 1) named_barrier_arrive(1, 256);  // the first warpgroup goes first
      float rescale[2];
      // kHalfLast: this warpgroup's blocks of the tile, [0, n_wg), the last of them half or not.
      int n_wg = n_blocks;
      bool half = false;
      if constexpr (kHalfLast) {
        const WgBlocks wb = wg_blocks<kN, kPart>(wg_row0, n_begin, n_blocks, sb.sk, mod);
        n_wg = wb.n, half = wb.half;
      }
      // f(Half{}) for a part block (kHalfLast only), else f(Full{}).
      const auto with_keys = [&](bool part, auto&& f) {
        if constexpr (kHalfLast)
          if (part) return f(Half{});
        f(Full{});
      };
      // Block 0: S only (the library kernel's kOverlap schedule; K/V stage of block i: it + i).
      const auto first = [&](auto keys) {
        mbarrier_wait(&k_full[it % kStages], (it / kStages) & 1);
        turn_begin();
        gemm_qk(it % kStages);
        turn_end(false);
        settle_store();  // kStoreWaitLate: the last tile's O store, under this product
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        qk_done(it % kStages, n_wg == 1);
        softmax(n_begin, rescale, std::false_type{}, keys, nothing);
        convert_p(keys);
      };
      with_keys(half && n_wg == 1, first);
      // Block i >= 1: S_i and P_{i-1} V_{i-1} issued together, the softmax of S_i under the latter.
      const auto step = [&](int i, auto no_mask, auto keys) {
        const int cur = it + i, prv = it + i - 1;
        const int st = cur % kStages, prev = prv % kStages;
        mbarrier_wait(&k_full[st], (cur / kStages) & 1);
        mbarrier_wait(&v_full[prev], (prv / kStages) & 1);
        turn_begin();
        gemm_qk(st);            // S_i = Q K_i^T
        gemm_pv(prev, Full{});  // O += P_{i-1} V_{i-1}
        turn_end(false);
        if constexpr (kLag > 0)
          if (cur >= kLag) lag_release();
        wgmma_wait<1>();  // S_i done; P V still running
        wgmma_fence_operands(s);
        qk_done(st, i == n_wg - 1);
        softmax(n_begin + i, rescale, no_mask, keys, nothing);
        // P V done; the wait kept after the softmax where the library kernel keeps it (d 128).
        if constexpr (kHeadDim == 128) wgmma_wait_after<0>(kSumByMma ? s[kN / 2 - 1] : row_sum[1]);
        else wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&v_empty[prev]);
        add_sums(rescale);
        hopper_attn_rescale_o<Tr, kLazyRescale>(o, rescale);
        convert_p(keys);
      };
      // The whole blocks 1 .. n_end - 1 (kHalfLast: a half last block after them).
      const int n_end = kHalfLast && half ? n_wg - 1 : n_wg;
      if constexpr (kPeelMask) {
        // Blocks [lo, hi) (of 1 .. n_end - 1) need no mask for this warpgroup's rows (the test of
        // hopper_attn_softmax_max solved for the block index; warp-uniform): their own loop,
        // without the mask code; the masked blocks before and after it in loops of their own.
        const NoMaskRange r = no_mask_range<kN>(wg_row0, n_begin, n_end, sb.sk, mod);
        int i = 1;
        for (; i < r.lo; ++i) step(i, std::false_type{}, Full{});
        for (; i < r.hi; ++i) step(i, std::true_type{}, Full{});
        for (; i < n_end; ++i) step(i, std::false_type{}, Full{});
      } else {
        for (int i = 1; i < n_end; ++i) step(i, std::false_type{}, Full{});
      }
      if constexpr (kHalfLast)
        if (half && n_wg > 1) step(n_wg - 1, std::false_type{}, Half{});
      const int lst = it + n_wg - 1;
      mbarrier_wait(&v_full[lst % kStages], (lst / kStages) & 1);
      turn_begin();
      with_keys(half, [&](auto keys) { gemm_pv(lst % kStages, keys); });
      turn_end(true);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      add_sums(kOne);
      if (!kStageO || cw == 0) release(&v_empty[lst % kStages]);  // kStageO: 1's after its store
      if (kStageO && cw == 0) named_barrier_arrive(kLastVRead, 256);
      // kHalfLast: the blocks after this warpgroup's, waited for (so that each release counts toward
      // that block's use of its stage) and given back, an empty turn each.
      if constexpr (kHalfLast)
        for (int j = it + n_wg; j < it + n_blocks; ++j) {
          mbarrier_wait(&k_full[j % kStages], (j / kStages) & 1);
          mbarrier_wait(&v_full[j % kStages], (j / kStages) & 1);
          turn_begin();
          turn_end(false);
          release(&k_empty[j % kStages]);
          release(&v_empty[j % kStages]);
        }
      it += n_blocks;
    }

    // Epilogue (the library kernel's): O / l and LSE into the tile's Q buffer, the TMA store or the
    // varlen copy, then the buffer's release. The tile's batch, head and rows are fetched again
    // (tile_info, or from the index) rather than kept in registers through the block loop.
    if (!kEarlyQ || n_blocks == 0) {
      if constexpr (kSharedTile) e = tile_info[qs];
      else tile_at(tile, e);
    }
    if constexpr (kSplitTail)
      if (e.unit >= 0) {  // a part: its rows in fp32; the last of its tile's parts merges them
        __shared__ int merge_last[kConsumers];  // this warpgroup's part was its tile's last
        mbarrier_arrive(&q_empty[qs]);  // neither the Q buffer nor its tile entries are read again
        hopper_attn_store_part<Tr>(o, row_sum, row_max, 1.f, args.part_o, args.part_lse, e.unit, cw, warp, g, t);
        __threadfence();  // this thread's rows before its warpgroup's count
        named_barrier_sync(1 + kConsumers + cw, 128);
        const int ti = e.unit / args.splits;  // the tile's index among the split ones
        if (t128 == 0) {
          int* count = counters + 2 + ti * kConsumers + cw;
          const bool last = atomicAdd(count, 1) == args.splits - 1;
          if (last) *count = 0;  // every part has counted: the next launch finds it zero
          merge_last[cw] = last;
        }
        named_barrier_sync(1 + kConsumers + cw, 128);
        if (merge_last[cw]) {
          __threadfence();  // the other parts' rows (written before their counts) after this count
          // Two threads a row, half its columns each.
          hopper_attn_merge_row<kHeadDim, kM, kAttnSplitTailMax, kHeadDim / 2, T>(args, ti, 64 * cw + t128 / 2,
                                                                                 (t128 % 2) * (kHeadDim / 2), t128 % 2 == 0);
        }
        continue;
      }
    T* out_rows =
        static_cast<T*>(p.o) + attn_offset(p, e.b, e.sb.q_row0, 0, e.h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
    if constexpr (kStageO) {
      if (n_blocks > 0) {
        // The other warpgroup is done with this warpgroup's staging buffer.
        named_barrier_sync(cw == 0 ? kLastKRead : kLastVRead, 256);
        const int sl = (it - 1) % kStages;  // the last block's stage (it counts it already)
        unsigned char* stage = cw == 0 ? sk + sl * Tr::kKBytes : sv + sl * Tr::kVBytes;
        hopper_attn_normalize_o<Tr, T, false, false, true>(o, row_sum, row_max, 1.f, stage, out_rows, p, e.b, e.h, e.sb, cw, warp, g, t, row0);
        fence_proxy_async_smem();  // the writes above before the TMA engine reads them
        named_barrier_sync(1 + kConsumers + cw, 128);
        if (wg_row0 < e.sb.sq)
          hopper_attn_store_o<Tr, T, true, true>(&args.o, stage, out_rows, p.o_row_stride, varlen, wg_row0, e.sb.sq, e.h, e.b, cw, t128);
        named_barrier_sync(1 + kConsumers + cw, 128);  // the store has read the stage (thread 0 waited)
        release(cw == 0 ? &k_empty[sl] : &v_empty[sl]);
        continue;
      }
    }
    if constexpr (kOwnO) {
      // O's tile: once the other warpgroup's store has read it (the walk's tile j = qt - 1: warpgroup
      // 0 waits for 1's store of tile j - 1, a fresh barrier passing parity 1 at j = 0; 1 for 0's
      // of tile j); then given to the other (every thread's arrive after its own reads: thread 0
      // waited for the TMA store's).
      const uint32_t j = static_cast<uint32_t>(qt - 1);
      mbarrier_wait(&o_free[cw], cw == 0 ? (j & 1) ^ 1 : j & 1);
      hopper_attn_normalize_o<Tr, T, false, false, true, kStmatrix>(o, row_sum, row_max, 1.f, so, out_rows, p, e.b, e.h, e.sb, cw, warp, g,
                                                                  t, row0);
      fence_proxy_async_smem();  // the writes above before the TMA engine reads them
      named_barrier_sync(1 + kConsumers + cw, 128);
      if (wg_row0 < e.sb.sq)
        hopper_attn_store_o<Tr, T, true, true>(&args.o, so, out_rows, p.o_row_stride, varlen, wg_row0, e.sb.sq, e.h, e.b, cw, t128);
      mbarrier_arrive(&o_free[cw ^ 1]);
      if (n_blocks == 0) mbarrier_arrive(&q_empty[qs]);  // no Q K^T gave it back
      continue;
    }
    // The staging tile by stmatrix only in the lagging form (d 64 512 without a mask: 177.3 -> 174.5 us,
    // 0.995 -> 1.005x cuDNN; d 64 1k, two stages, fell 0.990 -> 0.962x with it: H100, 2026-11-27, 661c618).
    hopper_attn_normalize_o<Tr, T, false, kDirectO, false, kStmatrix>(o, row_sum, row_max, 1.f, sq, out_rows, p, e.b, e.h, e.sb, cw,
                                                                       warp, g, t, row0);
    if constexpr (kDirectO) {
      if (n_blocks == 0) mbarrier_arrive(&q_empty[qs]);
      continue;
    }
    fence_proxy_async_smem();  // the writes above before the TMA engine reads them
    named_barrier_sync(1 + kConsumers + cw, 128);  // (after the pingpong barriers 1 .. kConsumers)
    settle_store();  // kStoreWaitLate: a tile without keys issued no Q K^T since the last store
    const bool tma_store = !varlen && wg_row0 < e.sb.sq;  // (else the copy above, or nothing)
    if (wg_row0 < e.sb.sq)
      hopper_attn_store_o<Tr, T, kStoreWait && !kStoreWaitLate>(&args.o, sq, out_rows, p.o_row_stride, varlen, wg_row0, e.sb.sq,
                                                                 e.h, e.b, cw, t128);
    // Every thread arrives after its own reads (the TMA store's: thread 0 waits for them; with
    // kStoreWaitLate later, settle_store), so that each access to the buffer and its tile_of /
    // tile_info entries is ordered before the producer's next writes by the arrive itself (a single
    // arrive after a named barrier orders them too, but compute-sanitizer's racecheck reported the
    // tile entries' reuse as hazards).
    if (kStoreWaitLate && t128 == 0 && tma_store) store_pending = qs;
    else if (!kEarlyQProbe || n_blocks == 0) mbarrier_arrive(&q_empty[qs]);
  }
  if (!kStoreWait && t128 == 0) tma_store_wait_all<true>();  // (the probe) shared memory outlives the stores' reads
#endif
}

}  // namespace flashlab::kernels
