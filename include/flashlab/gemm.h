// GEMM: C = alpha * (A @ B) + beta * C + bias. Ladder: kernels/gemm/, doc: docs/ladder/gemm.md.
//
// Rungs (rung 0 is cuBLAS, measured in the benchmarks only):
//   1 naive, one thread per output             (fp32, fp16, bf16: the same-dtype reference rung)
//   2 coalesced                                 (fp32)
//   3 shared-memory tiles                       (fp32)
//   4 2D register blocking                      (fp32)
//   5 16-byte loads, transposed A tile in smem  (fp32)
//   6 warp tiling                               (fp32, the FP32 top rung)
//   7 WMMA (nvcuda::wmma)                       (fp16, bf16)
//   8 mma.sync m16n8k16 + ldmatrix + cp.async   (fp16, bf16; Ampere-class)
//   9 Hopper: TMA + wgmma, warp-specialized, persistent (fp16, bf16; sm_90; the top rung)
// FP32 rungs compute in fp32 FMA (no TF32). 16-bit rungs accumulate in fp32 and round once to
// the output dtype.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

inline constexpr int kGemmRungs = 9;

// Optional epilogue: out = alpha * acc + beta * c_in + bias[n], computed in fp32, rounded once.
struct GemmEpilogue {
  float alpha = 1.f;
  float beta = 0.f;                  // != 0: C is read before it is overwritten
  const TensorView* bias = nullptr;  // optional (N,), same dtype as C, contiguous
};

// A: (M, K), B: (K, N), C: (M, N), all on one CUDA device, one dtype (see the rung list).
// A and B may each be row-major (unit stride in the last dim, leading dim >= cols) or
// column-major (unit stride in the first dim: a transposed view such as w.t() of an (N, K)
// weight), so the layouts NN, NT and TN are A row/B row, A row/B col, A col/B row. Rungs 1-8
// take NN only (+ NT and TN on rung 1); rung 9 takes NN, NT and TN. C is row-major with unit
// last-dim stride and must not overlap A or B. M, N, K >= 1.
// Rung 9 also needs 16-byte aligned A, B, C pointers and leading dims (TMA); an operand stored
// as a single row (M = 1 for A and C, ...) needs no leading dim.
// Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid arguments.
void gemm(const TensorView& a, const TensorView& b, const TensorView& c, cudaStream_t stream = nullptr,
          int rung = kGemmRungs, const GemmEpilogue& epilogue = {});

// Which rungs take this dtype (the host's dispatch and the tests ask it).
bool gemm_rung_supports(int rung, DType dtype);

// The highest rung that takes these arguments (dtype, layout, alignment, device): rung 9 on
// sm_90 for 16-byte aligned 16-bit operands, else rung 8 (NN) or 1, and 6 or 1 for fp32. When
// none does, the top rung for the dtype, whose gemm() call then says what is wrong. Launches
// nothing. What the Python API uses when no rung is given.
int gemm_best_rung(const TensorView& a, const TensorView& b, const TensorView& c, const GemmEpilogue& epilogue = {});

}  // namespace flashlab
