// Rung 4 — Hopper attention forward (FlashAttention-3 class): TMA, wgmma, warp specialization,
// pingpong between consumer warpgroups, softmax overlapped with the next block's GEMM.
//
// Changes from rung 3 (FA2: mma.sync + ldmatrix + cp.async, 4 warps per block):
//   - TMA: one producer thread copies Q (128 x d, once) and each K and V block (kBlockN x d) as
//     64-column boxes of a 4-D tensor map (head dim, rows, heads, batch) into 128B-swizzled
//     shared memory; the copy engine zero-fills rows past the end of the tensor and signals
//     the bytes on an mbarrier per buffer ("full"). K and V have their own barriers, so S = Q K^T
//     can start while V is still in flight.
//   - wgmma: S = Q K^T with both operands from shared memory (K-major descriptors), O += P V
//     with P from registers (the S accumulator layout, rounded to 16 bits, is the register
//     A-operand layout) and V from shared memory as an MN-major (transposed) B operand. A
//     consumer warpgroup owns 64 query rows: 64 x kBlockN fp32 scores and 64 x d fp32 outputs
//     in registers, no ldmatrix, no shared-memory traffic issued by the math warps.
//   - Warp specialization: warpgroup 0 is the producer (setmaxnreg.dec to 24 registers), the
//     two consumer warpgroups take the registers (setmaxnreg.inc to 240). A ring of kStages K
//     and V buffers with full/empty mbarriers lets the producer run ahead.
//   - Intra-warpgroup overlap (kOverlap): in step n a consumer issues S_n = Q K_n^T and
//     O += P_{n-1} V_{n-1} together, waits only for S_n, runs the softmax of block n while the
//     P V wgmma is still on the tensor cores, then waits for it, rescales O and converts P_n.
//     The wait can be pinned after the softmax (kPinWait, wgmma_wait_after): left alone, ptxas
//     puts it at the top of the softmax and nothing runs under the P V product. Pinned at head
//     dim 128 only, where it measured 1-2% faster; at d 64 it was 5% slower, at d 256 1%
//     (docs/ladder/attention.md).
//   - Pingpong (kPingpong): the two consumers take turns to issue their GEMMs (named barriers),
//     so one warpgroup's softmax runs under the other's GEMMs.
//   - Scheduling: one CTA per (128-row query block, head, batch) on a 1-D grid, query blocks
//     fastest (the CTAs running at once read the same few heads' K and V, from L2), from the
//     last to the first (causal: the longest first), then heads (a GQA group's query heads,
//     which share K and V, follow each other).
//   - Epilogue: O / l rounded to 16 bits into Q's shared memory (swizzled like the TMA boxes),
//     then TMA-stored (fixed lengths, clipped at seqlen_q by the copy engine) or copied out 16
//     bytes at a time with a row bound (varlen, where the next rows belong to another
//     sequence); LSE from registers.
// Masks, softcap and ALiBi as in rung 3 (kernels/attention/common.cuh): fully masked key blocks
// are never loaded, the element-wise mask runs only on blocks that straddle its boundary.
// Varlen: K/V blocks past a sequence's end hold the next sequence's rows (only the end of the
// tensor is zero-filled); they are masked, but a non-finite value there would reach P V as
// 0 x inf = NaN (rung 3 zero-fills instead; FlashAttention-3 reads them too).
// FP8 (T = __nv_fp8_e4m3, head dim 128): the same kernel with 8-bit wgmma (k32) for both GEMMs,
// V read transposed (8-bit wgmma takes K-major operands only): two warps of the producer
// warpgroup transpose each V block in shared memory as TMA lands it (ldmatrix .trans, byte
// permutes, stmatrix: hopper_attn_fp8_transpose_v), or, kFp8VtPass (the library's over more than
// 2k keys, where it is faster), by a pass before the kernel (04_hopper_fp8_v.cuh), P 256 times larger
// (kAttnFp8PShiftLog2) packed to e4m3 in registers without shuffles (convert_p), the descale factors
// folded into the scale and 1 / l, bf16 O stored from registers (twice Q's tile size), and
// optionally the rows' sums by the tensor cores (kSumByMma). The library's FP8 kernel without
// softcap / ALiBi: three consumer warpgroups, 128-key blocks, no overlap, no pingpong.
// kSplitTail (the library's FP8 kernel without a mask and causal, and head dim 64's without a mask):
// the last, partial wave of CTAs splits its tiles along the keys, each part writing O / l and its
// LSE in fp32, attn_hopper_merge_tail_kernel combining them (HopperAttnArgs).
// Paged K/V (kPaged; the paged prefill, include/flashlab/serving.h): the same kernel with the
// producer loading whole key blocks as a TMA box per page (and V k-step-major at pages of 16),
// the last block of a request by cp.async copies, zero-filled (HopperAttnArgs, below).
// Lazy rescale (kLazyRescale, 16-bit at head dims 128 and 256): O's rescale skipped while a row's
// max grows by at most 2^8 (FP8: while it does not grow; hopper_attn_softmax).
// Limits: one CTA per query block (the persistent form, 04_hopper_persistent.cuh, serves short and
// medium key sequences at d 64, 128 and 256; from 8k keys at d 128 this kernel with 176-key blocks is as
// fast as the persistent one with them); the producer loads Q per CTA; FP8 reaches 1.42x the bf16
// rate at 8k (19be153): its exponentials take as long as its GEMMs (MUFU and tensor pipe each ~55%
// busy), and three consumer warpgroups cannot overlap a block's softmax with its P V (registers);
// moving a share of the exponentials to the FMA pipe or P V in halves measured slower (d5a28f9).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/attention/paged.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"

namespace flashlab::kernels {

// kBlockN_ = 0: the default key block for the head dim (the experiments try others).
// kElemBytes_: bytes of an input element, 2 (fp16 / bf16) or 1 (FP8 e4m3).
// kConsumers_: consumer warpgroups, 2, or 3 (FlashAttention-3's 192-row tile at head dim 64: a
// third warp per scheduler hides the softmax's latencies; 7-24% faster there, H100 2026-11-26, the
// library's choice at d 64 without softcap / ALiBi; and FP8 at d 128 with 128-key blocks without
// kOverlap, the library's FP8 kernel without softcap / ALiBi). Three fit 160 registers where S, P and O do:
// d 64 with 128-key blocks, d 96 with 96, d 128 with 64 or 80 (experiments).
// kSumByMma_: the rows' sums of P by the tensor cores (hopper_attn_gemm_pv; the library's for FP8).
template <int kHeadDim_, bool kScoreMod_, int kBlockN_ = 0, int kElemBytes_ = 2, int kConsumers_ = 2, bool kSumByMma_ = false>
struct HopperAttnTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kScoreMod = kScoreMod_;
  static constexpr bool kFp8 = kElemBytes_ == 1;
  static constexpr bool kSumByMma = kSumByMma_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;  // query rows per CTA: 64 per consumer warpgroup
  // CTAs an SM holds at once: two with one consumer warpgroup (each CTA's first block and
  // epilogue run under the other CTA's block loop), else one.
  static constexpr int kCtasPerSm = kConsumers == 1 ? 2 : 1;
  // Consumer registers after setmaxnreg (producer: 24): 240 with two consumers, 160 with three,
  // 232 with one (two CTAs of 256 threads launched at 128 registers share the register file).
  static constexpr int kConsumerRegs = kConsumers == 1 ? 232 : kConsumers == 2 ? 240 : 160;
  static_assert(kConsumers <= 2 || (kConsumers == 3 && kHeadDim <= 128),
                "one or two consumer warpgroups, or three up to head dim 128");
  static_assert((24 * 128 + kConsumerRegs * 128 * kConsumers) * kCtasPerSm <= 65536, "the register file");
  // Keys per block: the S accumulator (kBlockN / 2 registers), its 16-bit copy P (kBlockN / 4)
  // and O (d / 2) share a consumer thread's 240 registers.
  // Measured (bench/experiments/attention_hopper_ablation.cu, bc97cf9, 8773645): 176 at d 128
  // 1-3.5% faster at 8k-16k keys, 1-5% slower at 2k (the launcher takes it from 8k keys on); 80
  // at d 256 3-5% faster than 64; 192 at d 64 1-5% slower.
  // FP8: 128 keys by default (the library's choice; 160-224 measured faster with two consumer
  // warpgroups from 2k keys; three hold 128 at most).
  static constexpr int kBlockN = kBlockN_ > 0 ? kBlockN_ : kFp8 ? 128 : attn_hopper_default_key_block(kHeadDim);
  static constexpr int kStages = 2;  // 3 where it fits (d <= 128) measured 3-6% slower (08ecfe9)
  static constexpr int kThreads = 128 * (kConsumers + 1);  // producer + consumer warpgroups
  static constexpr int kBoxCols = 128 / kElemBytes_;  // columns of a 128-byte (swizzle-row) TMA box
  static constexpr int kBoxes = (kHeadDim + kBoxCols - 1) / kBoxCols;  // TMA boxes per row
  static constexpr int kQBytes = kBoxes * kBlockM * 128;
  static constexpr int kKBytes = kBoxes * kBlockN * 128;  // one K block
  // One V block: like K (16-bit: wgmma reads it as an MN-major operand), or FP8 (8-bit wgmma has
  // no transposed operands) its transpose, head dims x kBlockN keys, K-major, in chunks of kVtChunk
  // keys (128, 64 or 32: the widest dividing kBlockN), each head dims x kVtChunk bytes swizzled over
  // its width (one TMA box of a 5-D map loads a block's chunks, HopperAttnArgs).
  static constexpr int kVtChunk = !kFp8 ? 0 : kBlockN % 128 == 0 ? 128 : kBlockN % 64 == 0 ? 64 : 32;
  static constexpr int kVBytes = kFp8 ? kHeadDim * kBlockN : kKBytes;
  // FP8: V as TMA loads it (kBlockN rows of 128 bytes, like K), transposed by the producer
  // warpgroup into V^T's buffer (hopper_attn_fp8_transpose_v); one per stage.
  static constexpr int kVRawBytes = kFp8 ? kKBytes : 0;
  // wgmma k-steps of 32 bytes of k (16 values of 16 bits, or 32 of 8 bits) in Q K^T and in P V.
  static constexpr int kQkSteps = kHeadDim * kElemBytes_ / 32, kPvSteps = kBlockN * kElemBytes_ / 32;
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes + kVRawBytes) + 1024;  // + alignment slack
  static_assert(kHeadDim % 32 == 0 && kHeadDim >= 64 && kHeadDim <= 256, "head dims 64, 96, 128, 192, 256");
  static_assert(!kFp8 || (kHeadDim == 128 && kBlockN % 32 == 0), "FP8: head dim 128 and key blocks of k32 steps");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "k16 steps of P V; a wgmma N and a TMA box of at most 256");
  static_assert(kSmemBytes <= 227 * 1024, "the shared memory of one block on sm_90");
  // Two CTAs an SM: 228 KB per SM, 1 KB of it reserved per CTA, plus the static barriers.
  static_assert(kCtasPerSm == 1 || kSmemBytes + 2048 <= 114 * 1024, "two CTAs' shared memory on one SM");
};

