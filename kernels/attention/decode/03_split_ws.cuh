// Decode rung 3 on sm_90 with a 16-bit cache by TMA: the same work items and math as
// paged_decode_split_kernel (03_split.cuh), run by persistent, warp-specialized blocks.
//
// Changes from the block-per-item producer kernel (03_split.cuh, which e4m3 and cp.async keep):
//   - Persistent: a block per resident slot (1 an SM at d 128: 218 registers x 160 threads)
//     claims work items (an item's head block) in order: blockIdx.x first, then the next
//     unclaimed one (an atomic count in the plan's workspace, {claimed, finished blocks}, back at
//     0 after every launch: the last block to finish resets it; without a workspace, every
//     gridDim.x-th). One block an SM paid, for every item, its start and end with nothing in
//     flight on the SM: the epilogue, the next block's launch, its table reads and first copy
//     (0.6-1.3 us an item at batch 64 x 4k, 3.88 items an SM: ~1%). Here the stage ring runs on
//     across items: while the math warps finish an item (its last tiles, the merge of the warps'
//     states, the stores), the producer already streams the next item's tiles, and it claims the
//     item after that and reads its table entries while the current one's tiles go out.
//   - Q by bulk copies (a row per query head; 16-byte aligned rows) on the item's first stage's
//     barrier, into one of two Q buffers (items alternate); the item's metadata through shared
//     memory likewise, written by the producer before its arrival on that barrier. Every item
//     takes at least one stage (an empty chunk: a stage with Q only; the end: a marker stage), so
//     an item's metadata and Q buffer are never overwritten before its math warps have read them:
//     item i + 2's first stage is issued only after item i's last stage was released.
//   - The producer's steady loop carries nothing but the tiles: the item's first tile (metadata,
//     Q, end marker) is peeled off, and each tile's boxes, slots and byte count are computed
//     before the wait for its stage — from a stage's release to its next copies is this loop's
//     critical path where one block streams alone (batch 8 x 16k, one item an SM: 0.2347 ms
//     with both in the loop after the wait, 0.2185 without; bench/experiments/decode_sweep.cu).
//   - The pages of 32 boxes held in the producer's lanes (`cur`, a tile's boxes shuffled out) and
//     of the next 32 (`nxt`, read when `cur` is taken up: 8 tiles ahead at 16-token pages).
// Shared memory: [1 KB alignment slack][K stages][V stages][Q x 2][merge buffers] (the merge
// buffers apart: the next item's tiles land while an item's warps merge).
// Limits: 2-3% below the block-per-item kernel where one item an SM streams alone and nothing
// else runs (batch 8 x 16k; 64 x 16k 0.3%): its item loop and claims cost the steady state a
// little; the serial issue of a tile's boxes (one uniform copy per lane).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention/decode/03_split.cuh"

namespace flashlab::kernels {

template <int kHeadDim>
struct DecodeWsTraits {
  static constexpr int kWarps = 4, kMathThreads = kWarps * 32, kThreads = kMathThreads + 32;  // + the producer
  static constexpr int kRows = 16, kTileKeys = kWarps * 16, kStages = 2;
  static constexpr int kRowElems = kHeadDim + 8;                // a Q row, padded (ldmatrix without conflicts)
  static constexpr int kStageBytes = kTileKeys * kHeadDim * 2;  // dense 128B-swizzled boxes, K or V
  static constexpr int kQBytes = kRows * kRowElems * 2;
  static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 2) * 4;
  // [1 KB alignment slack][K stages][V stages][Q x 2][merge buffers]
  static constexpr int kSmemBytes = 1024 + 2 * kStages * kStageBytes + 2 * kQBytes + kMergeBytes;
};

