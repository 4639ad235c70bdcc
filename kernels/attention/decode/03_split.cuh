// Decode rung 3 — split-KV (flash-decoding) on tensor cores with a cp.async pipeline: a thread
// block per (chunk of a request's pages, KV head, up to 16 of its query heads).
//
// Changes from rung 2:
//   - Work items instead of one block per request: a host planner (src/serving_plan.cpp) cuts
//     long requests into chunks of a common page count so that the items fill the GPU evenly,
//     whatever the batch mix (batch 1 at 128k keys runs on every SM, not on 8). A chunk's state
//     (O normalized, lse) goes to an fp32 partial buffer; paged_decode_merge_kernel merges a
//     request's chunks (merge_states' formula). A request of one chunk writes out and lse
//     directly. Without a plan (items == nullptr) item x is request x, whole.
//   - A pipeline of 64-key tiles (K and V; 3 stages, 2 with an e4m3 cache or the producer warp
//     below): the next tiles' loads are issued before the wait for the current one. On sm_90
//     (kTma, DecodeTmaMaps) a tile comes as one TMA box per page (or per tile within a larger
//     page) of K and of V, 128B-swizzled, issued by one warp's lanes (each one page: warp 0,
//     looked up a tile ahead, with an e4m3 cache; the producer warp for 16-bit caches) and
//     completing on the stage's mbarrier; V's rows past the chunk's end are cleared after the
//     last tile lands (a page's stale tail: P is 0 there, but 0 x NaN is not). The copy engine
//     reads a page as one request stream: 3.04-3.05 TB/s at batch 64 x 16k against 2.93-2.96
//     with the per-thread cp.async copies (16 bytes each, .L2::256B, each key's page looked up
//     by the thread that copies it, keys past the chunk zero-filled), which remain for other
//     page sizes and head dims. Rung 2 had one key per warp in flight.
//   - With TMA and a 16-bit cache, a producer warp (a 5th warp) issues the tiles: each as soon
//     as the 4 math warps have arrived on its stage's "empty" mbarrier, the pages of 32 boxes
//     ahead held in its lanes; 2 stages. The math no longer delays the next tile's issue by a
//     block barrier per tile (bench/experiments/decode_fixed_cost.cu: 2-3% at batch 64).
//     On sm_90 the library runs these caches on the persistent form of this kernel
//     (03_split_ws.cuh: no start and end per item); this block-per-item form stays as the
//     baseline of bench/experiments/decode_sweep.cu.
//   - Tensor cores: the group's query heads are the 16 rows of an mma.sync m16n8k16 (rows past
//     the group are zeros, their results dropped), so S = Q K^T and O += P V cost a few mma per
//     16 keys instead of a shuffle reduction per key and head; P stays in registers (the S
//     accumulator layout is the P V A-fragment, as forward rung 3). Each warp takes 16 keys of
//     the tile and keeps its own online softmax; the warps' states merge in shared memory.
//     Compute is far below the memory time, so the choice is about issue slots: rung 2 spent
//     them on shuffles.
//   - An e4m3 cache (KV = __nv_fp8_e4m3; k_scale / v_scale): the mma runs in fp16; K goes from
//     its e4m3 tile straight into B fragments in registers (the head dim's order permuted within
//     each 16-wide step so a lane's four values of a key are one 4-byte read; Q's fragments read
//     in the same order), V through an fp16 buffer converted by the block (ldmatrix.trans).
// Shared memory: Q (16 rows) and kStages x (K, V) 64-row tiles, rows padded by 16 bytes (16-bit:
// an odd 16-byte chunk count, ldmatrix without bank conflicts; e4m3: the 4-byte K reads of 8 rows
// in distinct banks) or, with TMA, dense and 128B-swizzled (the same conflict-free reads: a
// 16-byte chunk's position XORed with the row mod 8); e4m3 adds the fp16 V buffer.
// Limits: fp16 / bf16 queries (fp32 runs rung 2); the 16-row mma wastes 3/4 of the tensor work
// at a group of 4 (free while memory-bound); a page-table load per copied 16-byte piece; with an
// e4m3 cache the kernel is issue-bound (V's conversion pass, the copies' address math per byte).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/attention/decode/01_naive.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/divide.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/tma.cuh"

// The producer kernel's stage count and math warps (an experiment may override them:
// bench/experiments/decode_sweep.cu).
#ifndef FLASHLAB_DECODE_PRODUCER_STAGES
#define FLASHLAB_DECODE_PRODUCER_STAGES 2
#endif
#ifndef FLASHLAB_DECODE_PRODUCER_WARPS
#define FLASHLAB_DECODE_PRODUCER_WARPS 4
#endif

