// Backward rung 3 — Hopper (FlashAttention-3 class): TMA, wgmma, warp specialization.
//
// Changes from rung 2 (mma.sync + ldmatrix + cp.async, 8 warps sharing every product):
//   - Warp specialization: warpgroup 0 is the producer (one thread issues every copy, 24
//     registers); warpgroups 1 and 2 are consumers with 240 registers each, and consumer cw owns
//     keys n0 + 64 cw .. n0 + 64 cw + 63 of the block's 128: its dK and dV (64 x d fp32 each) live
//     in its registers for the whole block.
//   - TMA: K and V (128 keys x d) once per block; per step (query head h, kBlockM query rows
//     m0..) Q and dO as 64-column, 128B-swizzled boxes of 4-D tensor maps (head dim, rows, heads,
//     batch), and the step's lse log2(e) and D (the preprocess's padded arrays) by 1-D bulk
//     copies, all completing on one mbarrier per stage; two stages, so step n + 1 lands while n
//     is computed.
//   - wgmma, transposed problem: each consumer computes S^T = K Q^T and dP^T = V dO^T (64 keys x
//     the step's rows, both operands K-major in shared memory), so P^T comes out of the accumulator in
//     the register A-operand layout of dV += P^T dO (B = dO, MN-major: no transpose pass). dS^T
//     goes to shared memory (16-bit, swizzled, 128-byte rows of 64 query rows per key); once both
//     consumers' halves are written:
//       dK += dS^T Q                       (A = its 64 keys of dS^T: from registers with plain
//                                           scores, like P^T for dV; else K-major in shared
//                                           memory, the softcap / ALiBi pass spilled with 16
//                                           more registers; B = Q, MN-major)
//       dQ[:, half cw] = dS K[:, half cw]  (A = dS, MN-major, all 128 keys; B = K, MN-major)
//     dQ goes to shared memory (fp32, 128B-swizzled 32-column boxes, stored without bank
//     conflicts: store_acc_f32_sw128) and one thread (kDqByProducer, the library's: producer warp
//     1 + cw) adds it to the fp32 workspace with a TMA reduction (cp.reduce.async.bulk.tensor
//     .add: the adds happen in L2; rung 2's threads each issue red.global.add.v4.f32 instead).
//   - The consumers meet only through mbarriers on two dS^T buffers (ds_full: both halves of a
//     step written; ds_empty: both consumers' dQ of it done), and each computes step n's dQ in
//     step n + 1, before its own dK (kDqFirst, the library's): neither waits for the other right
//     after writing its half, so they drift apart by up to a step and one's element-wise work
//     runs under the other's products. Plain scores: P as soon as S^T is done (dP^T still
//     running), dV's product issued, then dS while it runs.
//   - Element-wise P and dS: per element as in rung 2 (AttnBwdScore::p_ds), lse and D per column
//     (query row) from shared memory; the mask compiled in only for steps that straddle it.
//   - Epilogue (fixed lengths, TMA-walkable dk / dv): dK and dV rounded into the consumer's 64 rows
//     of the K and V tiles and stored by TMA (HopperBwdArgs::dk, dv); from registers otherwise.
//     Stored from registers everywhere they cost 2-17% of the backward at 8k-512 keys (2026-11-27 (26)).
// Head dims 64 (steps of 128 query rows, dQ split by rows) and 128 (steps of 64 rows, dQ split
// by columns); dK + dV take 64 or 128 registers a thread (head dim 256: 03_hopper_split.cuh). No
// dropout (rung 2 has it). Varlen:
// Q / dO rows past a sequence's end hold the next sequence's rows; their lse is +inf (the
// preprocess pads), so P = 0 and dS = 0 there, but a non-finite value in them would reach dK as
// 0 x inf (the forward's rung 4 reads past the end alike).
// Limits: within a consumer, the element-wise pass waits for S^T and dP^T, and the next step's
// products wait for that pass (two warpgroups of 240 registers, one block per SM: no third
// consumer to fill the gaps).
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/attention/04_hopper.cuh"
#include "kernels/attention/backward/02_flash2.cuh"
#include "kernels/attention/backward/common.cuh"
#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"

namespace flashlab::kernels {

// kStages_: Q / dO / lse / D stages (bench/experiments/attention_bwd_hopper_ablation.cu measures
// 3 at head dim 128, the most that fits).
template <int kHeadDim_, int kStages_ = 2, bool kDqByProducer_ = false>
struct HopperBwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  // Query rows per step: 128 at head dim 64 (S^T and dP^T take 64 registers each next to 64 of
  // dK + dV), 64 at 128 (32 each next to 128). kAttnBwdRowPad (the preprocess's padding) is a
  // multiple of both.
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kBlockN = 128;             // keys per block: 64 per consumer warpgroup
  static constexpr int kThreads = 384;            // producer + 2 consumer warpgroups
  static constexpr int kStages = kStages_;        // Q, dO, lse, D
  static constexpr int kBoxes = kHeadDim / 64;    // 64-column (128-byte) TMA boxes per row
  static constexpr int kKBytes = kBoxes * kBlockN * 128;  // K (and V): 128 keys
  static constexpr int kQBytes = kBoxes * kBlockM * 128;  // one stage of Q (and of dO)
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T: 128 keys x kBlockM rows, 16-bit, in 64-row boxes
  static constexpr int kRowBytes = kBlockM * 4;           // lse or D of one step
  static constexpr int kStepBytes = 2 * kQBytes + 2 * kRowBytes;  // a stage's transaction bytes
  // dQ (kBlockM rows x d) split between the consumers: by rows with 128-row steps (64 rows x d
  // each), else by columns (64 rows x d / 2 each); one wgmma M (64 rows) each either way.
  static constexpr bool kDqByRows = kBlockM == 128;
  static constexpr int kDqCols = kDqByRows ? kHeadDim : kHeadDim / 2;  // dQ columns per consumer
  static constexpr int kDqBoxes = kDqCols / 32;                        // its 32-column (128-byte fp32) boxes
  static constexpr int kDqBytes = kDqBoxes * 64 * 128;                 // a consumer's fp32 dQ tile (64 rows)
  static constexpr int kBaseBytes = 2 * kKBytes + kStages * (2 * kQBytes + 2 * kRowBytes) + 2 * kDsBytes + 1024;
  // dQ tiles per consumer: with the reductions issued by the producer's warps (kDqByProducer_), two
  // where they fit (a consumer stages step n + 1's while step n's is read), else one.
  static constexpr int kDqBufs = kDqByProducer_ && kBaseBytes + 4 * kDqBytes <= 227 * 1024 - 256 ? 2 : 1;
  static constexpr int kSmemBytes = kBaseBytes + 2 * kDqBufs * kDqBytes;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert((kBlockM == 64 || kBlockM == 128) && kAttnBwdRowPad % kBlockM == 0, "whole steps of padded rows");
  static_assert(kSmemBytes <= 227 * 1024, "the shared memory of one block on sm_90");
};

