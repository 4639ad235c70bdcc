// Body of launch_attn_hopper_hdim<kHeadDim> (rung 4), included by one
// src/attention_hopper_d<D>.cu per head dim: the tensor maps of q, k, v and o, the 1-D grid.
#pragma once

#include <algorithm>
#include <climits>

#include "kernels/attention/04_hopper.cuh"
#include "kernels/attention/04_hopper_fp8_v.cuh"
#include "kernels/attention/04_hopper_persistent.cuh"
#include "src/attention_hopper_dispatch.h"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/core/tensor_map.h"

namespace flashlab::detail {

// A (head dim, rows, heads, batch) tensor map with boxes of 128 bytes x box_rows rows. Dims of
// size > 1 keep the caller's strides (positive multiples of 16 bytes: validated for rung 4). A
// dim of size 1 may carry any stride in the caller's tensor (DLPack exporters write 1 or 0
// there); TMA never steps over it, so it gets the packed stride of the dims inside it.
inline CUtensorMap attn_tensor_map(const void* base, DType dtype, int headdim, int64_t rows, int64_t heads, int64_t batch,
                                   int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows) {
  const int64_t es = dtype_size(dtype);
  const int64_t dims[4] = {headdim, rows, heads, batch};
  const int64_t given[3] = {row_stride * es, head_stride * es, batch_stride * es};
  int64_t strides[3];
  int64_t packed = 16 * ceil_div(headdim * es, 16);  // bytes of one row, padded to 16
  for (int i = 0; i < 3; ++i) {
    strides[i] = dims[i + 1] > 1 ? given[i] : packed;
    packed = strides[i] * dims[i + 1];
  }
  const int box[4] = {static_cast<int>(128 / es), box_rows, 1, 1};
  return make_tensor_map_4d(base, dtype, dims, strides, box);
}

// FP8's V^T (kFp8VtPass): keys padded to a multiple of 128 per row; its bytes in the workspace (a
// multiple of 256).
inline int64_t attn_fp8_sk_pad(const AttnFwdParams& p) { return ceil_div(std::max(p.seqlen_k, 1), 128) * 128; }
inline int64_t attn_fp8_vt_bytes(const AttnFwdParams& p, int headdim) {
  return ceil_div(static_cast<int64_t>(p.batch) * p.nheads_kv * headdim * attn_fp8_sk_pad(p), 256) * 256;
}

// FP8 with kFp8VtPass (over more than 2k keys; else the kernel transposes V itself): V transposed
// into the stream's workspace (kernels/attention/04_hopper_fp8_v.cuh), (batch, kv heads, d,
// sk_pad), and its tensor map for Tr (HopperAttnArgs): (kVtChunk keys, d, key chunks, kv heads,
// batch), a block's chunks one box, swizzled over the chunk's bytes; chunks past sk_pad come
// zero-filled. extra_bytes > 0: as many more bytes of the workspace after V's, at *extra (256-byte
// aligned).
template <typename Tr>
CUtensorMap attn_fp8_transposed_v(const AttnFwdParams& p, cudaStream_t stream, int64_t extra_bytes = 0, void** extra = nullptr) {
  constexpr int kHeadDim = Tr::kHeadDim, kChunk = Tr::kVtChunk;
  const int64_t sk_pad = attn_fp8_sk_pad(p);
  const int64_t vt_bytes = attn_fp8_vt_bytes(p, kHeadDim);
  auto* vt = static_cast<uint8_t*>(workspace(stream, vt_bytes + extra_bytes));
  if (extra_bytes > 0) *extra = vt + vt_bytes;
  const dim3 grid(static_cast<unsigned>(sk_pad / kernels::kAttnFp8TransposeKeys), p.nheads_kv, p.batch);
  FLASHLAB_LAUNCH(kernels::attn_fp8_transpose_v_kernel<kHeadDim>, grid, kernels::kAttnFp8TransposeThreads, 0, stream, p, vt,
                  sk_pad);
  const int64_t dims[5] = {kChunk, kHeadDim, sk_pad / kChunk, p.nheads_kv, p.batch};
  const int64_t strides[4] = {sk_pad, kChunk, kHeadDim * sk_pad, p.nheads_kv * kHeadDim * sk_pad};
  const int box[5] = {kChunk, kHeadDim, Tr::kBlockN / kChunk, 1, 1};
  return make_tensor_map_5d(vt, DType::kE4M3, dims, strides, box, kChunk);
}

// True when no key block of p needs a mask at block width kN (kNoMask): fixed lengths, no causal /
// window, no softcap / ALiBi, not paged, seqlen_k a multiple of kN.
inline bool attn_hopper_no_mask(const AttnFwdParams& p, int kN) {
  return p.cu_seqlens_q == nullptr && p.kv_indptr == nullptr && p.window_left < 0 && p.window_right < 0 && p.softcap == 0.f &&
         p.alibi_slopes == nullptr && p.seqlen_k > 0 && p.seqlen_k % kN == 0;
}

// A kNoMask launcher's precondition (attn_hopper_no_mask), checked before any launch.
inline void check_attn_hopper_no_mask(const AttnFwdParams& p, int kN) {
  FLASHLAB_CHECK(attn_hopper_no_mask(p, kN), "attention_fwd: rung 4 without masks needs fixed lengths, no causal / window, no softcap / ",
                 "ALiBi and seqlen_k a multiple of ", kN, ", got seqlen_k ", p.seqlen_k);
}

// The kernel arguments of rung 4 (the tensor maps, m_blocks) for p; FP8 with kFp8VtPass: V
// transposed into the stream's workspace first (else the kernel transposes V as it loads it).
// extra_bytes > 0: as many bytes of the workspace at *extra (after V^T's).
template <typename T, int kHeadDim, bool kScoreMod, int kBlockN = 0, bool kPaged = false, int kConsumers = 2, bool kSumByMma = false,
          bool kFp8VtPass = false>
kernels::HopperAttnArgs attn_hopper_args(const AttnFwdParams& p, DType dtype, cudaStream_t stream, int64_t extra_bytes = 0,
                                         void** extra = nullptr) {
  using Tr = kernels::HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, static_cast<int>(sizeof(T)), kConsumers, kSumByMma>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t batch = varlen ? 1 : p.batch;  // varlen: packed rows, one "batch" in the maps
  kernels::HopperAttnArgs args{};
  args.p = p;
  // Varlen with no packed rows: a map needs non-zero dims; nothing is read through it then (every
  // row sees no key, or there is no row).
  const int64_t total_q = std::max<int64_t>(p.total_q, 1), total_k = std::max<int64_t>(p.total_k, 1);
  args.q = attn_tensor_map(p.q, dtype, kHeadDim, total_q, p.nheads, batch, p.q_row_stride, p.q_head_stride,
                           p.q_batch_stride, Tr::kBlockM);
  if constexpr (kPaged) {  // the caches as (head dim, page_size, kv heads, pages); o stored row by row (varlen)
    const int ps = p.page_size, n = Tr::kBlockN;
    const int box_rows = ps % 8 == 0 && n % ps == 0 ? ps : ps % n == 0 ? n : 0;  // 1024-byte aligned boxes (swizzle)
    if (box_rows > 0 && n / box_rows * Tr::kBoxes <= 32) {  // one warp issues a block's boxes
      args.page_box_rows = box_rows;
      const int64_t pages = std::max<int64_t>(p.total_k, 1);  // the pool's pages (the caller sets total_k)
      args.k = attn_tensor_map(p.k, dtype, kHeadDim, ps, p.nheads_kv, pages, p.k_row_stride, p.k_head_stride, p.k_batch_stride, box_rows);
      args.v = attn_tensor_map(p.v, dtype, kHeadDim, ps, p.nheads_kv, pages, p.v_row_stride, p.v_head_stride, p.v_batch_stride, box_rows);
      if (ps == 16) {  // V k-step-major, a box per page (kernels/attention/04_hopper.cuh, HopperAttnArgs)
        const int64_t es = dtype_size(dtype);
        const int64_t dims[5] = {64, 16, Tr::kBoxes, p.nheads_kv, pages};
        // A dim of size 1 (one KV head, one page) may carry any stride in the caller's tensor; TMA
        // never steps it: it gets a valid one (16 rows' bytes).
        const int64_t rows_bytes = 16 * p.v_row_stride * es;
        const int64_t head_bytes = p.nheads_kv > 1 ? p.v_head_stride * es : rows_bytes;
        const int64_t strides[4] = {p.v_row_stride * es, 128, head_bytes, pages > 1 ? p.v_batch_stride * es : rows_bytes};
        const int box[5] = {64, 16, Tr::kBoxes, 1, 1};
        args.v = make_tensor_map_5d(p.v, dtype, dims, strides, box);
        args.v_step_major = 1;
      }
    }
  } else {
    args.k = attn_tensor_map(p.k, dtype, kHeadDim, total_k, p.nheads_kv, batch, p.k_row_stride, p.k_head_stride,
                             p.k_batch_stride, Tr::kBlockN);
  }
  if constexpr (Tr::kFp8 && kFp8VtPass) {  // bf16 output, stored from registers: no map for o
    args.v = attn_fp8_transposed_v<Tr>(p, stream, extra_bytes, extra);
  } else if constexpr (!kPaged) {
    args.v = attn_tensor_map(p.v, dtype, kHeadDim, total_k, p.nheads_kv, batch, p.v_row_stride, p.v_head_stride,
                             p.v_batch_stride, Tr::kBlockN);
    if constexpr (!Tr::kFp8)
      args.o = attn_tensor_map(p.o, dtype, kHeadDim, total_q, p.nheads, batch, p.o_row_stride, p.o_head_stride,
                               p.o_batch_stride, 64);
  }
  if constexpr (!(Tr::kFp8 && kFp8VtPass))
    if (extra_bytes > 0) *extra = workspace(stream, extra_bytes);
  args.m_blocks = static_cast<int>(ceil_div(p.seqlen_q, Tr::kBlockM));
  return args;
}

// HopperAttnArgs::tail_heads for p at this head dim: tail_heads pairs if >= 0 (at most all of them),
// else the library's (attn_hopper_tail_heads over `ctas` CTAs at work at once).
template <int kHeadDim>
int attn_hopper_walk_tail(const AttnFwdParams& p, DType dtype, int ctas, int tail_heads) {
  const int64_t pairs = static_cast<int64_t>(p.nheads) * p.batch;
  if (tail_heads >= 0) return static_cast<int>(std::min<int64_t>(tail_heads, pairs));
  const int64_t kv_bytes = static_cast<int64_t>(p.seqlen_k) * kHeadDim * 2 * dtype_size(dtype);  // a pair's K and V
  return attn_hopper_tail_heads(p.window_right, kv_bytes, ctas, pairs);
}

// Query blocks (of Tr::kBlockM rows) x heads x batches of rung 4 for p: the one-CTA kernel's
// CTAs, the persistent kernel's tiles; checked to fit an int. args_named: the op and arguments
// that set them, for the message.
template <typename Tr>
int attn_hopper_tiles(const kernels::HopperAttnArgs& args, const AttnFwdParams& p, const char* args_named) {
  const int64_t tiles = static_cast<int64_t>(args.m_blocks) * p.nheads * p.batch;
  FLASHLAB_CHECK(tiles <= INT_MAX, args_named, ": expected at most 2^31 - 1 query blocks of ", Tr::kBlockM,
                 " rows x heads x batches for rung 4, got ", tiles);
  return static_cast<int>(tiles);
}

// True when the one-CTA kernel can run p in CTA pairs (kCluster 2, kernels/attention/04_hopper.cuh):
// fixed lengths, no causal / window, not paged, an even count of query blocks (the two CTAs of a pair
// on adjacent query blocks of one (batch, head), so on the same key blocks).
inline bool attn_hopper_pairs(const AttnFwdParams& p, int block_m) {
  return p.cu_seqlens_q == nullptr && p.kv_indptr == nullptr && p.window_left < 0 && p.window_right < 0 && p.seqlen_k > 0 &&
         ceil_div(p.seqlen_q, block_m) % 2 == 0;
}

// kSplitTail (fixed lengths, not paged; the library's FP8 kernel without a mask and causal, head
// dim 64's without a mask): the last, partial wave's tiles split along the keys
// (attn_hopper_split_tail; HopperAttnArgs), their parts merged by a second kernel. kCluster 2: CTA
// pairs sharing each K / V block by multicast (attn_hopper_pairs, checked).
template <typename T, int kHeadDim, bool kScoreMod, bool kPingpong, bool kOverlap, int kBlockN = 0, bool kPaged = false,
          bool kPinWait = (kHeadDim == 128), bool kDescAdvance = true, bool kRescaleUnderQk = false, int kConsumers = 2,
          bool kLazyRescale = kernels::kAttnLazyRescaleDefault<T, kHeadDim>, bool kTreeReduce = kernels::kAttnTreeReduceDefault<T, kHeadDim>,
          bool kSpecialized = true, bool kSumByMma = false, bool kSplitTail = false, bool kFp8VtPass = false, bool kNoMask = false,
          int kCluster = 1>
void launch_attn_hopper_variant(const AttnFwdParams& p, DType dtype, cudaStream_t stream, bool fp8_pdl = true, int tail_heads = -1) {
  using Tr = kernels::HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, static_cast<int>(sizeof(T)), kConsumers, kSumByMma>;
  if constexpr (kNoMask) check_attn_hopper_no_mask(p, Tr::kBlockN);
  if constexpr (kCluster > 1)
    FLASHLAB_CHECK(attn_hopper_pairs(p, Tr::kBlockM), "attention_fwd: rung 4 in CTA pairs needs fixed lengths, no causal / window ",
                   "and an even count of ", Tr::kBlockM, "-row query blocks, got seqlen_q ", p.seqlen_q, ", window (",
                   p.window_left, ", ", p.window_right, ")");
  // kSplitTail: the tiles are ceil(seqlen_q / kBlockM) x heads x batch, each of every key block.
  const int64_t all_tiles = ceil_div(p.seqlen_q, Tr::kBlockM) * p.nheads * p.batch;
  AttnSplitTail split =
      kSplitTail ? attn_hopper_split_tail(all_tiles, sm_count(), static_cast<int>(ceil_div(p.seqlen_k, Tr::kBlockN)))
                 : AttnSplitTail{0, 1};
  int64_t units = split.splits > 1 ? (all_tiles - split.from) * split.splits : 0;  // the parts' CTAs
  constexpr int64_t kUnitBytes = Tr::kBlockM * (kHeadDim + 1) * 4;                 // O / l, then the LSEs
  // Under CUDA-graph capture (no cudaMalloc) only into a workspace that holds the parts already
  // (and kFp8VtPass's V^T): else no split, as the persistent kernel's choice (launch_attn_hopper_hdim).
  if (units > 0 && capturing(stream) &&
      workspace_if_ready(stream, (Tr::kFp8 && kFp8VtPass ? attn_fp8_vt_bytes(p, kHeadDim) : 0) + units * kUnitBytes,
                         Workspace::kScratch) == nullptr) {
    split = AttnSplitTail{0, 1};
    units = 0;
  }
  const int64_t tiles_split = units / split.splits, part_o_bytes = units * Tr::kBlockM * kHeadDim * 4;
  void* parts = nullptr;
  kernels::HopperAttnArgs args =
      attn_hopper_args<T, kHeadDim, kScoreMod, kBlockN, kPaged, kConsumers, kSumByMma, kFp8VtPass>(p, dtype, stream,
                                                                                                  units * kUnitBytes, &parts);
  const int tiles = attn_hopper_tiles<Tr>(
      args, p, kPaged ? "batch_prefill_paged: arguments 'q', 'max_qo_len'" : "attention_fwd: arguments 'q', 'max_seqlen_q'");
  args.split_from = split.splits > 1 ? split.from : tiles;
  args.splits = split.splits;
  args.part_o = static_cast<float*>(parts);
  args.part_lse = parts != nullptr ? reinterpret_cast<float*>(static_cast<char*>(parts) + part_o_bytes) : nullptr;
  // The grid's tail in rounds of one query block (HopperAttnArgs::tail_heads; -1: the library's,
  // attn_hopper_tail_heads over the CTAs resident at once), not with kSplitTail (its split tiles are the
  // grid's last, of equal length) or paged.
  // (kCluster: none; a pair's two CTAs are adjacent query blocks of one pair in the grid's order.)
  if (!kSplitTail && !kPaged && kCluster == 1)
    args.tail_heads = attn_hopper_walk_tail<kHeadDim>(p, dtype, sm_count() * Tr::kCtasPerSm, tail_heads);
  const auto kernel = kernels::attn_hopper_kernel<T, kHeadDim, kScoreMod, kPingpong, kOverlap, kBlockN, kPaged, kPinWait,
                                                   kDescAdvance, kRescaleUnderQk, kConsumers, kLazyRescale, kTreeReduce, kSpecialized,
                                                   kSumByMma, kSplitTail, kFp8VtPass, kNoMask, kCluster>;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  if constexpr (Tr::kCtasPerSm > 1)  // the largest shared-memory carveout, so that two CTAs fit an SM
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const int threads = kSpecialized ? Tr::kThreads : 128 * kConsumers;  // without the producer warpgroup
  const int64_t ctas = tiles + units - tiles_split;
  FLASHLAB_CHECK(ctas <= INT_MAX, "attention_fwd: arguments 'q', 'max_seqlen_q': expected at most 2^31 - 1 CTAs, got ", ctas);
  if (Tr::kFp8 && kFp8VtPass && fp8_pdl) {
    // After the V^T pass: programmatic dependent launch, the CTAs starting during the pass's tail
    // (its producer waits for the pass before loading V^T; fp8_pdl false: the ablation's plain launch).
    launch_programmatic(kernel, dim3(static_cast<unsigned>(ctas)), dim3(static_cast<unsigned>(threads)), Tr::kSmemBytes, stream, args);
  } else if constexpr (kCluster > 1) {
    launch_clustered(kernel, dim3(static_cast<unsigned>(ctas)), dim3(static_cast<unsigned>(threads)), Tr::kSmemBytes, stream, kCluster,
                     args);
  } else {
    FLASHLAB_LAUNCH(kernel, static_cast<unsigned>(ctas), threads, Tr::kSmemBytes, stream, args);
  }
  if constexpr (kSplitTail) {
    if (tiles_split == 0) return;
    constexpr int kRowsPerCta = 8;  // a warp per row
    const auto merge = kernels::attn_hopper_merge_tail_kernel<kHeadDim, Tr::kBlockM, kAttnSplitTailMax, kernels::HopperAttnOut<T>>;
    FLASHLAB_LAUNCH(merge, static_cast<unsigned>(ceil_div(tiles_split * Tr::kBlockM, kRowsPerCta)), 32 * kRowsPerCta, 0, stream,
                    args, static_cast<int>(tiles_split));
  }
}

// The one-CTA kernel with the library's switches (two consumer warpgroups, pingpong, overlap) on
// kBlockN-key blocks, in CTA pairs that load each K / V block once, multicast into both (kCluster 2;
// attn_hopper_pairs, checked). Measured slower than the same kernel alone: the ablation's and the
// tests', not the library's (docs/ladder/attention.md).
template <typename T, int kHeadDim, bool kScoreMod, int kBlockN = 0>
void launch_attn_hopper_pairs(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true, kBlockN, false, (kHeadDim == 128), true, false, 2,
                             kernels::kAttnLazyRescaleDefault<T, kHeadDim>, kernels::kAttnTreeReduceDefault<T, kHeadDim>, true, false,
                             false, false, false, 2>(p, dtype, stream);
}

// The persistent kernel's two counters (next tile, CTAs done), in the stream's counters workspace.
constexpr int64_t kAttnHopperPersistentCounterBytes = 2 * sizeof(int);

// Rung 4's persistent form (kernels/attention/04_hopper_persistent.cuh): the arguments of rung 4,
// its counters in the stream's zero-filled counters workspace (the kernel leaves them zero),
// min(work items, SMs) CTAs. kSplitTail (no mask, fixed lengths: the caller's choice): the last
// tiles split along the keys where attn_hopper_persistent_split_tail (with split_min_saving >= 0) says,
// their parts' fp32 rows in the stream's workspace; under CUDA-graph capture only into workspaces
// that hold them already, else unsplit. tail_heads: the walk's tail (HopperAttnArgs; -1: the
// library's, attn_hopper_tail_heads).
template <typename T, int kHeadDim, bool kScoreMod, int kBlockN = 0, bool kCarryTurns = true,
          bool kSharedTile = (kHeadDim < 128 || !kScoreMod), int kStages = 2,
          bool kLazyRescale = kernels::kAttnLazyRescaleDefault<T, kHeadDim>, int kConsumers = 2,
          bool kTreeReduce = kernels::kAttnTreeReduceDefault<T, kHeadDim>,
          bool kPingpong = kernels::kAttnPersistentPingpongDefault<kHeadDim, kConsumers>, bool kStoreWait = true,
          bool kDirectO = false, bool kEarlyQProbe = false, bool kStageO = false, bool kSumByMma = false, bool kSplitTail = false,
          bool kNoMask = false, bool kPeelMask = false, bool kHalfLast = false, int kLag = 0, int kTailKeys = 0, bool kOwnO = false,
          bool kStmatrix = (kLag > 0), bool kStoreWaitLate = false, bool kExpTurns = false, bool kSerial = false>
void launch_attn_hopper_persistent(const AttnFwdParams& p, DType dtype, cudaStream_t stream, double split_min_saving = 0.01,
                                   int tail_heads = -1) {
  using Tr = kernels::HopperAttnPersistentTraits<kHeadDim, kScoreMod, kBlockN, kStages, kConsumers, kSumByMma, kOwnO>;
  if constexpr (kNoMask) check_attn_hopper_no_mask(p, Tr::kBlockN);
  const int64_t tiles = ceil_div(p.seqlen_q, Tr::kBlockM) * p.nheads * p.batch;
  constexpr int64_t kUnitBytes = Tr::kBlockM * (kHeadDim + 1) * 4;  // a part's O / l, then its LSEs
  AttnSplitTail split{0, 1};
  const auto split_tiles = [&] { return split.splits > 1 ? tiles - split.from : int64_t{0}; };
  const auto counter_bytes = [&] { return kAttnHopperPersistentCounterBytes + split_tiles() * kConsumers * static_cast<int64_t>(sizeof(int)); };
  if constexpr (kSplitTail) {
    split = attn_hopper_persistent_split_tail(tiles, sm_count(), static_cast<int>(ceil_div(p.seqlen_k, Tr::kBlockN)), split_min_saving);
    if (split.splits > 1 && capturing(stream) &&
        (workspace_if_ready(stream, split_tiles() * split.splits * kUnitBytes, Workspace::kScratch) == nullptr ||
         workspace_if_ready(stream, counter_bytes(), Workspace::kCounters) == nullptr))
      split = AttnSplitTail{0, 1};
    // No split: the kernel without the parts' code (split_min_saving < 0: the kSplitTail kernel
    // unsplit, the ablation's measure of that code's cost).
    if (split.splits == 1 && split_min_saving >= 0)
      return launch_attn_hopper_persistent<T, kHeadDim, kScoreMod, kBlockN, kCarryTurns, kSharedTile, kStages, kLazyRescale, kConsumers,
                                           kTreeReduce, kPingpong, kStoreWait, kDirectO, kEarlyQProbe, kStageO, kSumByMma, false, kNoMask,
                                           kPeelMask, kHalfLast, kLag, kTailKeys, kOwnO, kStmatrix, kStoreWaitLate, kExpTurns,
                                           kSerial>(p, dtype, stream,
                                                                                                                    split_min_saving,
                                                                                                                    tail_heads);
  }
  const int64_t units = split_tiles() * split.splits;
  void* parts = nullptr;
  kernels::HopperAttnArgs args =
      attn_hopper_args<T, kHeadDim, kScoreMod, kBlockN, false, kConsumers, kSumByMma>(p, dtype, stream, units * kUnitBytes, &parts);
  const int n_tiles = attn_hopper_tiles<Tr>(args, p, "attention_fwd: arguments 'q', 'max_seqlen_q'");
  if (n_tiles == 0) return;
  const int64_t items = split.splits > 1 ? split.from + units : n_tiles;
  FLASHLAB_CHECK(items <= INT_MAX, "attention_fwd: arguments 'q', 'max_seqlen_q': expected at most 2^31 - 1 work items, got ", items);
  args.split_from = split.splits > 1 ? split.from : n_tiles;
  args.splits = split.splits;
  args.tail_heads = attn_hopper_walk_tail<kHeadDim>(p, dtype, sm_count(), tail_heads);
  args.part_o = static_cast<float*>(parts);
  args.part_lse = parts != nullptr ? reinterpret_cast<float*>(static_cast<char*>(parts) + units * Tr::kBlockM * kHeadDim * 4) : nullptr;
  auto* counters = static_cast<int*>(workspace(stream, counter_bytes(), Workspace::kCounters));
  const auto kernel = kernels::attn_hopper_persistent_kernel<T, kHeadDim, kScoreMod, kBlockN, kCarryTurns, kSharedTile, kStages,
                                                              kLazyRescale, kConsumers, kTreeReduce, kPingpong, kStoreWait, kDirectO,
                                                              kEarlyQProbe, kStageO, kSumByMma, kSplitTail, kNoMask, kPeelMask,
                                                              kHalfLast, kLag, kTailKeys, kOwnO, kStmatrix, kStoreWaitLate, kExpTurns,
                                                              kSerial>;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const auto grid = static_cast<unsigned>(std::min<int64_t>(items, sm_count()));
  FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, args, counters, static_cast<int>(items));
}

