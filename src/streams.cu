// Host side of the streams pipeline: validation, then chunks issued round-robin over streams.
#include <algorithm>

#include "flashlab/streams.h"
#include "flashlab/validate.h"
#include "kernels/streams/pipeline.cuh"
#include "src/core/launch.h"

namespace flashlab {

void streams_pipeline(const TensorView& host_in, const TensorView& host_out, const TensorView& dev_in,
                      const TensorView& dev_out, const std::vector<cudaStream_t>& streams, int64_t num_chunks) {
  constexpr const char* op = "streams_pipeline";
  const check::Arg HI{op, "host_in", host_in}, HO{op, "host_out", host_out}, DI{op, "dev_in", dev_in},
      DO{op, "dev_out", dev_out};
  for (const auto& h : {HI, HO}) {
    if (h.t.device.type != DeviceType::kCUDAHost)
      check::fail(h, "pinned host memory (cuda_host); pageable memory would serialise the copies",
                  device_str(h.t.device));
    if (h.t.data == nullptr) check::fail(h, "a non-null data pointer", "null");
  }
  check::cuda(DI);
  check::cuda(DO);
  check::same_device(DO, DI);
  for (const auto& arg : {HI, HO, DI, DO}) {
    check::dtype_in(arg, {DType::kF32});
    check::contiguous(arg);
    check::aligned(arg, sizeof(float));
  }
  check::nonempty(HI);
  for (const auto& arg : {HO, DI, DO}) check::shape_eq(arg, HI);
  check::no_overlap(DO, DI);
  const int64_t n = host_in.numel();
  FLASHLAB_CHECK(!streams.empty(), op, ": argument 'streams': expected at least one stream, got none");
  FLASHLAB_CHECK(num_chunks >= 1 && num_chunks <= n, op, ": argument 'num_chunks': expected 1..", n,
                 " (numel), got ", num_chunks);

  detail::DeviceGuard guard(dev_in.device.index);
  const int64_t chunk = detail::ceil_div(n, num_chunks);
  const int blocks_cap = detail::sm_count() * 8;
  const auto* hin = host_in.ptr<const float>();
  auto* hout = host_out.ptr<float>();
  auto* din = dev_in.ptr<float>();
  auto* dout = dev_out.ptr<float>();
  for (int64_t c = 0; c * chunk < n; ++c) {
    cudaStream_t s = streams[c % streams.size()];
    const int64_t off = c * chunk, len = std::min(chunk, n - off);
    const size_t bytes = static_cast<size_t>(len) * sizeof(float);
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(din + off, hin + off, bytes, cudaMemcpyHostToDevice, s));
    const int grid = static_cast<int>(std::min<int64_t>(detail::ceil_div(len, kernels::kPipelineThreads), blocks_cap));
    FLASHLAB_LAUNCH(kernels::pipeline_f_kernel, grid, kernels::kPipelineThreads, 0, s, din + off, dout + off, len);
    FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(hout + off, dout + off, bytes, cudaMemcpyDeviceToHost, s));
  }
}

}  // namespace flashlab
