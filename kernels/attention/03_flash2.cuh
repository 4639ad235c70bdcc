// Rung 3 — FlashAttention-2: one thread block per (query block, head, batch), tensor cores.
//
// Changes from rung 2 (FA1 order, CUDA cores):
//   - Loop order: a thread block owns kBlockM = 64 query rows (16 per warp) and walks the key/
//     value blocks itself, so O, m and l of its rows stay in registers from the first key block
//     to the last: O is written once, no read-modify-write per key block, and the grid has
//     ceil(sq / 64) x nheads x batch blocks instead of nheads x batch.
//   - Tensor cores: S = Q K^T and O += P V are mma.sync m16n8k16 (fp32 accumulators) with
//     operands loaded by ldmatrix (.trans for V, whose rows are keys); Q's A-fragments are
//     loaded once and kept in registers (head dims <= 128; above, re-read from shared memory
//     each key block, the registers going to the larger O accumulator).
//   - P never leaves registers: the accumulator layout of S (m16n8, fp32) is, two n8 tiles at a
//     time and rounded to 16 bits, exactly the A-fragment layout of the P V mma.
//   - K/V tiles stream through a 2-stage cp.async pipeline: block n + 1 is in flight while
//     block n is computed. Tiles are zero-filled past the sequence ends (cp.async src-size 0).
//   - Softmax in base 2: logits are scaled by scale * log2(e) once (exp2 = one MUFU.EX2); the
//     row sums stay per-thread partial sums (reduced over the 4 threads of a row only at the
//     end) and the output is divided by l once per row at the end.
//   - Key blocks that are fully masked for the whole query block (causal, sliding window) are
//     skipped (attn_key_range); the element-wise mask is applied only to blocks that straddle
//     the mask boundary or the sequence end.
// Steps per key block n: sync; issue block n + 1's K and V copies; wait for block n; S = Q K_n^T;
// logits (scale, softcap, ALiBi, mask); m' = max(m, rowmax S); O *= 2^(m - m'); l = l 2^(m - m')
// + rowsum P; P = 2^(S - m'); O += P V_n.
// Shared memory: Q (64, d), K and V (2 stages, kBlockN, d), 16-bit, rows padded by 8 elements
// (an odd number of 16-byte chunks per row: the 8 rows of an ldmatrix 8x8 matrix fall in 8
// different bank groups).
// Limits: no warp specialization and synchronous mma.sync (the tensor cores idle during the
// softmax), rows of 64 per block (4 warps); the output is stored from registers in 4-byte pairs.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/attention/paged.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"

namespace flashlab::kernels {

// kScoreMod: the kernel applies softcap and/or ALiBi (the generic score path); without them the
// logit is the dot product times scale log2(e), and the registers that path needs go to a
// second m16 tile of rows per warp.
template <int kHeadDim_, bool kScoreMod_ = false>
struct Flash2Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kScoreMod = kScoreMod_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  // m16 tiles of rows per warp: with 2, every K and V fragment a warp loads feeds two mmas (half
  // the shared-memory reads per mma). The O accumulators of head dims past 128, or the generic
  // score path, leave no registers for a second tile.
  static constexpr int kMTiles = !kScoreMod && kHeadDim <= 128 ? 2 : 1;
  static constexpr int kBlockM = kWarps * 16 * kMTiles;  // query rows per block
  // Keys per block: the S accumulator (kMTiles x kBlockN / 2 registers), O (kMTiles x d / 2) and
  // Q (kMTiles x d / 4, when in registers) share a thread's registers.
  static constexpr int kBlockN = kMTiles == 2 ? (kHeadDim <= 64 ? 64 : 32) : kHeadDim <= 64 ? 128 : kHeadDim <= 192 ? 64 : 32;
  static constexpr bool kQInRegs = kMTiles == 2 ? kHeadDim <= 64 : kHeadDim <= 128;
  static constexpr int kStride = kHeadDim + 8;  // shared row stride in elements (padded)
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kNTiles = kBlockN / 8;   // n8 tiles of S
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O
  static constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kPSteps = kBlockN / 16;   // k16 steps of P V
  static constexpr int kSmemElems = (kBlockM + 4 * kBlockN) * kStride;  // Q + 2 x K + 2 x V
  static constexpr int kSmemBytes = kSmemElems * 2;
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dims 32, 64, 96, 128, 192, 256");
  static_assert((kStride / 8) % 2 == 1, "an odd number of 16-byte chunks per shared row");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 loads two n8 tiles at a time");
};

