// Backward rung 2 — FlashAttention-2 style: one thread block per (key block, KV head, batch),
// tensor cores, P recomputed block by block and never stored in global memory.
//
// Changes from rung 1 (naive, P and dS materialised in global memory):
//   - Loop order: a thread block owns kBlockN keys of one KV head; K and V stay in shared memory
//     while it walks the query blocks that can see them (attn_row_range: causal and window skip
//     the others) of every query head of its group (GQA: dK, dV summed in registers, no extra
//     pass). dK and dV accumulate in registers (fp32) and are written once.
//   - Per query block (kBlockM rows): Q and dO by cp.async, with lse (as a base-2 offset) and
//     D = rowsum(dO * O) (preprocess kernel); then on mma.sync m16n8k16 with ldmatrix operands:
//       S = Q K^T and dP = dO V^T        (warp tile 32 x 32, 64 x 32 with 128-row blocks; 16 x 32
//                                         with 64-key blocks)
//       P = 2^(S log2(e) - lse log2(e)), dS = P (dP - D) g   (g: scale; times 1 - tanh^2 with
//       softcap), both rounded to 16 bits into shared memory
//       dV += P^T dO and dK += dS^T Q     (warp tile kBlockN / 4 keys x d / 2 columns; P^T and
//       dS^T read by ldmatrix.trans)
//       dQ += dS K (warp tile 32 rows x d / 4 columns at d 64 (64 rows with 128-row blocks), 128;
//       else 16 x d / 2): fp32 atomics, one red.global.add.v4.f32 a lane per n8 tile, into a
//       workspace laid out in the order the warps add it (a warp's reduction 512 contiguous
//       bytes: Flash2BwdTraits::dq_tile_offset), put back in order and converted to dq's dtype
//       by a last kernel (attn_bwd_dq_convert_tiles_kernel); so the result depends on the order
//       of the adds (not deterministic; `deterministic` takes rung 1).
// Blocks: 64 query rows (128 at head dims up to 64, dropout aside) x 128 keys for head dims up to
// 128, 64 keys above: the wider the key
// block, the fewer times Q, dO, lse and D are loaded and dQ is added per key, and the more
// MMAs each ldmatrix'd fragment feeds. One thread block (8 warps) per SM: the dK / dV
// accumulators take 2 x kBlockN x d / 256 fp32 registers a thread (128 at d 128 and 256).
// Shared memory: Q, dO (two buffers each: the next query block lands while this one is
// computed), K, V (kBlockN x d), P, dS (kBlockM x kBlockN), 16-bit, XOR-swizzled rows (head dims
// 64, 128, 256; rows padded by 8 elements at 32, 96, 192: Flash2BwdRows); lse, D. The element-wise
// mask only on blocks that straddle it.
// Limits: one thread block's phases run in series between barriers (S/dP, then P/dS, then the
// dK/dV/dQ products), and the dQ atomics (every key block adds the whole dQ of its query blocks:
// seqlen_k / kBlockN times the size of dQ through L2).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/attention/03_flash2.cuh"
#include "kernels/attention/common.cuh"
#include "kernels/attention/backward/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dtype.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/online_softmax.cuh"

