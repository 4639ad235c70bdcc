#include <map>
#include <mutex>
#include <utility>

#include "src/core/launch.h"

namespace flashlab::detail {

int sm_count() {
  static std::mutex mu;
  static std::map<int, int> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  int n = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  cache[dev] = n;
  return n;
}

void* workspace(cudaStream_t stream, int64_t bytes) {
  struct Buffer {
    void* ptr = nullptr;
    int64_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Buffer> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Buffer& buf = cache[{dev, stream}];
  if (buf.bytes < bytes) {
    if (buf.ptr != nullptr) {
      FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
      FLASHLAB_CUDA_CHECK(cudaFree(buf.ptr));
      buf = Buffer{};
    }
    FLASHLAB_CUDA_CHECK(cudaMalloc(&buf.ptr, static_cast<size_t>(bytes)));
    FLASHLAB_CUDA_CHECK(cudaMemset(buf.ptr, 0, static_cast<size_t>(bytes)));
    buf.bytes = bytes;
  }
  return buf.ptr;
}

}  // namespace flashlab::detail
