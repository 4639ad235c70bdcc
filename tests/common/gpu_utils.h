// GPU test helpers: skip without a GPU, device buffers, upload/download, NaN poisoning, streams
// and captured graphs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"
#include "tests/common/test_utils.h"

namespace flashlab::testing {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Compute capability major of the current device.
inline int device_cc_major() {
  int dev = 0, major = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major;
}

#define SKIP_WITHOUT_GPU() \
  if (!::flashlab::testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine"

// Owning device allocation, sized in bytes, with room to place views at a byte offset.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { FLASHLAB_CUDA_CHECK(cudaMalloc(&ptr, n)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* at(size_t offset) const { return static_cast<char*>(ptr) + offset; }
  // All bits set: NaN in fp32 and bf16. Finished before return: cudaMemset runs on the legacy
  // default stream, which a non-blocking stream's work does not wait for (the memset could land
  // after it: StreamsPipeline saw such a race on a busy GPU, 2026-11-26).
  void poison() const {
    FLASHLAB_CUDA_CHECK(cudaMemset(ptr, 0xff, bytes));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

inline void upload(void* dst, const std::vector<uint8_t>& src) {
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
}
inline std::vector<uint8_t> download(const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost));
  return out;
}

// Packed host rows (rows x row_bytes) <-> device rows stride_bytes apart.
inline void upload_row_bytes(void* dst, const void* src, int64_t rows, int64_t row_bytes, int64_t stride_bytes) {
  FLASHLAB_CUDA_CHECK(cudaMemcpy2D(dst, stride_bytes, src, row_bytes, row_bytes, rows, cudaMemcpyHostToDevice));
}
inline std::vector<uint8_t> download_row_bytes(const void* src, int64_t rows, int64_t row_bytes, int64_t stride_bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  FLASHLAB_CUDA_CHECK(cudaMemcpy2D(out.data(), row_bytes, src, stride_bytes, row_bytes, rows, cudaMemcpyDeviceToHost));
  return out;
}

// A host (rows, cols) tensor -> buf, rows `stride` elements apart, everything else poisoned;
// and the (rows, cols) values back.
inline void upload_rows(const DeviceBuffer& buf, const HostTensor& t, int64_t rows, int64_t cols, int64_t stride) {
  const int64_t es = dtype_size(t.dtype);
  buf.poison();
  upload_row_bytes(buf.ptr, t.bytes.data(), rows, cols * es, stride * es);
}
inline std::vector<double> download_rows(const DeviceBuffer& buf, DType dt, int64_t rows, int64_t cols, int64_t stride) {
  const int64_t es = dtype_size(dt);
  return decode(dt, download_row_bytes(buf.ptr, rows, cols * es, stride * es));
}

// A non-blocking stream, and a CUDA graph captured from one (the serving tests).
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  // fn's work on `stream`, captured in global mode (as torch.cuda.graph) and instantiated.
  void capture(cudaStream_t stream, const std::function<void()>& fn) {
    FLASHLAB_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
      fn();
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream, &g);
      if (g != nullptr) cudaGraphDestroy(g);
      throw;
    }
    FLASHLAB_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    FLASHLAB_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  }
  size_t nodes() const {
    size_t n = 0;
    FLASHLAB_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    return n;
  }
  void replay(cudaStream_t stream) const {
    FLASHLAB_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

inline TensorView device_view(void* p, DType dt, std::vector<int64_t> shape) {
  return TensorView(p, dt, std::move(shape), Device{DeviceType::kCUDA, 0});
}

}  // namespace flashlab::testing