// Copies rows [row0, row0 + kRows) of one head of a (rows, d) tensor slice into a shared tile,
// zero-filling rows >= nrows. `base` points at row 0 of the slice; rows are `row_stride` elements
// apart. The tile: rows Tr::kStride elements apart (padded), or, with Rows, element (r, col) at
// Rows::at(r, col) (the backward's swizzled tiles).
template <typename T, typename Tr, int kRows, typename Rows = void>
__device__ __forceinline__ void flash2_load_tile(T* smem, const T* base, int64_t row_stride, int row0, int nrows) {
  const auto dst = [](int r, int c) {
    if constexpr (std::is_void_v<Rows>) return r * Tr::kStride + c * 8;
    else return Rows::at(r, c * 8);
  };
  constexpr int kTotal = kRows * Tr::kChunks;
  static_assert(kTotal % Tr::kThreads == 0, "whole chunks per thread");
  if constexpr (Tr::kThreads % Tr::kChunks == 0) {
    // A compile-time trip count (the loop below from threadIdx.x is not unrolled cleanly): each
    // thread keeps its chunk column and walks rows kThreads / kChunks apart, one address
    // computed, then a constant stride.
    constexpr int kRowsPerPass = Tr::kThreads / Tr::kChunks;
    const int r0 = threadIdx.x / Tr::kChunks, c = threadIdx.x % Tr::kChunks;
    const T* src = base + static_cast<int64_t>(row0 + r0) * row_stride + c * 8;
    const int64_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
    for (int it = 0; it < kRows / kRowsPerPass; ++it) {
      const int r = r0 + it * kRowsPerPass;
      const bool in = row0 + r < nrows;
      cp_async_16(smem + dst(r, c), in ? src + it * pass_stride : base, in ? 16 : 0);
    }
  } else {
    // (Head dims 96 and 192. A compile-time trip count here, fully unrolled, spilled rung 3 at
    // head dim 192.)
#pragma unroll
    for (int e = threadIdx.x; e < kTotal; e += Tr::kThreads) {
      const int r = e / Tr::kChunks, c = e % Tr::kChunks;
      const bool in = row0 + r < nrows;
      const T* src = in ? base + static_cast<int64_t>(row0 + r) * row_stride + c * 8 : base;
      cp_async_16(smem + dst(r, c), src, in ? 16 : 0);
    }
  }
}