// An item as the math warps need it (written by the producer into shared memory).
struct DecodeWsItem {
  int b, h0, ng, row, k_begin, k_end, tiles, pad;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(DecodeWsTraits<kHeadDim>::kThreads, 1)
    paged_decode_split_ws_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ PagedDecodeSplit s,
                                 const __grid_constant__ DecodeTmaMaps maps) {
  using Tr = DecodeWsTraits<kHeadDim>;
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "TMA: rows of whole 128-byte lines");
  static_assert(Tr::kStageBytes % 1024 == 0 && Tr::kQBytes % 16 == 0, "alignment of the regions");
  constexpr int kRows = Tr::kRows, kRowElems = Tr::kRowElems, kTileKeys = Tr::kTileKeys, kStages = Tr::kStages;
  constexpr int kWarps = Tr::kWarps, kMathThreads = Tr::kMathThreads;
  constexpr int kLines = kHeadDim / 64;  // 128-byte lines of a row
  constexpr bool kQInRegs = kHeadDim <= 128;
  constexpr float kLog2e = 1.4426950408889634f;
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // (see paged_decode_split_kernel)
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023));
  T* const sk = reinterpret_cast<T*>(base);
  T* const sv = reinterpret_cast<T*>(base + kStages * Tr::kStageBytes);
  T* const sq = reinterpret_cast<T*>(base + 2 * kStages * Tr::kStageBytes);  // buffer i at i x kQBytes
  float* const s_m = reinterpret_cast<float*>(base + 2 * kStages * Tr::kStageBytes + 2 * Tr::kQBytes);
  float* const s_l = s_m + kWarps * kRows;
  float* const s_o = s_l + kWarps * kRows;  // [warp][row][kHeadDim]
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ DecodeWsItem meta[2];

  const int group = p.nheads / p.nheads_kv, blocks = (group + kRows - 1) / kRows, per = p.nheads_kv * blocks;
  const int units = (s.items != nullptr ? *s.num_items : p.batch) * per;  // (item, head block) pairs
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Q buffers zeroed once: rows past an item's heads are never copied (stale rows of an earlier
  // item's queries at worst; an mma row's results depend on its own row only, and these are dropped).
  for (int i = tid; i < 2 * Tr::kQBytes / 16; i += Tr::kThreads)
    reinterpret_cast<uint4*>(sq)[i] = make_uint4(0u, 0u, 0u, 0u);
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) mbarrier_init(&full[st], 1), mbarrier_init(&empty[st], kWarps);
    fence_barrier_init();
  }
  fence_proxy_async_smem();  // the zeroed Q rows ordered before the copy engine's writes
  __syncthreads();
  const int box_rows = maps.box_rows, boxes = kTileKeys / box_rows;  // boxes divides 32

  if (warp == kWarps) {  // the producer
    prefetch_tensor_map(&maps.k);
    prefetch_tensor_map(&maps.v);
    // The block's items: blockIdx.x first, then the next unclaimed one (s.claims[0] counts the
    // claims past the first gridDim.x; {claimed, finished blocks}, 0 between launches; without
    // s.claims, every gridDim.x-th). Two items ahead: while an item's tiles are issued, the next
    // one's table entries are in flight and the one after it is being claimed, so an item's start
    // waits for nothing but its first pages.
    const int box_shift_p = __ffs(box_rows) - 1;  // box_rows is a power of 2
    int static_next = blockIdx.x;
    const auto claim_issue = [&] {  // lane 0's atomic, its result used only by claim_take
      return s.claims != nullptr && lane == 0 ? atomicAdd(s.claims, 1) : 0;
    };
    const auto claim_take = [&](int ticket) {
      if (s.claims == nullptr) return static_next += gridDim.x;
      return static_cast<int>(gridDim.x) + __shfl_sync(0xffffffffu, ticket, 0);
    };
    struct Entry {
      int4 it;
      int first, next, last_len;
    };
    const auto fetch = [&](int u) {
      Entry e{make_int4(u / per, 0, -1, -1), 0, 0, 0};
      if (u >= units) return e;
      if (s.items != nullptr) e.it = s.items[u / per];
      e.first = p.kv_indptr[e.it.x], e.next = p.kv_indptr[e.it.x + 1], e.last_len = p.kv_last_page_len[e.it.x];
      return e;
    };
    int u = blockIdx.x;
    Entry cur_e = fetch(u);
    int u_next = claim_take(claim_issue());
    int g = 0;  // stages issued so far (the ring position)
    for (int i = 0;; ++i) {
      const Entry next_e = fetch(u_next);  // in flight while this item's tiles are issued
      const bool more = u_next < units;
      const int ticket = more ? claim_issue() : 0;  // the item after next
      // (u >= units: the end marker, a stage with no bytes and tiles = -1 that stops the math warps)
      const bool done = u >= units;
      const int y = u % per;
      const int b = cur_e.it.x, row = cur_e.it.w, first = cur_e.first, pages = cur_e.next - first;
      const int pb = cur_e.it.y, pe = min(cur_e.it.z < 0 ? INT_MAX : cur_e.it.z, pages);
      const int hk = y / blocks, hb = y % blocks;
      const int h0 = hk * group + hb * kRows, ng = min(kRows, group - hb * kRows);
      const int len = pages > 0 ? (pages - 1) * p.page_size + cur_e.last_len : 0;
      const int k_begin = pb < pages ? pb * p.page_size : len;
      const int k_end = max(k_begin, min(pe >= pages ? len : pe * p.page_size, len));
      const int tiles = done ? -1 : (k_end - k_begin + kTileKeys - 1) / kTileKeys;
      const auto load_box = [&](int box) {
        const int key = k_begin + box * box_rows;
        return !done && key < k_end ? p.kv_indices[first + s.page_size.div(key)] : -1;
      };
      int cur = load_box(lane), nxt = load_box(32 + lane);
      // Tile t's issue: everything it needs computed before the wait for its stage (from a
      // stage's release to its next copies is this loop's critical path), the item's first tile
      // (its metadata, Q, or the end marker) apart so the steady loop carries none of it.
      const auto tile = [&](int t, bool first_tile) {
        const int box0 = t * boxes;  // boxes divides 32
        if (box0 % 32 == 0 && box0 > 0) cur = nxt, nxt = load_box(box0 + 32 + lane);
        const int page = __shfl_sync(0xffffffffu, cur, (box0 + lane) % 32);
        const int st = g % kStages, key0 = k_begin + t * kTileKeys;
        const int valid = tiles > 0 ? min(boxes, (k_end - key0 + box_rows - 1) >> box_shift_p) : 0;
        const int key = key0 + lane * box_rows, slot = s.page_size.mod(key, s.page_size.div(key));
        const int at = st * (Tr::kStageBytes / 2) + lane * box_rows * kHeadDim;
        const uint32_t bytes = static_cast<uint32_t>((valid * box_rows * 2 + (first_tile && !done ? ng : 0)) * kHeadDim * 2);
        uint64_t* bar = &full[st];
        if (g >= kStages) mbarrier_wait(&empty[st], (g / kStages - 1) & 1);
        if (lane == 0) {
          if (first_tile) meta[i & 1] = DecodeWsItem{b, h0, ng, row, k_begin, k_end, tiles, 0};  // (its slot freed by the wait)
          mbarrier_arrive_expect_tx(bar, bytes);
        }
        if (first_tile && !done && lane < ng)
          bulk_load(sq + (i & 1) * (Tr::kQBytes / 2) + lane * kRowElems,
                    static_cast<const T*>(p.q) + b * p.q_batch_stride + (h0 + lane) * p.q_head_stride, kHeadDim * 2, bar);
        if (lane < valid) {
          tma_load_5d(sk + at, &maps.k, 0, slot, 0, hk, page, bar);
          tma_load_5d(sv + at, &maps.v, 0, slot, 0, hk, page, bar);
        }
        ++g;
      };
      tile(0, true);
#pragma unroll 1
      for (int t = 1; t < tiles; ++t) tile(t, false);
      if (done) break;
      u = u_next, cur_e = next_e;
      if (more) u_next = claim_take(ticket);
    }
    // The last block to finish sets the claim count back to 0 for the next launch (every other
    // block's last claim came before its count here; the fences order this block's claims before
    // its count, and the others' counts before the reset).
    if (s.claims != nullptr && lane == 0) {
      __threadfence();
      if (atomicAdd(s.claims + 1, 1) == static_cast<int>(gridDim.x) - 1) {
        __threadfence();
        s.claims[0] = 0, s.claims[1] = 0;
      }
    }
    return;
  }

  // The math warps. Swizzled addressing as in paged_decode_split_kernel: row r is line
  // r % box_rows of box r / box_rows, whose kLines lines lie box_rows lines apart; a 16-byte
  // chunk's position XORed with r % 8.
  const int box_shift = __ffs(box_rows) - 1;
  const uint32_t line_stride = static_cast<uint32_t>(box_rows) * 128;
  const auto line_of = [&](int r) {
    return static_cast<uint32_t>((((r >> box_shift) * kLines << box_shift) + (r & (box_rows - 1))) * 128);
  };
  const auto swz = [&](uint32_t line, int r, int c) {
    const int byte = c * 2;
    return line + static_cast<uint32_t>(byte / 128) * line_stride + static_cast<uint32_t>(((byte % 128 / 16) ^ (r % 8)) * 16 + byte % 16);
  };
  const int k_row = warp * 16 + (lane / 16) * 8 + lane % 8, v_row = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
  const uint32_t k_line = line_of(k_row), v_line = line_of(v_row);
  const float scale_log2 = p.scale * kLog2e;
  int g = 0;
  for (int i = 0;; ++i) {
    mbarrier_wait(&full[g % kStages], (g / kStages) & 1);  // the item's first stage: its metadata and Q
    const DecodeWsItem it = meta[i & 1];
    if (it.tiles < 0) break;  // the producer's end marker
    const uint32_t q_base = smem_u32(sq + (i & 1) * (Tr::kQBytes / 2));
    float o[kHeadDim / 8][4] = {};  // rows g, g + 8 (g = lane / 4) of each 8-column tile, this warp's keys
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // log2 units; l a per-thread partial sum
    uint32_t qa[kQInRegs ? kHeadDim / 16 : 1][4];
    for (int t = 0; t < max(it.tiles, 1); ++t, ++g) {
      const int st = g % kStages;
      if (t > 0) mbarrier_wait(&full[st], (g / kStages) & 1);
      const int key_t = it.k_begin + t * kTileKeys, key0 = key_t + warp * 16;
      if (it.tiles > 0 && key_t + kTileKeys > it.k_end) {
        // The item's last tile: V's rows past its end (a page's stale tail, or boxes not loaded:
        // P is 0 there, but 0 x NaN is not) cleared by each warp among its own 16 keys, the only V
        // rows it reads (no block barrier); the writes fenced before the copy engine's next ones
        // into the stage (the next item's tiles).
        const int r0 = max(it.k_end - key_t, warp * 16), r1 = warp * 16 + 16;
        if (r0 < r1) {
          unsigned char* vt = reinterpret_cast<unsigned char*>(sv) + st * Tr::kStageBytes;
          for (int j = lane; j < (r1 - r0) * kLines * 8; j += 32) {
            const int r = r0 + j / (kLines * 8), line = j / 8 % kLines, c = j % 8;
            *reinterpret_cast<uint4*>(vt + line_of(r) + line * line_stride + c * 16) = make_uint4(0u, 0u, 0u, 0u);
          }
          fence_proxy_async_smem();
          __syncwarp();
        }
      }
      if (it.tiles > 0 && key0 < it.k_end) {
        const uint32_t k_base = smem_u32(reinterpret_cast<unsigned char*>(sk) + st * Tr::kStageBytes);
        const uint32_t v_base = smem_u32(reinterpret_cast<unsigned char*>(sv) + st * Tr::kStageBytes);
        if (kQInRegs && t == 0) {
#pragma unroll
          for (int kk = 0; kk < kHeadDim / 16; ++kk)
            ldmatrix_x4(qa[kQInRegs ? kk : 0], q_base + ((lane % 16) * kRowElems + kk * 16 + (lane / 16) * 8) * 2);
        }
        // S = Q K^T: 16 heads x 16 keys, the head dim's steps in two accumulator chains (d <= 128).
        float sc[2][4] = {}, sc2[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          uint32_t a[4], bk[4];
          if constexpr (kQInRegs) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = qa[kk][e];
          } else {
            ldmatrix_x4(a, q_base + ((lane % 16) * kRowElems + kk * 16 + (lane / 16) * 8) * 2);
          }
          ldmatrix_x4(bk, k_base + swz(k_line, k_row, kk * 16 + ((lane / 8) % 2) * 8));
          if (kk % 2 == 0 || !kQInRegs) mma_m16n8k16_x2<T>(sc[0], sc[1], a, bk);
          else mma_m16n8k16_x2<T>(sc2[0], sc2[1], a, bk);
        }
        // Online softmax per row (query head); keys past the item masked.
        float mx[2] = {m[0], m[1]};
        const bool tail = key0 + 16 > it.k_end;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + nt * 8 + 2 * (lane % 4) + e % 2;
            sc[nt][e] = !tail || key < it.k_end ? (sc[nt][e] + sc2[nt][e]) * scale_log2 : -INFINITY;
            mx[e / 2] = fmaxf(mx[e / 2], sc[nt][e]);
          }
        float corr[2], base2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          base2[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // every key so far masked: no NaN from -inf - -inf
          corr[r] = exp2f(m[r] - base2[r]);
          m[r] = mx[r];
          l[r] *= corr[r];
        }
        uint32_t pa[4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          float pr[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) pr[e] = exp2f(sc[nt][e] - base2[e / 2]), l[e / 2] += pr[e];
          pa[2 * nt] = pack2<T>(pr[0], pr[1]);
          pa[2 * nt + 1] = pack2<T>(pr[2], pr[3]);
        }
        if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
          for (int j = 0; j < kHeadDim / 8; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
        }
        // O += P V (ldmatrix .trans: V's rows are the keys).
#pragma unroll
        for (int j = 0; j < kHeadDim / 16; ++j) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_base + swz(v_line, v_row, j * 16 + (lane / 16) * 8));
          mma_m16n8k16_x2<T>(o[2 * j], o[2 * j + 1], pa, bv);
        }
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&empty[st]);  // this warp is done with the stage
    }
    // The warps' states merge through the merge buffers (the previous item's reads of them are
    // done once every warp has passed this barrier).
    named_barrier_sync(1, kMathThreads);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int gr = lane / 4;
    if (lane % 4 == 0) {
      s_m[warp * kRows + gr] = m[0], s_m[warp * kRows + gr + 8] = m[1];
      s_l[warp * kRows + gr] = l[0], s_l[warp * kRows + gr + 8] = l[1];
    }
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) {
      float* dst = s_o + (warp * kRows + gr) * kHeadDim + j * 8 + 2 * (lane % 4);
      *reinterpret_cast<float2*>(dst) = make_float2(o[j][0], o[j][1]);
      *reinterpret_cast<float2*>(dst + 8 * kHeadDim) = make_float2(o[j][2], o[j][3]);
    }
    named_barrier_sync(1, kMathThreads);
    // Per head: M = max m_w, L = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M) / L.
    for (int xi = tid; xi < it.ng * kHeadDim; xi += kMathThreads) {
      const int r = xi / kHeadDim, c = xi % kHeadDim;
      float big = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) big = fmaxf(big, s_m[w * kRows + r]);
      const float off = big == -INFINITY ? 0.f : big;
      float wsum = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(s_m[w * kRows + r] - off);
        wsum += s_l[w * kRows + r] * wt, acc += s_o[(w * kRows + r) * kHeadDim + c] * wt;
      }
      const float val = wsum > 0.f ? acc / wsum : 0.f, lse2 = wsum > 0.f ? off + log2f(wsum) : -INFINITY;
      const int h = it.h0 + r;
      if (it.row < 0) {
        static_cast<T*>(p.out)[it.b * p.out_batch_stride + h * p.out_head_stride + c] = from_float<T>(val);
        if (c == 0 && p.lse != nullptr) p.lse[static_cast<int64_t>(it.b) * p.nheads + h] = lse2 * 0.6931471805599453f;
      } else {
        s.partial_o[(static_cast<int64_t>(it.row) * p.nheads + h) * kHeadDim + c] = val;
        if (c == 0) s.partial_lse[static_cast<int64_t>(it.row) * p.nheads + h] = lse2;
      }
    }
  }
}

}  // namespace flashlab::kernels