// The persistent kernel with the library's choices for every switch but these: kConsumers consumer
// warpgroups on kBlockN-key blocks, the loop / tail forms kSplitTail, kNoMask, kPeelMask, kHalfLast
// (kTailKeys), a K/V ring of kStages with a lag of kLag blocks, the O store's wait kStoreWaitLate (by
// default the library's at head dim 128, kAttnHopperStoreWaitLate), O's own staging tile kOwnO and O
// written to its staging tile by stmatrix (kStmatrix).
template <typename T, int kHeadDim, bool kScoreMod, int kConsumers = 2, int kBlockN = 0, bool kSplitTail = false, bool kNoMask = false,
          bool kPeelMask = false, bool kHalfLast = false, int kTailKeys = 0, int kStages = 2, int kLag = 0,
          bool kStoreWaitLate = kAttnHopperStoreWaitLate<kHeadDim, kScoreMod>, bool kOwnO = false, bool kStmatrix = (kLag > 0),
          bool kExpTurns = false, bool kSerial = false>
void launch_attn_hopper_persistent_as(const AttnFwdParams& p, DType dtype, cudaStream_t stream, double split_min_saving = 0.01,
                                      int tail_heads = -1) {
  launch_attn_hopper_persistent<T, kHeadDim, kScoreMod, kBlockN, true, (kHeadDim < 128 || !kScoreMod), kStages,
                                kernels::kAttnLazyRescaleDefault<T, kHeadDim>, kConsumers, kernels::kAttnTreeReduceDefault<T, kHeadDim>,
                                kernels::kAttnPersistentPingpongDefault<kHeadDim, kConsumers>, true, false, false, false, false, kSplitTail,
                                kNoMask, kPeelMask, kHalfLast, kLag, kTailKeys, kOwnO, kStmatrix, kStoreWaitLate, kExpTurns, kSerial>(
      p, dtype, stream, split_min_saving, tail_heads);
}