// The output element: the input's, or bf16 for FP8 inputs.
template <typename T>
using HopperAttnOut = std::conditional_t<sizeof(T) == 1, __nv_bfloat16, T>;

// Four fp32 values as e4m3 (round to nearest, saturated to +-448), a in the lowest byte.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));  // first source -> upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// FP8 P V: where key j of a 16-key group sits in the transposed V tile (and in P's register A
// fragment, see convert_p): keys 2t + c + 8h (t < 4, c, h in {0, 1}) at position 4t + 2h + c.
FLASHLAB_HD inline int attn_fp8_v_position(int j) { return (j & ~15) | (4 * ((j % 8) / 2) + 2 * ((j % 16) / 8) + j % 2); }

// FP8, V^T in the kernel (kFp8VtPass false): warp w's share (of kWarps) of one V
// block's transpose, from V as TMA loaded it (src: kBlockN keys x 128 bytes of head dims,
// 128B-swizzled) into V^T's layout (dst: chunks of head dims x 128 keys, 128B-swizzled, the keys of
// each 16-key group in attn_fp8_v_position's order; key blocks of 128 or 256),
// in units of 16 keys x 32 head dims, warp w taking head dims 32 w .. and every kWarps-th 32 after.
// In a unit, ldmatrix .trans (b16) gives lane l = 4 c + q, of each 8-key x 16-byte matrix, the bytes
// (keys 2q + {0, 1}) x (dims 2c + {0, 1}); two byte permutes join the matrices of keys 0-7 and
// 8-15 into dims 2c's and 2c + 1's 4 bytes at positions 4q .. 4q + 3, which hold keys 2q, 2q + 1,
// 2q + 8, 2q + 9: the stmatrix layout (row c, bytes 4q) of matrices whose rows are every other
// head dim. The reads are free of bank conflicts; the stores conflict 2-way (a matrix's 8 rows fall
// in 4 swizzle phases). kUnroll: key groups unrolled (registers).
template <typename Tr, int kWarps, int kUnroll>
__device__ __forceinline__ void hopper_attn_fp8_transpose_v(uint32_t src, uint32_t dst, int w, int lane) {
  constexpr int kKeyGroups = Tr::kBlockN / 16, kDimGroups = Tr::kHeadDim / 32;
  static_assert(kDimGroups % kWarps == 0, "whole head-dim groups per warp");
  static_assert(Tr::kVtChunk == 128, "V^T in chunks of 128 keys (128-byte swizzled rows)");
  const int m = lane / 8;
  // Lane l's ldmatrix row: matrix m is keys 8 (m % 2) .. + 7 of a group (key % 8 = l % 8), at V's
  // 16-byte chunk 2 dg + m / 2; its stmatrix row: matrix m is head dims 32 dg + 16 (m / 2) + m % 2
  // + 2 j (row j = l % 8), d % 8 = x below. In V^T, row d's 16-byte unit kg % 8 sits at (kg % 8) ^ x:
  // dst + 128 d has those address bits (4-6) clear (dst is 128-byte aligned), so the store address
  // is (dst + 128 d) | 16 x, XORed with 16 (kg % 8): one instruction per unit.
  const uint32_t src_lane = src + (8 * (m % 2) + lane % 8) * 128;
  const int d_lane = 16 * (m / 2) + m % 2 + 2 * (lane % 8), x = d_lane % 8;
#pragma unroll 1
  for (int dg = w; dg < kDimGroups; dg += kWarps) {
    const uint32_t src_dg = src_lane + (((2 * dg + m / 2) ^ (lane % 8)) * 16);
    const uint32_t dst_dg = (dst + (32 * dg + d_lane) * 128) | (x * 16);
#pragma unroll kUnroll
    for (int kg = 0; kg < kKeyGroups; ++kg) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, src_dg + kg * 16 * 128);
      uint32_t o[4] = {__byte_perm(r[0], r[1], 0x6420), __byte_perm(r[0], r[1], 0x7531), __byte_perm(r[2], r[3], 0x6420),
                       __byte_perm(r[2], r[3], 0x7531)};
      stmatrix_x4(o, (dst_dg ^ static_cast<uint32_t>((kg % 8) * 16)) + (kg / 8) * Tr::kHeadDim * 128);
    }
  }
}

// The block that holds a sequence's end: warp w of kWarps zeroes its head dims' bytes (as
// hopper_attn_fp8_transpose_v splits them) of V's rows from valid_keys on in src (as TMA loaded it),
// so that the transpose writes 0 for keys past the end (in a varlen batch they are the next
// sequence's, which may hold NaN; P is 0 there, and 0 x NaN is NaN).
template <typename Tr, int kWarps>
__device__ __forceinline__ void hopper_attn_fp8_zero_v_rows(uint32_t src, int w, int lane, int valid_keys) {
#pragma unroll 1
  for (int dg = w; dg < Tr::kHeadDim / 32; dg += kWarps)
#pragma unroll 1
    for (int e = lane; e < 2 * (Tr::kBlockN - valid_keys); e += 32) {
      const int row = valid_keys + e / 2, chunk = 2 * dg + e % 2;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(src + row * 128 + ((chunk ^ (row % 8)) * 16)), "r"(0) : "memory");
    }
}

// Tensor maps over (head dim, rows, heads, batch): q and o with 128- and 64-row boxes, k and v
// with kBlockN-row boxes, all 128 bytes wide. Varlen: rows are the packed rows, batch 1. FP8
// with kFp8VtPass: v is the pass's transposed copy seen as (kVtChunk keys, head dims, key chunks,
// kv heads, batch) with boxes of kVtChunk keys x d x kBlockN / kVtChunk chunks (without it, v maps
// V as it is, like k).
struct HopperAttnArgs {
  AttnFwdParams p;
  CUtensorMap q, k, v, o;
  int m_blocks;  // query blocks per (batch, head): ceil(max seqlen_q / 128)
  // Paged (kPaged): > 0: k and v map the caches as (head dim, page_size, kv heads, pages) with boxes
  // of page_box_rows rows (the page size, dividing kBlockN, or kBlockN, dividing the page size),
  // and whole key blocks come by TMA; 0: every block by cp.async copies.
  int page_box_rows;
  // Paged with pages of 16 keys (one k-step of P V each): V's tile stored k-step-major, (key step,
  // column box, 16 rows, 128 bytes), so one 3-D box (64 columns x 16 rows x column boxes) of a
  // 5-D map (columns, page rows, column boxes, kv heads, pages) loads a page's V (kBoxes boxes -> 1).
  int v_step_major;
  // kSplitTail: the tiles from split_from on (the last, partial wave of CTAs) split their keys into
  // `splits` parts, one CTA each (CTA split_from + splits x (tile - split_from) + part); a part
  // writes O / l (fp32, its rows of kBlockM, head dim columns) to part_o and its LSE (log2 units)
  // to part_lse, both indexed by the CTA's unit (blockIdx - split_from), and
  // attn_hopper_merge_tail_kernel combines them into o and lse.
  int split_from, splits;
  float* part_o;
  float* part_lse;
  // The walk (the persistent kernel's, or the one-CTA kernel's grid; hopper_attn_walk_tile): its last
  // tail_heads (batch, head) pairs in rounds of one query block each, from the last block down; 0: the
  // grid's order throughout.
  int tail_heads;
};

// Tile `tile` of the grid (attn_hopper_kernel's order: query blocks fastest, from the last one
// down, then heads, then batches): its head h, batch b and query block mb.
struct HopperAttnTile {
  int h, b, mb;
};
__device__ __forceinline__ HopperAttnTile hopper_attn_tile(int tile, int m_blocks, int nheads) {
  const int hb = static_cast<int>(static_cast<unsigned>(tile) / static_cast<unsigned>(m_blocks));
  return {hb % nheads, hb / nheads, m_blocks - 1 - static_cast<int>(static_cast<unsigned>(tile) % static_cast<unsigned>(m_blocks))};
}

// Tile `tile` of a walk over `pairs` (batch, head) pairs (the persistent kernel's tiles in the order it
// draws them, the one-CTA kernel's CTAs): the grid's order (hopper_attn_tile), but the last
// tail_heads pairs' tiles come in rounds of one query block each,
// from the last block down, every pair of the tail in turn: with a mask whose rows see more keys the
// later they lie (causal), a pair's tiles shorten as its query block falls, so the walk ends with
// the tail's shortest tiles rather than with one pair's longest, which would leave the other SMs idle.
__device__ __forceinline__ HopperAttnTile hopper_attn_walk_tile(int tile, int m_blocks, int nheads, int pairs, int tail_heads) {
  const int tail_from = (pairs - tail_heads) * m_blocks;  // the tail's first tile
  if (tail_heads <= 0 || tile < tail_from) return hopper_attn_tile(tile, m_blocks, nheads);
  const unsigned r = static_cast<unsigned>(tile - tail_from), g = static_cast<unsigned>(tail_heads);
  const int hb = pairs - tail_heads + static_cast<int>(r % g);
  return {hb % nheads, hb / nheads, m_blocks - 1 - static_cast<int>(r / g)};
}

// Byte offset of element (row, col) of a k-step-major V tile (HopperAttnArgs::v_step_major): 16
// rows per step, kBoxes 64-column boxes of 2048 bytes each per step, 128B-swizzled.
template <int kBoxes>
__device__ __forceinline__ uint32_t hopper_attn_step_swizzle(int row, int col) {
  const int chunk = (col % 64) / 8;
  return static_cast<uint32_t>(((row / 16) * kBoxes + col / 64) * 2048 + (row % 16) * 128 + ((chunk ^ (row % 8)) * 16) +
                               (col % 8) * 2);
}

// Byte offset of element (row, col) in a tile stored as 64-column, 128B-swizzled boxes of
// `rows` rows: the 16-byte chunk index within a 128-byte row is XORed with row % 8.
__device__ __forceinline__ uint32_t hopper_attn_swizzle(int row, int col, int rows) {
  const int box = col / 64, chunk = (col % 64) / 8;
  return static_cast<uint32_t>(box * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2);
}

// A rung-4 consumer warpgroup's work on one key block, shared by attn_hopper_kernel and the
// persistent kernel (04_hopper_persistent.cuh). Tr: HopperAttnTraits; T: the input element.

