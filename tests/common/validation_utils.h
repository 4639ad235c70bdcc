// Helpers of the CPU validation tests: fake device tensors and "rejected, nothing launched".
//
// The public API validates every argument before touching memory or CUDA, so tensors that
// claim to live on a CUDA device at fake, well-aligned addresses are enough to exercise every
// check on a machine without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"
#include "flashlab/validate.h"

namespace flashlab::testing {

inline const Device kGpu{DeviceType::kCUDA, 0};
inline const Device kCpu{DeviceType::kCPU, 0};

// A fake address: 4 GiB apart per slot (distinct tensors never overlap), plus offset_bytes.
inline void* fake(uintptr_t offset_bytes = 0, int slot = 0) {
  return reinterpret_cast<void*>(0x7f0000000000ull + (static_cast<uintptr_t>(slot) << 32) + offset_bytes);
}

inline TensorView gpu(DType dt, std::vector<int64_t> shape, int slot, uintptr_t offset_bytes = 0) {
  return TensorView(fake(offset_bytes, slot), dt, std::move(shape), kGpu);
}

inline TensorView gpu_strided(DType dt, std::vector<int64_t> shape, std::vector<int64_t> strides, int slot) {
  return TensorView(fake(0, slot), dt, std::move(shape), std::move(strides), kGpu);
}

// Asserts fn throws flashlab::Error whose message contains every piece, and launches nothing.
inline void expect_rejected(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  const int64_t launches = check::launch_count();
  try {
    fn();
    ADD_FAILURE() << "expected flashlab::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  }
  EXPECT_EQ(check::launch_count(), launches) << "a rejected call launched a kernel";
}

}  // namespace flashlab::testing