// Q, dO (64-row boxes), K, V (128-row boxes) over (head dim, rows, heads, batch), 128-byte boxes;
// Q, dO boxes of kBlockM rows; dq_accum over (head dim, heads, rows (attn_dq_accum_row), 1) with
// boxes of 32 fp32 x 1 x 64 rows.
// tiles (kPersistent kernels only): block i takes tiles i, i + gridDim.x, ... < tiles in the order
// of the one-block-per-tile grid (key block fastest, then KV head, then batch: hopper_bwd_tile).
// dk, dv (with dkdv_tma != 0: fixed lengths, strides TMA can walk): maps over (head dim, rows, KV
// heads, batch) with boxes of 64 columns x 64 rows, for the epilogue's TMA stores.
struct HopperBwdArgs {
  AttnBwdParams p;
  CUtensorMap q, k, v, dout, dq_accum, dk, dv;
  int tiles;
  int dkdv_tma;
};

// Tile t's (batch, KV head, first key) in the order a one-block-per-tile grid launches them (key
// block fastest: the blocks in flight share a head's Q, dO and dq_accum rows in L2).
struct HopperBwdTile {
  int b, hk, n0;
};
template <int kN, bool kPersistent>
__device__ __forceinline__ HopperBwdTile hopper_bwd_tile(const HopperBwdArgs& args, int tile) {
  if constexpr (!kPersistent) return {static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x) * kN};
  const int n_blocks = (args.p.seqlen_k + kN - 1) / kN, per_batch = n_blocks * args.p.nheads_kv;
  const int b = tile / per_batch, r = tile - b * per_batch;
  return {b, r / n_blocks, (r % n_blocks) * kN};
}