// S = Q K^T into s (both operands K-major in shared memory: q_base, this warpgroup's 64 rows of
// Q's boxes; k_base, the K block), one committed wgmma group. kDescAdvance: each k-step's
// descriptors are the first ones advanced (wgmma_desc_advance); else rebuilt from the address
// (the rung until 2026-11-26: about 60 more instructions per block, kept for the ablation).
// (Always the whole block: an m64n(kBlockN / 2) product into the first half of s, for the
// persistent kernel's kHalfLast, made ptxas serialize every wgmma of the kernel, a wait after each,
// 14-21% slower at d 64; H100, 2026-11-27, 0504845.)
template <typename T, typename Tr, bool kDescAdvance = true>
__device__ __forceinline__ void hopper_attn_gemm_qk(float (&s)[Tr::kBlockN / 2], uint32_t q_base, uint32_t k_base) {
  const uint64_t da0 = wgmma_desc_sw128(q_base, 16, 1024), db0 = wgmma_desc_sw128(k_base, 16, 1024);
  wgmma_fence_operands(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kQkSteps; ++kk) {
    // K-major operands: the next k-step is 32 bytes further along the 128-byte rows of a box.
    const uint32_t a_off = (kk / 4) * Tr::kBlockM * 128 + (kk % 4) * 32, b_off = (kk / 4) * Tr::kBlockN * 128 + (kk % 4) * 32;
    const uint64_t da = kDescAdvance ? wgmma_desc_advance(da0, a_off) : wgmma_desc_sw128(q_base + a_off, 16, 1024);
    const uint64_t db = kDescAdvance ? wgmma_desc_advance(db0, b_off) : wgmma_desc_sw128(k_base + b_off, 16, 1024);
    Wgmma<T, Tr::kBlockN>::template mma<0, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// O += P V, P from registers (pa), V at v_base: k-steps v_step_bytes apart, 64-column boxes (LBO)
// v_lbo apart; one committed wgmma group. kDescAdvance: as hopper_attn_gemm_qk.
// Tr::kSumByMma: in the same group, lsum = P x ones (an m64n8k32 wgmma per k-step against an
// 8-row tile of e4m3 ones at ones_base, hopper_attn_fill_ones; 16-bit: m64n8k16, ones of T): each
// row's sum of this block's P as rounded to T (FP8 shifted: kAttnFp8PShiftLog2), replacing the
// softmax's kBlockN / 2 FADDs per thread. (Eight more columns of O against rows of ones after V^T's chunks measured the same.)
// kKeys < kBlockN (16-bit): the block's first kKeys keys only (P's first kKeys / 16 k-steps; the
// persistent kernel's part blocks, kHalfLast).
template <typename T, typename Tr, bool kDescAdvance = true, int kKeys = Tr::kBlockN>
__device__ __forceinline__ void hopper_attn_gemm_pv(float (&o)[Tr::kHeadDim / 2], uint32_t (&pa)[Tr::kPvSteps][4],
                                                    uint32_t v_base, uint32_t v_step_bytes, uint32_t v_lbo,
                                                    float* lsum = nullptr, uint32_t ones_base = 0) {
  // FP8: V^T is K-major (keys contiguous): the next 32 keys are 32 bytes further along each row
  // of a chunk of kVtChunk keys, chunks head dims x kVtChunk bytes apart (8 rows: SBO).
  // 16-bit: V is MN-major for this GEMM (head dims contiguous): 16 more keys are 16 rows of 128
  // bytes further (v_step_bytes); 64-column boxes (LBO) are v_lbo apart.
  static_assert(kKeys == Tr::kBlockN || (!Tr::kFp8 && kKeys % 16 == 0), "a part of the block: 16-bit k16 steps");
  constexpr int kSteps = kKeys * (Tr::kFp8 ? 1 : 2) / 32;
  constexpr uint32_t kChunk = Tr::kFp8 ? Tr::kVtChunk : 128;
  const uint64_t db0 = Tr::kFp8 ? wgmma_desc_swizzled(v_base, 16, 8 * kChunk, kChunk) : wgmma_desc_sw128(v_base, v_lbo, 1024);
  wgmma_fence_operands(o);
  wgmma_fence_operands(pa);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint32_t off = Tr::kFp8 ? (kk * 32 / kChunk) * Tr::kHeadDim * kChunk + kk * 32 % kChunk : kk * v_step_bytes;
    const uint64_t db = kDescAdvance ? wgmma_desc_advance(db0, off)
                      : Tr::kFp8     ? wgmma_desc_swizzled(v_base + off, 16, 8 * kChunk, kChunk)
                                     : wgmma_desc_sw128(v_base + off, v_lbo, 1024);
    if constexpr (Tr::kFp8) WgmmaRs<T, Tr::kHeadDim>::template mma<0>(o, pa[kk], db, 1);
    else WgmmaRs<T, Tr::kHeadDim>::template mma<1>(o, pa[kk], db, 1);
  }
  if constexpr (Tr::kSumByMma) {
    float(&l)[4] = *reinterpret_cast<float(*)[4]>(lsum);
    wgmma_fence_operands(l);
    const uint64_t d1 = wgmma_desc_swizzled(ones_base, 16, 256, 32);  // 8 rows x 32 bytes: every k-step the same
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) WgmmaRs<T, 8>::template mma<0>(l, pa[kk], d1, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// The online softmax of block n: s becomes 2^(logit - max) in log2 units, rescale[r] the factor
// for O and l of row r. Plain scores stay raw dot products until the exponent, where one FFMA
// applies scale log2(e) and subtracts the max (the max of raw scores scaled is the scaled max:
// scale > 0); softcap / ALiBi (kScoreMod) turn s into log2-unit logits first. The mask is a
// separate pass, taken only by blocks that straddle its boundary or the sequence end.
// Thread coordinates: rows row0, row0 + 8 (its warpgroup's from wg_row0), key columns 2t, 2t + 1
// of each n8 tile; seqlen_k: the sequence's keys.
//
// kLazyRescale: the max that the exponents subtract (row_max) moves only when a block's max exceeds
// it by more than kAttnLazyRescaleLog2 (as FlashAttention-4 does); else it stays, P's entries reach
// up to 2^kAttnLazyRescaleLog2, and the factor for O and l is exactly 1 (hopper_attn_rescale_o then
// skips O's multiplications). The result is the same softmax (O / l and the LSE use the same
// max), rounded differently.
// FP8 (Tr::kFp8) uses a margin of 0: the max moves whenever it grows, as without kLazyRescale (the
// same P, the same rounding), and only O's multiplications by 1 are skipped.
// With the margin of 8 a row's largest P, exactly 1 in e4m3 under the eager max, is rounded (up to
// 2^-4 relative) while l sums the unrounded values, and a peaked row's output moved by that much
// (tests/python/test_attention.py::test_fp8 failed with it).
constexpr float kAttnLazyRescaleLog2 = 8.f;  // P <= 256: within fp16's and bf16's range
// FP8: the softmax's P is 2^kAttnFp8PShiftLog2 = 256 times larger (P in [0, 256], below e4m3's 448),
// as FlashAttention-3 does: e4m3 keeps 3 mantissa bits only from 2^-6 on, and the small entries of
// P rounded there (to 2^-9 steps below, to 0 under 2^-10) lose most of their value, the more so the
// flatter the row. The shift moves that floor 256 times lower. O and l grow alike (O / l unchanged);
// the LSE subtracts the shift. Needed for the rows' sums of the rounded P (kSumByMma): a float64
// emulation of test_fp8's inputs (1000 keys) puts O / l with l = sum of the e4m3-rounded P at 0.435
// max error unshifted (the naive rounding's error: 0.064; the GPU measured 0.456), 0.049 shifted.
constexpr float kAttnFp8PShiftLog2 = 8.f;
// Where it is the default: 16-bit inputs at head dims 128 and 256, where it measured faster
// (bench/experiments/attention_hopper_ablation.cu, H100, 2026-11-26: d 256 +2-3%, the d 128 persistent
// kernel +1-3.5%, the d 128 one-CTA kernel within 1%), and FP8. Not at d 64 (0.7-3% slower with three
// consumer warpgroups, 3-8% in the persistent kernel). Head dims 96 and 192 unmeasured: off.
template <typename T, int kHeadDim>
constexpr bool kAttnLazyRescaleDefault = kHeadDim == 128 || (sizeof(T) == 2 && kHeadDim == 256);

// kTreeReduce: a row's max and sum over this thread's scores of the block folded as a balanced
// tree (log2(kBlockN / 4) dependent steps; FMNMX / FADD have ~4 cycles of latency) rather than one
// running value (kBlockN / 4 dependent steps). Same instructions; with 2-3 warps per scheduler the
// softmax's dependency chains are what it waits on (Nsight Compute, d 64 2k and FP8 8k: "wait" the
// largest stall reason, the tensor pipe and MUFU both about half busy). The sum rounds in another
// order. The tree keeps more values live at once: where registers are tight it measured slower.
// Default (kAttnTreeReduceDefault; bench/experiments/attention_hopper_ablation.cu --tree, H100,
// 2026-11-26, 17d4575): on at d 64 (three consumers +2.3% / +3.8% at 2k / 8k keys, the persistent
// kernels +0.2..+2.3%), off at d 128 (one-CTA within 0.3%, 176-key blocks and the persistent kernel
// 0.3-2.5% slower), FP8 (4-10% slower) and d 256 (within 1%); d 96 and 192 unmeasured: off.
template <typename T, int kHeadDim>
constexpr bool kAttnTreeReduceDefault = sizeof(T) == 2 && kHeadDim == 64;

// x folded with op as a balanced tree (kTreeReduce).
template <int kN, typename Op>
__device__ __forceinline__ float hopper_attn_tree(const float (&x)[kN], Op op) {
  if constexpr (kN == 1) {
    return x[0];
  } else {
    constexpr int kHalf = (kN + 1) / 2;
    float y[kHalf];
#pragma unroll
    for (int j = 0; j < kHalf; ++j) y[j] = j + kHalf < kN ? op(x[j], x[j + kHalf]) : x[j];
    return hopper_attn_tree(y, op);
  }
}

// The softmax's first half: scores modified and masked, each row's new max (row_max), the offset
// its exponents subtract (off, log2 units) and the factor for O and l (rescale). kNoMask: the
// caller knows no block needs a mask (no causal / window, keys a multiple of kBlockN): no mask
// test, no mask pass in the code. kKeys < kBlockN: the block's first kKeys keys only (s[0 ..
// kKeys / 2); the persistent kernel's part blocks, kHalfLast).
template <typename Tr, bool kLazyRescale = false, bool kTreeReduce = false, bool kNoMask = false, int kKeys = Tr::kBlockN>
__device__ __forceinline__ void hopper_attn_softmax_max(float (&s)[Tr::kBlockN / 2], float (&row_max)[2], float (&off)[2],
                                                        float (&rescale)[2], int n, const AttnScoreMod& mod, int seqlen_k,
                                                        int wg_row0, int row0, int t, float scale_log2, float slope_log2) {
  const int k0 = n * Tr::kBlockN;
  if constexpr (Tr::kScoreMod) {
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = row0 + (e / 2) * 8, key = k0 + j * 8 + 2 * t + (e % 2);
        s[4 * j + e] = attn_logit_log2(s[4 * j + e], i, key, mod, scale_log2, slope_log2);
      }
  }
  const bool need_mask = k0 + kKeys > seqlen_k ||
                         (mod.window_left >= 0 && k0 < wg_row0 + 63 + mod.diag - mod.window_left) ||
                         (mod.window_right >= 0 && k0 + kKeys - 1 > wg_row0 + mod.diag + mod.window_right);
  if (!kNoMask && need_mask) {
    // Row i keeps keys [lo, hi] (attn_visible, clipped to the sequence), as offsets from this
    // thread's first key k0 + 2t: each score is two integer compares with a constant and a select.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int d = row0 + 8 * r + mod.diag, base = k0 + 2 * t;
      const int hi = min(seqlen_k - 1, mod.window_right >= 0 ? d + mod.window_right : INT_MAX) - base;
      const int lo = (mod.window_left >= 0 ? d - mod.window_left : INT_MIN / 2) - base;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = j * 8 + c;
          s[4 * j + 2 * r + c] = col >= lo && col <= hi ? s[4 * j + 2 * r + c] : -INFINITY;
        }
    }
  }
  const float to_log2 = Tr::kScoreMod ? 1.f : scale_log2;  // s x to_log2: log2-unit logits
  constexpr int kGroups = kKeys / 8;  // n8 tiles: two scores of each row per thread
  const auto fmax2 = [](float a, float b) { return fmaxf(a, b); };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
    if constexpr (kTreeReduce) {
      float part[kGroups];
#pragma unroll
      for (int j = 0; j < kGroups; ++j) part[j] = fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
      mx = hopper_attn_tree(part, fmax2);
    } else {
#pragma unroll
      for (int j = 0; j < kGroups; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(row_max[r], mx * to_log2);
    // kLazyRescale: keep the old max unless this block's exceeds it by more than the margin (a
    // row's first visible block always moves it: -inf + margin = -inf).
    const bool moves = !kLazyRescale || mx > row_max[r] + (Tr::kFp8 ? 0.f : kAttnLazyRescaleLog2);
    if (!moves) mx = row_max[r];
    // A row with every key so far masked keeps max -inf: offset 0 gives 2^(-inf) = 0, not NaN.
    // FP8: P is 2^kAttnFp8PShiftLog2 times larger (kAttnFp8PShiftLog2's comment).
    const float base = mx == -INFINITY ? 0.f : mx;
    off[r] = Tr::kFp8 ? base - kAttnFp8PShiftLog2 : base;
    rescale[r] = moves ? exp2_approx_ftz(row_max[r] - base) : 1.f;
    row_max[r] = mx;
  }
}

// The softmax's second half: s = 2^(s x to_log2 - off) and, unless Tr::kSumByMma, the rows' sums
// into row_sum (rescaled first).
template <typename Tr, bool kTreeReduce = false, int kKeys = Tr::kBlockN>
__device__ __forceinline__ void hopper_attn_softmax_exp(float (&s)[Tr::kBlockN / 2], float (&row_sum)[2], const float (&off)[2],
                                                        const float (&rescale)[2], float scale_log2) {
  const float to_log2 = Tr::kScoreMod ? 1.f : scale_log2;
  constexpr int kGroups = kKeys / 8;
  const auto add2 = [](float a, float b) { return a + b; };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = 0.f, part[kGroups];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      s[4 * j + 2 * r] = exp2_approx_ftz(fmaf(s[4 * j + 2 * r], to_log2, -off[r]));
      s[4 * j + 2 * r + 1] = exp2_approx_ftz(fmaf(s[4 * j + 2 * r + 1], to_log2, -off[r]));
      if constexpr (Tr::kSumByMma) continue;  // the block's sums come with P V (hopper_attn_gemm_pv)
      if constexpr (kTreeReduce) part[j] = s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      else sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    if constexpr (kTreeReduce && !Tr::kSumByMma) sum = hopper_attn_tree(part, add2);
    row_sum[r] = row_sum[r] * rescale[r] + sum;
  }
}