// Each consumer warpgroup on its own blocks of the tile, a half last block where its rows see only
// that (kHalfLast; kTailKeys > 0: its first kTailKeys keys rather than half), with the masked blocks
// peeled off or not.
template <typename T, int kHeadDim, bool kScoreMod, int kConsumers = 2, int kBlockN = 0, bool kPeelMask = false, int kTailKeys = 0>
void launch_attn_hopper_persistent_half(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_persistent_as<T, kHeadDim, kScoreMod, kConsumers, kBlockN, false, false, kPeelMask, true, kTailKeys>(p, dtype, stream);
}

// Head dim 256 (no softcap / ALiBi) on 64-key blocks with O staged in a tile of its own and the Q
// buffer given back after each warpgroup's last Q K^T of the tile (kOwnO), the block loop split
// around the masked blocks (kPeelMask) or not, each warpgroup on its own blocks (kHalfLast) or not, O
// written to its tile by stmatrix (kStmatrix) or by 4-byte stores.
template <typename T, bool kPeelMask, bool kHalfLast = false, bool kStmatrix = false>
void launch_attn_hopper_persistent_own_o(const AttnFwdParams& p, DType dtype, cudaStream_t stream, int tail_heads = -1) {
  launch_attn_hopper_persistent_as<T, 256, false, 2, 64, false, false, kPeelMask, kHalfLast, 0, 2, 0, false, true, kStmatrix>(
      p, dtype, stream, 0.01, tail_heads);
}

