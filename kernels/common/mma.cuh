// Ampere-class tensor-core primitives (sm_80+, also on Hopper): ldmatrix (and sm_90's stmatrix), mma.sync
// m16n8k16 with fp32 accumulators, and the XOR swizzle of 16-byte chunks that keeps ldmatrix
// reads of row-major shared tiles free of bank conflicts. Used by GEMM rung 8 and the
// FlashAttention-2 rung.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashlab::kernels {

// ldmatrix .x4: lanes 8q .. 8q+7 give the shared addresses of the 8 rows (16 bytes each) of
// 8x8 matrix q; lane l receives in r[q] the elements (l / 4, 2 (l % 4) + {0, 1}) of matrix q.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// As ldmatrix_x4, each matrix transposed: lane l receives elements (2 (l % 4) + {0, 1}, l / 4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// stmatrix .x4 (sm_90): the store of ldmatrix_x4's layout; lanes 8q .. 8q+7 give the shared addresses
// of the 8 rows (16 bytes each) of matrix q, lane l supplies in r[q] its elements (l / 4, 2 (l % 4) + {0, 1}).
__device__ __forceinline__ void stmatrix_x4(const uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators. With g = lane / 4, t = lane % 4:
// a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..), a[3] = A(g+8, 2t+8..);
// b[0] = B(2t..2t+1, g), b[1] = B(2t+8.., g); d[0..1] = D(g, 2t..2t+1), d[2..3] = D(g+8, 2t..).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16 operands");
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// d0 += a * b[0..1] and d1 += a * b[2..3]: the two adjacent n8 tiles of one ldmatrix_x4 (or
// _trans) B load, in that order.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16_x2(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                                const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<T>(d0, a, b0);
  mma_m16n8k16<T>(d1, a, b1);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared tile of kChunksPerRow chunks
// per row, stored swizzled: the low 3 bits of the chunk index XORed with row % 8.
template <int kChunksPerRow>
__host__ __device__ __forceinline__ constexpr uint32_t swizzle_chunk_offset(int row, int chunk) {
  static_assert(kChunksPerRow % 8 == 0, "rows of whole 128-byte groups of 8 chunks");
  return static_cast<uint32_t>((row * kChunksPerRow + (chunk ^ (row & 7))) * 16);
}

}  // namespace flashlab::kernels