// The online softmax of block n: hopper_attn_softmax_max, then _exp.
template <typename Tr, bool kLazyRescale = false, bool kTreeReduce = false, bool kNoMask = false, int kKeys = Tr::kBlockN>
__device__ __forceinline__ void hopper_attn_softmax(float (&s)[Tr::kBlockN / 2], float (&row_max)[2], float (&row_sum)[2],
                                                    float (&rescale)[2], int n, const AttnScoreMod& mod, int seqlen_k,
                                                    int wg_row0, int row0, int t, float scale_log2, float slope_log2) {
  float off[2];
  hopper_attn_softmax_max<Tr, kLazyRescale, kTreeReduce, kNoMask, kKeys>(s, row_max, off, rescale, n, mod, seqlen_k, wg_row0, row0, t,
                                                                         scale_log2, slope_log2);
  hopper_attn_softmax_exp<Tr, kTreeReduce, kKeys>(s, row_sum, off, rescale, scale_log2);
}

// The named barrier on which consumer warpgroup cw lets the next one (cyclically) take its
// pingpong turn: barrier 1 + c is warpgroup c's (written 2 - cw for two).
template <int kConsumers>
__device__ __forceinline__ int hopper_attn_next_turn_barrier(int cw) {
  return kConsumers == 2 ? 2 - cw : 1 + (cw + 1) % kConsumers;
}

// Tr::kSumByMma: the row sums of the P V just waited for (lsum, hopper_attn_gemm_pv) into row_sum,
// times factor (the rescale of the blocks since, which the softmax has applied to row_sum already).
template <typename Tr>
__device__ __forceinline__ void hopper_attn_add_sums(float (&row_sum)[2], float (&lsum)[4], const float (&factor)[2]) {
  if constexpr (Tr::kSumByMma) {
    wgmma_fence_operands(lsum);
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = fmaf(lsum[2 * r], factor[r], row_sum[r]);
  }
}