// Grid (ceil(max_sq / kBlockM), nheads, batch), Tr::kThreads threads, Tr::kSmemBytes dynamic
// shared memory.
// kDropout: P multiplied by the dropout mask before P V (the row sums stay those before
// dropout; O / l times 1 / (1 - p) at the end). Only with kScoreMod: its draws need the registers
// the generic score path leaves (one m16 tile per warp; the two-tile kernel spilled).
// kPaged: K and V from a paged cache (p.kv_indptr; q and o varlen), copied by PagedRowCopy
// (kernels/attention/paged.cuh).
template <typename T, int kHeadDim, bool kScoreMod, bool kDropout = false, bool kPaged = false>
__global__ void __launch_bounds__(Flash2Traits<kHeadDim, kScoreMod>::kThreads) attn_flash2_kernel(const __grid_constant__ AttnFwdParams p) {
  static_assert(!kDropout || kScoreMod, "dropout runs on the generic score path");
  using Tr = Flash2Traits<kHeadDim, kScoreMod>;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kS = Tr::kStride;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // (kM, kS)
  T* ks = qs + kM * kS;                    // (2, kN, kS)
  T* vs = ks + 2 * kN * kS;                // (2, kN, kS)

  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * kM;
  const AttnBatch sb = attn_batch<kPaged>(p, b);
  if (m0 >= sb.sq) return;  // varlen: this batch has fewer rows
  const int hk = h / (p.nheads / p.nheads_kv);
  const AttnScoreMod mod = attn_score_mod(p, b, h, sb);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  constexpr int kMT = Tr::kMTiles;
  // This thread's rows: row0 + 16 mt + g and row0 + 16 mt + g + 8 for each m16 tile mt.
  const int warp_row = warp * 16 * kMT;  // first row of this warp in the block
  const int row0 = m0 + warp_row + g;

  const T* q = static_cast<const T*>(p.q) + attn_offset(p, b, sb.q_row0, 0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  // Paged: the pools' KV head (the page table places the rows); else this sequence's first row.
  const T* k = static_cast<const T*>(p.k) +
               (kPaged ? hk * p.k_head_stride : attn_offset(p, b, sb.k_row0, 0, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride));
  const T* v = static_cast<const T*>(p.v) +
               (kPaged ? hk * p.v_head_stride : attn_offset(p, b, sb.k_row0, 0, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride));
  // K and V block rows key0 .. key0 + kN into stage buffers.
  const auto load_kv = [&](T* kdst, T* vdst, int key0) {
    if constexpr (kPaged) {
      const IntDivisor page_size = IntDivisor::of(static_cast<uint32_t>(p.page_size), p.page_size_magic, p.page_size_shift);
      const PagedRowCopy<kN, kHeadDim / 8> rows(p.kv_indices + p.kv_indptr[b], page_size, key0, sb.sk);
      const auto at = [](int row, int col) { return static_cast<uint32_t>((row * kS + col) * sizeof(T)); };
      rows.copy(reinterpret_cast<unsigned char*>(kdst), k, static_cast<int>(p.k_batch_stride), static_cast<int>(p.k_row_stride), at);
      rows.copy(reinterpret_cast<unsigned char*>(vdst), v, static_cast<int>(p.v_batch_stride), static_cast<int>(p.v_row_stride), at);
    } else {
      flash2_load_tile<T, Tr, kN>(kdst, k, p.k_row_stride, key0, sb.sk);
      flash2_load_tile<T, Tr, kN>(vdst, v, p.v_row_stride, key0, sb.sk);
    }
  };
  T* o = static_cast<T*>(p.o) + attn_offset(p, b, sb.q_row0, 0, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);

  // Key blocks this query block can see.
  const int rows_hi = sb.sq - m0 < kM ? sb.sq : m0 + kM;
  const AttnKeyRange kr = attn_key_range(m0, rows_hi, sb.sk, mod.diag, mod.window_left, mod.window_right);
  const int n_begin = kr.lo / kN, n_end = kr.hi > kr.lo ? (kr.hi + kN - 1) / kN : n_begin;

  float acc[kMT][Tr::kDTiles][4];  // O: per m16 tile, rows (g, g + 8) x columns 8 j + 2 t + {0, 1}
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < Tr::kDTiles; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  float row_max[kMT][2], row_sum[kMT][2];  // running max (log2 units); this thread's partial sums of 2^(s - max)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY, row_sum[mt][0] = row_sum[mt][1] = 0.f;

  const float scale_log2 = mod.scale * kLog2e, slope_log2 = mod.slope * kLog2e;
  uint32_t qf[Tr::kQInRegs ? kMT : 1][Tr::kQInRegs ? Tr::kKSteps : 1][4];  // Q A-fragments (when kept in registers)
  // ldmatrix addresses: A (Q, row-major): lane -> row (l % 8) + 8 ((l / 8) % 2), column 8 (l / 16);
  // B of Q K^T (K rows are keys): lane -> key (l % 8) + 8 (l / 16), column 8 ((l / 8) % 2);
  // B of P V (V rows are keys, .trans): lane -> key (l % 8) + 8 ((l / 8) % 2), column 8 (l / 16).
  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);
  const int kb_row = (lane % 8) + 8 * (lane / 16), kb_col = 8 * ((lane / 8) % 2);
  const int vb_row = a_row, vb_col = a_col;
  const auto smem_addr = [](const T* ptr) { return static_cast<uint32_t>(__cvta_generic_to_shared(ptr)); };

  if (n_begin < n_end) {
    flash2_load_tile<T, Tr, kM>(qs, q, p.q_row_stride, m0, sb.sq);
    load_kv(ks, vs, n_begin * kN);
    cp_async_commit();
  }
  for (int n = n_begin; n < n_end; ++n) {
    const int stage = (n - n_begin) % 2;
    T* kst = ks + stage * kN * kS;
    T* vst = vs + stage * kN * kS;
    __syncthreads();  // every warp is done with the other stage (block n - 1)
    if (n + 1 < n_end) {
      load_kv(ks + (1 - stage) * kN * kS, vs + (1 - stage) * kN * kS, (n + 1) * kN);
    }
    cp_async_commit();  // (possibly empty: keeps one group per iteration)
    cp_async_wait<1>();  // block n (and Q) landed
    __syncthreads();
    if constexpr (Tr::kQInRegs) {
      if (n == n_begin) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int kk = 0; kk < Tr::kKSteps; ++kk)
            ldmatrix_x4(qf[mt][kk], smem_addr(qs + (warp_row + 16 * mt + a_row) * kS + kk * 16 + a_col));
      }
    }

    // S = Q K^T: (16 kMT, kN) per warp; each K fragment feeds the kMT m16 tiles.
    float s[kMT][Tr::kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < Tr::kNTiles; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kk][e];
        } else {
          ldmatrix_x4(a[mt], smem_addr(qs + (warp_row + 16 * mt + a_row) * kS + kk * 16 + a_col));
        }
      }
