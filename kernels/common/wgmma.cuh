// wgmma (sm_90a): warpgroup matrix multiply-accumulate, both operands from shared memory
// through 64-bit matrix descriptors, fp32 accumulators in registers. Plus the fences and the
// commit/wait that order it. The instruction specialisations list every accumulator register
// (PTX needs them spelled out), so they are generated (scripts/gen_wgmma.py -> wgmma_ops.inc):
// D (64 x N, fp32) += A (64 x 16) B (16 x N).
//
// Accumulator layout (m64nNk16, thread t of the warpgroup, warp w = t / 32, lane l):
//   d[4 j + 2 i + c] holds row 16 w + l / 4 + 8 i, column 8 j + 2 (l % 4) + c   (i, c in {0, 1}).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/common/wgmma_desc.h"

namespace flashlab::kernels {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// wgmma_wait, kept after the computation of `after`. ptxas places a wgmma.wait_group, which has
// no register inputs, as early in its basic block as it may, and pulls it above math written
// before it (rung 4's softmax, meant to run under the P V product: SASS showed the wait at the top
// of the softmax). A branch on `after` ends the basic block once `after` is computed; the wait
// starts the next one. The branch is never taken for a non-negative `after` (a row sum), and its
// body does nothing, so the result does not depend on the value.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_after(float after) {
  if (__float_as_uint(after) == 0x80000001u) asm volatile("nanosleep.u32 0;\n");
  wgmma_wait<kPending>();
}

// A consumer thread of a warp-specialized block whose warpgroup 0 is the producer: consumer
// warpgroup cw (warpgroup cw + 1), its thread t128, warp and lane, and the accumulator fragment
// coordinates g = lane / 4 (row), t = lane % 4 (column pair).
struct ConsumerThread {
  int cw, t128, warp, lane, g, t;
};
// The warpgroup index, known warp-uniform to the compiler (a lane-0 broadcast): values derived
// from it (a warpgroup's shared-memory tile addresses, hence its wgmma descriptors) then live in
// uniform registers. From threadIdx.x / 128 alone each descriptor is built in ordinary registers
// and moved over by R2UR before its wgmma (rung-4 forward block loop: 758 -> 716 instructions,
// 16 R2UR -> 0; SASS, 2026-11-26).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0); }

__device__ __forceinline__ ConsumerThread consumer_thread() {
  const int wg = threadIdx.x / 128;
  const int t128 = threadIdx.x - 128 * wg;
  const int warp = t128 / 32, lane = t128 % 32;
  return {wg - 1, t128, warp, lane, lane / 4, lane % 4};
}

// Stores a warpgroup's fp32 accumulator of 64 rows x 8 kFrags columns (thread (warp, g, t) holds
// rows 16 warp + g and + 8, columns 8 j + 2 t and + 1, in acc[4 j + 2 r + 0 / 1]) as 32-column
// boxes of 64 rows x 128 bytes, 128B-swizzled (an fp32 TMA box): box(x) is box x's base.
// An 8-byte store is served a half-warp (rows g = 0..3 or 4..7) at a time; a row's 32 bytes of
// column block j are the chunk pair 2 (j % 4), + 1, XORed with the row, so rows g and g ^ 1 land
// on the same pair and every store takes four wavefronts instead of two (the backward's dQ tiles:
// 8% of its shared-memory wavefronts excess, Nsight Compute). Here lanes of odd g store column
// block j ^ 2 when the others store j: a half-warp's four rows then cover eight distinct chunks.
// kColumnOrder: every lane stores block j (the conflicting order; for the ablation).
template <int kFrags, bool kColumnOrder = false, typename BoxFn>
__device__ __forceinline__ void store_acc_f32_sw128(const float* acc, const BoxFn& box, int warp, int g, int t) {
  static_assert(kFrags % 4 == 0, "whole 32-column boxes");
  const bool odd = !kColumnOrder && (g & 1);
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int jj = odd ? j ^ 2 : j;  // same box: j ^ 2 stays in j's group of four
      const int row = 16 * warp + g + 8 * r, chunk = 2 * (jj % 4) + t / 2;
      const float x0 = odd ? acc[4 * (j ^ 2) + 2 * r] : acc[4 * j + 2 * r];
      const float x1 = odd ? acc[4 * (j ^ 2) + 2 * r + 1] : acc[4 * j + 2 * r + 1];
      *reinterpret_cast<float2*>(box(j / 4) + row * 128 + ((chunk ^ (row % 8)) * 16) + 8 * (t % 2)) = make_float2(x0, x1);
    }
}

// Keeps the compiler from moving accumulator accesses across an asynchronous wgmma.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for register A fragments (four 32-bit pairs per k16 step) of an RS wgmma in flight.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// Wgmma<T, N>::mma<kTransA, kTransB>(d, desc_a, desc_b, scale_d): both operands from shared
// memory; kTrans = 1 for an MN-major operand; scale_d = 0 overwrites d (the first k-step of a
// tile), 1 accumulates.
template <typename T, int kN>
struct Wgmma;

// WgmmaRs<T, N>::mma<kTransB>(d, a, desc_b, scale_d): A (64 x 16) from registers, four 32-bit
// pairs per thread in the mma.sync m16n8k16 A-fragment layout of each warp's 16 rows (warp w
// holds rows 16 w .. 16 w + 15): a[0] = (row l / 4, k 2 (l % 4) + {0, 1}), a[1] = row + 8,
// a[2] = k + 8, a[3] = both. B from shared memory as above.
template <typename T, int kN>
struct WgmmaRs;

// N = 64, 80, 96, 112, 128, 144, 160, 176, 192, 256 for bf16 and fp16 (m64nNk16), 8, 64, 96, 128, 160, 192, 224, 256
// for e4m3 (m64nNk32: 32 k per instruction, K-major operands only; the register A fragment is
// mma.sync m16n8k32's: a[0] = (row l / 4, k 4 (l % 4) + {0..3}, low byte first), a[1] = row + 8,
// a[2] = k + 16, a[3] = both). Generated: every accumulator register named.
#include "kernels/common/wgmma_ops.inc"

}  // namespace flashlab::kernels