// O's rows scaled by the softmax's rescale factors. kLazyRescale: skipped by the whole warp when
// every factor of its rows is 1 (hopper_attn_softmax).
template <typename Tr, bool kLazyRescale = false>
__device__ __forceinline__ void hopper_attn_rescale_o(float (&o)[Tr::kHeadDim / 2], const float (&rescale)[2]) {
  if constexpr (kLazyRescale)
    if (!__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < Tr::kHeadDim / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= rescale[e / 2];
}

// P's A fragments. 16-bit: columns 16 kk .. 16 kk + 15 are the accumulator's n8 tiles 2 kk and
// 2 kk + 1. FP8: a register holds 4 consecutive k of one row, k 4t .. 4t + 3 (t = lane % 4), but
// the thread's scores of a 16-key group are keys 2t, 2t + 1, 2t + 8, 2t + 9: it packs those,
// and the transposed V tile holds its keys in the same order (attn_fp8_v_position), so P V
// pairs each probability with its key's row of V without moving bytes between threads.
// kKeys < kBlockN (16-bit): the block's first kKeys keys only.
template <typename T, typename Tr, int kKeys = Tr::kBlockN>
__device__ __forceinline__ void hopper_attn_convert_p(const float (&s)[Tr::kBlockN / 2], uint32_t (&pa)[Tr::kPvSteps][4]) {
  static_assert(kKeys == Tr::kBlockN || !Tr::kFp8, "a part of the block: 16-bit");
#pragma unroll
  for (int kk = 0; kk < kKeys * (Tr::kFp8 ? 1 : 2) / 32; ++kk) {
    if constexpr (Tr::kFp8) {
      const float* x = s + 16 * kk;  // keys 32 kk .. 32 kk + 31: n8 tiles 4 kk .. 4 kk + 3
      pa[kk][0] = pack4_e4m3(x[0], x[1], x[4], x[5]);     // row g,     keys 0 .. 15 of the step
      pa[kk][1] = pack4_e4m3(x[2], x[3], x[6], x[7]);     // row g + 8
      pa[kk][2] = pack4_e4m3(x[8], x[9], x[12], x[13]);   // row g,     keys 16 .. 31
      pa[kk][3] = pack4_e4m3(x[10], x[11], x[14], x[15]); // row g + 8
    } else {
      pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
}

// The epilogue, first half: l over the row's 4 threads, O / l (times o_scale: FP8's V descale)
// rounded to To into this warpgroup's rows of the staging tile sq (swizzled like a TMA box; the
// warpgroup's own wgmmas, the only readers of those rows, have completed) or, FP8 (a bf16 O is
// twice Q's tile), straight to out_rows; LSE from registers. kLseRowStride: attn_lse_offset's.
// Thread coordinates as hopper_attn_softmax, plus cw, warp, g (its warpgroup, warp, lane / 4).
// Row r's l (row_sum over the row's 4 threads; kSumByMma: each thread holds the whole sum).
template <typename Tr>
__device__ __forceinline__ float hopper_attn_row_l(float row_sum) {
  if constexpr (!Tr::kSumByMma) {
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
  }
  return row_sum;
}

// Row r's LSE in log2 units from its max (log2 units) and l: -inf for a row that saw no key (l = 0);
// FP8 subtracts P's shift (kAttnFp8PShiftLog2).
template <typename Tr>
__device__ __forceinline__ float hopper_attn_lse_log2(float row_max, float l) {
  // __log2f: one MUFU.LG2 (absolute error 2^-22 for l in [0.5, 2], 2 ulp elsewhere) where
  // log2f's exact sequence (range reduction, a polynomial) is on the epilogue's path.
  return l > 0.f ? row_max + __log2f(l) - (Tr::kFp8 ? kAttnFp8PShiftLog2 : 0.f) : -INFINITY;
}

// A split CTA's epilogue (kSplitTail): O / l times o_scale in fp32 and the LSE in log2 units
// (-inf for a row that saw no key) of its rows to its unit's part_o / part_lse rows.
template <typename Tr>
__device__ __forceinline__ void hopper_attn_store_part(const float (&o)[Tr::kHeadDim / 2], const float (&row_sum)[2],
                                                       const float (&row_max)[2], float o_scale, float* part_o,
                                                       float* part_lse, int unit, int cw, int warp, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = hopper_attn_row_l<Tr>(row_sum[r]);
    const float inv = l > 0.f ? o_scale / l : 0.f;
    const int64_t row = static_cast<int64_t>(unit) * Tr::kBlockM + 64 * cw + warp * 16 + g + 8 * r;
#pragma unroll
    for (int j = 0; j < Tr::kHeadDim / 8; ++j)
      *reinterpret_cast<float2*>(part_o + row * Tr::kHeadDim + 8 * j + 2 * t) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    if (t == 0) part_lse[row] = hopper_attn_lse_log2<Tr>(row_max[r], l);
  }
}

// kDirectStore (16-bit; FP8 always): O's rows straight from registers to out_rows (rows past sb.sq
// skipped) instead of into the staging tile sq. kOwnStage: sq is this warpgroup's own staging tile
// of 64 rows (boxes 64 rows apart) instead of the CTA's tile of kBlockM. kStmatrix: the staging
// tile written by stmatrix (below) rather than by 4-byte stores: the one-CTA kernel's (d 256 2k
// 378.3 -> 366.8 us, against cuDNN 1.046 -> 1.078x; d 64 2k 1.029 -> 1.043x) and the persistent
// kernel's lagging form (d 64 512); in its other forms d 64 1k fell from 0.990 to 0.962x cuDNN
// (H100, 2026-11-27, 661c618; docs/ladder/attention.md).
template <typename Tr, typename To, bool kLseRowStride = false, bool kDirectStore = false, bool kOwnStage = false,
          bool kStmatrix = false>
__device__ __forceinline__ void hopper_attn_normalize_o(const float (&o)[Tr::kHeadDim / 2], const float (&row_sum)[2],
                                                        const float (&row_max)[2], float o_scale, unsigned char* sq,
                                                        To* out_rows, const AttnFwdParams& p, int b, int h,
                                                        const AttnBatch& sb, int cw, int warp, int g, int t, int row0) {
  float ls[2];
  // A row that saw no key: O = 0. __fdividef: MUFU.RCP and a multiply (2 ulp; l is a sum of at most
  // 2^margin-scaled exponentials a key, far below 2^126), where IEEE division adds a Newton step, a
  // range test and a branch to a slow path on the epilogue's path.
  const auto inv_of = [o_scale](float l) { return l > 0.f ? __fdividef(o_scale, l) : 0.f; };
  if constexpr (Tr::kFp8 || kDirectStore || !kStmatrix) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = ls[r] = hopper_attn_row_l<Tr>(row_sum[r]);
      const float inv = inv_of(l);
      const int row = (kOwnStage ? 0 : 64 * cw) + warp * 16 + g + 8 * r;  // in the staging tile
      const int i = row0 + 8 * r;
#pragma unroll
      for (int j = 0; j < Tr::kHeadDim / 8; ++j) {
        const uint32_t pair = pack2<To>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if constexpr (Tr::kFp8 || kDirectStore) {
          if (i < sb.sq) *reinterpret_cast<uint32_t*>(out_rows + static_cast<int64_t>(i) * p.o_row_stride + 8 * j + 2 * t) = pair;
        } else {
          *reinterpret_cast<uint32_t*>(sq + hopper_attn_swizzle(row, 8 * j + 2 * t, kOwnStage ? 64 : Tr::kBlockM)) = pair;
        }
      }
    }
  } else {
    // By stmatrix: the accumulator's pairs (row g + 8 r, columns 8 j + 2 t) are, for each r and j,
    // an 8 x 8 matrix in stmatrix's layout, so one .x4 stores the warp's 16 rows x 16 columns
    // (matrix k: rows + 8 (k % 2), columns 8 (2 jp + k / 2)) where 4-byte stores took 8 and an
    // address each. Lane l gives row 8 (q % 2) + l % 8 of matrix q = l / 8; a matrix row is one
    // 16-byte chunk, at chunk c ^ (row % 8) of its 128-byte row. The lane's row address has bits
    // 4-6 clear (the tile is 1024-byte aligned), so each store's address is it ORed with the
    // lane's part of the XOR (16 ((q / 2) ^ (l % 8))), XORed with 16 (2 jp % 8), plus the box.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) inv[r] = inv_of(ls[r] = hopper_attn_row_l<Tr>(row_sum[r]));
    constexpr int kRows = kOwnStage ? 64 : Tr::kBlockM;
    const int lane = 4 * g + t, q = lane / 8, m = lane % 8;
    const int row = (kOwnStage ? 0 : 64 * cw) + warp * 16 + 8 * (q % 2) + m;  // in the staging tile
    const uint32_t lane_addr = (smem_u32(sq) + row * 128) | static_cast<uint32_t>(((q / 2) ^ m) * 16);
#pragma unroll
    for (int jp = 0; jp < Tr::kHeadDim / 16; ++jp) {
      uint32_t r4[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int j = 2 * jp + k / 2, r = k % 2;
        r4[k] = pack2<To>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      }
      stmatrix_x4(r4, (lane_addr ^ static_cast<uint32_t>((2 * jp % 8) * 16)) + (2 * jp / 8) * kRows * 128);
    }
  }
  // The LSEs (natural log) of the quad's two rows: lane t = r stores row g + 8 r, so that the warp
  // issues one logarithm, one offset and one store instead of lane 0's two of each (every lane
  // issues every instruction; with two, the LSE cost 7-10% of the kernel at head dim 64, 512 keys:
  // Nsight Compute, H100, 2026-11-27).
  if (p.lse != nullptr && t < 2) {
    const int i = row0 + 8 * t;
    if (i < sb.sq)
      p.lse[attn_lse_offset<kLseRowStride>(p, b, h, sb, i)] =
          hopper_attn_lse_log2<Tr>(t == 0 ? row_max[0] : row_max[1], t == 0 ? ls[0] : ls[1]) * 0.6931471805599453f;
  }
}

// The epilogue, second half (16-bit): this warpgroup's 64 rows of the staging tile out, from
// query row wg_row0 of (head h, batch b): by TMA store (fixed lengths, clipped at seqlen_q by the
// copy engine; thread 0 of the warpgroup waits until the copy has read the tile) or, varlen, row
// by row, 16 bytes at a time, up to the sequence's sq rows (the rows past it belong to the next
// sequence). t128: the thread's index in its warpgroup.
// kStoreWait false: no wait (the persistent kernel's kStoreWaitLate waits later; or a timing probe of
// it, wrong output). kOwnStage: sq is
// this warpgroup's own 64-row staging tile (hopper_attn_normalize_o).
template <typename Tr, typename T, bool kStoreWait = true, bool kOwnStage = false>
__device__ __forceinline__ void hopper_attn_store_o(const CUtensorMap* o_map, const unsigned char* sq, T* out_rows,
                                                    int64_t o_row_stride, bool varlen, int wg_row0, int sq_rows, int h,
                                                    int b, int cw, int t128) {
  if (!varlen) {
    if (t128 == 0) {
#pragma unroll
      for (int x = 0; x < Tr::kBoxes; ++x)
        tma_store_4d(o_map, sq + (kOwnStage ? x * 64 * 128 : x * Tr::kBlockM * 128 + cw * 64 * 128), x * 64, wg_row0, h, b);
      tma_store_commit();
      if constexpr (kStoreWait) tma_store_wait_all<true>();  // shared memory must outlive the copy's reads
    }
  } else {
    constexpr int kChunks = Tr::kHeadDim / 8;
    for (int e = t128; e < 64 * kChunks; e += 128) {
      const int r = e / kChunks, c = e % kChunks;
      const int i = wg_row0 + r;
      if (i >= sq_rows) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(
          sq + (kOwnStage ? hopper_attn_swizzle(r, 8 * c, 64) : hopper_attn_swizzle(64 * cw + r, 8 * c, Tr::kBlockM)));
      *reinterpret_cast<uint4*>(out_rows + static_cast<int64_t>(i) * o_row_stride + 8 * c) = v;
    }
  }
}

// kSumByMma: the 8 x 32-byte tile of T's ones (e4m3 1.0 = 0x38 in every byte, bf16 0x3f80 and fp16
// 0x3c00 in every 2 bytes, so no swizzle matters) that hopper_attn_gemm_pv's row-sum wgmmas read,
// written by the CTA before its first barrier; a proxy fence: the async proxy (wgmma) reads it.
template <typename T>
__device__ __forceinline__ void hopper_attn_fill_ones(uint32_t (&ones)[64]) {
  constexpr uint32_t kOnes = sizeof(T) == 1 ? 0x38383838u : std::is_same_v<T, __nv_bfloat16> ? 0x3f803f80u : 0x3c003c00u;
  if (threadIdx.x < 64) ones[threadIdx.x] = kOnes;
  fence_proxy_async_smem();
}

// kPaged: K and V from a paged cache (p.kv_indptr). Blocks whose keys all lie in the request come
// by TMA, a box per page (args.page_box_rows); a request's last block (whose last page's tail, and
// pages past its end, hold stale values: NaN there would meet P = 0 in P V) and page sizes TMA
// cannot tile come by the producer warpgroup's cp.async copies (PagedRowCopy,
// kernels/attention/paged.cuh), keys past the end zero-filled, into the same swizzled layout.
// kPinWait, kDescAdvance, kRescaleUnderQk: instruction-order choices (the P V wait after the
// softmax; descriptors by addition; O rescaled under the next Q K^T), defaults as measured,
// switched by bench/experiments/attention_hopper_ablation.cu. kConsumers: HopperAttnTraits.
// kLazyRescale, kTreeReduce: hopper_attn_softmax.
// kSpecialized false (an ablation, bench/experiments/attention_hopper_ablation.cu; 16-bit, not
// paged, kOverlap): no producer warpgroup. The consumers' first thread issues the TMA loads
// between its own block steps: K of block i + 1 after S_i's product, V of block i after P_{i-1}
// V_{i-1}'s, each after the wait for its stage's release by every consumer warp; the consumers
// keep the launch's register share (no setmaxnreg).
// kSplitTail: the CTAs from args.split_from on are parts of the last tiles (HopperAttnArgs).
// kNoMask (fixed lengths, no causal / window, seqlen_k a multiple of kBlockN, no softcap / ALiBi,
// not paged: the launcher's check): no mask test or pass in the softmax, no varlen epilogue.
// FP8: the producer warpgroup's warps 1 and 2 transpose each V block that TMA loads (args.v maps V as
// it is) into the buffer P V reads (hopper_attn_fp8_transpose_v); kFp8VtPass (the library's over
// more than 2k keys, src/attention_hopper_dispatch.h): V^T from a pass before the kernel
// (04_hopper_fp8_v.cuh), loaded by TMA (args.v maps it).
// kCluster 2 (16-bit, not paged, a producer warpgroup, no split tail; launched in clusters of two
// CTAs on adjacent query blocks of one (batch, head) that walk the same key blocks: the launcher's
// check): each K and V block is loaded once for the pair, each CTA's producer issuing half of its
// 64-column boxes multicast into both CTAs' shared memory (at the same offsets, completing on both
// CTAs' "full" barriers); a stage is free again once the consumer warps of both CTAs have released
// it (each arrives on its own CTA's "empty" barrier and on the peer's). Measured 3-6% slower than
// the same kernel alone at d 128 and 256 (H200, 2026-11-29, 750a7ed; docs/ladder/attention.md): an
// ablation switch, not the library's.
template <typename T, int kHeadDim, bool kScoreMod, bool kPingpong, bool kOverlap, int kBlockNArg = 0, bool kPaged = false,
          bool kPinWait = (kHeadDim == 128), bool kDescAdvance = true, bool kRescaleUnderQk = false, int kConsumers = 2,
          bool kLazyRescale = kAttnLazyRescaleDefault<T, kHeadDim>, bool kTreeReduce = kAttnTreeReduceDefault<T, kHeadDim>,
          bool kSpecialized = true, bool kSumByMma = false, bool kSplitTail = false, bool kFp8VtPass = false, bool kNoMask = false,
          int kCluster = 1>