#pragma unroll
      for (int j = 0; j < Tr::kNTiles; j += 2) {
        uint32_t bk[4];  // keys 8 j .. 8 j + 15, head dims 16 kk .. 16 kk + 15
        ldmatrix_x4(bk, smem_addr(kst + (j * 8 + kb_row) * kS + kk * 16 + kb_col));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma_m16n8k16_x2<T>(s[mt][j], s[mt][j + 1], a[mt], bk);
      }
    }

    // Logits in log2 units (softcap and ALiBi only in the kScoreMod kernel); the mask only where
    // this block needs it.
    const int k0 = n * kN;
    const bool need_mask = k0 + kN > sb.sk || (mod.window_left >= 0 && k0 < m0 + kM - 1 + mod.diag - mod.window_left) ||
                           (mod.window_right >= 0 && k0 + kN - 1 > m0 + mod.diag + mod.window_right);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < Tr::kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row0 + 16 * mt + (e / 2) * 8, key = k0 + j * 8 + 2 * t + (e % 2);
          float x = s[mt][j][e];
          if constexpr (kScoreMod) x = attn_logit_log2(x, i, key, mod, scale_log2, slope_log2);
          else x *= scale_log2;
          if (need_mask && (key >= sb.sk || !attn_visible(i, key, mod.diag, mod.window_left, mod.window_right))) x = -INFINITY;
          s[mt][j][e] = x;
        }
      }

    // Online softmax: new row max (over the 4 threads of a row), rescale O and l, P = 2^(s - max).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int j = 0; j < Tr::kNTiles; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with every key so far masked keeps max -inf: use 0 as the offset so that
        // 2^(-inf - 0) = 0 instead of 2^(-inf + inf) = NaN.
        const float off = mx == -INFINITY ? 0.f : mx;
        const float rescale = exp2f(row_max[mt][r] - off);  // 0 when the old max is -inf
        row_max[mt][r] = mx;
        row_sum[mt][r] *= rescale;
#pragma unroll
        for (int j = 0; j < Tr::kDTiles; ++j) acc[mt][j][2 * r] *= rescale, acc[mt][j][2 * r + 1] *= rescale;
#pragma unroll
        for (int j = 0; j < Tr::kNTiles; ++j) {
          s[mt][j][2 * r] = exp2f(s[mt][j][2 * r] - off);
          s[mt][j][2 * r + 1] = exp2f(s[mt][j][2 * r + 1] - off);
          row_sum[mt][r] += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
        }
      }

    // Dropout: each (row, key pair) of this thread's P regenerated from the seed (one Philox call
    // per pair), dropped entries zeroed; the row sums above are those before dropout.
    if constexpr (kDropout) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < Tr::kNTiles; ++j)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float z0, z1;
            attn_dropout_weight2(p, b, h, row0 + 16 * mt + 8 * r, k0 + j * 8 + 2 * t, z0, z1);
            s[mt][j][2 * r] *= z0 == 0.f ? 0.f : 1.f;
            s[mt][j][2 * r + 1] *= z1 == 0.f ? 0.f : 1.f;
          }
    }

    // O += P V: P's A-fragments straight from the S accumulators (two n8 tiles per k16 step);
    // each V fragment feeds the kMT m16 tiles.
#pragma unroll
    for (int kk = 0; kk < Tr::kPSteps; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int j = 0; j < Tr::kDTiles; j += 2) {
        uint32_t bv[4];  // keys 16 kk .. 16 kk + 15, head dims 8 j .. 8 j + 15 (transposed)
        ldmatrix_x4_trans(bv, smem_addr(vst + (kk * 16 + vb_row) * kS + j * 8 + vb_col));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma_m16n8k16_x2<T>(acc[mt][j], acc[mt][j + 1], a[mt], bv);
      }
    }
  }

  // Epilogue: l over the row's 4 threads, O / l, lse = (max + log2 l) ln 2.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      float inv = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key: O = 0
      if constexpr (kDropout) inv *= p.dropout_scale;
      const int i = row0 + 16 * mt + 8 * r;
      if (i < sb.sq) {
        T* orow = o + static_cast<int64_t>(i) * p.o_row_stride;
#pragma unroll
        for (int j = 0; j < Tr::kDTiles; ++j)
          *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t) = pack2<T>(acc[mt][j][2 * r] * inv, acc[mt][j][2 * r + 1] * inv);
        if (t == 0 && p.lse != nullptr) {
          const int64_t at = attn_lse_offset<kPaged>(p, b, h, sb, i);
          p.lse[at] = l > 0.f ? (row_max[mt][r] + log2f(l)) * 0.6931471805599453f : -INFINITY;
        }
      }
    }
}

}  // namespace flashlab::kernels