// Both rung-3 kernels' epilogue with HopperBwdArgs::dkdv_tma (2026-11-27 (26)). Staging: a
// consumer's dK and dV accumulator rows row and row + 8 (n8 tiles j: d[4 j + 2 r + c], columns
// col0 + 8 j + 2 t + c) rounded to T into the K and V tiles (kRows rows, 128B-swizzled:
// hopper_attn_swizzle), which nothing reads any more.
template <typename T, int kRows, int kCols>
__device__ __forceinline__ void hopper_bwd_stage_dkdv(unsigned char* sk, unsigned char* sv, const float* dk, const float* dv,
                                                      int row, int col0, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const uint32_t at = hopper_attn_swizzle(row + 8 * r, col0 + 8 * j + 2 * t, kRows);
      *reinterpret_cast<uint32_t*>(sk + at) = pack2<T>(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
      *reinterpret_cast<uint32_t*>(sv + at) = pack2<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
}

// Then (one thread, after the stagers' proxy fence and barrier) the TMA stores of the staged
// 64 x 64 boxes: column boxes x_lo .. x_hi - 1, row tiles row0 + 64 kt (kt < kRowTiles) of the K / V
// tiles, to keys n0 + row0 + 64 kt of KV head hk, batch b (the copy engine clips at seqlen_k); it
// waits for the copies' reads (shared memory must outlive them).
template <int kRows, int kRowTiles>
__device__ __forceinline__ void hopper_bwd_store_dkdv(const HopperBwdArgs& args, const unsigned char* sk, const unsigned char* sv,
                                                      int x_lo, int x_hi, int row0, int n0, int hk, int b) {
#pragma unroll
  for (int x = x_lo; x < x_hi; ++x)
#pragma unroll
    for (int kt = 0; kt < kRowTiles; ++kt) {
      const int off = x * kRows * 128 + (row0 + 64 * kt) * 128;
      tma_store_4d(&args.dk, sk + off, 64 * x, n0 + row0 + 64 * kt, hk, b);
      tma_store_4d(&args.dv, sv + off, 64 * x, n0 + row0 + 64 * kt, hk, b);
    }
  tma_store_commit();
  tma_store_wait_all<true>();
}

// The steps of a key block as both rung-3 kernels (this one and 03_hopper_split.cuh) walk them,
// as in rung 2: step st < n_steps is (query head hk group + st / m_blocks, query rows m_first +
// kM (st % m_blocks)), m_first .. over the row blocks that see keys n0 .. n0 + kN - 1.
struct HopperBwdSteps {
  int m_first, m_blocks, n_steps;
};
template <int kM, int kN>
__device__ __forceinline__ HopperBwdSteps hopper_bwd_steps(const AttnBwdParams& p, const AttnBatch& sb, int n0) {
  const int key_hi = sb.sk - n0 < kN ? sb.sk : n0 + kN;
  const AttnRowRange rr = attn_row_range(n0, key_hi, sb.sq, sb.sk - sb.sq, p.window_left, p.window_right);
  HopperBwdSteps steps;
  steps.m_first = rr.lo - rr.lo % kM;
  steps.m_blocks = rr.hi > rr.lo ? (rr.hi - steps.m_first + kM - 1) / kM : 0;
  steps.n_steps = steps.m_blocks * (p.nheads / p.nheads_kv);
  return steps;
}

// kProbe 6 (an experiment, right gradients): a timeline. Where the including file defines
// FLASHLAB_BWD_TRACE, the first kBwdTraceCtas key blocks of KV head 8 % nheads_kv of batch 0 write
// the SM's clock (clock64) at the phases of each step (slot 11 cw + e: consumer cw's thread 0; 22:
// the producer's copies issued; 23 + 2 rc, 24 + 2 rc: reducing warp rc saw the dQ tile staged / its
// reductions read it) into g_bwd_trace (bench/experiments/attention_bwd_hopper_ablation.cu --trace).
#if defined(FLASHLAB_BWD_TRACE)
constexpr int kBwdTraceCtas = 4, kBwdTraceSteps = 128, kBwdTraceSlots = 27;
static __device__ long long g_bwd_trace[kBwdTraceCtas][kBwdTraceSteps][kBwdTraceSlots];
#endif
template <int kProbe>
__device__ __forceinline__ void bwd_trace(int st, int slot) {
#if defined(FLASHLAB_BWD_TRACE)
  if constexpr (kProbe == 6) {
    if (blockIdx.z == 0 && blockIdx.y == 8 % gridDim.y && blockIdx.x < kBwdTraceCtas && st < kBwdTraceSteps)
      g_bwd_trace[blockIdx.x][st][slot] = clock64();
  }
#endif
}

// The producer thread's copies for key block n0 of KV head hk, batch b (Tr: either kernel's
// traits): K and V (kBlockN keys) on kv_full, then each step's Q and dO (kBlockM rows, 64-column
// boxes) and its lse log2(e) and D rows into stage st % kStages once `empty` lets it. kProbe 1 (an
// experiment): the first kStages steps only, later stages handed over as they are.
// Persistent kernel: g0 = the steps of this block's earlier tiles (stages and parities continue
// across tiles); only steps st_begin .. st_end - 1, and K and V only if with_kv.
template <typename Tr, int kProbe = 0>
__device__ __forceinline__ void hopper_bwd_produce(const HopperBwdArgs& args, const AttnBatch& sb, int b, int hk, int n0,
                                                   const HopperBwdSteps& steps, unsigned char* sk, unsigned char* sv,
                                                   unsigned char* sq, unsigned char* sdo, float* slse, float* sdsum,
                                                   uint64_t* kv_full, uint64_t* full, uint64_t* empty, uint32_t g0 = 0,
                                                   int st_begin = 0, int st_end = INT_MAX, bool with_kv = true) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages;
  const AttnBwdParams& p = args.p;
  const int qb = p.cu_seqlens_q != nullptr ? 0 : b;  // batch coordinate (varlen: packed rows, batch 1)
  const int group = p.nheads / p.nheads_kv;
  const int k_row = static_cast<int>(sb.k_row0) + n0;
  if (with_kv) {
    mbarrier_arrive_expect_tx(kv_full, 2 * Tr::kKBytes);
#pragma unroll
    for (int x = 0; x < Tr::kBoxes; ++x) {
      tma_load_4d(sk + x * kN * 128, &args.k, 64 * x, k_row, hk, qb, kv_full);
      tma_load_4d(sv + x * kN * 128, &args.v, 64 * x, k_row, hk, qb, kv_full);
    }
  }
  const int st_stop = st_end < steps.n_steps ? st_end : steps.n_steps;
#pragma unroll 1  // (unrolled, the loop spilled at the producer's 24 registers, even at 32)
  for (int st = st_begin; st < st_stop; ++st) {
    const uint32_t gs = g0 + st;
    const int s = gs % kStages;
    const int h = hk * group + st / steps.m_blocks, m0 = steps.m_first + kM * (st % steps.m_blocks);
    const int q_row = static_cast<int>(sb.q_row0) + m0;
    mbarrier_wait(&empty[s], ((gs / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
    if (kProbe == 1 && st >= kStages) {
      mbarrier_arrive(&full[s]);
      continue;
    }
    bwd_trace<kProbe>(st, 22);
    mbarrier_arrive_expect_tx(&full[s], Tr::kStepBytes);
#pragma unroll
    for (int x = 0; x < Tr::kBoxes; ++x) {
      tma_load_4d(sq + s * Tr::kQBytes + x * kM * 128, &args.q, 64 * x, q_row, h, qb, &full[s]);
      tma_load_4d(sdo + s * Tr::kQBytes + x * kM * 128, &args.dout, 64 * x, q_row, h, qb, &full[s]);
    }
    const int64_t at = (static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + m0;
    bulk_load(slse + s * kM, p.lse_log2 + at, Tr::kRowBytes, &full[s]);
    bulk_load(sdsum + s * kM, p.dsum + at, Tr::kRowBytes, &full[s]);
  }
}

// Grid (ceil(max_sk / 128), nheads_kv, batch), 384 threads, Tr::kSmemBytes dynamic shared memory.
// dq_accum zeroed, dsum and lse_log2 written by attn_bwd_dsum_rows_kernel first.
// kStages: HopperBwdTraits' kStages_. kSharedSpace: the tiles' base aligned by align_smem, so
// the dS^T and dQ tile stores and the lse / D loads are STS / LDS; false: through uintptr_t,
// generic ST.E / LD.E (both measured by bench/experiments/attention_bwd_hopper_ablation.cu).
// kDqFirst (the library's, with kDqByProducer, since 2026-11-27): a step issues the previous
// step's dQ product before its own dK product and waits only for dQ, so that dQ's tile stores,
// barriers and TMA reduction run while dK is on the tensor cores (without it, the dQ step's wait
// drains dK and dQ together and the consumer's tensor work stops for the whole dQ epilogue). The
// Q stage is released after dK completes.
// kDqByProducer: a consumer stages its dQ tile and arrives on an mbarrier; producer warp 1 + cw
// issues the tile's TMA reductions, waits for them to read it and hands the tile back (two tiles
// per consumer where they fit: HopperBwdTraits::kDqBufs). Without it, the consumer's thread 0
// issues the reductions and, before staging the next tile, waits for their reads, with two named
// barriers of the consumer around the stores.
// kProbe (experiments only): 1 loads Q / dO / lse / D for the first kStages steps only (later
// steps compute on whatever the stages hold), 2 skips dQ's TMA reductions (both: wrong
// gradients); 3 stores the dQ tile in column order (two-way bank conflicts), 4 reads dK's A
// operand (dS^T) from shared memory with plain scores (the forms before 2026-11-27 (23)); 6 writes
// a timeline (bwd_trace above); 7 and 8 take turns between the consumers (below); 9 rebuilds each
// wgmma descriptor from its address (wgmma_desc_sw128_at); 13 loads D into registers before the
// wait for dP^T; 14 skips the dK / dV stores (timing only: what the epilogue's stores cost); 15
// stores dK / dV from registers as before 2026-11-27 (26) (right gradients); 16 (kDqByProducer)
// defers the proxy fence and the dq_full arrive after a step's dQ tile stores until the next step
// has issued its score products (the fence waited for the stores to land: 2.3% of the stall
// samples at d 128 8k, 2026-11-27 (27)).
// kPersistent (an experiment, 2026-11-27 (25)): a block per SM walking the tiles (args.tiles;
// stages, buffers and barrier parities counted across tiles; K and V reloaded once the consumers
// arrive on kv_empty, so a tile's dK / dV stores run under the next tile's loads); without it the
// tile loop runs once and compiles away.
template <typename T, int kHeadDim, bool kScoreMod, int kStages_ = 2, bool kSharedSpace = false, bool kDqFirst = false,
          bool kDqByProducer = false, int kProbe = 0, bool kPersistent = false>
__global__ void __launch_bounds__(384, 1) attn_bwd_hopper_kernel(const __grid_constant__ HopperBwdArgs args) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma, TMA and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  using Tr = HopperBwdTraits<kHeadDim, kStages_, kDqByProducer>;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages, kD = kHeadDim;
  // dK's A operand from registers with plain scores (16 registers a thread at d 128; the
  // softcap / ALiBi pass spilled with them).
  constexpr bool kDkRs = !kScoreMod && kProbe != 4;
  extern __shared__ unsigned char smem_raw[];
  // kv_full / kv_empty: K and V landed (kPersistent: and tile_info written) / read by the tile's
  // last products (kPersistent: the next tile's K and V and tile_info wait for it); full / empty:
  // a Q / dO / lse / D stage; ds_full / ds_empty: both consumers' halves of a dS^T buffer written /
  // both consumers' dQ done reading it.
  // dq_full / dq_empty[kDqBufs cw + i] (kDqByProducer): consumer cw's dQ tile i staged / read by
  // its reductions.
  // tile_info[i] (kPersistent): the producer's tile i % 2 (batch, KV head, first key, 1), or 0s
  // after the last, published with kv_full; the consumers read it through warp reductions
  // (info_tile, below) rather than decode the tile index themselves.
  __shared__ int4 tile_info[2];
  __shared__ uint64_t kv_full, kv_empty, full[kStages], empty[kStages], ds_full[2], ds_empty[2], dq_full[2 * Tr::kDqBufs],
      dq_empty[2 * Tr::kDqBufs];
  // 128B-swizzled tiles start on a 1024-byte boundary.
  unsigned char* smem =
      kSharedSpace ? align_smem<1024>(smem_raw)
                   : reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sk = smem;                         // K: kBoxes x 128 rows
  unsigned char* sv = sk + Tr::kKBytes;             // V
  unsigned char* sq = sv + Tr::kKBytes;             // (kStages, kBoxes x 64 rows)
  unsigned char* sdo = sq + kStages * Tr::kQBytes;  // (kStages, kBoxes x 64 rows)
  unsigned char* sds = sdo + kStages * Tr::kQBytes; // (2, 128 keys x 128 bytes): dS^T, rows contiguous
  unsigned char* sdq = sds + 2 * Tr::kDsBytes;      // (2 consumers x kDqBufs, kDqBoxes x 64 rows x 128 bytes): fp32 dQ
  float* slse = reinterpret_cast<float*>(sdq + 2 * Tr::kDqBufs * Tr::kDqBytes);  // (kStages, 64): lse log2(e)
  float* sdsum = slse + kStages * kM;                                // (kStages, 64): D
  const AttnBwdParams& p = args.p;

  const int group = p.nheads / p.nheads_kv;
  // This block's tiles (without kPersistent: the one of its grid position), as the producer thread
  // and the reducing warps walk them: f(tile, its batch, its steps, g0 = the steps of the earlier
  // tiles (stages, buffers and barrier parities continue across tiles), it = the earlier tiles);
  // returns the number of tiles. The consumers take each tile from tile_info instead (below).
  const int tile_end = kPersistent ? args.tiles : 1, tile_stride = kPersistent ? static_cast<int>(gridDim.x) : 1;
  const auto for_each_tile = [&](auto&& f) {
    uint32_t g0 = 0, it = 0;
#pragma unroll 1
    for (int tile = kPersistent ? static_cast<int>(blockIdx.x) : 0; tile < tile_end; tile += tile_stride) {
      const HopperBwdTile tl = hopper_bwd_tile<kN, kPersistent>(args, tile);
      const AttnBatch sb = attn_batch(p, tl.b);
      if (tl.n0 >= sb.sk) continue;  // varlen: this batch has fewer keys
      const HopperBwdSteps steps = hopper_bwd_steps<kM, kN>(p, sb, tl.n0);
      f(tl, sb, steps, g0, it);
      g0 += static_cast<uint32_t>(steps.n_steps);
      ++it;
    }
    return it;
  };

  if (threadIdx.x == 0) {
    mbarrier_init(&kv_full, 1);
    mbarrier_init(&kv_empty, 256);  // every consumer thread, after its tile's last product (kPersistent)
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);   // the producer's arrive + the copies' bytes
      mbarrier_init(&empty[s], 256);  // every consumer thread (each reads lse and D itself)
    }
    for (int x = 0; x < 2; ++x) {
      mbarrier_init(&ds_full[x], 256);   // every consumer thread, after its dS^T writes
      mbarrier_init(&ds_empty[x], 256);  // every consumer thread, after its dQ product
    }
    for (int x = 0; x < 2 * Tr::kDqBufs; ++x) {
      mbarrier_init(&dq_full[x], 128);  // the consumer's threads, after their stores
      mbarrier_init(&dq_empty[x], 1);   // its reducing thread, after the reads
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // producer
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      // kPersistent: each tile published in tile_info once the consumers are done with the
      // previous one's K and V (kv_empty), on kv_full (with K and V's bytes where it has steps, a
      // plain arrive where not); then the end (0s).
      const uint32_t tiles = for_each_tile([&](const HopperBwdTile& tl, const AttnBatch& sb, const HopperBwdSteps& steps,
                                               uint32_t g0, uint32_t it) {
        // The tile's first kStages steps' Q / dO go into their stages as the previous tile frees
        // them, before the wait for its K and V to be read.
        int pre = 0;
        if constexpr (kPersistent) {
          if (it > 0) {
            pre = steps.n_steps < kStages ? steps.n_steps : kStages;
            hopper_bwd_produce<Tr, kProbe>(args, sb, tl.b, tl.hk, tl.n0, steps, sk, sv, sq, sdo, slse, sdsum, &kv_full, full,
                                           empty, g0, 0, pre, false);
            mbarrier_wait(&kv_empty, (it - 1) & 1);
          }
          tile_info[it % 2] = make_int4(tl.b, tl.hk, tl.n0, 1);
          if (steps.n_steps == 0) mbarrier_arrive(&kv_full);
        }
        if (steps.n_steps > 0)
          hopper_bwd_produce<Tr, kProbe>(args, sb, tl.b, tl.hk, tl.n0, steps, sk, sv, sq, sdo, slse, sdsum, &kv_full, full,
                                         empty, g0, pre);
      });
      if constexpr (kPersistent) {
        if (tiles > 0) mbarrier_wait(&kv_empty, (tiles - 1) & 1);
        tile_info[tiles % 2] = make_int4(0, 0, 0, 0);
        mbarrier_arrive(&kv_full);
      }
    } else if (kDqByProducer && (threadIdx.x == 32 || threadIdx.x == 64)) {
      // Consumer rc's dQ tiles, step by step: once staged, added to dq_accum by TMA; handed back
      // once the reductions have read them.
      const int rc = threadIdx.x / 32 - 1;
      for_each_tile([&](const HopperBwdTile& tl, const AttnBatch& sb, const HopperBwdSteps& steps, uint32_t g0, uint32_t) {
#pragma unroll 1
        for (int st = 0; st < steps.n_steps; ++st) {
          const uint32_t gs = g0 + st;
          const int i = rc * Tr::kDqBufs + gs % Tr::kDqBufs;
          const int h = tl.hk * group + st / steps.m_blocks, m0 = steps.m_first + kM * (st % steps.m_blocks);
          mbarrier_wait(&dq_full[i], (gs / Tr::kDqBufs) & 1);
          bwd_trace<kProbe>(st, 23 + 2 * rc);
          const int row0 = static_cast<int>(attn_dq_accum_row(p, tl.b, sb, m0)) + (Tr::kDqByRows ? 64 * rc : 0);
          const int col0 = Tr::kDqByRows ? 0 : rc * Tr::kDqCols;
#pragma unroll
          for (int x = 0; x < (kProbe == 2 ? 0 : Tr::kDqBoxes); ++x)
            tma_reduce_add_4d(&args.dq_accum, sdq + i * Tr::kDqBytes + x * 64 * 128, col0 + 32 * x, h, row0, 0);
          tma_store_commit();
          tma_store_wait_all<true>();
          bwd_trace<kProbe>(st, 24 + 2 * rc);
          mbarrier_arrive(&dq_empty[i]);
        }
      });
    }
    return;
  }

  // Consumers: warpgroup cw = 0, 1 owns keys n0 + 64 cw .. + 63.
  setmaxnreg_inc<240>();
  const ConsumerThread c = consumer_thread();
  const int cw = c.cw, t128 = c.t128, warp = c.warp, g = c.g, t = c.t;
  const int key_base = 64 * cw + 16 * warp + g;  // this thread's keys (in the block): key_base, + 8
  const auto mark = [&](int st, int e) {
    if (t128 == 0) bwd_trace<kProbe>(st, 11 * cw + e);
  };

  // dK, dV accumulators: d[4 j + 2 r + c] = key key_base + 8 r, column 8 j + 2 t + c.
  float dk[kD / 2], dv[kD / 2];

  const int cwu = warpgroup_index() - 1;  // cw, warp-uniform: the descriptors below in uniform registers
  const uint32_t k_wg = smem_u32(sk) + cwu * 64 * 128, v_wg = smem_u32(sv) + cwu * 64 * 128;  // this consumer's 64 keys
  constexpr int kDSteps = kD / 16;  // k16 steps over the head dim
  // A k-step's descriptor: the product's first one advanced by the k-step's offset (one add
  // instead of mask, shift and or per wgmma); kProbe 9 rebuilds it (the form before 2026-11-27 (24)).
  constexpr bool kRebuildDesc = kProbe == 9;
  // One tile: g0 as in for_each_tile.
  // The tile of tile_info slot it (kPersistent), its coordinates in uniform registers: through a
  // warp reduction (REDUX), as a value loaded from shared memory is not warp-uniform to the
  // compiler (in ordinary registers, they took the step loop's stage addresses and wgmma
  // descriptors out of the uniform datapath: 955 instructions a step against 803). Volatile: read
  // again for the epilogue rather than kept in registers across the step loop.
  const auto info_tile = [&](uint32_t it) {
    const volatile int* info = reinterpret_cast<const volatile int*>(&tile_info[it % 2]);
    return HopperBwdTile{__reduce_max_sync(0xffffffffu, info[0]), __reduce_max_sync(0xffffffffu, info[1]),
                         __reduce_max_sync(0xffffffffu, info[2])};
  };
  // One tile: g0 as in for_each_tile; it: its tile_info slot (kPersistent).
  const auto consume = [&](const HopperBwdTile& tl, const AttnBatch& sb, const HopperBwdSteps& steps, uint32_t g0,
                           uint32_t it) {
    const int b = tl.b, hk = tl.hk, n0 = tl.n0;
    const int m_first = steps.m_first, m_blocks = steps.m_blocks, n_steps = steps.n_steps;
#pragma unroll
    for (int e = 0; e < kD / 2; ++e) dk[e] = dv[e] = 0.f;
    // dQ of step st (gs: its number counted over this block's tiles), one step late (so that a consumer does not wait for the other's dS^T half
    // right after writing its own: the two drift apart by up to a step, and one's element-wise
    // work runs under the other's products). dQ[:, cw half] = dS K[:, cw half]: A = dS (rows
    // contiguous per key: MN-major), B = K (head-dim columns contiguous per key: MN-major); 16 keys
    // per k-step. Then into this consumer's fp32 tile (32-column boxes, 128B-swizzled; the previous
    // reduction has finished reading it), and one thread (kDqByProducer: producer warp 1 + cw)
    // adds the tile to dq_accum by TMA
    // (cp.reduce.async.bulk .add: the additions happen in L2, nothing comes back to the SM). Rows
    // past the sequence's end get dS = 0, so they add 0 to the rows after it. Waits for every
    // wgmma in flight (this step's dV and dK too) except issue_behind's.
    // issue_behind: nullptr, or (kDqFirst) the current step's dK product, issued right after dQ's;
    // the wait then leaves it in flight.
    // (Step numbers unsigned here and in the loop below: their stage, buffer and parity arithmetic
    // is then masks and shifts, not signed division.)
    int dq_pending = -1;  // kProbe 16: the dQ tile stored but not yet fenced and published
    const auto dq_step = [&](uint32_t st, uint32_t gs, auto&& issue_behind, bool defer = false) {
      constexpr bool kBehind = !std::is_same_v<std::decay_t<decltype(issue_behind)>, std::nullptr_t>;
      const int h = hk * group + static_cast<int>(st) / m_blocks, m0 = m_first + kM * (static_cast<int>(st) % m_blocks);
      // A: this consumer's 64 rows of dS (by rows: the cw-th 64-row box of dS^T), B: its columns of K
      // (by columns: the cw-th half of each key's row, 64 or 32 columns).
      const uint32_t ds_rows = smem_u32(sds + (gs % 2) * Tr::kDsBytes) + (Tr::kDqByRows ? cwu * kN * 128 : 0);
      mbarrier_wait(&ds_full[gs % 2], (gs / 2) & 1);
      mark(st, 6);
      float dq[Tr::kDqCols / 2];
      constexpr int kColBytes = Tr::kDqByRows ? 0 : Tr::kDqCols * 2;  // where this consumer's columns start in a key's row
      const uint32_t k_cols = smem_u32(sk) + (cwu * kColBytes / 128) * kN * 128 + (cwu * kColBytes) % 128;
      const uint64_t da0 = wgmma_desc_sw128(ds_rows, kN * 128, 1024), db0 = wgmma_desc_sw128(k_cols, kN * 128, 1024);
      wgmma_fence_operands(dq);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk)
        Wgmma<T, Tr::kDqCols>::template mma<1, 1>(dq, wgmma_desc_sw128_at<kRebuildDesc>(da0, ds_rows, kN * 128, kk * 16 * 128),
                                                  wgmma_desc_sw128_at<kRebuildDesc>(db0, k_cols, kN * 128, kk * 16 * 128), kk > 0 ? 1 : 0);
      wgmma_commit();
      if constexpr (kBehind) {
        issue_behind();
        wgmma_wait<1>();  // dV and dQ done; dK still running
      } else {
        wgmma_wait<0>();
      }
      wgmma_fence_operands(dq);
      wgmma_fence_operands(dv);
      if constexpr (!kBehind) wgmma_fence_operands(dk);
      mark(st, 7);
      mbarrier_arrive(&ds_empty[gs % 2]);
      const int dq_i = cw * Tr::kDqBufs + gs % Tr::kDqBufs;
      unsigned char* dq_tile = sdq + dq_i * Tr::kDqBytes;
      if constexpr (kDqByProducer) {
        if (gs >= Tr::kDqBufs) mbarrier_wait(&dq_empty[dq_i], (gs / Tr::kDqBufs - 1) & 1);  // step gs - kDqBufs's reductions read it
        mark(st, 8);
      } else {
        if (t128 == 0) tma_store_wait_all<true>();
        named_barrier_sync(2 + cw, 128);
      }
      store_acc_f32_sw128<Tr::kDqCols / 8, kProbe == 3>(dq, [&](int x) { return dq_tile + x * 64 * 128; }, warp, g, t);
      if constexpr (kDqByProducer && kProbe == 16) {
        if (defer) {
          dq_pending = dq_i;  // fenced and published after the next step's score products
          return;
        }
      }
      fence_proxy_async_smem();
      if constexpr (kDqByProducer) {
        mbarrier_arrive(&dq_full[dq_i]);  // producer warp 1 + cw takes it from here
        mark(st, 9);
        return;
      }
      named_barrier_sync(2 + cw, 128);
      if (t128 == 0) {
        const int row0 = static_cast<int>(attn_dq_accum_row(p, b, sb, m0)) + (Tr::kDqByRows ? 64 * cw : 0);
        const int col0 = Tr::kDqByRows ? 0 : cw * Tr::kDqCols;
#pragma unroll
        for (int x = 0; x < (kProbe == 2 ? 0 : Tr::kDqBoxes); ++x)
          tma_reduce_add_4d(&args.dq_accum, dq_tile + x * 64 * 128, col0 + 32 * x, h, row0, 0);
        tma_store_commit();
      }
    };

    if (!kPersistent && n_steps > 0) mbarrier_wait(&kv_full, 0);  // (kPersistent: waited with tile_info)
    // kProbe 7 / 8 (experiments, 2026-11-27 (24)): turns between the consumers, as the forward's
    // pingpong (named barriers 4 + cw): a consumer issues its S^T and dP^T products only after the
    // other has issued its dV product (7) or its dQ and dK products (8) of its previous step, so that
    // one's element-wise passes run under the other's products. Consumer 0 goes first; consumer 1
    // skips its last arrive (every arrive matched by a sync).
    constexpr bool kTurns = kProbe == 7 || kProbe == 8;
    const auto turn_begin = [&] {
      if constexpr (kTurns) named_barrier_sync(4 + cw, 256);
    };
    const auto turn_end = [&](int st) {
      if constexpr (kTurns)
        if (!(st == n_steps - 1 && cw == 1)) named_barrier_arrive(4 + (cw ^ 1), 256);
    };
    if constexpr (kTurns)
      if (n_steps > 0 && cw == 1) named_barrier_arrive(4, 256);
    // Step st's query head h and first row m0, advanced at the end of each step (st / m_blocks and
    // st % m_blocks, an integer division every step, ran 0.2-0.5% slower: ablation at 49fa223).
    int h = hk * group, m0 = m_first;
    const int m_end = m_first + kM * m_blocks;
    // Counted over the block's tiles (gs), the step of the tile st = gs - g0 where needed.
    const uint32_t g_end = g0 + static_cast<uint32_t>(n_steps);
    bool after_first = false;  // (not gs != g0: g0 would stay live through the loop)
    for (uint32_t gs = g0; gs != g_end; ++gs) {
      const uint32_t st = gs - g0;
      const int s = gs % kStages;
      const uint32_t q_base = smem_u32(sq + s * Tr::kQBytes), do_base = smem_u32(sdo + s * Tr::kQBytes);
      unsigned char* ds_buf = sds + (gs % 2) * Tr::kDsBytes;
      mbarrier_wait(&full[s], (gs / kStages) & 1);
      mark(st, 0);

      // S^T = K Q^T and dP^T = V dO^T: d[4 j + 2 r + c] = key key_base + 8 r, query row 8 j + 2 t + c.
      // Both K-major: the next k-step is 32 bytes further along the 128-byte rows of a box.
      float sT[kM / 2], dpT[kM / 2];
      const auto gemm_t = [&](float (&acc)[kM / 2], uint32_t a_keys, uint32_t b_rows) {
        const uint64_t da0 = wgmma_desc_sw128(a_keys, 16, 1024), db0 = wgmma_desc_sw128(b_rows, 16, 1024);
        wgmma_fence_operands(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
          const uint32_t a_off = (kk / 4) * kN * 128 + (kk % 4) * 32, b_off = (kk / 4) * kM * 128 + (kk % 4) * 32;
          Wgmma<T, kM>::template mma<0, 0>(acc, wgmma_desc_sw128_at<kRebuildDesc>(da0, a_keys, 16, a_off),
                                           wgmma_desc_sw128_at<kRebuildDesc>(db0, b_rows, 16, b_off), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
      };
      turn_begin();
      gemm_t(sT, k_wg, q_base);
      gemm_t(dpT, v_wg, do_base);
      if constexpr (kProbe == 16) {
        if (dq_pending >= 0) {
          fence_proxy_async_smem();
          mbarrier_arrive(&dq_full[dq_pending]);
          dq_pending = -1;
        }
      }
      if (gs >= 2) mbarrier_wait(&ds_empty[gs % 2], ((gs - 2) / 2) & 1);  // both consumers' dQ of step gs - 2 done
      mark(st, 1);

      // P^T and dS^T g element by element, into the A fragments of dV's product (the accumulator's
      // n8 tiles 2 kk, 2 kk + 1 are k-step kk) and dS^T into shared memory, one 128-byte row per key
      // (its 64 query rows), swizzled like a TMA box. Thread's elements: tile j, e = 2 r + c: key
      // key_base + 8 r, query row m0 + 8 j + 2 t + c.
      const AttnBwdScore score(attn_score_mod(p, b, h, sb));
      const AttnScoreMod& mod = score.mod;
      const bool need_mask = attn_bwd_step_needs_mask(mod, m0, kM, n0, kN, sb.sk);
      const float* lse_s = slse + s * kM;
      const float* dsum_s = sdsum + s * kM;
      // The rows that see key key_base + 8 r, from this thread's first row m0 + 2 t (about 40
      // instructions). kLeanPass (the one-pass element-wise form: softcap / ALiBi, d 64): computed
      // only in the pass of steps that straddle the mask, and the dS^T store addresses by XOR (below):
      // 0.7-1.8% faster at d 64 (ablation, e163711 / 4eb3d39). The two-pass form (plain scores at
      // d 128) computes them every step before the wait for S^T, under which they hide, and each
      // store address from hopper_attn_swizzle: the lean forms there ran 1-2% slower at 8k.
      constexpr bool kLeanPass = kScoreMod || kM == 128;
      AttnBwdRowBounds seen_up_front[2] = {};
      if constexpr (!kLeanPass)
#pragma unroll
        for (int r = 0; r < 2; ++r) seen_up_front[r] = attn_bwd_row_bounds(mod, n0 + key_base + 8 * r, m0 + 2 * t, sb.sk);
      const auto row_bounds = [&](AttnBwdRowBounds (&seen)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          seen[r] = !kLeanPass ? seen_up_front[r] : attn_bwd_row_bounds(mod, n0 + key_base + 8 * r, m0 + 2 * t, sb.sk);
      };
      const auto visible = [](const AttnBwdRowBounds (&seen)[2], int j, int e) {
        return 8 * j + e % 2 >= seen[e / 2].lo && 8 * j + e % 2 <= seen[e / 2].hi;
      };
      // An element-wise pass over this thread's n8 tiles j (query rows 8 j + 2 t, + 1): body(j,
      // their lse log2(e), keep) with keep(e) whether element e is visible; the mask compiled in
      // only for steps that straddle it.
      const auto elementwise = [&](auto&& body) {
        const auto pass = [&](auto mask_tag) {
          constexpr bool kMask = decltype(mask_tag)::value;
          AttnBwdRowBounds seen[2] = {};
          if constexpr (kMask) row_bounds(seen);
#pragma unroll
          for (int j = 0; j < kM / 8; ++j) {
            const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + 8 * j + 2 * t);
            const float lse_c[2] = {lse2.x, lse2.y};
            body(j, lse_c, [&](int e) { return !kMask || visible(seen, j, e); });
          }
        };
        if (need_mask) pass(std::true_type{});
        else pass(std::false_type{});
      };
      uint32_t pa[kM / 16][4];
      // Accumulator n8 tile j (keys key_base and + 8, packed in pairs) as half of A fragment j / 2.
      const auto set_frag = [](uint32_t (&a)[kM / 16][4], int j, uint32_t lo, uint32_t hi) {
        a[j / 2][2 * (j % 2)] = lo, a[j / 2][2 * (j % 2) + 1] = hi;
      };
      const auto pack_p = [&](int j, const float (&pr)[4]) { set_frag(pa, j, pack2<T>(pr[0], pr[1]), pack2<T>(pr[2], pr[3])); };
      // dS^T: to shared memory (dQ's A operand, both consumers) and, with kDkRs, into the A
      // fragments of this consumer's dK product as well (pa's layout).
      uint32_t dsa[kM / 16][4];
      // Swizzled like a TMA box (hopper_attn_swizzle). kLeanPass: row key_base at ds_off0 (its
      // swizzle phase key_base % 8 in bits 4-6, column 2 t), tile j's 16-byte chunk j % 8 XORed
      // into bits 4-6, 64-row boxes kN rows apart; key_base + 8 (same phase) 8 rows further.
      const uint32_t ds_off0 = key_base * 128 + ((key_base % 8) << 4) + 4 * t;
      const auto store_ds = [&](int j, const float (&ds)[4]) {
        const uint32_t lo = pack2<T>(ds[0], ds[1]), hi = pack2<T>(ds[2], ds[3]);
        if constexpr (!kLeanPass) {
          *reinterpret_cast<uint32_t*>(ds_buf + hopper_attn_swizzle(key_base, 8 * j + 2 * t, kN)) = lo;
          *reinterpret_cast<uint32_t*>(ds_buf + hopper_attn_swizzle(key_base + 8, 8 * j + 2 * t, kN)) = hi;
        } else {
          unsigned char* at = ds_buf + (j / 8) * kN * 128 + (ds_off0 ^ ((j % 8) << 4));
          *reinterpret_cast<uint32_t*>(at) = lo;
          *reinterpret_cast<uint32_t*>(at + 8 * 128) = hi;
        }
        if constexpr (kDkRs) set_frag(dsa, j, lo, hi);
      };
      // dV += P^T dO: B = dO as an MN-major operand (16 rows of 128 bytes per k-step; 64-column
      // boxes kM rows apart).
      const auto issue_dv = [&] {
        const uint64_t db0 = wgmma_desc_sw128(do_base, kM * 128, 1024);
        wgmma_fence_operands(dv);
        wgmma_fence_operands(pa);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kM / 16; ++kk)
          WgmmaRs<T, kD>::template mma<1>(dv, pa[kk], wgmma_desc_sw128_at<kRebuildDesc>(db0, do_base, kM * 128, kk * 16 * 128), 1);
        wgmma_commit();
      };
      if constexpr (kScoreMod || kM == 128) {
        // Softcap / ALiBi, or 128-row steps (where P in fp32 next to P's fragments and dP^T spilled:
        // 144 bytes): one pass per element after both products (AttnBwdScore::p_ds).
        wgmma_wait<0>();
        wgmma_fence_operands(sT);
        wgmma_fence_operands(dpT);
        elementwise([&](int j, const float (&lse_c)[2], auto&& keep) {
          const float2 dsum = *reinterpret_cast<const float2*>(dsum_s + 8 * j + 2 * t);
          const float dsum_c[2] = {dsum.x, dsum.y};
          float pr[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + key_base + 8 * (e / 2), i = m0 + 8 * j + 2 * t + e % 2;
            score.template p_ds<kScoreMod, false>(sT[4 * j + e], dpT[4 * j + e], i, key, keep(e), lse_c[e % 2],
                                                  dsum_c[e % 2], dsum_c[e % 2] * mod.scale, 1.f, pr[e], ds[e]);
          }
          pack_p(j, pr);
          store_ds(j, ds);
        });
        issue_dv();
        if constexpr (kProbe == 7) turn_end(st);
      } else {
        // Plain scores: P as soon as S is done (dP^T still on the tensor cores), dV's product
        // issued, then dS from P in fp32 while dV runs.
        wgmma_wait<1>();
        mark(st, 2);
        wgmma_fence_operands(sT);
        elementwise([&](int j, const float (&lse_c)[2], auto&& keep) {
          float pr[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            pr[e] = keep(e) ? exp2_approx_ftz(fmaf(sT[4 * j + e], score.scale_log2, -lse_c[e % 2])) : 0.f;
            sT[4 * j + e] = pr[e];
          }
          pack_p(j, pr);
        });
        issue_dv();
        if constexpr (kProbe == 7) turn_end(st);
        mark(st, 3);
        // kProbe 13 (an experiment, 2026-11-27 (24)): D g of this thread's rows into registers
        // before the wait for dP^T (16 registers; not lse as well).
        float2 dsum_r[kProbe == 13 ? kM / 8 : 1];
        if constexpr (kProbe == 13) {
#pragma unroll
          for (int j = 0; j < kM / 8; ++j) {
            const float2 d = *reinterpret_cast<const float2*>(dsum_s + 8 * j + 2 * t);
            dsum_r[j] = make_float2(d.x * mod.scale, d.y * mod.scale);
          }
        }
        wgmma_wait<1>();  // dP^T done (dV may still run)
        mark(st, 4);
        wgmma_fence_operands(dpT);
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) {
          float dsum_g[2];
          if constexpr (kProbe == 13) {
            dsum_g[0] = dsum_r[j].x, dsum_g[1] = dsum_r[j].y;
          } else {
            const float2 dsum = *reinterpret_cast<const float2*>(dsum_s + 8 * j + 2 * t);
            dsum_g[0] = dsum.x * mod.scale, dsum_g[1] = dsum.y * mod.scale;
          }
          float ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[e] = sT[4 * j + e] * fmaf(dpT[4 * j + e], mod.scale, -dsum_g[e % 2]);
          store_ds(j, ds);
        }
      }
      // dK += dS^T Q: B = Q (MN-major, as dO above); A = dS^T from registers (kDkRs: issued at
      // once, before this consumer's half of the tile is even published), else this consumer's 64
      // keys of the dS^T tile (K-major: 16 rows are 32 bytes along a key's row of a 64-row box).
      const uint32_t ds_base = smem_u32(ds_buf);
      const auto issue_dk = [&] {
        const uint32_t ds_keys = ds_base + cwu * 64 * 128;  // this consumer's 64 keys of each 64-row box
        const uint64_t db0 = wgmma_desc_sw128(q_base, kM * 128, 1024), da0 = wgmma_desc_sw128(ds_keys, 16, 1024);
        wgmma_fence_operands(dk);
        if constexpr (kDkRs) wgmma_fence_operands(dsa);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kM / 16; ++kk) {
          const uint64_t b = wgmma_desc_sw128_at<kRebuildDesc>(db0, q_base, kM * 128, kk * 16 * 128);
          if constexpr (kDkRs)
            WgmmaRs<T, kD>::template mma<1>(dk, dsa[kk], b, 1);
          else
            Wgmma<T, kD>::template mma<0, 1>(
                dk, wgmma_desc_sw128_at<kRebuildDesc>(da0, ds_keys, 16, (kk / 4) * kN * 128 + (kk % 4) * 32), b, 1);
        }
        wgmma_commit();
      };
      constexpr bool kDkEarly = kDkRs && !kDqFirst;
      if constexpr (kDkEarly) issue_dk();
      fence_proxy_async_smem();  // the dS^T writes before the tensor cores read them
      mbarrier_arrive(&ds_full[gs % 2]);
      named_barrier_sync(2 + cw, 128);  // this consumer's half written
      mark(st, 5);

      if (kDqFirst && after_first) {
        if constexpr (kProbe == 8)
          dq_step(st - 1, gs - 1, [&] {
            issue_dk();
            turn_end(st);
          });
        else
          dq_step(st - 1, gs - 1, issue_dk, kProbe == 16);  // dQ of step st - 1, then this step's dK behind it
        wgmma_wait<0>();            // dK done: the Q stage may go
        wgmma_fence_operands(dk);
        mark(st, 10);
      } else {
        if constexpr (!kDkEarly) issue_dk();
        if constexpr (kProbe == 8) turn_end(st);
        if (after_first) {
          dq_step(st - 1, gs - 1, nullptr);
        } else {
          wgmma_wait<0>();
          wgmma_fence_operands(dv);
          wgmma_fence_operands(dk);
        }
      }
      mbarrier_arrive(&empty[s]);  // Q, dO, lse, D of this stage read
      m0 += kM;
      if (m0 == m_end) m0 = m_first, ++h;
      after_first = true;
    }
    if constexpr (kProbe == 16) {
      if (dq_pending >= 0) {  // the last loop step's deferred dQ tile: no score products follow
        fence_proxy_async_smem();
        mbarrier_arrive(&dq_full[dq_pending]);
      }
    }
    if (n_steps > 0) dq_step(n_steps - 1, g0 + n_steps - 1, nullptr);
    if constexpr (kPersistent) mbarrier_arrive(&kv_empty);  // K and V read: the producer may load the next tile's

    // dK, dV of this consumer's keys, written once (0 where no step ran). With args.dkdv_tma (the
    // one-block-per-tile kernel, fixed lengths) and steps run: staged in this consumer's 64 rows of
    // the K and V tiles (free once both consumers' last products are done: the other's dQ reads
    // every key of K) and stored by TMA, which clips at seqlen_k. (Stored straight from registers,
    // four bytes a thread and row, they cost 2-17% of the whole backward at 8k-512 keys: the
    // timing probe kProbe 14, 2026-11-27 (26).)
    if (!kPersistent && kProbe != 14 && kProbe != 15 && args.dkdv_tma != 0 && n_steps > 0) {
      named_barrier_sync(6, 256);  // both consumers' last products done: K and V are free
      hopper_bwd_stage_dkdv<T, kN, kD>(sk, sv, dk, dv, key_base, 0, t);
      fence_proxy_async_smem();  // the writes above before the TMA engine reads them
      named_barrier_sync(2 + cw, 128);
      if (t128 == 0) hopper_bwd_store_dkdv<kN, 1>(args, sk, sv, 0, Tr::kBoxes, 64 * cw, n0, hk, b);
      return;
    }
    const HopperBwdTile tl_out = kPersistent ? info_tile(it) : tl;
    const int b_out = tl_out.b, hk_out = tl_out.hk;
    const AttnBatch sb_out = kPersistent ? attn_batch(p, b_out) : sb;
    T* dk_out = static_cast<T*>(p.dk) + attn_offset(p, b_out, sb_out.k_row0, 0, hk_out, p.dk_batch_stride, p.dk_row_stride,
                                                     p.dk_head_stride);
    T* dv_out = static_cast<T*>(p.dv) + attn_offset(p, b_out, sb_out.k_row0, 0, hk_out, p.dv_batch_stride, p.dv_row_stride,
                                                     p.dv_head_stride);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = tl_out.n0 + key_base + 8 * r;
      // kProbe 14: no dK / dV stores (timing only): the stores stay in the code behind a condition the
      // compiler cannot see is false (seqlen_k < 0; removed, ptxas drops the dK / dV products too).
      if (key >= sb_out.sk || (kProbe == 14 && sb_out.sk >= 0)) continue;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) = pack2<T>(dk[4 * j + 2 * r], dk[4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) = pack2<T>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
  };
  if constexpr (kPersistent) {
    uint32_t g0 = 0;
#pragma unroll 1
    for (uint32_t it = 0;; ++it) {
      mbarrier_wait(&kv_full, it & 1);
      if (__reduce_max_sync(0xffffffffu, reinterpret_cast<const volatile int*>(&tile_info[it % 2])[3]) == 0) break;
      const HopperBwdTile tl = info_tile(it);
      const AttnBatch sb = attn_batch(p, tl.b);
      const HopperBwdSteps steps = hopper_bwd_steps<kM, kN>(p, sb, tl.n0);
      // g0 through REDUX too: the sum of the tiles' step counts (products with nheads / nheads_kv,
      // a division in ordinary registers) would take the step loop's stage addresses with it.
      consume(tl, sb, steps, __reduce_max_sync(0xffffffffu, g0), it);
      g0 += static_cast<uint32_t>(steps.n_steps);
    }
  } else {
    for_each_tile([&](const HopperBwdTile& tl, const AttnBatch& sb, const HopperBwdSteps& steps, uint32_t, uint32_t) {
      consume(tl, sb, steps, 0, 0);
    });
  }
  if (!kDqByProducer && t128 == 0) tma_store_wait_all<true>();  // shared memory must outlive the reductions' reads
#endif
}

}  // namespace flashlab::kernels
