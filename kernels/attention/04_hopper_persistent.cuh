// Rung 4 with a persistent, dynamic tile scheduler (prepared 2026-11-26, not yet run on a GPU;
// measured against the library's rung 4 by bench/experiments/attention_hopper_ablation.cu
// --persistent). The kernel of kernels/attention/04_hopper.cuh (16-bit, not paged: pingpong and
// intra-warpgroup overlap on, the same helpers, copied) with one change of structure:
//   - One CTA per SM (grid = min(tiles, SMs)) walks tiles (128-row query block, head, batch) in
//     the library's order (query blocks fastest, from the last: the longest causal rows first;
//     then heads, then batches). CTA c starts with tile c; every next tile comes from a counter in
//     global memory (atomicAdd by the producer thread), so a
//     CTA that drew short tiles draws more: the static striding of a80b187 (tile c, c + #CTAs, ...)
//     left CTAs with long causal tiles behind (16k causal 599 -> 417 TFLOP/s). The counter and a
//     count of CTAs done live in the library's zero-filled counters workspace; the last CTA to
//     finish its walk zeroes both for the next launch.
//   - The producer runs ahead across tiles: it hands each tile to the consumers through a Q
//     buffer (the tile index in tile_of[], Q's bytes on q_full), two Q buffers where they fit
//     (head dims <= 128), so the next tile's Q and first K/V blocks load while this tile computes
//     and stores its output; with one, the next Q waits for this tile's epilogue. A tile index of
//     -1 ends the walk. The K/V ring's stage and phase counters run on across tiles.
//   - A Q buffer goes back to the producer (q_empty, one arrive per consumer warpgroup) once the
//     warpgroup's O rows in it have been read out (TMA store read, or the varlen copy).
// Why it should pay: a non-persistent CTA loads Q and its first K/V block before any math and
// stores O after the last (one CTA per SM: nothing overlaps them); at 512-1k keys that is a large
// part of a CTA's life (rung 4 reaches 373 / 530 TFLOP/s there against 596-615 at 2k-16k).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention/04_hopper.cuh"

namespace flashlab::kernels {

template <int kHeadDim, bool kScoreMod, int kBlockN = 0>
struct HopperAttnPersistentTraits : HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, 2> {
  using Base = HopperAttnTraits<kHeadDim, kScoreMod, kBlockN, 2>;
  // Q buffers: two where they fit next to the K/V ring, else one.
  static constexpr int kQStages =
      2 * Base::kQBytes + Base::kStages * (Base::kKBytes + Base::kVBytes) + 1024 <= 227 * 1024 ? 2 : 1;
  static constexpr int kSmemBytes = kQStages * Base::kQBytes + Base::kStages * (Base::kKBytes + Base::kVBytes) + 1024;
};

// Grid: min(tiles, SMs) CTAs (1-D), Tr::kThreads threads, Tr::kSmemBytes dynamic shared memory;
// tiles = m_blocks x nheads x batch; counters[0] (the next tile - gridDim.x) and counters[1] (CTAs
// done) zero at launch, and left zero.
template <typename T, int kHeadDim, bool kScoreMod, int kBlockNArg = 0>
__global__ void __launch_bounds__(384, 1)
    attn_hopper_persistent_kernel(const __grid_constant__ HopperAttnArgs args, int* counters, int tiles) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma, TMA and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  static_assert(sizeof(T) == 2, "16-bit inputs (the FP8 path is the library kernel's only)");
  static_assert(kHeadDim <= 128, "head dims up to 128 (at 256 the consumers' tile state spilled at 240 registers)");
  using Tr = HopperAttnPersistentTraits<kHeadDim, kScoreMod, kBlockNArg>;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages, kQStages = Tr::kQStages;
  constexpr bool kFp8 = Tr::kFp8, kPaged = false, kPingpong = true;  // the copied helpers' switches (overlap: always)
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t q_full[kQStages], q_empty[kQStages], k_full[kStages], k_empty[kStages], v_full[kStages],
      v_empty[kStages];
  __shared__ int tile_of[kQStages];  // the tile whose Q buffer this is (-1: no more tiles)
  unsigned char* smem = align_smem<1024>(smem_raw);
  unsigned char* sq_all = smem;                        // (kQStages, kBoxes x 128 rows): Q, later O
  unsigned char* sk = sq_all + kQStages * Tr::kQBytes; // (kStages, kBoxes x kN rows)
  unsigned char* sv = sk + kStages * Tr::kKBytes;      // (kStages, kBoxes x kN rows)
  const AttnFwdParams& p = args.p;
  const bool varlen = p.cu_seqlens_q != nullptr;

