// Internal: the GEMM host's launchers, one file per group of rungs so that each compiles on its
// own (src/gemm.cu validates and dispatches). Arguments are already validated.
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"
#include "kernels/gemm/params.h"

namespace flashlab::detail {

void launch_gemm_naive(const GemmParams& p, DType dtype, cudaStream_t stream);          // rung 1, src/gemm.cu
void launch_gemm_fp32(const GemmParams& p, int rung, cudaStream_t stream);               // rungs 2-6, src/gemm_fp32.cu
void launch_gemm_tensor_core(const GemmParams& p, DType dtype, int rung, cudaStream_t stream);  // rungs 7-8, src/gemm_mma.cu
// rung 9, src/gemm_hopper.cu; cluster_pairs = false keeps single CTAs (the ablation in
// bench/experiments/gemm_hopper_ablation.cu)
void launch_gemm_hopper(const GemmParams& p, DType dtype, cudaStream_t stream, bool cluster_pairs = true);

}  // namespace flashlab::detail
