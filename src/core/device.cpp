#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "src/core/launch.h"

namespace flashlab::detail {

namespace {
// A device attribute of the current device, cached per (device, attribute).
int device_attribute(cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, static_cast<int>(attr)});
  if (it != cache.end()) return it->second;
  int value = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
  cache[{dev, static_cast<int>(attr)}] = value;
  return value;
}
}  // namespace

int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

int cc_major() { return device_attribute(cudaDevAttrComputeCapabilityMajor); }

int max_smem_optin() { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

int resident_blocks(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({dev, kernel, threads});
    if (it != cache.end()) return it->second;
  }
  int per_sm = 0;
  FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  const int blocks = std::max(1, per_sm) * sm_count();
  std::lock_guard<std::mutex> lock(mu);
  cache[{dev, kernel, threads}] = blocks;
  return blocks;
}

int resident_clusters(const void* kernel, int cluster, int threads, int smem_bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int, int>, int> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  const auto key = std::make_tuple(dev, kernel, cluster, threads, smem_bytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(cluster * sm_count()));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  FLASHLAB_CHECK(clusters > 0, "no cluster of ", cluster, " blocks of ", threads, " threads and ", smem_bytes,
                 " bytes of shared memory fits on this device");
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = clusters;
  return clusters;
}

namespace {

struct WorkspaceBuffer {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

std::mutex& workspace_mutex() {
  static std::mutex mu;
  return mu;
}

// Guarded by workspace_mutex().
WorkspaceBuffer& workspace_buffer(cudaStream_t stream, Workspace kind) {
  static std::map<std::tuple<int, cudaStream_t, Workspace>, WorkspaceBuffer> cache;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  return cache[{dev, stream, kind}];
}

}  // namespace

void* workspace_if_ready(cudaStream_t stream, int64_t bytes, Workspace kind) {
  std::lock_guard<std::mutex> lock(workspace_mutex());
  const WorkspaceBuffer& buf = workspace_buffer(stream, kind);
  return buf.bytes >= bytes ? buf.ptr : nullptr;
}

void* workspace(cudaStream_t stream, int64_t bytes, Workspace kind) {
  std::lock_guard<std::mutex> lock(workspace_mutex());
  WorkspaceBuffer& buf = workspace_buffer(stream, kind);
  if (buf.bytes < bytes) {
    if (buf.ptr != nullptr) {
      FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
      FLASHLAB_CUDA_CHECK(cudaFree(buf.ptr));
      buf = WorkspaceBuffer{};
    }
    FLASHLAB_CUDA_CHECK(cudaMalloc(&buf.ptr, static_cast<size_t>(bytes)));
    // On the caller's stream: cudaMemset runs on the legacy default stream, which a non-blocking
    // stream's next kernel does not wait for (a kernel reading kCounters could see the memset
    // land halfway through).
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(buf.ptr, 0, static_cast<size_t>(bytes), stream));
    buf.bytes = bytes;
  }
  return buf.ptr;
}

}  // namespace flashlab::detail

namespace flashlab::detail {

std::vector<int> read_int32(const TensorView& t, cudaStream_t stream) {
  std::vector<int> h(static_cast<size_t>(t.numel()));
  if (h.empty()) return h;
  FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(h.data(), t.data, h.size() * sizeof(int), cudaMemcpyDeviceToHost, stream));
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FLASHLAB_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace flashlab::detail