  // Tile t: head-batch t / m_blocks, query block m_blocks - 1 - t % m_blocks (as the library's
  // grid). False for a tile past its batch's rows (varlen).
  struct Tile {
    int m0, h, b, hk, n_begin, n_blocks;
    AttnBatch sb;
    AttnScoreMod mod;
  };
  const auto tile_at = [&](int tile, Tile& w) {
    const int hb = tile / args.m_blocks;
    w.h = hb % p.nheads, w.b = hb / p.nheads;
    w.m0 = (args.m_blocks - 1 - tile % args.m_blocks) * kM;
    w.sb = attn_batch(p, w.b);
    if (w.m0 >= w.sb.sq) return false;
    w.hk = w.h / (p.nheads / p.nheads_kv);
    w.mod = attn_score_mod(p, w.b, w.h, w.sb);
    const int rows_hi = w.sb.sq - w.m0 < kM ? w.sb.sq : w.m0 + kM;
    const AttnKeyRange kr = attn_key_range(w.m0, rows_hi, w.sb.sk, w.mod.diag, w.mod.window_left, w.mod.window_right);
    w.n_begin = kr.lo / kN;
    w.n_blocks = kr.hi > kr.lo ? (kr.hi + kN - 1) / kN - w.n_begin : 0;
    return true;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQStages; ++s) {
      mbarrier_init(&q_full[s], 1);   // the producer's arrive (+ Q's bytes)
      mbarrier_init(&q_empty[s], 2);  // one arrive per consumer warpgroup, its O rows read out
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], 8);  // one arrive per consumer warp
      mbarrier_init(&v_empty[s], 8);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // producer: one thread hands out tiles and loads their Q, K and V
    // 40 registers (the library's producer has 24; the tile walk's state spilled at 24 and 32),
    // the consumers 232: 40 x 128 + 232 x 256 = 64,512 of the 65,536-register file.
    setmaxnreg_dec<40>();
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

  // Consumers: warpgroup cw = 0, 1 computes query rows [m0 + 64 cw, m0 + 64 cw + 64) of each tile.
  setmaxnreg_inc<232>();
  const int cw = wg - 1;
  const int t128 = threadIdx.x - 128 * wg;
  const int warp = t128 / 32, lane = t128 % 32;
  const int g = lane / 4, t = lane % 4;

  float o[kHeadDim / 2];  // O accumulator: d[4 j + 2 r + c] = row row0 + 8 r, column 8 j + 2 t + c