namespace flashlab::kernels {

// The split of a decode into work items (rung 3). One item is a chunk of a request's pages,
// run for every (KV head, 16-query-head block): a 1-D grid of capacity x nheads_kv x ceil(group / 16)
// blocks (the persistent kernel of 03_split_ws.cuh: at most its resident blocks, looping over them).
struct PagedDecodeSplit {
  const int4* items;         // (request, page_begin, page_end or -1 = the request's end, partial row or -1 = final)
                             // per item; nullptr: item x = request x, all its pages, final
  const int* num_items;      // items in use (a plan's count, read on the device); with items == nullptr, the batch
  const int* request_items;  // (batch + 1,) CSR: request b's items (the merge's input rows)
  int* claims;               // the persistent kernel's (03_split_ws.cuh) {items claimed past the first
                             // gridDim.x, blocks finished}, 0 between launches; nullptr: static order
  float* partial_o;          // (rows, nheads, headdim) fp32: a chunk's normalized output
  float* partial_lse;        // (rows, nheads) fp32, log2 units (-inf: no key)
  IntDivisor page_size;      // p.page_size as a divisor
  float k_scale, v_scale;    // an e4m3 cache's dequantization scales (1 for fp16 / bf16 caches)
  bool kv_same_strides;      // v_cache's page and slot strides are k_cache's: one offset for both
};

// The TMA path (kTma: rows a whole number of 128-byte lines — 16-bit caches at head dims a
// multiple of 64, e4m3 at a multiple of 128 — and page sizes a multiple of 8 dividing the 64-key
// tile or a multiple of it): K and V as (128-byte line, page slots, lines of a row, KV heads,
// pages) 5-D tensor maps, 128B-swizzled, a box of box_rows slots (the page size, or the tile
// within a larger page) x whole rows per (page, K or V). A box lands as [line of the row][slot]
// [128 bytes]; box b of a tile takes rows [b box_rows, (b + 1) box_rows); box_rows is a power of 2.
struct DecodeTmaMaps {
  CUtensorMap k, v;
  int box_rows;
};

// kKvBytes: the cache's element size, 2 (fp16 / bf16, the query's type) or 1 (e4m3: K converted
// in registers, V through an fp16 buffer, before the fp16 mma; the scales k_scale / v_scale
// applied to the scores and the output).
template <int kHeadDim, int kKvBytes = 2, bool kTma = false>
struct DecodeSplitTraits {
  // 4 warps, 16 keys each per tile. (2 warps and 32-key tiles, 4 blocks an SM at d 128 so that a
  // batch-64 GQA-8 decode's 512 items start in one wave, measured 2-4% slower at batch 64: fewer
  // bytes in flight per SM mattered more than the second wave.)
  static constexpr bool kFp8 = kKvBytes == 1;
  // A producer warp (16-bit caches by TMA): a 5th warp issues the tiles, each as soon as the 4
  // math warps have released its stage on the stage's "empty" mbarrier; no block barrier per tile.
  static constexpr bool kProducer = kTma && !kFp8;
  static constexpr int kWarps = kProducer ? FLASHLAB_DECODE_PRODUCER_WARPS : 4, kMathThreads = kWarps * 32, kThreads = kMathThreads + (kProducer ? 32 : 0);
  static constexpr int kRows = 16;                 // query heads per block (the mma's M)
  static constexpr int kTileKeys = kWarps * 16;    // keys per pipeline stage, 16 per warp
  // e4m3: 2 stages (rows padded by 16 bytes: the K fragments' 4-byte reads of 8 rows fall in
  // different banks) and an fp16 buffer for V only keep a block at 58 KB at d 128, 3 an SM: the
  // kernel is issue-bound there (a tile is half the bytes for the same math), and 12 warps an SM
  // hide more latency than 8. The producer warp: 2 stages too (two tiles in flight per block
  // whatever the math is doing).
  static constexpr int kStages = kFp8 ? 2 : kProducer ? FLASHLAB_DECODE_PRODUCER_STAGES : 3;
  static constexpr int kMinBlocks = kFp8 && kHeadDim <= 128 ? 3 : 0;  // __launch_bounds__ (e4m3: <= 168 registers; 0: unset)
  static constexpr int kRowElems = kHeadDim + 8;  // padded 16-bit smem row (Q; 16-bit K, V; e4m3: V's fp16 copy)
  static constexpr int kVec = 16 / kKvBytes;      // cache elements per 16-byte chunk
  static constexpr int kChunks = kHeadDim / kVec; // 16-byte chunks per cache row
  static constexpr int kRowKv = kHeadDim + 16 / kKvBytes;  // padded cache row in a stage (16 bytes more)
  // (TMA: stages on 1024-byte boundaries; 64-key tiles' padded size already is a multiple)
  static constexpr int kTileKv = kTma ? (kTileKeys * kRowKv * kKvBytes + 1023) / 1024 * 1024 / kKvBytes : kTileKeys * kRowKv;
  static constexpr int kTileElems = kTileKeys * kRowElems;
  static constexpr int kSmemBytes =
      kRows * kRowElems * 2 + 2 * kStages * kTileKv * kKvBytes + (kFp8 ? kTileElems * 2 : 0);
  // The TMA path: the stages first, on a 1024-byte boundary (the 128B swizzle's period; a
  // stage's padded size is a multiple of 1024 bytes), Q after them.
  static constexpr int kSmemBytesTma = kSmemBytes + 1024;
  static_assert(kTileKv * kKvBytes % 1024 == 0, "stages on 1024-byte boundaries");
  // The end-of-chunk merge of the warps' states reuses the tiles' space.
  static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 2) * 4;
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dims: multiples of 16 up to 256");
  static_assert(kMergeBytes <= kSmemBytes, "merge buffers fit in the tiles' space");
};

