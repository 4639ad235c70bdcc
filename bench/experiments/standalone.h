// What the standalone experiments (built by their own nvcc line, no library link) share: a CUDA
// error check that exits with the call's location, and the timing of the project's benchmarks
// (warm-up, L2 flushed by a 256 MiB memset before each repetition, CUDA events, median of 30).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

// Times fn (work enqueued on `stream`) in ms; owns the flush buffer and the events.
class FlushedTimer {
 public:
  explicit FlushedTimer(cudaStream_t stream) : stream_(stream) {
    CK(cudaMalloc(&flush_, kFlushBytes));
    CK(cudaEventCreate(&e0_));
    CK(cudaEventCreate(&e1_));
  }
  FlushedTimer(const FlushedTimer&) = delete;
  FlushedTimer& operator=(const FlushedTimer&) = delete;
  ~FlushedTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaFree(flush_);
  }
  double operator()(const std::function<void()>& fn) {
    for (int i = 0; i < 3; ++i) fn();
    CK(cudaStreamSynchronize(stream_));
    std::vector<float> v;
    for (int i = 0; i < 30; ++i) {
      CK(cudaMemsetAsync(flush_, i, kFlushBytes, stream_));
      CK(cudaEventRecord(e0_, stream_));
      fn();
      CK(cudaEventRecord(e1_, stream_));
      CK(cudaEventSynchronize(e1_));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0_, e1_));
      v.push_back(ms);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

 private:
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  cudaStream_t stream_;
  void* flush_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};