__global__ void __launch_bounds__(128 * (kConsumers + (kSpecialized ? 1 : 0)), kConsumers == 1 ? 2 : 1)
    attn_hopper_kernel(const __grid_constant__ HopperAttnArgs args) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma, TMA and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  using Tr = HopperAttnTraits<kHeadDim, kScoreMod, kBlockNArg, static_cast<int>(sizeof(T)), kConsumers, kSumByMma>;
  static_assert(kConsumers == 2 || !kPaged, "the paged producer: two consumer warpgroups");
  static_assert(kConsumers > 1 || (!kPingpong && kSpecialized && !kFp8VtPass && sizeof(T) == 2),
                "one consumer warpgroup: 16-bit, no pingpong turns, a producer warpgroup");
  static_assert(kSpecialized || (!kPaged && sizeof(T) == 2 && kOverlap), "no producer warpgroup: 16-bit, not paged, kOverlap");
  static_assert(!kSumByMma || !kRescaleUnderQk, "the row sums by the tensor cores follow O's rescale after P V");
  static_assert(!kSplitTail || (!kPaged && kSpecialized), "split tail tiles: not paged, a producer warpgroup");
  static_assert(kCluster == 1 || (kCluster == 2 && sizeof(T) == 2 && !kPaged && kSpecialized && !kSplitTail && Tr::kBoxes % 2 == 0),
                "CTA pairs: 16-bit, not paged, a producer warpgroup, no split tail, an even count of 64-column boxes");
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr bool kFp8 = Tr::kFp8;
  constexpr bool kVtInKernel = kFp8 && !kFp8VtPass;  // V^T by the producer warpgroup's warps 1, 2
  constexpr int kTransposeWarps = 2;  // warps 1 and 2 of the producer warpgroup
  using To = HopperAttnOut<T>;  // output element
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t q_full, k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
  __shared__ uint64_t vraw_full[kVtInKernel ? kStages : 1], vraw_empty[kVtInKernel ? kStages : 1];  // kVtInKernel: V as loaded
  // The 128B swizzle pattern repeats every 1024 bytes: tiles start on a 1024-byte boundary.
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sq = smem;                           // Q (kBoxes x 128 rows), later O
  unsigned char* sk = sq + Tr::kQBytes;               // (kStages, kBoxes x kN rows)
  unsigned char* sv = sk + kStages * Tr::kKBytes;     // (kStages, kBoxes x kN rows; FP8: chunks of d rows x kVtChunk keys)
  unsigned char* sv_raw = sv + kStages * Tr::kVBytes;  // FP8: (kStages, kN rows of 128 bytes), V as loaded
  const AttnFwdParams& p = args.p;

  // Work: query blocks fastest, from the last one down (causal: the longest first), then heads,
  // then batches. CTAs running at once share their heads' K and V in L2, and the query heads of
  // a GQA group (adjacent heads) follow each other; the last args.tail_heads (batch, head) pairs in
  // rounds of one query block (hopper_attn_walk_tile), so that the grid ends with short causal tiles.
  // kSplitTail: the CTAs from split_from on are parts of the tiles from split_from on (HopperAttnArgs).
  const bool split = kSplitTail && static_cast<int>(blockIdx.x) >= args.split_from;
  const int unit = split ? static_cast<int>(blockIdx.x) - args.split_from : 0;
  const int tile = split ? args.split_from + unit / args.splits : static_cast<int>(blockIdx.x);
  const int part = split ? unit % args.splits : 0;
  const HopperAttnTile tc = hopper_attn_walk_tile(tile, args.m_blocks, p.nheads, p.nheads * p.batch, args.tail_heads);
  const int h = tc.h, b = tc.b, m0 = tc.mb * kM;
  const AttnBatch sb = attn_batch<kPaged>(p, b);
  if (m0 >= sb.sq) return;  // varlen: this batch has fewer rows (the whole CTA leaves)
  const bool varlen = !kNoMask && p.cu_seqlens_q != nullptr;  // kNoMask: fixed lengths
  const int hk = h / (p.nheads / p.nheads_kv);
  AttnScoreMod mod = attn_score_mod(p, b, h, sb);
  float v_descale = 1.f;  // FP8: O is P (V_e4m3 x v_descale)
  if constexpr (kFp8) {  // the logits of dequantized q and k: the descales fold into the scale
    const int64_t di = b * p.descale_batch_stride + hk * p.descale_head_stride;
    if (p.q_descale != nullptr) mod.scale *= p.q_descale[di];
    if (p.k_descale != nullptr) mod.scale *= p.k_descale[di];
    if (p.v_descale != nullptr) v_descale = p.v_descale[di];
  }
  const int rows_hi = sb.sq - m0 < kM ? sb.sq : m0 + kM;
  const AttnKeyRange kr = attn_key_range(m0, rows_hi, sb.sk, mod.diag, mod.window_left, mod.window_right);
  const int n_first = kr.lo / kN, n_all = kr.hi > kr.lo ? (kr.hi + kN - 1) / kN - n_first : 0;
  // A split part: blocks [n_all part / splits, n_all (part + 1) / splits) of the tile's.
  const int n_lo = split ? n_all * part / args.splits : 0, n_hi = split ? n_all * (part + 1) / args.splits : n_all;
  const int n_begin = n_first + n_lo, n_blocks = n_hi - n_lo;

  if (threadIdx.x == 0) {
    mbarrier_init(&q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      // The producer's arrive + the TMA bytes; paged: an arrive per producer thread when its copies land.
      mbarrier_init(&k_full[s], kPaged ? 128 : 1);
      mbarrier_init(&v_full[s], kPaged ? 128 : kVtInKernel ? kTransposeWarps : 1);  // kVtInKernel: each transposing warp's arrive
      mbarrier_init(&k_empty[s], 4 * kConsumers * kCluster);  // one arrive per consumer warp (of the pair)
      mbarrier_init(&v_empty[s], 4 * kConsumers * kCluster);
      if constexpr (kVtInKernel) {
        mbarrier_init(&vraw_full[s], 1);  // the producer's arrive + the TMA bytes
        mbarrier_init(&vraw_empty[s], kTransposeWarps);
      }
    }
    fence_barrier_init();
  }
  __shared__ alignas(256) uint32_t ones[kSumByMma ? 64 : 1];  // kSumByMma: hopper_attn_fill_ones
  if constexpr (kSumByMma) hopper_attn_fill_ones<T>(ones);
  // kCluster: the peer's barriers are initialized before any copy completes on them or arrive reaches them.
  if constexpr (kCluster > 1) cluster_sync_all();
  else __syncthreads();
  [[maybe_unused]] const uint32_t rank = kCluster > 1 ? cluster_cta_rank() : 0;

  const int wg = warpgroup_index();
  if constexpr (kPaged) {
    if (wg == 0) {  // producer: Q by TMA (thread 0), then K and V gathered by the whole warpgroup
      setmaxnreg_dec<24>();
      if (n_blocks == 0) return;
      if (threadIdx.x == 0) {
        prefetch_tensor_map(&args.q);
        mbarrier_arrive_expect_tx(&q_full, Tr::kQBytes);
#pragma unroll
        for (int x = 0; x < Tr::kBoxes; ++x)
          tma_load_4d(sq + x * kM * 128, &args.q, x * Tr::kBoxCols, static_cast<int>(sb.q_row0) + m0, h, 0, &q_full);
      }
      const int* pages = p.kv_indices + p.kv_indptr[b];
      const IntDivisor page_size = IntDivisor::of(static_cast<uint32_t>(p.page_size), p.page_size_magic, p.page_size_shift);
      const T* k = static_cast<const T*>(p.k) + hk * p.k_head_stride;
      const T* v = static_cast<const T*>(p.v) + hk * p.v_head_stride;
      const auto swizzle = [](int row, int col) { return hopper_attn_swizzle(row, col, kN); };
      // TMA boxes of box_rows keys (a page, or a block's part of a longer page) x 64 columns:
      // warp 0's lane l issues box (l / kBoxes, column box l % kBoxes). Thread 0's arrive sets the
      // bytes; the other 127 arrive plainly (the barriers count 128, as for the copies).
      const int box_rows = args.page_box_rows, lane = threadIdx.x % 32;
      const int boxes = box_rows > 0 ? kN / box_rows * Tr::kBoxes : 0;
      const bool v_steps = args.v_step_major != 0;
      const auto v_offset = [v_steps](int row, int col) {
        return v_steps ? hopper_attn_step_swizzle<Tr::kBoxes>(row, col) : hopper_attn_swizzle(row, col, kN);
      };
      const auto load_boxes = [&](unsigned char* dst, const CUtensorMap* map, uint64_t* bar, int page, int row_in_page) {
        if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, Tr::kKBytes);
        __syncwarp();
        if (threadIdx.x != 0) mbarrier_arrive(bar);
        if (threadIdx.x < boxes) {
          const int j = lane / Tr::kBoxes, x = lane % Tr::kBoxes;
          tma_load_4d(dst + (x * kN + j * box_rows) * 128, map, x * Tr::kBoxCols, row_in_page, hk, page, bar);
        }
      };
      for (int i = 0; i < n_blocks; ++i) {
        const int s = i % kStages;
        const uint32_t phase = (i / kStages) & 1;
        const int key0 = (n_begin + i) * kN;
        if (box_rows > 0 && key0 + kN <= sb.sk) {  // every key of the block in the request: TMA
          int page = 0, row_in_page = 0;
          if (threadIdx.x < boxes) {
            const uint32_t key = static_cast<uint32_t>(key0 + lane / Tr::kBoxes * box_rows);
            const uint32_t q = page_size.div(key);
            page = pages[q], row_in_page = static_cast<int>(page_size.mod(key, q));
          }
          mbarrier_wait(&k_empty[s], phase ^ 1);
          load_boxes(sk + s * Tr::kKBytes, &args.k, &k_full[s], page, row_in_page);
          const int v_page = __shfl_sync(0xffffffffu, page, (lane * Tr::kBoxes) % 32);  // lane j: page j of the block
          mbarrier_wait(&v_empty[s], phase ^ 1);
          if (v_steps) {  // a box per page: (64 columns, 16 rows, every column box)
            uint64_t* bar = &v_full[s];
            if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, Tr::kVBytes);
            __syncwarp();
            if (threadIdx.x != 0) mbarrier_arrive(bar);
            if (threadIdx.x < kN / 16) tma_load_5d(sv + s * Tr::kVBytes + threadIdx.x * Tr::kBoxes * 2048, &args.v, 0, 0, 0, hk, v_page, bar);
          } else {
            load_boxes(sv + s * Tr::kVBytes, &args.v, &v_full[s], page, row_in_page);
          }
        } else {  // the request's last block (keys past its end zero-filled), or no TMA for this page size
          const PagedRowCopy<kN, kHeadDim / 8> rows(pages, page_size, key0, sb.sk);  // in flight during the wait
          mbarrier_wait(&k_empty[s], phase ^ 1);
          rows.copy(sk + s * Tr::kKBytes, k, static_cast<int>(p.k_batch_stride), static_cast<int>(p.k_row_stride), swizzle);
          cp_async_mbarrier_arrive_noinc(&k_full[s]);
          mbarrier_wait(&v_empty[s], phase ^ 1);
          rows.copy(sv + s * Tr::kVBytes, v, static_cast<int>(p.v_batch_stride), static_cast<int>(p.v_row_stride), v_offset);
          cp_async_mbarrier_arrive_noinc(&v_full[s]);
        }
      }
      return;
    }
  }
  const int qb = varlen ? 0 : b;  // batch coordinate (varlen: rows are packed, batch 1)
  const int q_row = static_cast<int>(sb.q_row0) + m0, k_row = static_cast<int>(sb.k_row0);
  // The producer's loads (!kSpecialized: the consumers' first thread's). Q, then block i's K or V
  // into its stage of the ring, once every consumer warp has released the stage (a fresh barrier
  // passes parity 1).
  const auto load_q = [&] {
    mbarrier_arrive_expect_tx(&q_full, Tr::kQBytes);
#pragma unroll
    for (int x = 0; x < Tr::kBoxes; ++x) tma_load_4d(sq + x * kM * 128, &args.q, x * Tr::kBoxCols, q_row, h, qb, &q_full);
  };
  // The kBoxes 64-column boxes of a K or V block (its first row `row` of `map`) into dst; kCluster:
  // this CTA's share of them, multicast into both CTAs of the pair.
  const auto load_kv_block = [&](unsigned char* dst, const CUtensorMap* map, int row, uint64_t* bar) {
#pragma unroll
    for (int x = 0; x < Tr::kBoxes; ++x) {
      if constexpr (kCluster > 1) {
        if (x % kCluster == static_cast<int>(rank)) tma_load_4d_multicast(dst + x * kN * 128, map, x * Tr::kBoxCols, row, hk, qb, bar, 0x3);
      } else {
        tma_load_4d(dst + x * kN * 128, map, x * Tr::kBoxCols, row, hk, qb, bar);
      }
    }
  };
  const auto load_k = [&](int i) {
    const int s = i % kStages, row = k_row + (n_begin + i) * kN;
    mbarrier_wait(&k_empty[s], ((i / kStages) & 1) ^ 1);
    mbarrier_arrive_expect_tx(&k_full[s], Tr::kKBytes);  // kCluster: half of them from the peer
    load_kv_block(sk + s * Tr::kKBytes, &args.k, row, &k_full[s]);
  };
  const auto load_v = [&](int i) {
    const int s = i % kStages, row = k_row + (n_begin + i) * kN;
    if constexpr (kVtInKernel) {  // V as it is, into the transposing warps' buffer
      mbarrier_wait(&vraw_empty[s], ((i / kStages) & 1) ^ 1);
      mbarrier_arrive_expect_tx(&vraw_full[s], Tr::kVRawBytes);
      tma_load_4d(sv_raw + s * Tr::kVRawBytes, &args.v, 0, row, hk, qb, &vraw_full[s]);
      return;
    }
    mbarrier_wait(&v_empty[s], ((i / kStages) & 1) ^ 1);
    mbarrier_arrive_expect_tx(&v_full[s], Tr::kVBytes);
    if constexpr (kFp8) {
      // V^T of batch b (head dims x keys of this sequence, from key 0): one box of the block's chunks.
      tma_load_5d(sv + s * Tr::kVBytes, &args.v, 0, 0, (n_begin + i) * (kN / Tr::kVtChunk), hk, b, &v_full[s]);
    } else {
      load_kv_block(sv + s * Tr::kVBytes, &args.v, row, &v_full[s]);
    }
  };
  if (kSpecialized && wg == 0) {  // producer
    // 24 registers; 32 for the V transpose with three consumer warpgroups (launched at 128, they
    // take the 3 x 32 that the producer gives back). Two consumer warpgroups launched at 168 reach
    // 240 only if the producer gives back 144: 24.
    setmaxnreg_dec<kVtInKernel && kConsumers == 3 ? 32 : 24>();
    if constexpr (kVtInKernel) {
      // Warps 1, 2: each block's V, once loaded, into V^T's buffer of its stage once the consumers
      // have released it; a proxy fence (generic writes, read by wgmma), then an arrive per warp.
      // (Warp 3 has nothing to do.)
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      if (warp > kTransposeWarps) return;
      if (warp > 0) {
        for (int i = 0; i < n_blocks; ++i) {
          const int s = i % kStages;
          const uint32_t phase = (i / kStages) & 1;
          mbarrier_wait(&vraw_full[s], phase);
          mbarrier_wait(&v_empty[s], phase ^ 1);
          const uint32_t raw = smem_u32(sv_raw + s * Tr::kVRawBytes);
          const int valid_keys = sb.sk - (n_begin + i) * kN;
          if (valid_keys < kN) {
            hopper_attn_fp8_zero_v_rows<Tr, kTransposeWarps>(raw, warp - 1, lane, valid_keys);
            __syncwarp();
          }
          // Key groups all unrolled with 32 registers; one at a time with 24 (two spilled 4 bytes).
          constexpr int kUnroll = kConsumers == 3 ? kN / 16 : 1;
          hopper_attn_fp8_transpose_v<Tr, kTransposeWarps, kUnroll>(raw, smem_u32(sv + s * Tr::kVBytes), warp - 1, lane);
          fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) {
            mbarrier_arrive(&vraw_empty[s]);
            mbarrier_arrive(&v_full[s]);
          }
        }
        return;
      }
    }
    if (threadIdx.x == 0 && n_blocks > 0) {
      prefetch_tensor_map(&args.q);
      prefetch_tensor_map(&args.k);
      prefetch_tensor_map(&args.v);
      load_q();
      for (int i = 0; i < n_blocks; ++i) {
        load_k(i);
        // kFp8VtPass: V^T is the pass's output, and this grid may have started during the pass's
        // tail (programmatic dependent launch): wait for that grid to finish (a no-op without it).
        if (kFp8 && kFp8VtPass && i == 0) asm volatile("griddepcontrol.wait;\n" ::: "memory");
        load_v(i);
      }
      // kCluster: the CTA stays until both CTAs' consumers have released every stage for the last
      // time (the peer's arrives on this CTA's barriers). Its own consumers wait for every block the
      // peer multicasts into it, so nothing lands after they are done.
      if constexpr (kCluster > 1)
        for (int i = n_blocks > kStages ? n_blocks - kStages : 0; i < n_blocks; ++i) {
          mbarrier_wait(&k_empty[i % kStages], (i / kStages) & 1);
          mbarrier_wait(&v_empty[i % kStages], (i / kStages) & 1);
        }
    }
    return;
  }

  // Consumers: warpgroup cw = 0 .. kConsumers - 1 computes query rows [m0 + 64 cw, m0 + 64 cw + 64).
  if constexpr (kSpecialized) setmaxnreg_inc<Tr::kConsumerRegs>();
  const int cw = kSpecialized ? wg - 1 : wg;
  const bool loader = !kSpecialized && threadIdx.x == 0;  // !kSpecialized: issues the loads
  const int t128 = threadIdx.x - 128 * wg;
  const int warp = t128 / 32, lane = t128 % 32;
  const int g = lane / 4, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw;              // first query row of this warpgroup
  const int row0 = wg_row0 + warp * 16 + g;      // this thread's rows: row0, row0 + 8
  const float scale_log2 = mod.scale * kLog2e, slope_log2 = mod.slope * kLog2e;

  float o[kHeadDim / 2];  // O accumulator: d[4 j + 2 r + c] = row row0 + 8 r, column 8 j + 2 t + c