// T: the query's and output's type; KV: the cache's (T, or __nv_fp8_e4m3 with T fp16 / bf16).
// kTma: K and V tiles by TMA through `maps` (DecodeTmaMaps); else cp.async (maps unused).
template <typename T, int kHeadDim, typename KV = T, bool kTma = false>
__global__ void __launch_bounds__(DecodeSplitTraits<kHeadDim, static_cast<int>(sizeof(KV)), kTma>::kThreads,
                                  DecodeSplitTraits<kHeadDim, static_cast<int>(sizeof(KV)), kTma>::kMinBlocks)
    paged_decode_split_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ PagedDecodeSplit s,
                              const __grid_constant__ DecodeTmaMaps maps) {
  using Tr = DecodeSplitTraits<kHeadDim, static_cast<int>(sizeof(KV)), kTma>;
  constexpr bool kProducer = Tr::kProducer;
  constexpr int kMathThreads = Tr::kMathThreads;
  static_assert(!kTma || kHeadDim * sizeof(KV) % 128 == 0, "TMA: rows of whole 128-byte lines");
  using TC = std::conditional_t<Tr::kFp8, __half, T>;  // the mma's operand type
  constexpr int kRowElems = Tr::kRowElems, kChunks = Tr::kChunks, kTileKeys = Tr::kTileKeys, kStages = Tr::kStages;
  constexpr int kRowKv = Tr::kRowKv, kVec = Tr::kVec;
  constexpr float kLog2e = 1.4426950408889634f;
  // The merge kernel (launched with programmatic stream serialization) may start once every block
  // of this grid has started: its blocks for requests that did not split exit at once, during this
  // grid's tail, instead of as a wave of their own after it.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const stages =  // TMA: the stages on a 1024-byte boundary, (e4m3: V's fp16 buffer,) Q after them
      kTma ? reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023))
           : smem + Tr::kRows * kRowElems * sizeof(TC);
  TC* sq = kTma ? reinterpret_cast<TC*>(stages + 2 * kStages * Tr::kTileKv * sizeof(KV) + (Tr::kFp8 ? Tr::kTileElems * 2 : 0))
              : reinterpret_cast<TC*>(smem);
  KV* sk = reinterpret_cast<KV*>(stages);  // stage st: sk + st * kTileKv
  KV* sv = sk + kStages * Tr::kTileKv;
  TC* cv = reinterpret_cast<TC*>(sv + kStages * Tr::kTileKv);  // e4m3: the current tile's V in fp16
  __shared__ uint64_t full[kTma ? kStages : 1];        // TMA: stage st's K and V boxes have landed
  __shared__ uint64_t empty[kProducer ? kStages : 1];  // producer: the math warps are done with stage st

  // The item (blockIdx.x / per: all heads of an item are consecutive blocks, so the items'
  // order is the order the GPU starts them in): request b, pages [pb, pe) of it.
  const int group = p.nheads / p.nheads_kv, blocks = (group + Tr::kRows - 1) / Tr::kRows, per = p.nheads_kv * blocks;
  const int x = static_cast<int>(blockIdx.x / per), y = static_cast<int>(blockIdx.x % per);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // The tensor maps into the cache fetched while the item's table reads are in flight (else the
  // first copy of every block waits for its descriptor).
  if constexpr (kTma)
    if (tid == (kProducer ? kMathThreads : 0)) prefetch_tensor_map(&maps.k), prefetch_tensor_map(&maps.v);
  // Item x is most often request x (a plan of whole requests in order, or no plan): that
  // request's table entries are read alongside the item, not after it (one round trip less at
  // each item's start); read again for another request.
  const int guess = min(x, p.batch - 1);
  int first = p.kv_indptr[guess], next = p.kv_indptr[guess + 1], last_len = p.kv_last_page_len[guess];
  int b, pb = 0, pe = INT_MAX, row = -1;
  if (s.items != nullptr) {
    // Both loads leave together (x < the capacity: items[x] is in the workspace; a request index
    // is never negative, the test only keeps the compiler from loading the item after the exit).
    const int4 it = s.items[x];
    const int num_items = *s.num_items;
    if ((x >= num_items) | (it.x < 0)) return;
    b = it.x, pb = it.y, pe = it.z < 0 ? INT_MAX : it.z, row = it.w;
    if (b != guess) first = p.kv_indptr[b], next = p.kv_indptr[b + 1], last_len = p.kv_last_page_len[b];
  } else {
    b = x;
  }
  const int hk = y / blocks, hb = y % blocks;
  const int h0 = hk * group + hb * Tr::kRows, ng = min(Tr::kRows, group - hb * Tr::kRows);
  const int pages = next - first;
  const int len = pages > 0 ? (pages - 1) * p.page_size + last_len : 0;
  pe = min(pe, pages);
  // Keys [k_begin, k_end) of the request (the end clamped to its length: pages past a shrunk
  // request's end give an empty chunk).
  const int k_begin = pb < pages ? pb * p.page_size : len;
  const int k_end = max(k_begin, min(pe >= pages ? len : pe * p.page_size, len));
  const int tiles = (k_end - k_begin + kTileKeys - 1) / kTileKeys;
  if constexpr (kTma) {
    if (tid == 0) {
      for (int st = 0; st < kStages; ++st) mbarrier_init(&full[st], 1);
      if constexpr (kProducer)
        for (int st = 0; st < kStages; ++st) mbarrier_init(&empty[st], Tr::kWarps);
      fence_barrier_init();
    }
    __syncthreads();  // the barriers exist before they are issued into
  }
  // The math warps' own barrier (the producer warp does not take part): named barrier 1.
  const auto math_sync = [&] {
    if constexpr (kProducer) named_barrier_sync(1, kMathThreads);
    else __syncthreads();
  };

  // Q: rows past the group's heads zero-filled (no read); with an fp8 cache converted to fp16.
  for (int i = tid; i < Tr::kRows * kHeadDim / 8 && (!kProducer || warp < Tr::kWarps); i += kMathThreads) {
    const int r = i / (kHeadDim / 8), c = i % (kHeadDim / 8);
    const bool ok = r < ng;
    const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + (h0 + (ok ? r : 0)) * p.q_head_stride + c * 8;
    if constexpr (Tr::kFp8) {
      alignas(16) T v[8] = {};
      if (ok) *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(src);
      alignas(16) __half h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = __float2half_rn(to_float(v[e]));  // exact for |q| in [2^-14, 65504]
      *reinterpret_cast<uint4*>(sq + r * kRowElems + c * 8) = *reinterpret_cast<const uint4*>(h);
    } else {
      cp_async_16(sq + r * kRowElems + c * 8, src, ok ? 16 : 0);
    }
  }
  // Tile t's copies: thread tid copies chunks i = tid + j kThreads (row i / kChunks). The page
  // of each row is read one tile ahead (fetch_pages, into registers) so that the page table's
  // latency does not sit between a tile's wait and the next tile's copies.
  constexpr int kIters = (kTileKeys * kChunks + Tr::kThreads - 1) / Tr::kThreads;
  const auto fetch_pages = [&](int t, int (&pg)[kIters]) {
    const int key0 = k_begin + t * kTileKeys;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int i = tid + j * Tr::kThreads, key = key0 + i / kChunks;
      pg[j] = i < kTileKeys * kChunks && key < k_end ? p.kv_indices[first + s.page_size.div(key)] : -1;
    }
  };
  // Head dims <= 128 keep Q's fragments (below) and the head's base pointers in registers; past
  // that both are recomputed (held across the loop, the pointers spilled d 256's registers).
  // (e4m3 caches: Q re-read too, the registers going to 3 blocks an SM.)
  constexpr bool kQInRegs = kHeadDim <= 128 && !Tr::kFp8;
  const KV* k_head = static_cast<const KV*>(p.k_cache) + hk * p.head_stride;
  const KV* v_head = static_cast<const KV*>(p.v_cache) + hk * p.v_head_stride;
  const auto load_tile = [&](int t, const int (&pg)[kIters]) {
    KV* dk = sk + (t % kStages) * Tr::kTileKv;
    KV* dv = sv + (t % kStages) * Tr::kTileKv;
    const int key0 = k_begin + t * kTileKeys;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int i = tid + j * Tr::kThreads;
      if (i >= kTileKeys * kChunks) break;
      const int r = i / kChunks, c = i % kChunks, key = key0 + r;
      const bool ok = pg[j] >= 0;  // a key of the chunk (else zero-filled, nothing read)
      const int64_t page = ok ? pg[j] : 0, slot = ok ? s.page_size.mod(key, s.page_size.div(key)) : 0;
      const int64_t off = page * p.page_stride + slot * p.slot_stride;
      const int64_t v_off = s.kv_same_strides ? off : page * p.v_page_stride + slot * p.v_slot_stride;
      const KV* kp = (kQInRegs ? k_head : static_cast<const KV*>(p.k_cache) + hk * p.head_stride) + off + c * kVec;
      const KV* vp = (kQInRegs ? v_head : static_cast<const KV*>(p.v_cache) + hk * p.v_head_stride) + v_off + c * kVec;
      cp_async_16_l2_256(dk + r * kRowKv + c * kVec, kp, ok ? 16 : 0);
      cp_async_16_l2_256(dv + r * kRowKv + c * kVec, vp, ok ? 16 : 0);
    }
  };
  // TMA: the issuing warp's lanes b < boxes (warp 0, or the producer warp) each issue box b of a
  // tile (K and V), from the page lane b holds (box_page: read a tile ahead by warp 0); lane 0
  // sets the stage's expected bytes. A box whose first key
  // lies in the chunk is loaded whole (a request's last page: rows past its end, cleared below).
  const int box_rows = kTma ? maps.box_rows : kTileKeys, boxes = kTileKeys / box_rows;
  const auto box_page = [&](int t) {
    const int key = k_begin + t * kTileKeys + lane * box_rows;
    return warp == 0 && lane < boxes && key < k_end ? p.kv_indices[first + s.page_size.div(key)] : -1;
  };
  const auto issue_tile = [&](int t, int page) {
    if (warp != (kProducer ? Tr::kWarps : 0)) return;
    const int key0 = k_begin + t * kTileKeys, valid = min(boxes, (k_end - key0 + box_rows - 1) / box_rows);
    uint64_t* bar = &full[t % kStages];
    if (lane == 0) mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(valid * box_rows * kHeadDim * sizeof(KV) * 2));
    if (lane < valid) {
      const int key = key0 + lane * box_rows, slot = s.page_size.mod(key, s.page_size.div(key));
      const int at = (t % kStages) * Tr::kTileKv + lane * box_rows * kHeadDim;
      tma_load_5d(sk + at, &maps.k, 0, slot, 0, hk, page, bar);
      tma_load_5d(sv + at, &maps.v, 0, slot, 0, hk, page, bar);
    }
  };
  // The producer warp: the pages of 32 boxes in its lanes' registers (`cur`, a tile's boxes
  // shuffled out of them) and of the next 32 (`nxt`, loaded when `cur` is taken up: 8 tiles ahead
  // at 16-key pages), so no table read sits between a stage's release and its tile's issue; each
  // tile issued once the math warps have released its stage (tiles 0 .. kStages - 1 at once).
  if constexpr (kProducer) {
    if (warp == Tr::kWarps) {
      const auto load_box = [&](int box) {
        const int key = k_begin + box * box_rows;
        return key < k_end ? p.kv_indices[first + s.page_size.div(key)] : -1;
      };
      int cur = load_box(lane), nxt = load_box(32 + lane);
      for (int t = 0; t < tiles; ++t) {
        const int box0 = t * boxes;  // boxes divides 32
        if (box0 % 32 == 0 && box0 > 0) cur = nxt, nxt = load_box(box0 + 32 + lane);
        const int page = __shfl_sync(0xffffffffu, cur, (box0 + lane) % 32);
        if (t >= kStages) mbarrier_wait(&empty[t % kStages], (t / kStages - 1) & 1);
        issue_tile(t, page);
      }
      return;
    }
  }
  // Prologue: Q with tile 0, then tiles up to kStages - 2 (a group committed for each, empty or
  // not); the pages of tile kStages - 1 fetched for the loop's first copies.
  [[maybe_unused]] int pg[kIters];
  [[maybe_unused]] int pg_box = -1;  // TMA: the page of this lane's box of the next tile to issue
  if constexpr (kProducer) {
    cp_async_commit();  // Q
  } else if constexpr (kTma) {
    cp_async_commit();  // Q
    // The first kStages tiles' pages in one round of loads (not one table read before each issue).
    int first_pages[kStages];
#pragma unroll
    for (int t = 0; t < kStages; ++t) first_pages[t] = t < tiles ? box_page(t) : -1;
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t)
      if (t < tiles) issue_tile(t, first_pages[t]);
    pg_box = first_pages[kStages - 1];
  } else {
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < tiles) {
        fetch_pages(t, pg);
        load_tile(t, pg);
      }
      cp_async_commit();
    }
    if (kStages - 1 < tiles) fetch_pages(kStages - 1, pg);
  }

  float o[kHeadDim / 8][4] = {};  // rows g, g + 8 (g = lane / 4) of each 8-column tile, this warp's keys
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // log2 units; l a per-thread partial sum
  const float scale_log2 = p.scale * kLog2e * s.k_scale;
  const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(sq));
  uint32_t qa[kQInRegs ? kHeadDim / 16 : 1][4];
  // TMA: the byte offset of (row, column) in a swizzled stage: row r is line r % box_rows of box
  // r / box_rows, whose kLines lines (128 bytes each) lie box_rows lines apart; the 16-byte chunk
  // is XORed with the line mod 8 (= r mod 8: box_rows is a multiple of 8). Per lane, the rows
  // its K and V reads address: their first line's offset, computed once.
  constexpr int kLineElems = 128 / static_cast<int>(sizeof(KV)), kLines = kHeadDim / kLineElems;
  const int box_shift = __ffs(box_rows) - 1;
  const uint32_t line_stride = static_cast<uint32_t>(box_rows) * 128;  // between a row's lines
  const auto line_of = [&](int r) {
    return static_cast<uint32_t>((((r >> box_shift) * kLines << box_shift) + (r & (box_rows - 1))) * 128);
  };
  // Column c (elements; a 16-byte chunk's start, or a 4-byte read's) of the row whose first line is at `line`.
  const auto swz = [&](uint32_t line, int r, int c) {
    const int byte = c * static_cast<int>(sizeof(KV));
    return line + static_cast<uint32_t>(byte / 128) * line_stride + static_cast<uint32_t>(((byte % 128 / 16) ^ (r % 8)) * 16 + byte % 16);
  };
  [[maybe_unused]] uint32_t k_line = 0, v_line = 0, k_line8 = 0;  // k_line8: row + 8 (e4m3's second key tile)
  const int k_row = Tr::kFp8 ? warp * 16 + lane / 4 : warp * 16 + (lane / 16) * 8 + lane % 8;
  const int v_row = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
  if constexpr (kTma) k_line = line_of(k_row), k_line8 = line_of(k_row + 8), v_line = line_of(v_row);
  for (int t = 0; t < tiles; ++t) {
    // Copies first, then the wait: while tile t is awaited, tiles t + 1 .. t + kStages - 1 are in
    // flight too (waiting first would leave one fewer).
    // (The producer warp: the stage's release is the math warps' arrival on its "empty" barrier.)
    if constexpr (!kProducer) __syncthreads();  // every warp done with tile t - 1, whose stage tile t + kStages - 1 takes
    if constexpr (kTma) {
      if constexpr (!kProducer) {
        if (t + kStages - 1 < tiles) issue_tile(t + kStages - 1, pg_box);
        if (t + kStages < tiles) pg_box = box_page(t + kStages);  // in flight during this tile's math
      }
      mbarrier_wait(&full[t % kStages], (t / kStages) & 1);
      const int key_t = k_begin + t * kTileKeys;
      // The chunk's last tile: V's rows past the chunk are a page's stale tail or boxes not
      // loaded; P is 0 there, but 0 x NaN is not: clear them (whole 128-byte lines). With the
      // producer warp each math warp clears the rows of its own 16 keys (the only V rows it reads),
      // so only the warp itself needs to see them; else the block clears them all (e4m3's V
      // conversion reads every row).
      const bool last = key_t + kTileKeys > k_end;
      unsigned char* vt = reinterpret_cast<unsigned char*>(sv + (t % kStages) * Tr::kTileKv);
      if constexpr (kProducer) {
        const int r0 = max(k_end - key_t, warp * 16), r1 = warp * 16 + 16;
        if (last && r0 < r1) {
          for (int i = lane; i < (r1 - r0) * kLines * 8; i += 32) {
            const int r = r0 + i / (kLines * 8), line = i / 8 % kLines, c = i % 8;
            *reinterpret_cast<uint4*>(vt + line_of(r) + line * line_stride + c * 16) = make_uint4(0u, 0u, 0u, 0u);
          }
          __syncwarp();
        }
        if (t == 0) {
          cp_async_wait<0>();  // Q
          math_sync();
        }
      } else if (t == 0 || last) {
        if (t == 0) cp_async_wait<0>();  // Q
        if (last) {
          const int r0 = k_end - key_t;
          for (int i = tid; i < (kTileKeys - r0) * kLines * 8; i += kMathThreads) {
            const int r = r0 + i / (kLines * 8), line = i / 8 % kLines, c = i % 8;
            *reinterpret_cast<uint4*>(vt + line_of(r) + line * line_stride + c * 16) = make_uint4(0u, 0u, 0u, 0u);
          }
        }
        math_sync();  // Q, the cleared rows visible to all
      }
    } else {
      if (t + kStages - 1 < tiles) load_tile(t + kStages - 1, pg);
      cp_async_commit();
      if (t + kStages < tiles) fetch_pages(t + kStages, pg);  // in flight during this tile's math
      cp_async_wait<kStages - 1>();
      __syncthreads();  // tile t visible to all
    }
    const TC* tk = reinterpret_cast<const TC*>(sk + (t % kStages) * Tr::kTileKv);  // tile t's K, V as TC
    const TC* tv = reinterpret_cast<const TC*>(sv + (t % kStages) * Tr::kTileKv);
    if constexpr (Tr::kFp8) {
      // V: e4m3 -> fp16 (exact: every e4m3 value is an fp16 value), 16 elements a thread per
      // step, into the conversion buffer (free: the loop's first barrier follows the last tile's
      // math). K is converted in registers, below.
      for (int i = tid; i < kTileKeys * kChunks; i += Tr::kThreads) {
        const int r = i / kChunks, c = i % kChunks;
        const KV* vst = sv + (t % kStages) * Tr::kTileKv;
        const uint4 raw = *reinterpret_cast<const uint4*>(
            kTma ? reinterpret_cast<const unsigned char*>(vst) + swz(line_of(r), r, c * 16) : reinterpret_cast<const unsigned char*>(vst + r * kRowKv + c * 16));
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        alignas(16) __half2_raw h[8];
#pragma unroll
        for (int e = 0; e < 8; ++e)
          h[e] = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[e / 2] >> (16 * (e % 2))), __NV_E4M3);
        TC* dst = cv + r * kRowElems + c * 16;
        reinterpret_cast<uint4*>(dst)[0] = reinterpret_cast<const uint4*>(h)[0];
        reinterpret_cast<uint4*>(dst)[1] = reinterpret_cast<const uint4*>(h)[1];
      }
      __syncthreads();
      tv = cv;
    }

    const int key0 = k_begin + t * kTileKeys + warp * 16;  // this warp's 16 keys
    // The producer: the warp hands the stage back after its last read of it (here, or after P V).
    const auto release = [&] {
      if constexpr (kProducer) {
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&empty[t % kStages]);
      }
    };
    if (key0 >= k_end) {
      release();
      continue;
    }
    // (e4m3: V is read from the fp16 buffer, padded rows, not swizzled.)
    constexpr bool kSwzV = kTma && !Tr::kFp8;
    const uint32_t k_base = static_cast<uint32_t>(__cvta_generic_to_shared(tk + (kTma ? 0 : warp * 16 * kRowElems)));
    const uint32_t v_base = static_cast<uint32_t>(__cvta_generic_to_shared(tv + (kSwzV ? 0 : warp * 16 * kRowElems)));
    // Q's A-fragments: kept in registers from the first tile on (head dims <= 128; above, the
    // registers go to O and Q is re-read from shared memory per tile).
    if (kQInRegs && t == 0) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk)
        ldmatrix_x4(qa[kQInRegs ? kk : 0], q_base + ((lane % 16) * kRowElems + kk * 16 + (lane / 16) * 8) * 2);
    }
    // S = Q K^T: 16 heads x 16 keys (two n8 tiles), the head dim's steps in two independent
    // accumulator chains (half the dependent mma latency), added at the end.
    float sc[2][4] = {}, sc2[2][4] = {};
    if constexpr (Tr::kFp8) {
      // e4m3 K straight into B fragments: within each 16-wide head-dim step the mma's k order is
      // permuted (slots 2t, 2t + 1, 2t + 8, 2t + 9 of lane t hold elements 4t .. 4t + 3; a dot
      // product does not depend on the order, Q's fragments follow it), so a lane's four e4m3
      // values per key are one 4-byte read, converted to two fp16 pairs.
      const uint8_t* kst = reinterpret_cast<const uint8_t*>(sk + (t % kStages) * Tr::kTileKv);
      const uint8_t* kt = kst + (warp * 16 + lane / 4) * kRowKv;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const int col = kk * 16 + 4 * (lane % 4);
        uint32_t a[4], bk[4];
        const uint2 q0 = *reinterpret_cast<const uint2*>(sq + (lane / 4) * kRowElems + col);
        const uint2 q1 = *reinterpret_cast<const uint2*>(sq + (lane / 4 + 8) * kRowElems + col);
        a[0] = q0.x, a[1] = q1.x, a[2] = q0.y, a[3] = q1.y;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint32_t w = *reinterpret_cast<const uint32_t*>(
              kTma ? kst + swz(nt == 0 ? k_line : k_line8, k_row + 8 * nt, col) : kt + nt * 8 * kRowKv + col);
          const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
          const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
          bk[2 * nt] = static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(lo.y) << 16);
          bk[2 * nt + 1] = static_cast<uint32_t>(hi.x) | (static_cast<uint32_t>(hi.y) << 16);
        }
        if (kk % 2 == 0) mma_m16n8k16_x2<TC>(sc[0], sc[1], a, bk);
        else mma_m16n8k16_x2<TC>(sc2[0], sc2[1], a, bk);
      }
    }