#pragma unroll
  for (int e = 0; e < kHeadDim / 2; ++e) o[e] = 0.f;
  // wgmma k-steps of 32 bytes of k (16 values of 16 bits, or 32 of 8 bits).
  constexpr int kQkSteps = kHeadDim * static_cast<int>(sizeof(T)) / 32, kPvSteps = kN * static_cast<int>(sizeof(T)) / 32;
  float s[kN / 2];               // S, then P in fp32, same layout with key columns
  uint32_t pa[kPvSteps][4];      // P as the register A operand of P V, one k-step per entry
  float row_max[2], row_sum[2];  // log2 units; partial sums (set per tile)
  // This tile's: score and mask parameters, key count, first row of the warpgroup, this thread's
  // rows (row0, row0 + 8), scales, and this warpgroup's 64 rows of each box of its Q buffer.
  AttnScoreMod mod{};
  int seqlen_k = 0, wg_row0 = 0, row0 = 0;
  float scale_log2 = 0.f, slope_log2 = 0.f;
  uint32_t q_base = 0;
  // Pingpong turns: warpgroup cw issues GEMMs after a sync on barrier 1 + cw, then lets the other
  // go with an arrive on its barrier. The second warpgroup starts by letting the first go, and
  // skips its final arrive (so every arrive is matched by a sync of the same barrier).
  const auto turn_begin = [&] {
    if constexpr (kPingpong) named_barrier_sync(1 + cw, 256);
  };
  const auto turn_end = [&](bool last) {
    if constexpr (kPingpong)
      if (!(last && cw == 1)) named_barrier_arrive(1 + (1 - cw), 256);
  };
  const auto gemm_qk = [&](int stage) {
    const uint32_t k_base = smem_u32(sk + stage * Tr::kKBytes);
    wgmma_fence_operands(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
      // K-major operands: the next k-step is 32 bytes further along the 128-byte rows of a box.
      const uint64_t da = wgmma_desc_sw128(q_base + (kk / 4) * kM * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = wgmma_desc_sw128(k_base + (kk / 4) * kN * 128 + (kk % 4) * 32, 16, 1024);
      Wgmma<T, kN>::template mma<0, 0>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // V's k-steps of 16 keys and 64-column boxes (LBO): kN rows of 128 bytes per box, or k-step-major
  // (paged, pages of 16: HopperAttnArgs::v_step_major).
  const bool v_steps = kPaged && args.v_step_major != 0;
  const uint32_t v_step_bytes = v_steps ? Tr::kBoxes * 2048 : 16 * 128, v_lbo = v_steps ? 2048 : kN * 128;
  const auto gemm_pv = [&](int stage) {
    const uint32_t v_base = smem_u32(sv + stage * Tr::kVBytes);
    wgmma_fence_operands(o);
    wgmma_fence_operands(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      if constexpr (kFp8) {
        // V^T is K-major (keys contiguous): the next 32 keys are 32 bytes further along each row.
        WgmmaRs<T, kHeadDim>::template mma<0>(o, pa[kk], wgmma_desc_sw128(v_base + kk * 32, 16, 1024), 1);
      } else {
        // V is MN-major for this GEMM (head dims contiguous): 16 more keys are 16 rows of 128
        // bytes further; 64-column boxes (LBO) are kN rows apart.
        const uint64_t db = wgmma_desc_sw128(v_base + kk * v_step_bytes, v_lbo, 1024);
        WgmmaRs<T, kHeadDim>::template mma<1>(o, pa[kk], db, 1);
      }
    }
    wgmma_commit();
  };
  const auto release = [&](uint64_t* bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };
  // A K or V buffer has landed. Paged: written by cp.async (generic proxy), read by wgmma (async
  // proxy): a proxy fence between them.
  const auto wait_full = [&](uint64_t* bar, uint32_t parity) {
    mbarrier_wait(bar, parity);
    if constexpr (kPaged) fence_proxy_async_smem();
  };
  // The online softmax of block n: s becomes 2^(logit - max) in log2 units, rescale[r] the factor
  // for O and l of row r. Plain scores stay raw dot products until the exponent, where one FFMA
  // applies scale log2(e) and subtracts the max (the max of raw scores scaled is the scaled max:
  // scale > 0); softcap / ALiBi (kScoreMod) turn s into log2-unit logits first. The mask is a
  // separate pass, taken only by blocks that straddle its boundary or the sequence end.
  const auto softmax = [&](int n, float (&rescale)[2]) {
    const int k0 = n * kN;
    if constexpr (kScoreMod) {
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row0 + (e / 2) * 8, key = k0 + j * 8 + 2 * t + (e % 2);
          s[4 * j + e] = attn_logit_log2(s[4 * j + e], i, key, mod, scale_log2, slope_log2);
        }
    }
    const bool need_mask = k0 + kN > seqlen_k ||
                           (mod.window_left >= 0 && k0 < wg_row0 + 63 + mod.diag - mod.window_left) ||
                           (mod.window_right >= 0 && k0 + kN - 1 > wg_row0 + mod.diag + mod.window_right);
    if (need_mask) {
      // Row i keeps keys [lo, hi] (attn_visible, clipped to the sequence), as offsets from this
      // thread's first key k0 + 2t: each score is two integer compares with a constant and a select.
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int d = row0 + 8 * r + mod.diag, base = k0 + 2 * t;
        const int hi = min(seqlen_k - 1, mod.window_right >= 0 ? d + mod.window_right : INT_MAX) - base;
        const int lo = (mod.window_left >= 0 ? d - mod.window_left : INT_MIN / 2) - base;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int off = j * 8 + c;
            s[4 * j + 2 * r + c] = off >= lo && off <= hi ? s[4 * j + 2 * r + c] : -INFINITY;
          }
      }
    }
    const float to_log2 = kScoreMod ? 1.f : scale_log2;  // s x to_log2: log2-unit logits
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(row_max[r], mx * to_log2);
      // A row with every key so far masked keeps max -inf: offset 0 gives 2^(-inf) = 0, not NaN.
      const float off = mx == -INFINITY ? 0.f : mx;
      rescale[r] = exp2_approx_ftz(row_max[r] - off);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        s[4 * j + 2 * r] = exp2_approx_ftz(fmaf(s[4 * j + 2 * r], to_log2, -off));
        s[4 * j + 2 * r + 1] = exp2_approx_ftz(fmaf(s[4 * j + 2 * r + 1], to_log2, -off));
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
      row_sum[r] = row_sum[r] * rescale[r] + sum;
    }
  };
  const auto rescale_o = [&](const float (&rescale)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= rescale[e / 2];
  };
  // P's A fragments. 16-bit: columns 16 kk .. 16 kk + 15 are the accumulator's n8 tiles 2 kk and
  // 2 kk + 1. FP8: a register holds 4 consecutive k of one row, k 4t .. 4t + 3 (t = lane % 4), but
  // the thread's scores of a 16-key group are keys 2t, 2t + 1, 2t + 8, 2t + 9: it packs those,
  // and the transposed V tile holds its keys in the same order (attn_fp8_v_position), so P V
  // pairs each probability with its key's row of V without moving bytes between threads.
  const auto convert_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      if constexpr (kFp8) {
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
  };


  int qt = 0, it = 0;  // tiles and K/V blocks consumed so far
  while (true) {
    const int qs = qt % kQStages;
    mbarrier_wait(&q_full[qs], (qt / kQStages) & 1);
    ++qt;
    const int tile = *static_cast<volatile int*>(&tile_of[qs]);
    if (tile < 0) break;
    Tile w;
    tile_at(tile, w);  // a tile the producer handed out lies in its batch's rows
    const AttnBatch& sb = w.sb;
    const int b = w.b, h = w.h, n_begin = w.n_begin, n_blocks = w.n_blocks;
    mod = w.mod, seqlen_k = sb.sk;
    wg_row0 = w.m0 + 64 * cw;
    row0 = wg_row0 + warp * 16 + g;
    scale_log2 = mod.scale * kLog2e, slope_log2 = mod.slope * kLog2e;
    unsigned char* sq = sq_all + qs * Tr::kQBytes;
    q_base = smem_u32(sq) + cw * 64 * 128;
#pragma unroll
    for (int e = 0; e < kHeadDim / 2; ++e) o[e] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    if (n_blocks > 0) {
      if constexpr (kPingpong)
        if (cw == 1) named_barrier_arrive(1, 256);  // the first warpgroup goes first
      float rescale[2];
      // Block 0: S only (the library kernel's kOverlap schedule; K/V stage of block i: it + i).
      wait_full(&k_full[it % kStages], (it / kStages) & 1);
      turn_begin();
      gemm_qk(it % kStages);
      turn_end(false);
      wgmma_wait<0>();
      wgmma_fence_operands(s);
      release(&k_empty[it % kStages]);
      softmax(n_begin, rescale);
      convert_p();
      for (int i = 1; i < n_blocks; ++i) {
        const int cur = it + i, prv = it + i - 1;
        const int st = cur % kStages, prev = prv % kStages;
        wait_full(&k_full[st], (cur / kStages) & 1);
        wait_full(&v_full[prev], (prv / kStages) & 1);
        turn_begin();
        gemm_qk(st);    // S_i = Q K_i^T
        gemm_pv(prev);  // O += P_{i-1} V_{i-1}
        turn_end(false);
        wgmma_wait<1>();  // S_i done; P V still running
        wgmma_fence_operands(s);
        release(&k_empty[st]);
        softmax(n_begin + i, rescale);
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&v_empty[prev]);
        rescale_o(rescale);
        convert_p();
      }
      const int lst = it + n_blocks - 1;
      wait_full(&v_full[lst % kStages], (lst / kStages) & 1);
      turn_begin();
      gemm_pv(lst % kStages);
      turn_end(true);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      release(&v_empty[lst % kStages]);
      it += n_blocks;
    }

    // Epilogue (the library kernel's): l over the row's 4 threads, O / l into this warpgroup's rows
    // of the tile's Q buffer (its own wgmmas, the only readers of those rows, have completed), LSE
    // from registers; then the TMA store (or the varlen copy) and the buffer's release.
    T* out_rows = static_cast<T*>(p.o) + attn_offset(p, b, sb.q_row0, 0, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key: O = 0
      const int row = 64 * cw + warp * 16 + g + 8 * r;  // in the tile's 128
      const int i = row0 + 8 * r;
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j)
        *reinterpret_cast<uint32_t*>(sq + hopper_attn_swizzle(row, 8 * j + 2 * t, kM)) =
            pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (t == 0 && p.lse != nullptr && i < sb.sq)
        p.lse[attn_lse_offset(p, b, h, sb, i)] = l > 0.f ? (row_max[r] + log2f(l)) * 0.6931471805599453f : -INFINITY;
    }
    fence_proxy_async_smem();  // the writes above before the TMA engine reads them
    named_barrier_sync(3 + cw, 128);
    if (wg_row0 < sb.sq) {
      if (!varlen) {
        if (t128 == 0) {
#pragma unroll
          for (int x = 0; x < Tr::kBoxes; ++x) tma_store_4d(&args.o, sq + x * kM * 128 + cw * 64 * 128, x * 64, wg_row0, h, b);
          tma_store_commit();
          tma_store_wait_all<true>();  // the copy has read the buffer
        }
      } else {
        // Rows past this sequence belong to the next one: copy row by row, 16 bytes at a time.
        constexpr int kChunks = kHeadDim / 8;
        for (int e = t128; e < 64 * kChunks; e += 128) {
          const int r = e / kChunks, c = e % kChunks;
          const int i = wg_row0 + r;
          if (i >= sb.sq) continue;
          const uint4 v = *reinterpret_cast<const uint4*>(sq + hopper_attn_swizzle(64 * cw + r, 8 * c, kM));
          *reinterpret_cast<uint4*>(out_rows + static_cast<int64_t>(i) * p.o_row_stride + 8 * c) = v;
        }
        named_barrier_sync(3 + cw, 128);  // every thread's reads of the buffer done
      }
    }
    if (t128 == 0) mbarrier_arrive(&q_empty[qs]);
  }
#endif
}

}  // namespace flashlab::kernels
