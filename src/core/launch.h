// Host-side launch helpers shared by every op's host file (internal, not installed).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"
#include "flashlab/validate.h"

// Launches a kernel, counts it, and checks the launch error right away.
#define FLASHLAB_LAUNCH(kernel, grid, block, smem, stream, ...)          \
  do {                                                                   \
    ::flashlab::check::note_launch();                                    \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__);          \
    FLASHLAB_CUDA_CHECK(cudaGetLastError());                             \
  } while (0)

namespace flashlab::detail {

// FLASHLAB_LAUNCH through cudaLaunchKernelEx with one launch attribute.
template <typename... Params, typename... Args>
void launch_with_attribute(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           cudaLaunchAttribute attr, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  check::note_launch();
  FLASHLAB_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// FLASHLAB_LAUNCH with programmatic stream serialization (programmatic dependent launch): the
// kernel's blocks may start once every block of the kernel before it on `stream` has executed
// griddepcontrol.launch_dependents (or exited); it must execute griddepcontrol.wait before it
// reads what that kernel writes.
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  launch_with_attribute(kernel, grid, block, smem, stream, attr, std::forward<Args>(args)...);
}

// FLASHLAB_LAUNCH in thread-block clusters of `cluster` blocks along x (grid.x a multiple of it);
// for kernels without a compile-time cluster size (__cluster_dims__).
template <typename... Params, typename... Args>
void launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster,
                      Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  launch_with_attribute(kernel, grid, block, smem, stream, attr, std::forward<Args>(args)...);
}

// Multiprocessor count of the current device (cached per device).
int sm_count();

// Reads a small int32 device vector (cu_seqlens, a page table) on `stream` and waits for it: the
// values are validated on the host before any launch. t: 1-D, contiguous.
std::vector<int> read_int32(const TensorView& t, cudaStream_t stream);

// Whether `stream` is being captured into a CUDA graph (a device-to-host read then cannot run:
// the checks that read device memory are skipped and the kernels trust their inputs).
bool capturing(cudaStream_t stream);

// Compute capability major version of the current device (cached per device): 9 on Hopper.
int cc_major();

// Most dynamic shared memory one block may opt in to on the current device (cached per
// device): 227 KB on H100, 163 KB on A100, 99 KB on sm_86 / sm_89.
int max_smem_optin();

// Blocks of `threads` threads of `kernel` that fit on the whole device at once (occupancy x
// SMs, cached per kernel and device): the grid of a persistent, grid-stride kernel.
int resident_blocks(const void* kernel, int threads);

// Clusters of `cluster` blocks (threads each, smem_bytes of dynamic shared memory) of `kernel`
// that fit on the device at once (cudaOccupancyMaxActiveClusters, cached per kernel and
// device): the grid of a persistent cluster kernel. A cluster's blocks share one GPC, so this
// can be less than SMs / cluster. The kernel's dynamic shared memory attribute must be set.
int resident_clusters(const void* kernel, int cluster, int threads, int smem_bytes);

// Device memory owned by the library, one buffer per (device, stream, kind), grown on demand
// and never freed (like a BLAS handle's workspace). Growing synchronizes the stream; a warm-up
// call of the largest size avoids it later.
//   kScratch: contents undefined on entry (partial sums between passes).
//   kCounters: zero-filled when allocated; every kernel that uses it must leave it zero.
enum class Workspace { kScratch, kCounters };
void* workspace(cudaStream_t stream, int64_t bytes, Workspace kind = Workspace::kScratch);
// The buffer workspace() would return, if it already holds `bytes`; nullptr otherwise (nothing is
// allocated: usable while `stream` is being captured, when cudaMalloc and the synchronization of a
// growing buffer are not allowed).
void* workspace_if_ready(cudaStream_t stream, int64_t bytes, Workspace kind);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Block size that gives each thread `per_thread` vectors of an `nvec`-vector row: whole warps,
// clamped to [lo, hi]. The row-per-block kernels (norms, softmax) size their blocks with it.
inline int cover_threads(int64_t nvec, int per_thread, int lo = 32, int hi = 1024) {
  const int64_t t = ceil_div(ceil_div(nvec, per_thread), 32) * 32;
  return static_cast<int>(t < lo ? lo : t > hi ? hi : t);
}

// Elements between the rows of a 2-D tensor (its row length when there is one row, whose
// stride is arbitrary).
inline int64_t row_stride(const TensorView& t) { return t.shape[0] > 1 ? t.strides[0] : t.shape[1]; }

// True when every row of a tensor (from ptr, stride_bytes apart) starts on an `align`-byte
// boundary: the precondition of the 16-byte vector rungs.
inline bool rows_aligned(const void* ptr, int64_t stride_bytes, int64_t align) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(align) == 0 && stride_bytes % align == 0;
}

// rows_aligned for rows of T, `stride` elements apart, on 16-byte vectors.
template <typename T>
bool rows_vec16_aligned(const void* ptr, int64_t stride) {
  return rows_aligned(ptr, stride * static_cast<int64_t>(sizeof(T)), 16);
}

}  // namespace flashlab::detail

namespace flashlab::detail {

// Makes `index` the current device for the scope, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    FLASHLAB_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != index) FLASHLAB_CUDA_CHECK(cudaSetDevice(index));
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace flashlab::detail