namespace flashlab::kernels {

// A shared tile of 16-bit rows of kCols elements, in one of two layouts that keep ldmatrix (8 rows
// of one 16-byte chunk column) and the P / dS stores (8 rows x 4 words) free of bank conflicts:
// rows of a multiple of 64 elements XOR-swizzled (chunk c of row r at chunk c ^ (r % 8), rows
// unpadded), others padded by one chunk (an odd number of chunks a row). The swizzle also keeps
// each 128-byte global line of a cp.async copy on one aligned 128-byte span of shared memory: with
// rows of 272 bytes the Q / dO copies took 2.6x their ideal shared wavefronts and 1.5x their
// ideal L2 sectors (Nsight Compute, d 128 16k, H100, 2026-11-27).
template <int kCols>
struct Flash2BwdRows {
  static constexpr bool kSwizzle = kCols % 64 == 0;
  static constexpr int kStride = kSwizzle ? kCols : kCols + 8;  // elements between rows
  static_assert(kSwizzle || (kStride / 8) % 2 == 1, "an odd number of 16-byte chunks per padded row");
  // Element (row, col): col a multiple of 8, or inside the chunk of one.
  __device__ __forceinline__ static constexpr int at(int row, int col) {
    if constexpr (kSwizzle) return row * kStride + (((col / 8) ^ (row % 8)) * 8) + col % 8;
    else return row * kStride + col;
  }
};

// kNarrow: 64-key blocks at every head dim (the dropout kernel: its draws need registers that
// 128-key blocks, with 128 accumulators a thread, do not leave).
template <int kHeadDim_, bool kNarrow = false>
struct Flash2BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Query rows per step (kAttnBwdRowPad, the preprocess's padding, is a multiple): 128 at head dims
  // up to 64 (half the steps, barriers and dQ reduction bursts per key block; 6-7% faster at d 64
  // than 64 rows, H100, 2026-11-27), else 64 (d 128's 128 dK / dV accumulators leave no room for
  // 128-row S and dP tiles).
  static constexpr int kBlockM = kHeadDim <= 64 && !kNarrow ? 128 : 64;
  static constexpr int kBlockN = kHeadDim <= 128 && !kNarrow ? 128 : 64;  // keys per thread block
  // S and dP: kSWarpsM warps along the rows x kSWarpsN along the keys, each warp kSMTiles m16
  // tiles x kSNTiles n8 tiles (128 keys: 32 rows x 32 keys; 64 keys: 16 rows x 32 keys, fewer
  // fragment registers next to the larger dK / dV accumulators of head dims past 128).
  static constexpr int kSWarpsM = kBlockN == 128 ? 2 : 4, kSWarpsN = kWarps / kSWarpsM;
  static constexpr int kSMTiles = kBlockM / kSWarpsM / 16, kSNTiles = kBlockN / kSWarpsN / 8;
  // dK and dV: 4 warps along the keys x 2 along the head dim (kBlockN / 4 keys x d / 2 columns);
  // past head dim 128, 2 x 4 (32 keys x d / 4: per k16 step 2 A and 4 B fragment loads for 16
  // MMAs instead of 1 and 8; FA2's d 256 layout; with the dQ layout below, 6-10% faster at d 256,
  // H100, 2026-11-27).
  static constexpr int kKVWarpsN = kHeadDim > 128 ? 2 : 4, kKVWarpsD = kWarps / kKVWarpsN;
  static constexpr int kKVMTiles = kBlockN / kKVWarpsN / 16;
  static constexpr int kKVCols = kHeadDim / kKVWarpsD;  // head-dim columns of a warp's dK / dV
  static constexpr int kKVTiles = kKVCols / 8;
  // dQ: kQWarpsM warps along the rows x kQWarpsD along the head dim, kQMTiles m16 tiles x
  // kDqCols columns each, in chunks of kDqChunk columns (accumulators of one chunk live at a time);
  // 2 x 4 warps wherever d / 4 is a multiple of 16 (d 64, 128, 192, 256), except with 128-row
  // blocks (d 64): 4 x 2, 32 rows x 32 columns (FA2's layout there; +0.5-1.3%, H100, 2026-11-27).
  static constexpr int kQWarpsD = (kHeadDim / 4) % 16 == 0 && kBlockM == 64 ? 4 : 2, kQWarpsM = kWarps / kQWarpsD;
  static constexpr int kQMTiles = kBlockM / kQWarpsM / 16;
  static constexpr int kDqCols = kHeadDim / kQWarpsD;
  static constexpr int kDqChunk = kDqCols % 32 == 0 ? 32 : kDqCols;
  // dQ's n8 tiles a lane adds per step (kQMTiles x kDqCols / 8), four floats each.
  static constexpr int kDqFrags = kQMTiles * kDqCols / 8;
  // Shared tiles: Q, dO, K, V rows of d (QRows), P and dS rows of kBlockN keys (PRows).
  using QRows = Flash2BwdRows<kHeadDim>;
  using PRows = Flash2BwdRows<kBlockN>;
  static constexpr int kStride = QRows::kStride, kPStride = PRows::kStride;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row (flash2_load_tile)
  // One thread block per SM (up to 255 registers a thread for 2 kBlockN x d / 256 fp32 dK / dV
  // accumulators), Q and dO twice: the next query block lands while this one is computed.
  static constexpr int kStages = 2;
  // Q and dO (kStages each), K, V, P, dS.
  static constexpr int kSmemElems = (2 * kStages * kBlockM + 2 * kBlockN) * kStride + 2 * kBlockM * kPStride;
  static constexpr int kSmemBytes = kSmemElems * 2 + 2 * kStages * kBlockM * 4;  // + lse, D
  static_assert(kSMTiles >= 1 && kKVMTiles >= 1 && kQMTiles >= 1, "whole m16 tiles per warp");
  static_assert(kSNTiles % 2 == 0 && kKVTiles % 2 == 0 && (kDqChunk / 8) % 2 == 0 && kDqCols % kDqChunk == 0,
                "ldmatrix.x4 loads two n8 tiles at a time");
  static_assert(kWarps * 32 * kDqFrags * 4 == kBlockM * kHeadDim, "the dQ tiles of the warps cover the block");

  // A warp's dQ tile: first row and column (kQMTiles m16 tiles x kDqCols columns).
  __host__ __device__ static constexpr int dq_row(int warp) { return (warp % kQWarpsM) * kQMTiles * 16; }
  __host__ __device__ static constexpr int dq_col(int warp) { return (warp / kQWarpsM) * kDqCols; }
  // n8 tile f of a lane's dQ (f = (chunk x kQMTiles + mi) x kDqChunk / 8 + j): m16 tile mi of the
  // warp's rows, n8 tile j of column chunk `chunk`; the tile's values are (g, 2t), (g, 2t + 1),
  // (g + 8, 2t), (g + 8, 2t + 1). Row and column of the first, from the block's origin.
  struct DqTile {
    int row, col;
  };
  __host__ __device__ static constexpr DqTile dq_tile(int warp, int lane, int f) {
    const int j = f % (kDqChunk / 8), mi = f / (kDqChunk / 8) % kQMTiles, chunk = f / (kDqChunk / 8) / kQMTiles;
    return {dq_row(warp) + 16 * mi + lane / 4, dq_col(warp) + kDqChunk * chunk + 8 * j + 2 * (lane % 4)};
  }
  // Where n8 tile f of (warp, lane) lives in its block's kBlockM x d floats of dq_accum (rung 2's
  // tiled layout, AttnBwdParams::dq_accum): the four values at ((warp x kDqFrags + f) x 32 + lane) x 4,
  // so a warp's reduction of one n8 tile covers 512 contiguous bytes (4 lines of 128 bytes; a
  // row-major accumulator makes it 8 rows, 8 lines, at 2 x 8 bytes a lane).
  __host__ __device__ static constexpr int dq_tile_offset(int warp, int lane, int f) {
    return ((warp * kDqFrags + f) * 32 + lane) * 4;
  }
  // Checked at compile time for every instantiation: the places of all (warp, lane, tile) are the
  // block's kBlockM x d floats, each once, and so are their (row, column) values (what the main
  // kernel adds and the conversion reads back).
  static constexpr bool dq_tiles_cover_block() {
    bool place[kBlockM * kHeadDim / 4] = {}, value[kBlockM * kHeadDim / 2] = {};
    for (int w = 0; w < kWarps; ++w)
      for (int l = 0; l < 32; ++l)
        for (int f = 0; f < kDqFrags; ++f) {
          const int off = dq_tile_offset(w, l, f);
          const DqTile at = dq_tile(w, l, f);
          if (off % 4 != 0 || off / 4 >= kBlockM * kHeadDim / 4 || place[off / 4]) return false;
          place[off / 4] = true;
          for (int r = 0; r < 16; r += 8) {  // rows g and g + 8, columns 2 t and 2 t + 1
            const int v = ((at.row + r) * kHeadDim + at.col) / 2;
            if (at.col % 2 != 0 || at.col >= kHeadDim || at.row + r >= kBlockM || value[v]) return false;
            value[v] = true;
          }
        }
    return true;
  }
};

// Packed row of dq_accum for (batch b, row i): dense (batch x seqlen_q) rows, or the packed row.
__device__ __forceinline__ int64_t attn_dq_accum_row(const AttnBwdParams& p, int b, const AttnBatch& sb, int i) {
  return p.cu_seqlens_q != nullptr ? sb.q_row0 + i : static_cast<int64_t>(b) * p.seqlen_q + i;
}

// (Row-major dq_accum: rung 3.) A lane's two dq_accum rows of an mma tile, query rows i and i + 8 of head h (head dim d), at
// column col: row i's address and row i + 8's offset from it. A row past the sequence's end (its
// dS is 0, so its dQ is exactly 0) points at the sequence's last row, where adding 0 changes
// nothing: every lane reduces every time (red_add_tile_f32).
struct AttnDqAccumRows {
  float* lo;
  int hi_off;
};
__device__ __forceinline__ AttnDqAccumRows attn_dq_accum_rows(const AttnBwdParams& p, int b, const AttnBatch& sb, int h,
                                                              int i, int d, int col) {
  const int lo = min(i, sb.sq - 1), hi = min(i + 8, sb.sq - 1);
  return {p.dq_accum + (attn_dq_accum_row(p, b, sb, lo) * p.nheads + h) * d + col, (hi - lo) * p.nheads * d};
}

// Rung 2's dq_accum (AttnBwdParams::dq_accum_tiled): (batch, nheads, dsum_rows, d), each block of
// kBlockM rows one tile in the order its warps add it (Flash2BwdTraits::dq_tile_offset). Offset of
// padded row m0 of (batch b, head h): for m0 a multiple of kBlockM, where that block's tile starts.
__device__ __forceinline__ int64_t attn_dq_accum_tile(const AttnBwdParams& p, int b, int h, int m0) {
  return ((static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + m0) * p.headdim;
}

// The preprocess and the dq conversion give kLanes lanes to a row, one 16-byte chunk (8 values of
// 16 bits, or of the fp32 accumulator 2 x 16 bytes) per lane: head dim / 8 chunks rounded up to a
// power of two (32: 4 lanes, 64: 8, 96 and 128: 16, 192 and 256: 32), 32 / kLanes rows per warp.
// A warp per row (their form until 2026-11-26) left 24 of 32 lanes idle at head dim 64 and 16 at
// 128: on an H100 the pair took 0.218 ms at d 64 and 0.170 at d 128 (16k tokens x 2048), this
// form 0.170 and 0.167 (bench/experiments/attention_bwd_hopper_ablation.cu, bb6e0f4).
__host__ __device__ constexpr int attn_bwd_row_lanes(int headdim) {
  return headdim <= 32 ? 4 : headdim <= 64 ? 8 : headdim <= 128 ? 16 : 32;
}

// Preprocess: D_i = dO_i . O_i (fp32), lse_i log2(e) (+inf for a row that sees no key), the
// row's dq_accum zeroed; rows from the batch's end to dsum_rows get D = 0, lse +inf. kLanes
// (attn_bwd_row_lanes) lanes per (batch, head, row), lane c of a row on 16-byte chunk c of the
// head dim. Grid (dsum_rows / (4 x 32 / kLanes), nheads, batch), 128 threads (dsum_rows is a
// multiple of 128).
template <typename T, int kLanes>
__global__ void attn_bwd_dsum_rows_kernel(const __grid_constant__ AttnBwdParams p) {
  static_assert(kLanes == 4 || kLanes == 8 || kLanes == 16 || kLanes == 32, "a power of two of lanes per row");
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32, c = lane % kLanes;
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = (blockIdx.x * 4 + threadIdx.x / 32) * kRowsPerWarp + lane / kLanes;
  const AttnBatch sb = attn_batch(p, b);
  const bool in_rows = i < sb.sq;  // rows of one warp may straddle the batch's end: no early return before the shuffles
  float acc = 0.f;
  if (in_rows && c < p.headdim / 8) {
    const T* o = static_cast<const T*>(p.o) + attn_offset(p, b, sb.q_row0, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
    const T* dout = static_cast<const T*>(p.dout) +
                    attn_offset(p, b, sb.q_row0, i, h, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c * 8), dv = *reinterpret_cast<const uint4*>(dout + c * 8);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += to_float(oe[e]) * to_float(de[e]);
  }
  // The row's dq_accum zeroed: rung 3's row-major rows up to the batch's end; rung 2's tiled
  // accumulator by place, every padded row (a row's values are spread over its tile, and the
  // padding rows take the zero dQ of rows past the end).
  if ((in_rows || p.dq_accum_tiled) && c < p.headdim / 8) {
    const int64_t off = p.dq_accum_tiled ? attn_dq_accum_tile(p, b, h, i)
                                         : (attn_dq_accum_row(p, b, sb, i) * p.nheads + h) * p.headdim;
    float4* accum = reinterpret_cast<float4*>(p.dq_accum + off + c * 8);
    accum[0] = accum[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // Sum over the row's kLanes lanes (xor offsets below kLanes stay within the row's lanes).
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (c == 0) {
    const int64_t at = (static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + i;
    if (in_rows) {
      const float lse = p.lse[attn_lse_offset(p, b, h, sb, i)];
      p.dsum[at] = acc;
      p.lse_log2[at] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    } else {
      p.dsum[at] = 0.f, p.lse_log2[at] = INFINITY;
    }
  }
}

// Postprocess: dq = dq_accum in dq's dtype. kLanes lanes per row as the preprocess. Grid
// (ceil(max_sq / (4 x 32 / kLanes)), nheads, batch), 128 threads.
template <typename T, int kLanes>
__global__ void attn_bwd_dq_convert_rows_kernel(const __grid_constant__ AttnBwdParams p) {
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32, c = lane % kLanes;
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = (blockIdx.x * 4 + threadIdx.x / 32) * kRowsPerWarp + lane / kLanes;
  const AttnBatch sb = attn_batch(p, b);
  if (i >= sb.sq || c >= p.headdim / 8) return;
  const float4* accum =
      reinterpret_cast<const float4*>(p.dq_accum + (attn_dq_accum_row(p, b, sb, i) * p.nheads + h) * p.headdim + c * 8);
  const float4 a = accum[0], d = accum[1];
  const uint4 out = make_uint4(pack2<T>(a.x, a.y), pack2<T>(a.z, a.w), pack2<T>(d.x, d.y), pack2<T>(d.z, d.w));
  T* dq = static_cast<T*>(p.dq) + attn_offset(p, b, sb.q_row0, i, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  *reinterpret_cast<uint4*>(dq + c * 8) = out;
}

// Postprocess of rung 2's tiled accumulator, a block of Tr::kThreads per (query block, head,
// batch): thread (warp, lane) reads the n8 tiles that the main kernel's thread (warp, lane) added
// (16 bytes each, a warp's 512 contiguous bytes at a time) and puts them, rounded, at their rows and
// columns of a shared tile; the tile then goes to dq in 16-byte row chunks. (Writing the values
// straight from the fragments, 4 bytes a lane over 8 rows, made the whole backward 5-10% slower at
// 512 keys, H100, 2026-11-27.) kDropout: as attn_bwd_flash2_kernel's (its traits, so its tiles).
// Grid (ceil(max_sq / kBlockM), nheads, batch), Flash2BwdTraits::kThreads threads.
template <typename T, int kHeadDim, bool kDropout>
__global__ void __launch_bounds__(Flash2BwdTraits<kHeadDim, kDropout>::kThreads)
    attn_bwd_dq_convert_tiles_kernel(const __grid_constant__ AttnBwdParams p) {
  using Tr = Flash2BwdTraits<kHeadDim, kDropout>;
  constexpr int kM = Tr::kBlockM, kS = Tr::kHeadDim + 8, kChunks = Tr::kChunks;  // rows padded by a chunk
  __shared__ __align__(16) T tile_s[kM * kS];
  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * kM;
  const AttnBatch sb = attn_batch(p, b);
  if (m0 >= sb.sq) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* tile = p.dq_accum + attn_dq_accum_tile(p, b, h, m0);
#pragma unroll
  for (int f = 0; f < Tr::kDqFrags; ++f) {
    const float4 a = *reinterpret_cast<const float4*>(tile + Tr::dq_tile_offset(warp, lane, f));
    const typename Tr::DqTile at = Tr::dq_tile(warp, lane, f);
    *reinterpret_cast<uint32_t*>(tile_s + at.row * kS + at.col) = pack2<T>(a.x, a.y);
    *reinterpret_cast<uint32_t*>(tile_s + (at.row + 8) * kS + at.col) = pack2<T>(a.z, a.w);
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq) + attn_offset(p, b, sb.q_row0, m0, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  const int rows = min(kM, sb.sq - m0);
  for (int x = threadIdx.x; x < rows * kChunks; x += Tr::kThreads) {
    const int r = x / kChunks, c = x % kChunks;
    *reinterpret_cast<uint4*>(dq + static_cast<int64_t>(r) * p.dq_row_stride + 8 * c) =
        *reinterpret_cast<const uint4*>(tile_s + r * kS + 8 * c);
  }
}

// Four fp32 values added to global memory (16-byte aligned) without reading them back (sm_90: one
// vector reduction).
__device__ __forceinline__ void red_add_f32x4(float* dst, const float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
#else
  for (int e = 0; e < 4; ++e) atomicAdd(dst + e, v[e]);
#endif
}

// Two fp32 values added to global memory (8-byte aligned) without reading them back (sm_90: one
// vector reduction).
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// One n8 tile of an mma accumulator (acc: row g, columns 2t, 2t + 1; row g + 8, the same) added
// to the row-major accumulator (rung 3's split kernel, kDqMode 0; rung 2's form until 2026-11-27
// (27), which adds whole tiles to its tiled accumulator instead: red_add_f32x4): rows, this lane's rows g and g + 8 at column 2t (attn_dq_accum_rows); the tile at
// column col. Each lane's pair of adjacent columns as one 8-byte reduction, a warp's four lanes of
// a row one full 32-byte sector, every lane every time (rows past the sequence's end point at its
// last row: skipping them made ptxas branch around every reduction, with a convergence barrier
// each: 17 BSSY / BSYNC pairs a warp-step, 13% of the stall samples).
// Measured against the earlier form (lanes t and t ^ 1 trading halves by two shuffles so that
// each added four columns with one 16-byte reduction: half the reductions, but two shuffles and
// six selects a tile, and until 2026-11-27 (25) a branch between even and odd lanes that issued
// both reductions with half the warp each): 2-3% faster at head dim 128 (rung 2 against SDPA's
// flash backward, round-robin, `bench/results/experiments/rung2_dq_v2_vs_v4/`).
__device__ __forceinline__ void red_add_tile_f32(const AttnDqAccumRows& rows, int col, const float* acc) {
  red_add_f32x2(rows.lo + col, acc[0], acc[1]);
  red_add_f32x2(rows.lo + rows.hi_off + col, acc[2], acc[3]);
}

// Grid (ceil(max_sk / kBlockN), nheads_kv, batch), Tr::kThreads threads, Tr::kSmemBytes dynamic
// shared memory. dq_accum zeroed and dsum written by attn_bwd_dsum_rows_kernel first.
// kScoreMod: softcap and/or ALiBi (the generic element-wise path); without them P and dS take
// one FFMA, one MUFU.EX2, one FFMA and one FMUL per element. kDropout (generic path only): the
// forward's mask regenerated per (row, key pair): dP = (dO V^T) z, and P z into shared memory for
// dV (dS = P (dP - D) keeps P itself).
template <typename T, int kHeadDim, bool kScoreMod, bool kDropout = false>
__global__ void __launch_bounds__(Flash2BwdTraits<kHeadDim, kDropout>::kThreads, 1)
    attn_bwd_flash2_kernel(const __grid_constant__ AttnBwdParams p) {
  static_assert(!kDropout || kScoreMod, "dropout runs on the generic element-wise path");
  using Tr = Flash2BwdTraits<kHeadDim, kDropout>;
  static_assert(Tr::dq_tiles_cover_block(), "dQ's places in dq_accum: each float of the block once");
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kS = Tr::kStride, kPS = Tr::kPStride, kD = kHeadDim;
  using QRows = typename Tr::QRows;
  using PRows = typename Tr::PRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kStages = Tr::kStages;
  T* qs_buf = reinterpret_cast<T*>(smem_raw);  // (kStages, kM, kS)
  T* dos_buf = qs_buf + kStages * kM * kS;     // (kStages, kM, kS)
  T* ks = dos_buf + kStages * kM * kS;         // (kN, kS)
  T* vs = ks + kN * kS;                        // (kN, kS)
  T* ps = vs + kN * kS;                        // (kM, kPS): P
  T* dss = ps + kM * kPS;                      // (kM, kPS): dS g
  float* lse_buf = reinterpret_cast<float*>(dss + kM * kPS);  // (kStages, kM): lse log2(e), +inf for rows without P
  float* dsum_buf = lse_buf + kStages * kM;                    // (kStages, kM): D
  static_assert(kM % 64 == 0 && kM / 64 <= Tr::kWarps, "lse and D of a block by whole warps, one 16-byte copy a lane");

  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * kN;
  const AttnBatch sb = attn_batch(p, b);
  if (n0 >= sb.sk) return;  // varlen: this batch has fewer keys
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_u = __shfl_sync(0xffffffffu, warp, 0);  // the same, known to the compiler as warp-uniform
  const int g = lane / 4, t = lane % 4;
  const int group = p.nheads / p.nheads_kv;
  const auto smem_addr = [](const T* ptr) { return static_cast<uint32_t>(__cvta_generic_to_shared(ptr)); };
  // ldmatrix lane addresses (03_flash2.cuh): A of a row-major tile; B from rows that are the n
  // index (non-trans); B from rows that are the k index (.trans); A^T from a row-major tile
  // whose rows are the k index (.trans) takes the B-non-trans pattern.
  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);
  const int kb_row = (lane % 8) + 8 * (lane / 16), kb_col = 8 * ((lane / 8) % 2);

  const T* k = static_cast<const T*>(p.k) + attn_offset(p, b, sb.k_row0, 0, hk, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  const T* v = static_cast<const T*>(p.v) + attn_offset(p, b, sb.k_row0, 0, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  flash2_load_tile<T, Tr, kN, QRows>(ks, k, p.k_row_stride, n0, sb.sk);
  flash2_load_tile<T, Tr, kN, QRows>(vs, v, p.v_row_stride, n0, sb.sk);

  // This warp's tiles: S / dP rows s_row.. (kSMTiles m16 tiles) x keys s_key.. (kSNTiles n8
  // tiles); dK / dV keys kv_key.. (kKVMTiles m16 tiles) x columns kv_col.. (kKVTiles n8 tiles);
  // dQ rows q_row.. (kQMTiles m16 tiles) x columns q_col.. (kDqCols).
  const int s_row = (warp % Tr::kSWarpsM) * Tr::kSMTiles * 16, s_key = (warp / Tr::kSWarpsM) * Tr::kSNTiles * 8;
  const int kv_key = (warp % Tr::kKVWarpsN) * Tr::kKVMTiles * 16, kv_col = (warp / Tr::kKVWarpsN) * Tr::kKVCols;
  const int q_row = Tr::dq_row(warp), q_col = Tr::dq_col(warp);
  float dk_acc[Tr::kKVMTiles][Tr::kKVTiles][4], dv_acc[Tr::kKVMTiles][Tr::kKVTiles][4];
#pragma unroll
  for (int mi = 0; mi < Tr::kKVMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < Tr::kKVTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk_acc[mi][j][e] = dv_acc[mi][j][e] = 0.f;

  // The steps: (query head h of the group, query block m0), m0 over the blocks that see these
  // keys (the same rows for every head of a batch).
  const int key_hi = sb.sk - n0 < kN ? sb.sk : n0 + kN;
  const int diag = sb.sk - sb.sq;
  const AttnRowRange rr = attn_row_range(n0, key_hi, sb.sq, diag, p.window_left, p.window_right);
  const int m_first = rr.lo - rr.lo % kM;
  // Step (h, m0): query head h of the group, rows m0.. in [m_first, m_end), kM at a time.
  const int m_end = rr.hi > rr.lo ? rr.hi : m_first, h_end = (hk + 1) * group;
  // Issues the copies of the step on query head h, rows m0.. into buffer buf, all by cp.async: Q,
  // dO, and the block's lse (base 2) and D from the preprocess's arrays (dsum_rows rows a head:
  // whole blocks, no bounds to check).
  const auto load_step = [&](int h, int m0, int buf) {
    const T* q = static_cast<const T*>(p.q) + attn_offset(p, b, sb.q_row0, 0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const T* dout = static_cast<const T*>(p.dout) +
                    attn_offset(p, b, sb.q_row0, 0, h, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
    // lse and D: the first kM / 64 warps, a warp-uniform branch (as threadIdx.x < kM / 2 it was a
    // divergent one, and every warp stalled at it for the Q / dO copies just issued: 4.6% of the
    // stall samples at d 128, H100, 2026-11-27).
    if (warp_u < kM / 64) {
      const int c = threadIdx.x % (kM / 4);
      const int64_t at = (static_cast<int64_t>(b) * p.nheads + h) * p.dsum_rows + m0 + 4 * c;
      const bool is_lse = threadIdx.x < kM / 4;
      cp_async_16((is_lse ? lse_buf : dsum_buf) + buf * kM + 4 * c, (is_lse ? p.lse_log2 : p.dsum) + at);
    }
    flash2_load_tile<T, Tr, kM, QRows>(qs_buf + buf * kM * kS, q, p.q_row_stride, m0, sb.sq);
    flash2_load_tile<T, Tr, kM, QRows>(dos_buf + buf * kM * kS, dout, p.dout_row_stride, m0, sb.sq);
  };
  const bool any_step = m_end > m_first;
  if (any_step) load_step(hk * group, m_first, 0);
  cp_async_commit();  // K, V and the first step

  for (int h = hk * group, m0 = m_first, buf = 0; any_step && h < h_end; buf ^= 1) {
    // The next step's (h, m0).
    const bool last_block = m0 + kM >= m_end;
    const int h_next = last_block ? h + 1 : h, m_next = last_block ? m_first : m0 + kM;
    const T* qs = qs_buf + buf * kM * kS;
    const T* dos = dos_buf + buf * kM * kS;
    const float* lse_s = lse_buf + buf * kM;
    const float* dsum_s = dsum_buf + buf * kM;
    const AttnBwdScore score(attn_score_mod(p, b, h, sb));
    const AttnScoreMod& mod = score.mod;
    float* dq_tile = p.dq_accum + attn_dq_accum_tile(p, b, h, m0);
    __syncthreads();  // step st - 1 is done with its buffers, P and dS
    if (h_next < h_end) load_step(h_next, m_next, buf ^ 1);  // into the buffer step st - 1 used
    cp_async_commit();                      // (possibly empty: one group per step)
    cp_async_wait<1>();                     // step st's copies (and K, V) landed
    __syncthreads();
    // Every (row, key) pair of this step visible: no element-wise mask.
    const bool need_mask = attn_bwd_step_needs_mask(mod, m0, kM, n0, kN, sb.sk);
    {
      // S = Q K^T and dP = dO V^T: rows s_row + 16 mi + (g, g + 8), keys s_key + 8 j + 2 t + {0, 1}.
      float s[Tr::kSMTiles][Tr::kSNTiles][4], dp[Tr::kSMTiles][Tr::kSNTiles][4];
#pragma unroll
      for (int mi = 0; mi < Tr::kSMTiles; ++mi)
#pragma unroll
        for (int j = 0; j < Tr::kSNTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][j][e] = dp[mi][j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t aq[Tr::kSMTiles][4], ado[Tr::kSMTiles][4];
#pragma unroll
        for (int mi = 0; mi < Tr::kSMTiles; ++mi) {
          ldmatrix_x4(aq[mi], smem_addr(qs + QRows::at(s_row + 16 * mi + a_row, kk * 16 + a_col)));
          ldmatrix_x4(ado[mi], smem_addr(dos + QRows::at(s_row + 16 * mi + a_row, kk * 16 + a_col)));
        }
#pragma unroll
        for (int j = 0; j < Tr::kSNTiles; j += 2) {
          uint32_t bk[4], bv[4];
          ldmatrix_x4(bk, smem_addr(ks + QRows::at(s_key + j * 8 + kb_row, kk * 16 + kb_col)));
          ldmatrix_x4(bv, smem_addr(vs + QRows::at(s_key + j * 8 + kb_row, kk * 16 + kb_col)));
#pragma unroll
          for (int mi = 0; mi < Tr::kSMTiles; ++mi) {
            mma_m16n8k16_x2<T>(s[mi][j], s[mi][j + 1], aq[mi], bk);
            mma_m16n8k16_x2<T>(dp[mi][j], dp[mi][j + 1], ado[mi], bv);
          }
        }
      }
      // P and dS g, element by element, rounded into shared memory; the mask compiled in only
      // for blocks that straddle it.
      const auto p_ds = [&](auto mask_tag) {
        constexpr bool kMask = decltype(mask_tag)::value;
#pragma unroll
        for (int mi = 0; mi < Tr::kSMTiles; ++mi)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = s_row + 16 * mi + g + 8 * r, i = m0 + row;
            const float lse2 = lse_s[row], dsum = dsum_s[row];
            const float dsum_g = dsum * mod.scale;
#pragma unroll
            for (int j = 0; j < Tr::kSNTiles; ++j) {
              float pr[2], ds[2];
              [[maybe_unused]] float z[2] = {1.f, 1.f};
              if constexpr (kDropout) attn_dropout_weight2(p, b, h, i, n0 + s_key + j * 8 + 2 * t, z[0], z[1]);
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int key = n0 + s_key + j * 8 + 2 * t + c;
                const bool visible =
                    !kMask || (key < sb.sk && attn_visible(i, key, mod.diag, mod.window_left, mod.window_right));
                score.template p_ds<kScoreMod, kDropout>(s[mi][j][2 * r + c], dp[mi][j][2 * r + c], i, key, visible, lse2,
                                                         dsum, dsum_g, z[c], pr[c], ds[c]);
              }
              const int at = PRows::at(row, s_key + j * 8 + 2 * t);
              *reinterpret_cast<uint32_t*>(ps + at) = pack2<T>(pr[0], pr[1]);
              *reinterpret_cast<uint32_t*>(dss + at) = pack2<T>(ds[0], ds[1]);
            }
          }
      };
      if (need_mask) p_ds(std::true_type{});
      else p_ds(std::false_type{});
    }
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q: keys kv_key + 16 mi + (g, g + 8) x columns kv_col + 8 j + 2 t.
#pragma unroll
    for (int kq = 0; kq < kM / 16; ++kq) {
      uint32_t ap[Tr::kKVMTiles][4], ads[Tr::kKVMTiles][4];
#pragma unroll
      for (int mi = 0; mi < Tr::kKVMTiles; ++mi) {
        ldmatrix_x4_trans(ap[mi], smem_addr(ps + PRows::at(kq * 16 + kb_row, kv_key + 16 * mi + kb_col)));
        ldmatrix_x4_trans(ads[mi], smem_addr(dss + PRows::at(kq * 16 + kb_row, kv_key + 16 * mi + kb_col)));
      }
#pragma unroll
      for (int j = 0; j < Tr::kKVTiles; j += 2) {
        uint32_t bdo[4], bq[4];
        ldmatrix_x4_trans(bdo, smem_addr(dos + QRows::at(kq * 16 + a_row, kv_col + j * 8 + a_col)));
        ldmatrix_x4_trans(bq, smem_addr(qs + QRows::at(kq * 16 + a_row, kv_col + j * 8 + a_col)));
#pragma unroll
        for (int mi = 0; mi < Tr::kKVMTiles; ++mi) {
          mma_m16n8k16_x2<T>(dv_acc[mi][j], dv_acc[mi][j + 1], ap[mi], bdo);
          mma_m16n8k16_x2<T>(dk_acc[mi][j], dk_acc[mi][j + 1], ads[mi], bq);
        }
      }
    }

    // dQ += dS K: rows q_row + 16 mi + (g, g + 8) x columns q_col + ..., chunk by chunk, added to
    // dq_accum.
#pragma unroll
    for (int c0 = q_col; c0 < q_col + Tr::kDqCols; c0 += Tr::kDqChunk) {
      float dq[Tr::kQMTiles][Tr::kDqChunk / 8][4];
#pragma unroll
      for (int mi = 0; mi < Tr::kQMTiles; ++mi)
#pragma unroll
        for (int j = 0; j < Tr::kDqChunk / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[mi][j][e] = 0.f;
#pragma unroll
      for (int kn = 0; kn < kN / 16; ++kn) {
        uint32_t ads[Tr::kQMTiles][4];
#pragma unroll
        for (int mi = 0; mi < Tr::kQMTiles; ++mi)
          ldmatrix_x4(ads[mi], smem_addr(dss + PRows::at(q_row + 16 * mi + a_row, kn * 16 + a_col)));
#pragma unroll
        for (int j = 0; j < Tr::kDqChunk / 8; j += 2) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, smem_addr(ks + QRows::at(kn * 16 + a_row, c0 + j * 8 + a_col)));
#pragma unroll
          for (int mi = 0; mi < Tr::kQMTiles; ++mi) mma_m16n8k16_x2<T>(dq[mi][j], dq[mi][j + 1], ads[mi], bk);
        }
      }
      // Into this block's tile of dq_accum, an n8 tile (four values) a reduction, where
      // Tr::dq_tile_offset puts it (rows past the sequence's end too: their dQ is 0, their place
      // in the padded tile is read by no one).
      const int chunk = (c0 - q_col) / Tr::kDqChunk;
#pragma unroll
      for (int mi = 0; mi < Tr::kQMTiles; ++mi)
#pragma unroll
        for (int j = 0; j < Tr::kDqChunk / 8; ++j)
          red_add_f32x4(dq_tile + Tr::dq_tile_offset(warp, lane, (chunk * Tr::kQMTiles + mi) * (Tr::kDqChunk / 8) + j),
                        dq[mi][j]);
    }
    h = h_next, m0 = m_next;
  }

  // dK, dV of this block's keys, written once.
  cp_async_wait<0>();  // (K and V landed long ago when any query block ran; not when none did)
  T* dk = static_cast<T*>(p.dk) + attn_offset(p, b, sb.k_row0, 0, hk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  T* dv = static_cast<T*>(p.dv) + attn_offset(p, b, sb.k_row0, 0, hk, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
#pragma unroll
  for (int mi = 0; mi < Tr::kKVMTiles; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n0 + kv_key + 16 * mi + g + 8 * r;
      if (key >= sb.sk) continue;
#pragma unroll
      for (int j = 0; j < Tr::kKVTiles; ++j) {
        const int col = kv_col + j * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(dk + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            pack2<T>(dk_acc[mi][j][2 * r], dk_acc[mi][j][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            pack2<T>(dv_acc[mi][j][2 * r], dv_acc[mi][j][2 * r + 1]);
      }
    }
}

}  // namespace flashlab::kernels