#pragma unroll
    for (int kk = 0; kk < (Tr::kFp8 ? 0 : kHeadDim / 16); ++kk) {
      uint32_t a[4], bk[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qa[kk][e];
      } else {
        ldmatrix_x4(a, q_base + ((lane % 16) * kRowElems + kk * 16 + (lane / 16) * 8) * 2);
      }
      ldmatrix_x4(bk, kTma ? k_base + swz(k_line, k_row, kk * 16 + ((lane / 8) % 2) * 8)
                           : k_base + (((lane / 16) * 8 + lane % 8) * kRowElems + kk * 16 + ((lane / 8) % 2) * 8) * 2);
      if (kk % 2 == 0 || !kQInRegs) mma_m16n8k16_x2<TC>(sc[0], sc[1], a, bk);  // one chain past d 128 (registers)
      else mma_m16n8k16_x2<TC>(sc2[0], sc2[1], a, bk);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] += sc2[nt][e];
    // Online softmax per row (query head); keys past the chunk masked.
    float mx[2] = {m[0], m[1]};
    const bool tail = key0 + 16 > k_end;  // the chunk's last keys: mask (warp-uniform)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * (lane % 4) + e % 2;
        sc[nt][e] = !tail || key < k_end ? sc[nt][e] * scale_log2 : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], sc[nt][e]);
      }
    float corr[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // every key so far masked: no NaN from -inf - -inf
      corr[r] = exp2f(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
    uint32_t pa[4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float pr[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) pr[e] = exp2f(sc[nt][e] - base[e / 2]), l[e / 2] += pr[e];
      pa[2 * nt] = pack2<TC>(pr[0], pr[1]);
      pa[2 * nt + 1] = pack2<TC>(pr[2], pr[3]);
    }
    // O's rescale only when some row's max moved (rare after the first tiles; warp-uniform).
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
    }
    // O += P V: V's rows are the keys (ldmatrix .trans), two 8-column tiles per load.
#pragma unroll
    for (int j = 0; j < kHeadDim / 16; ++j) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, kSwzV ? v_base + swz(v_line, v_row, j * 16 + (lane / 16) * 8)
                                 : v_base + ((((lane / 8) % 2) * 8 + lane % 8) * kRowElems + j * 16 + (lane / 16) * 8) * 2);
      mma_m16n8k16_x2<TC>(o[2 * j], o[2 * j + 1], pa, bv);
    }
    release();
  }
  cp_async_wait<0>();
  // Every warp done with the tiles (and every tile issued has landed: each was waited for):
  // their space holds the merge buffers.
  math_sync();

  // The warps' states: m, l per row, O (unnormalized) per row and column.
  float* s_m = reinterpret_cast<float*>(smem);
  float* s_l = s_m + Tr::kWarps * Tr::kRows;
  float* s_o = s_l + Tr::kWarps * Tr::kRows;  // [warp][row][kHeadDim]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int g = lane / 4;
  if (lane % 4 == 0) {
    s_m[warp * Tr::kRows + g] = m[0], s_m[warp * Tr::kRows + g + 8] = m[1];
    s_l[warp * Tr::kRows + g] = l[0], s_l[warp * Tr::kRows + g + 8] = l[1];
  }
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j) {
    float* dst = s_o + (warp * Tr::kRows + g) * kHeadDim + j * 8 + 2 * (lane % 4);
    *reinterpret_cast<float2*>(dst) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(dst + 8 * kHeadDim) = make_float2(o[j][2], o[j][3]);
  }
  math_sync();

  // Per head: M = max m_w, L = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M) / L.
  for (int x = tid; x < ng * kHeadDim; x += kMathThreads) {
    const int r = x / kHeadDim, c = x % kHeadDim;
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) big = fmaxf(big, s_m[w * Tr::kRows + r]);
    const float off = big == -INFINITY ? 0.f : big;
    float wsum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float wt = exp2f(s_m[w * Tr::kRows + r] - off);
      wsum += s_l[w * Tr::kRows + r] * wt, acc += s_o[(w * Tr::kRows + r) * kHeadDim + c] * wt;
    }
    const float val = wsum > 0.f ? acc / wsum * s.v_scale : 0.f, lse2 = wsum > 0.f ? off + log2f(wsum) : -INFINITY;
    const int h = h0 + r;
    if (row < 0) {
      static_cast<T*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + c] = from_float<T>(val);
      if (c == 0 && p.lse != nullptr) p.lse[static_cast<int64_t>(b) * p.nheads + h] = lse2 * 0.6931471805599453f;
    } else {
      s.partial_o[(static_cast<int64_t>(row) * p.nheads + h) * kHeadDim + c] = val;
      if (c == 0) s.partial_lse[static_cast<int64_t>(row) * p.nheads + h] = lse2;
    }
  }
}