#pragma unroll
  for (int e = 0; e < kHeadDim / 2; ++e) o[e] = 0.f;
  float lsum[4];  // kSumByMma: a block's row sums (m64n8: rows g, g + 8 at lsum[0], lsum[2])
  float s[kN / 2];               // S, then P in fp32, same layout with key columns
  uint32_t pa[Tr::kPvSteps][4];  // P as the register A operand of P V, one k-step per entry
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};  // log2 units; partial sums

  const uint32_t q_base = smem_u32(sq) + cw * 64 * 128;  // this warpgroup's 64 rows of each Q box
  // Pingpong turns: warpgroup cw issues GEMMs after a sync on barrier 1 + cw, then lets the next
  // one (cyclically) go with an arrive on its barrier. The last warpgroup starts by letting the
  // first go, and skips its final arrive (so every arrive is matched by a sync of the same barrier).
  const auto turn_begin = [&] {
    if constexpr (kPingpong) named_barrier_sync(1 + cw, 256);
  };
  const auto turn_end = [&](bool last) {
    if constexpr (kPingpong)
      if (!(last && cw == kConsumers - 1)) named_barrier_arrive(hopper_attn_next_turn_barrier<kConsumers>(cw), 256);
  };
  const auto gemm_qk = [&](int stage) {
    hopper_attn_gemm_qk<T, Tr, kDescAdvance>(s, q_base, smem_u32(sk + stage * Tr::kKBytes));
  };
  // V's k-steps of 16 keys and 64-column boxes (LBO): kN rows of 128 bytes per box, or k-step-major
  // (paged, pages of 16: HopperAttnArgs::v_step_major).
  const bool v_steps = kPaged && args.v_step_major != 0;
  const uint32_t v_step_bytes = v_steps ? Tr::kBoxes * 2048 : 16 * 128, v_lbo = v_steps ? 2048 : kN * 128;
  const auto gemm_pv = [&](int stage) {
    hopper_attn_gemm_pv<T, Tr, kDescAdvance>(o, pa, smem_u32(sv + stage * Tr::kVBytes), v_step_bytes, v_lbo, lsum, smem_u32(ones));
  };
  const auto release = [&](uint64_t* bar) {  // kCluster: on this CTA's barrier and the peer's
    if (lane == 0) {
      mbarrier_arrive(bar);
      if constexpr (kCluster > 1) mbarrier_arrive_cluster(bar, rank ^ 1);
    }
  };
  // A K or V buffer has landed. Paged: written by cp.async (generic proxy), read by wgmma (async
  // proxy): a proxy fence between them.
  const auto wait_full = [&](uint64_t* bar, uint32_t parity) {
    mbarrier_wait(bar, parity);
    if constexpr (kPaged) fence_proxy_async_smem();
  };
  const auto softmax = [&](int n, float (&rescale)[2]) {
    hopper_attn_softmax<Tr, kLazyRescale, kTreeReduce, kNoMask>(s, row_max, row_sum, rescale, n, mod, sb.sk, wg_row0, row0, t, scale_log2,
                                                                slope_log2);
  };
  const auto rescale_o = [&](const float (&rescale)[2]) { hopper_attn_rescale_o<Tr, kLazyRescale>(o, rescale); };
  const auto add_sums = [&](const float (&factor)[2]) { hopper_attn_add_sums<Tr>(row_sum, lsum, factor); };
  constexpr float kOne[2] = {1.f, 1.f};
  const auto convert_p = [&] { hopper_attn_convert_p<T, Tr>(s, pa); };

  if (n_blocks > 0) {
    if (loader) {  // Q, then block 0's K and V
      load_q();
      load_k(0);
      load_v(0);
    }
    if constexpr (kPingpong)
      if (cw == kConsumers - 1) named_barrier_arrive(1, 256);  // the first warpgroup goes first
    mbarrier_wait(&q_full, 0);
    float rescale[2];
    if constexpr (kOverlap) {
      // Block 0: S only.
      wait_full(&k_full[0], 0);
      turn_begin();
      gemm_qk(0);
      turn_end(false);
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      release(&k_empty[0]);
      if (loader && n_blocks > 1) load_k(1);
      softmax(n_begin, rescale);
      convert_p();
      for (int i = 1; i < n_blocks; ++i) {
        const int st = i % kStages, prev = (i - 1) % kStages;
        wait_full(&k_full[st], (i / kStages) & 1);
        wait_full(&v_full[prev], ((i - 1) / kStages) & 1);
        turn_begin();
        gemm_qk(st);  // S_i = Q K_i^T
        // kRescaleUnderQk: O takes block i-1's factor here, under S_i's product, instead of
        // after P_{i-2} V_{i-2} (as FlashAttention-3 orders it).
        if constexpr (kRescaleUnderQk) rescale_o(rescale);
        gemm_pv(prev);  // O += P_{i-1} V_{i-1}
        turn_end(false);
        wgmma_wait<1>();  // S_i done; P V still running
        wgmma_fence_operands(s);
        release(&k_empty[st]);
        if (loader && i + 1 < n_blocks) load_k(i + 1);
        softmax(n_begin + i, rescale);
        // P V done (kPinWait: only after the softmax; see wgmma_wait_after; kSumByMma: after its
        // last exponent, non-negative too).
        if constexpr (kPinWait) wgmma_wait_after<0>(kSumByMma ? s[kN / 2 - 1] : row_sum[1]);
        else wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&v_empty[prev]);
        if (loader) load_v(i);
        if constexpr (!kRescaleUnderQk) rescale_o(rescale);
        add_sums(rescale);
        convert_p();
      }
      const int last = (n_blocks - 1) % kStages;
      wait_full(&v_full[last], ((n_blocks - 1) / kStages) & 1);
      turn_begin();
      if constexpr (kRescaleUnderQk) rescale_o(rescale);
      gemm_pv(last);
      turn_end(true);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release(&v_empty[last]);
      add_sums(kOne);
    } else {
      // One GEMM at a time: S_i, softmax, O += P_i V_i.
      for (int i = 0; i < n_blocks; ++i) {
        const int st = i % kStages;
        const uint32_t phase = (i / kStages) & 1;
        wait_full(&k_full[st], phase);
        turn_begin();
        gemm_qk(st);
        turn_end(false);
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        release(&k_empty[st]);
        softmax(n_begin + i, rescale);
        rescale_o(rescale);
        convert_p();
        wait_full(&v_full[st], phase);
        turn_begin();
        gemm_pv(st);
        turn_end(i == n_blocks - 1);
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&v_empty[st]);
        add_sums(kOne);
      }
    }
  }

  // Epilogue: O / l and LSE (hopper_attn_normalize_o), then the TMA store or the varlen copy; a
  // split part's to its unit's rows of part_o / part_lse.
  if constexpr (kSplitTail)
    if (split) return hopper_attn_store_part<Tr>(o, row_sum, row_max, v_descale, args.part_o, args.part_lse, unit, cw, warp, g, t);
  To* out_rows = static_cast<To*>(p.o) + attn_offset(p, b, sb.q_row0, 0, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  hopper_attn_normalize_o<Tr, To, kPaged, false, false, true>(o, row_sum, row_max, v_descale, sq, out_rows, p, b, h, sb, cw, warp, g, t, row0);
  if constexpr (kFp8) return;
  fence_proxy_async_smem();  // the writes above before the TMA engine reads them
  named_barrier_sync(1 + kConsumers + cw, 128);  // (after the pingpong barriers 1 .. kConsumers)
  if (wg_row0 >= sb.sq) return;
  hopper_attn_store_o<Tr>(&args.o, sq, out_rows, p.o_row_stride, varlen, wg_row0, sb.sq, h, b, cw, t128);
#endif
}

