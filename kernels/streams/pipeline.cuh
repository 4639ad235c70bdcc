// The kernel stage of the streams pipeline: y = f(x) (kernels/streams/pipeline_math.h).
// About 4160 fp32 flops per element sets the kernel time of a chunk to the same order as its
// two PCIe copies on an H100: the regime where overlapping copy in, compute and copy out pays
// most (serial time is the sum of the three stages, pipelined time approaches the largest).
#pragma once

#include <cstdint>

#include "kernels/streams/pipeline_math.h"

namespace flashlab::kernels {

inline constexpr int kPipelineThreads = 256;

__global__ void __launch_bounds__(kPipelineThreads)
    pipeline_f_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = pipeline_f(in[i]);
}

}  // namespace flashlab::kernels