// The merge of the split requests' chunks: a block per (request, query head); requests of one
// item return at once (the decode kernel wrote them), before waiting for the decode grid. S = log2 sum_i 2^{s_i},
// O = sum_i o_i 2^{s_i - S} (o_i normalized), out = O, lse = S ln 2. The threads share the max
// through shared memory and each sums its columns over the chunks (independent loads).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(128) paged_decode_merge_kernel(const __grid_constant__ PagedDecodeParams p,
                                                                 const __grid_constant__ PagedDecodeSplit s) {
  // request_items is the plan's (copied before the decode kernel ran); the partial states are the
  // decode kernel's: wait for that grid to finish (a no-op when launched without the attribute).
  const int b = blockIdx.x, h = blockIdx.y, i0 = s.request_items[b], i1 = s.request_items[b + 1];
  if (i1 - i0 <= 1) return;
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ float s_big[4];
  const float* lse = s.partial_lse + h;  // row i at lse[i * nheads]
  float big = -INFINITY;
  for (int i = i0 + static_cast<int>(threadIdx.x); i < i1; i += blockDim.x) big = fmaxf(big, lse[static_cast<int64_t>(i) * p.nheads]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, off));
  if (threadIdx.x % 32 == 0) s_big[threadIdx.x / 32] = big;
  __syncthreads();
  big = fmaxf(fmaxf(s_big[0], s_big[1]), fmaxf(s_big[2], s_big[3]));
  const float off = big == -INFINITY ? 0.f : big;
  for (int c = threadIdx.x; c < kHeadDim; c += blockDim.x) {
    float wsum = 0.f, acc = 0.f;
#pragma unroll 4
    for (int i = i0; i < i1; ++i) {
      const float wt = exp2f(lse[static_cast<int64_t>(i) * p.nheads] - off);
      wsum += wt, acc += wt * s.partial_o[(static_cast<int64_t>(i) * p.nheads + h) * kHeadDim + c];
    }
    static_cast<T*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + c] = from_float<T>(wsum > 0.f ? acc / wsum : 0.f);
    if (c == 0 && p.lse != nullptr)
      p.lse[static_cast<int64_t>(b) * p.nheads + h] = wsum > 0.f ? (off + log2f(wsum)) * 0.6931471805599453f : -INFINITY;
  }
}

}  // namespace flashlab::kernels