// kSplitTail's merge weights of row `row` of split tile ti (HopperAttnArgs): w_s = 2^(lse_s - max
// lse) of its parts (a part that saw no key has lse -inf: weight 0; parts past `splits` too), their
// sum, and the max (log2 units). The parts are read past L1 (ld.global.cg): the persistent kernel's
// merging warpgroup reads rows other SMs wrote during the same launch.
template <int kBlockM, int kMaxSplits>
struct HopperAttnMergeWeights {
  float w[kMaxSplits], total, mx;
  __device__ __forceinline__ HopperAttnMergeWeights(const HopperAttnArgs& args, int64_t first) {
    float lse[kMaxSplits];
    mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      lse[s] = s < args.splits ? __ldcg(args.part_lse + first + s * kBlockM) : -INFINITY;
      mx = fmaxf(mx, lse[s]);
    }
    total = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      w[s] = mx == -INFINITY || s >= args.splits ? 0.f : exp2f(lse[s] - mx);
      total += w[s];
    }
  }
  // The row's LSE (natural log) into p.lse.
  __device__ __forceinline__ void store_lse(const AttnFwdParams& p, int b, int h, int i) const {
    if (p.lse == nullptr) return;
    const AttnBatch sb = attn_batch(p, b);
    p.lse[attn_lse_offset(p, b, h, sb, i)] = total > 0.f ? (mx + log2f(total)) * 0.6931471805599453f : -INFINITY;
  }
};

// kSplitTail's merge: columns [c0, c0 + kCols) of row `row` of split tile split_from + ti from its
// parts: O = sum_s w_s O_s / sum_s w_s (HopperAttnMergeWeights), every part's columns loaded before
// they are summed; the LSE with `lse_too`. Fixed-length batches only.
// (The serving merge, merge_state_kernel, does the same sums over packed (query, head) rows of
// natural-log states into a packed output; here the rows are a tile's, in log2 units, into o's
// strides and the lse's layout.)
template <int kHeadDim, int kBlockM, int kMaxSplits, int kCols, typename To>
__device__ __forceinline__ void hopper_attn_merge_row(const HopperAttnArgs& args, int ti, int row, int c0, bool lse_too) {
  static_assert(kCols % 8 == 0, "8 columns (two float4 per part) a step");
  const AttnFwdParams& p = args.p;
  const HopperAttnTile tc = hopper_attn_walk_tile(args.split_from + ti, args.m_blocks, p.nheads, p.nheads * p.batch, args.tail_heads);
  const int i = tc.mb * kBlockM + row;
  if (i >= p.seqlen_q) return;
  const int64_t first = static_cast<int64_t>(ti) * args.splits * kBlockM + row;  // part 0's row; part s: + s kBlockM
  const HopperAttnMergeWeights<kBlockM, kMaxSplits> mw(args, first);
  const float inv = mw.total > 0.f ? 1.f / mw.total : 0.f;
  const float* src = args.part_o + first * kHeadDim + c0;
  To* out = static_cast<To*>(p.o) + attn_offset(p, tc.b, 0, i, tc.h, p.o_batch_stride, p.o_row_stride, p.o_head_stride) + c0;
#pragma unroll
  for (int c = 0; c < kCols; c += 8) {
    float4 v[kMaxSplits][2];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
#pragma unroll
      for (int x = 0; x < 2; ++x)
        v[s][x] = s < args.splits ? __ldcg(reinterpret_cast<const float4*>(src + s * kBlockM * kHeadDim + c + 4 * x))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    float acc[8] = {};
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        acc[4 * x + 0] = fmaf(mw.w[s], v[s][x].x, acc[4 * x + 0]);
        acc[4 * x + 1] = fmaf(mw.w[s], v[s][x].y, acc[4 * x + 1]);
        acc[4 * x + 2] = fmaf(mw.w[s], v[s][x].z, acc[4 * x + 2]);
        acc[4 * x + 3] = fmaf(mw.w[s], v[s][x].w, acc[4 * x + 3]);
      }
#pragma unroll
    for (int e = 0; e < 8; e += 2)  // 4-byte stores: o's rows need not be 16-byte aligned (FP8's o has no tensor map)
      *reinterpret_cast<uint32_t*>(out + c + e) = pack2<To>(acc[e] * inv, acc[e + 1] * inv);
  }
  if (lse_too) mw.store_lse(p, tc.b, tc.h, i);
}

// kSplitTail's second pass (the one-CTA kernel's): every row of the split tiles
// (hopper_attn_merge_row), one warp per row (8 columns a lane; 8 / 16 lanes busy at head dim 64 /
// 128). Grid: split tiles x kBlockM rows, 32 threads each, any block size.
template <int kHeadDim, int kBlockM, int kMaxSplits, typename To>
__global__ void attn_hopper_merge_tail_kernel(const __grid_constant__ HopperAttnArgs args, int split_tiles) {
  static_assert(kHeadDim % 256 == 0 || kHeadDim == 128 || kHeadDim == 64, "whole 8-column steps per lane");
  constexpr int kCols = kHeadDim >= 256 ? kHeadDim / 32 : 8;  // per lane; d 64 / 128: 8 / 16 lanes a row
  constexpr int kLanesPerRow = kHeadDim / kCols;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= static_cast<int64_t>(split_tiles) * kBlockM) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane >= kLanesPerRow) return;
  hopper_attn_merge_row<kHeadDim, kBlockM, kMaxSplits, kCols, To>(args, static_cast<int>(w / kBlockM), static_cast<int>(w % kBlockM),
                                                                  lane * kCols, lane == 0);
}

}  // namespace flashlab::kernels