// Its last tiles split (kSplitTail; no mask, fixed lengths): measured slower than without the
// split (bench/experiments/attention_hopper_ablation.cu --tail, docs/ladder/attention.md), not the
// library's.
template <typename T, int kHeadDim>
void launch_attn_hopper_persistent_split(const AttnFwdParams& p, DType dtype, cudaStream_t stream, double min_saving = 0.01) {
  launch_attn_hopper_persistent_as<T, kHeadDim, false, 2, 0, true>(p, dtype, stream, min_saving);
}

// Without softcap / ALiBi where no block needs a mask (kNoMask: fixed lengths, no causal / window,
// seqlen_k a multiple of the key block).
template <typename T, int kHeadDim>
void launch_attn_hopper_persistent_nomask(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_persistent_as<T, kHeadDim, false, 2, 0, false, true>(p, dtype, stream);
}

// Its block loop split around the masked blocks (kPeelMask).
template <typename T, int kHeadDim, bool kScoreMod, int kConsumers = 2, int kBlockN = 0>
void launch_attn_hopper_persistent_peel(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_persistent_as<T, kHeadDim, kScoreMod, kConsumers, kBlockN, false, false, true>(p, dtype, stream);
}

// Head dim 64 (two consumer warpgroups, no softcap / ALiBi) on a K/V ring of kStages, the second
// warpgroup kLag blocks behind the first (kLag; 0: none); kNoMask as launch_attn_hopper_persistent_nomask;
// the O store waited for after the next tile's first Q K^T (kStoreWaitLate) or not; the two warpgroups
// taking turns for their exponentials (kExpTurns; without a lag) or not.
template <typename T, bool kNoMask, int kStages, int kLag, bool kStoreWaitLate = false, bool kExpTurns = false>
void launch_attn_hopper_persistent_lag(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_persistent_as<T, 64, false, 2, 0, false, kNoMask, false, false, 0, kStages, kLag, kStoreWaitLate, false, (kLag > 0),
                                   kExpTurns>(p, dtype, stream);
}

