// Rung 4, FP8: V transposed for P V, as a pass before the kernel (kFp8VtPass: the library's over
// more than 2k keys; over fewer the kernel's producer warpgroup transposes each block in shared
// memory instead, hopper_attn_fp8_transpose_v, src/attention_hopper_dispatch.h). The 8-bit wgmma
// reads both operands K-major only, and the k of P V is the key, so the Hopper kernel reads V^T
// (head dims x keys, keys contiguous) where the 16-bit kernels read V as an MN-major operand. This
// pass writes it once per call:
//   vt[b][hk][c][position(j)] = v[b][j][hk][c],  j < sk of batch b;  0 for j in [sk, sk_pad)
// with the keys of each 16-key group in the order of P's register fragment (attn_fp8_v_position,
// kernels/attention/04_hopper.cuh) and each row padded with zeros to sk_pad (a multiple of 128
// keys; a key block reaching past sk_pad gets zero-filled chunks from the TMA), so that blocks past
// a sequence's end multiply masked probabilities by zeros.
// vt: (batch, nheads_kv, d, sk_pad) e4m3, contiguous; v: any strides (varlen: packed rows).
// Cost: a read and a write of V (the attention itself reads K and V once per query block).
// A block of 128 keys: V's rows into shared memory (16-byte loads, 128B-swizzled as TMA would
// store them), the kernel's own transpose of a block (hopper_attn_fp8_transpose_v: ldmatrix
// .trans, byte permutes, stmatrix) into V^T's layout, then V^T's 128-byte rows out with 16-byte
// stores. (Until 2026-11-27 a block of 64 keys gathered each output byte with its own shared-memory
// load: 35 us for the benchmark's 32 MiB of V, 61% of the copy rate; H100, 37a45a2.)
#pragma once

#include <cstdint>

#include "kernels/attention/04_hopper.cuh"

namespace flashlab::kernels {

inline constexpr int kAttnFp8TransposeKeys = 128;  // keys per block
inline constexpr int kAttnFp8TransposeThreads = 256;

// Grid: (sk_pad / kAttnFp8TransposeKeys, nheads_kv, batch), kAttnFp8TransposeThreads threads.
template <int kHeadDim>
__global__ void __launch_bounds__(kAttnFp8TransposeThreads)
    attn_fp8_transpose_v_kernel(const __grid_constant__ AttnFwdParams p, uint8_t* vt, int64_t sk_pad) {
  static_assert(kHeadDim == 128, "FP8: head dim 128 (a key's row of V is one 128-byte swizzle row)");
  // The attention kernel (launched with programmatic stream serialization) may start once every
  // block of this grid has started: its CTAs load Q and K and compute their first scores during
  // this grid's tail; its producer waits for the whole grid (griddepcontrol.wait) before it loads V^T.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  constexpr int kKeys = kAttnFp8TransposeKeys, kChunks = kHeadDim / 16;  // 16-byte chunks of a row of V
  using Tr = HopperAttnTraits<kHeadDim, false, kKeys, 1, 2>;            // a block of 128 keys, V^T in one chunk
  // V (keys x 128 bytes), then V^T (head dims x 128 keys), both 128B-swizzled; 128-byte aligned
  // (the transpose's store addresses need address bits 4-6 of each row clear).
  __shared__ __align__(128) uint8_t tile[2][kKeys * 128];
  const int b = blockIdx.z, hk = blockIdx.y, k0 = blockIdx.x * kKeys;
  const AttnBatch sb = attn_batch(p, b);
  const uint8_t* v = static_cast<const uint8_t*>(p.v) +
                     attn_offset(p, b, sb.k_row0, 0, hk, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  for (int e = threadIdx.x; e < kKeys * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (k0 + r < sb.sk) x = *reinterpret_cast<const uint4*>(v + static_cast<int64_t>(k0 + r) * p.v_row_stride + 16 * c);
    *reinterpret_cast<uint4*>(&tile[0][r * 128 + ((c ^ (r % 8)) * 16)]) = x;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp < kHeadDim / 32)  // a warp per 32 head dims
    hopper_attn_fp8_transpose_v<Tr, kHeadDim / 32, kKeys / 16>(smem_u32(tile[0]), smem_u32(tile[1]), warp, threadIdx.x % 32);
  __syncthreads();
  uint8_t* dst = vt + (static_cast<int64_t>(b) * p.nheads_kv + hk) * kHeadDim * sk_pad + k0;
  for (int e = threadIdx.x; e < kHeadDim * (kKeys / 16); e += blockDim.x) {
    const int d = e / (kKeys / 16), u = e % (kKeys / 16);  // head dim d, 16-key group u
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(d) * sk_pad + 16 * u) =
        *reinterpret_cast<const uint4*>(&tile[1][d * 128 + ((u ^ (d % 8)) * 16)]);
  }
}

}  // namespace flashlab::kernels
