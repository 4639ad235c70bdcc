// GPU test helpers: skip without a GPU, device buffers, upload/download, NaN poisoning.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"

namespace flashlab::testing {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
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
  // All bits set: NaN in fp32 and bf16.
  void poison() const { FLASHLAB_CUDA_CHECK(cudaMemset(ptr, 0xff, bytes)); }
};

inline void upload(void* dst, const std::vector<uint8_t>& src) {
  FLASHLAB_CUDA_CHECK(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
}
inline std::vector<uint8_t> download(const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost));
  return out;
}

inline TensorView device_view(void* p, DType dt, std::vector<int64_t> shape) {
  return TensorView(p, dt, std::move(shape), Device{DeviceType::kCUDA, 0});
}

}  // namespace flashlab::testing