// That kernel (head dim 64, no softcap / ALiBi, three consumer warpgroups, 96-key blocks), each
// consumer warpgroup on its own blocks of the tile (kHalfLast: on the causal diagonal the first
// skips the tile's last block, the second takes it half): +1.7% at 2k keys causal, the library's
// shape for it (H100, 2026-11-27, 7c55ecd and cffc2db; with two consumer warpgroups it loses 1-5% at
// d 64 and 1.5-2.3% at d 128; docs/ladder/attention.md); with its masked blocks peeled off
// (kPeelMask) +0.8..+1.0% more (cffc2db, b4bd2e8 twice); the O store waited for late (kStoreWaitLate).
// The library's for causal with a left window above 1k keys (plain causal: the two-warpgroup ring with
// turns for the exponentials since 2026-11-29, kAttnHopperExpTurnsCausalUpTo64).
template <typename T>
void launch_attn_hopper_persistent_three(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  launch_attn_hopper_persistent_as<T, 64, false, 3, kAttnHopperPersistentThreeBlockN, false, false, true, true, 0, 2, 0, true>(p, dtype,
                                                                                                                          stream);
}

template <int kHeadDim>
void launch_attn_hopper_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  if constexpr (kHeadDim == 128) {  // FP8: head dim 128 only (validated)
    if (dtype == DType::kE4M3) {
      using F8 = __nv_fp8_e4m3;
      // V^T from the pass before the kernel over long keys (kAttnHopperFp8VtInKernelUpTo), into the
      // stream's workspace: under CUDA-graph capture only if that holds it already (no cudaMalloc).
      const bool vt_pass = p.seqlen_k > kAttnHopperFp8VtInKernelUpTo &&
                           (!capturing(stream) || workspace_if_ready(stream, attn_fp8_vt_bytes(p, kHeadDim), Workspace::kScratch) != nullptr);
      BOOL_SWITCH(vt_pass, kVtPass, [&] {
        // With softcap / ALiBi: two consumer warpgroups, pingpong turns, intra-warpgroup overlap.
        if (p.softcap > 0.f || p.alibi_slopes != nullptr) {
          launch_attn_hopper_variant<F8, kHeadDim, true, true, true, 0, false, true, true, false, 2,
                                     kernels::kAttnLazyRescaleDefault<F8, kHeadDim>, kernels::kAttnTreeReduceDefault<F8, kHeadDim>,
                                     true, false, false, kVtPass>(p, dtype, stream);
          return;
        }
        // Without: three consumer warpgroups on 128-key blocks, one GEMM at a time (no overlap: S, P
        // and O fit 160 registers so), no pingpong turns; without an LSE out, the rows' sums by the
        // tensor cores (kSumByMma: the sums of the e4m3-rounded P; O / l as accurate, the LSE not to
        // fp32's 2^-12 of the logits: 0.004-0.02 off in Attention.Fp8Rung4). Against the kernel before
        // (two warpgroups, pingpong, overlap), H100, 2026-11-26, 91b6165, bench/experiments/
        // attention_hopper_ablation.cu --fp8 (docs/ladder/attention.md): without a mask +5.5..+17.9%
        // (sums by the tensor cores) / +3.2..+8.7% (fp32 sums) at 512-16k keys; causal +5.6..+12.3% /
        // +2.1..+5.6% from 2k, but 0.4-4.4% slower at 512-1k, where the kernel before stays (its
        // transpose in the kernel: kVtPass is false there).
        if constexpr (!kVtPass)
          if (p.window_right == 0 && p.seqlen_k <= kAttnHopperFp8TwoWarpgroupsUpToCausal) {
            launch_attn_hopper_variant<F8, kHeadDim, false, true, true>(p, dtype, stream);
            return;
          }
        // Without a mask or causal, fixed lengths: the last, partial wave's tiles split along the keys
        // (kSplitTail, attn_hopper_split_tail; H100, d5a28f9: +3.8% / +4.3% at 8k / 16k keys, causal
        // +0.3..+2.6% from 2k although its tiles are unequal; docs/ladder/attention.md).
        const bool split_tail = p.window_left < 0 && p.window_right <= 0 && p.cu_seqlens_q == nullptr;
        BOOL_SWITCH(p.lse == nullptr, kSumByMma, [&] {
          BOOL_SWITCH(split_tail, kSplitTail, [&] {
            // (no pingpong, no overlap, 128-key blocks, ..., 3 consumers, lazy rescale, no tree, a producer warpgroup)
            launch_attn_hopper_variant<F8, kHeadDim, false, false, false, 128, false, true, true, false, 3, true, false, true,
                                       kSumByMma, kSplitTail, kVtPass>(p, dtype, stream);
          });
        });
      });
      return;
    }
  }
  // Varlen with no packed key (or query) rows: every row sees no key (0 output, -inf lse) or
  // there is nothing to write: the FA2 rung does that without tensor maps.
  if (p.total_q == 0 || p.total_k == 0) return launch_attn_flash2(p, dtype, stream);
  BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
    HALF_DTYPE_SWITCH(dtype, T, [&] {
      // Short key sequences at head dims 64, 128 and 256: the persistent kernel, whose producer loads the
      // next tile's Q and first K/V blocks under this tile's math and epilogue. Against the
      // one-CTA kernels (interleaved timing, H100, 2026-11-26, cafac17; docs/ladder/attention.md):
      // d 128 +4.8% / +1.4% at 2k / 4k keys (against the better of 128- and 176-key blocks), causal
      // +9% / +4%, equal or slower from 8k; d 64 (against three consumer warpgroups) +3.7% at 1k
      // keys, slower beyond, causal +1.9% at 2k, where three consumer warpgroups in it win by 4.4%
      // (kAttnHopperPersistentThreeAboveCausal; hence the thresholds; below them it wins by more);
      // d 256 without softcap / ALiBi (one Q buffer) +3.4% at 512 keys, causal +2.4% at 512-1k
      // (595fb66); d 128 plain causal up to 8k keys since 2026-11-29 (kAttnHopperPersistentUpToPlainCausal128).
      // Under CUDA-graph capture only if its counters exist on this stream already (capture allows
      // no cudaMalloc): a first call captured on a fresh stream takes the one-CTA kernel.
      if constexpr (kHeadDim == 64 || kHeadDim == 128 || (kHeadDim == 256 && !kScoreMod))
        if (p.seqlen_k <= attn_hopper_persistent_reach<kHeadDim>(kScoreMod, p.window_right == 0, p.window_left) &&
            (!capturing(stream) ||
             workspace_if_ready(stream, kAttnHopperPersistentCounterBytes, Workspace::kCounters) != nullptr)) {
          if constexpr (kHeadDim == 64 && !kScoreMod) {
            // Plain causal: the two-warpgroup ring of four stages, the consumer warpgroups taking
            // turns for their exponentials (kAttnHopperExpTurnsCausalUpTo64: the persistent kernel's
            // whole causal reach here); with a left window above 1k keys three consumer warpgroups.
            static_assert(kAttnHopperExpTurnsCausalUpTo64 == kAttnHopperPersistentUpToCausal<64>,
                          "the turns ring, measured up to 2k keys, takes every plain causal length here");
            if (p.window_right == 0 && p.window_left < 0)
              return launch_attn_hopper_persistent_lag<T, false, kAttnHopperDeepRingStagesCausal, 0, true, true>(p, dtype, stream);
            if (p.window_right == 0 && p.seqlen_k > kAttnHopperPersistentThreeAboveCausal)
              return launch_attn_hopper_persistent_three<T>(p, dtype, stream);
            // Where no block needs a mask: the kernel without the mask code (kNoMask), +2.9..3.3% /
            // +4.8..4.9% at 512 / 1k keys (H100, 2026-11-27, ff6251f and 3674219, three runs; at d 128
            // within +-0.2%: docs/ladder/attention.md).
            // Without a mask a deeper K/V ring over the persistent kernel's whole reach here (up to
            // 1k keys), the second consumer warpgroup started blocks behind the first (kLag), so
            // that one's tile boundaries fall under the other's block loop, from
            // kAttnHopperDeepRingUpTo keys on with the O store waited for late (kStoreWaitLate).
            static_assert(kAttnHopperPersistentUpTo<64> == 1024, "the late deep rings, measured up to 1k keys, take every length here");
            if (attn_hopper_no_mask(p, kernels::HopperAttnPersistentTraits<64, false>::kBlockN)) {
              if (p.seqlen_k <= kAttnHopperDeepRingUpTo)
                return launch_attn_hopper_persistent_lag<T, true, kAttnHopperDeepRingStages, kAttnHopperDeepRingLag>(p, dtype, stream);
              return launch_attn_hopper_persistent_lag<T, true, kAttnHopperDeepRingStages, kAttnHopperDeepRingLag, true>(p, dtype, stream);
            }
          }
          // Head dim 128 from 2k keys, and head dim 256: the block loop split around the masked
          // blocks (kPeelMask, kAttnHopperPeelFrom).
          if constexpr (kHeadDim == 128 && !kScoreMod)
            if (p.seqlen_k >= kAttnHopperPeelFrom) return launch_attn_hopper_persistent_peel<T, 128, false>(p, dtype, stream);
          // Head dim 256: 64-key blocks and O's own staging tile, the Q buffer given back early
          // (kOwnO) up to kAttnHopperOwnOUpTo256 keys, with window_right 0 over the whole causal reach
          // of the persistent kernel (kAttnHopperOwnOUpToCausal256), plain causal also with each
          // warpgroup on its own blocks (kHalfLast); above, without a mask, 80-key blocks.
          if constexpr (kHeadDim == 256) {
            const bool causal = p.window_right == 0;
            if (p.seqlen_k <= (causal ? kAttnHopperOwnOUpToCausal256 : kAttnHopperOwnOUpTo256)) {
              if (causal && p.window_left < 0) return launch_attn_hopper_persistent_own_o<T, true, true>(p, dtype, stream);
              return launch_attn_hopper_persistent_own_o<T, true>(p, dtype, stream);
            }
            return launch_attn_hopper_persistent_peel<T, 256, false>(p, dtype, stream);
          }
          return launch_attn_hopper_persistent_as<T, kHeadDim, kScoreMod>(p, dtype, stream);
        }
      // Head dim 128 over long key sequences (varlen: the longest): key blocks of 176 (as
      // FlashAttention-3), 1-3.5% faster at 8k-16k keys, 1-5% slower at 2k (interleaved timing,
      // H100, 2026-11-26; docs/ladder/attention.md). Not with softcap / ALiBi (264 bytes spilled).
      if constexpr (kHeadDim == 128 && !kScoreMod)
        if (p.seqlen_k >= kAttnHopperWideBlocksFrom)
          return launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true, 176>(p, dtype, stream);
      // Head dim 256 up to 512 keys (with softcap / ALiBi; without them the persistent kernel above):
      // 64-key blocks (8 whole blocks at 512 keys where 80-key blocks take 7, the last 40% empty):
      // +1.7% / +2.5% at 512 keys (no mask / causal), 1-6% slower from 1k on (interleaved timing,
      // H100, 2026-11-26; docs/ladder/attention.md).
      if constexpr (kHeadDim == 256)
        if (p.seqlen_k <= kAttnHopperNarrowBlocksUpTo)
          return launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true, 64>(p, dtype, stream);
      // Head dim 64: three consumer warpgroups on 192-row tiles (as FlashAttention-3), 7-24%
      // faster than two at 2k-8k keys (interleaved timing, H100, 2026-11-26; docs/ladder/attention.md).
      // Not with softcap / ALiBi: 280 bytes spilled in 160 registers. Without a mask, fixed lengths:
      // the last, partial wave's tiles split along the keys (kSplitTail, attn_hopper_split_tail).
      if constexpr (kHeadDim == 64 && !kScoreMod) {
        const bool split_tail = p.window_left < 0 && p.window_right < 0 && p.cu_seqlens_q == nullptr;
        BOOL_SWITCH(split_tail, kSplitTail, [&] {
          launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true, 0, false, false, true, false, 3,
                                     kernels::kAttnLazyRescaleDefault<T, kHeadDim>, kernels::kAttnTreeReduceDefault<T, kHeadDim>,
                                     true, false, kSplitTail>(p, dtype, stream);
        });
        return;
      }
      launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true>(p, dtype, stream);
    });
  });
}

// Rung 4 over a paged KV cache (the paged prefill, src/paged_prefill.cu): p.kv_indptr set, q
// and o varlen, 16-bit.
template <int kHeadDim>
void launch_attn_hopper_paged_hdim(const AttnFwdParams& p, DType dtype, cudaStream_t stream) {
  BOOL_SWITCH(p.softcap > 0.f || p.alibi_slopes != nullptr, kScoreMod, [&] {
    HALF_DTYPE_SWITCH(dtype, T, [&] { launch_attn_hopper_variant<T, kHeadDim, kScoreMod, true, true, 0, true>(p, dtype, stream); });
  });
}

}  // namespace flashlab::detail
