// Copy/compute overlap with CUDA streams. Ladder: kernels/streams/, doc: docs/ladder/streams.md.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// host_out = f(host_in) with f of kernels/streams/pipeline_math.h, element by element, moving
// through device buffers: copy in (H2D), kernel, copy out (D2H).
// The range is cut into num_chunks chunks issued round-robin over `streams`; with one stream
// and one chunk this is the serial version. Returns once everything is enqueued: synchronize
// the streams before reading host_out.
//   host_in, host_out: pinned host memory (DeviceType::kCUDAHost), fp32, contiguous, same shape.
//   dev_in, dev_out: CUDA, fp32, contiguous, same shape as host_in.
//   streams: >= 1 stream; num_chunks: 1 .. numel.
void streams_pipeline(const TensorView& host_in, const TensorView& host_out,
                      const TensorView& dev_in, const TensorView& dev_out,
                      const std::vector<cudaStream_t>& streams, int64_t num_chunks);

}  // namespace flashlab
