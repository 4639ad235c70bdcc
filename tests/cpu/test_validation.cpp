// Bad input as a new user would try it, through the public C++ API, on a machine with no
// GPU: every call must throw flashlab::Error naming the argument, what was expected and what
// was given, before any CUDA call (no launch is counted).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "flashlab/flashlab.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::fake;
using testing::gpu;
using testing::kCpu;
using testing::kGpu;
const Device kPinned{DeviceType::kCUDAHost, 0};

TEST(VectorAddValidation, CpuTensor) {
  TensorView a(fake(0, 1), DType::kF32, {1024}, kCpu);
  expect_rejected([&] { vector_add(a, gpu(DType::kF32, {1024}, 2), gpu(DType::kF32, {1024}, 3)); },
                  {"vector_add", "argument 'a'", "expected a CUDA tensor", "got cpu"});
}

TEST(VectorAddValidation, WrongDtype) {
  expect_rejected([&] { vector_add(gpu(DType::kI32, {8}, 1), gpu(DType::kI32, {8}, 2), gpu(DType::kI32, {8}, 3)); },
                  {"argument 'a'", "expected dtype fp32 or bf16", "got int32"});
  expect_rejected([&] { vector_add(gpu(DType::kF32, {8}, 1), gpu(DType::kBF16, {8}, 2), gpu(DType::kF32, {8}, 3)); },
                  {"argument 'b'", "expected dtype fp32 (same as 'a')", "got bf16"});
}

TEST(VectorAddValidation, MismatchedShapes) {
  expect_rejected(
      [&] { vector_add(gpu(DType::kF32, {1024}, 1), gpu(DType::kF32, {1000}, 2), gpu(DType::kF32, {1024}, 3)); },
      {"argument 'b'", "expected shape [1024] (same as 'a')", "got [1000]"});
  expect_rejected(
      [&] { vector_add(gpu(DType::kF32, {4, 8}, 1), gpu(DType::kF32, {4, 8}, 2), gpu(DType::kF32, {32}, 3)); },
      {"argument 'out'", "expected shape [4, 8]", "got [32]"});
}

TEST(VectorAddValidation, NullPointer) {
  TensorView a(nullptr, DType::kF32, {16}, kGpu);
  expect_rejected([&] { vector_add(a, gpu(DType::kF32, {16}, 2), gpu(DType::kF32, {16}, 3)); },
                  {"argument 'a'", "non-null", "got null"});
}

TEST(VectorAddValidation, LengthZero) {
  expect_rejected([&] { vector_add(gpu(DType::kF32, {0}, 1), gpu(DType::kF32, {0}, 2), gpu(DType::kF32, {0}, 3)); },
                  {"argument 'a'", "expected at least one element", "got shape [0]"});
}

TEST(VectorAddValidation, MisalignedPointer) {
  // Not even element-aligned: any rung rejects it.
  expect_rejected(
      [&] { vector_add(gpu(DType::kF32, {16}, 1, 2), gpu(DType::kF32, {16}, 2), gpu(DType::kF32, {16}, 3)); },
      {"argument 'a'", "aligned to 4 bytes", "offset 2"});
  // Element-aligned but not 16-byte aligned: rung 3 (top) takes it, rung 2 does not.
  expect_rejected(
      [&] {
        vector_add(gpu(DType::kF32, {16}, 1, 4), gpu(DType::kF32, {16}, 2, 4), gpu(DType::kF32, {16}, 3, 4), nullptr, 2);
      },
      {"argument 'a'", "aligned to 16 bytes", "offset 4"});
  expect_rejected(
      [&] { vector_add(gpu(DType::kBF16, {12}, 1), gpu(DType::kBF16, {12}, 2), gpu(DType::kBF16, {12}, 3), nullptr, 2); },
      {"expected numel a multiple of 8", "got 12"});
}

TEST(VectorAddValidation, NonContiguousAndOverlap) {
  TensorView strided(fake(0, 1), DType::kF32, {4, 4}, {8, 1}, kGpu);
  expect_rejected([&] { vector_add(strided, gpu(DType::kF32, {4, 4}, 2), gpu(DType::kF32, {4, 4}, 3)); },
                  {"argument 'a'", "expected a contiguous tensor", "strides [8, 1]"});
  // out starts 4 elements into a: partial overlap.
  expect_rejected(
      [&] { vector_add(gpu(DType::kF32, {16}, 1), gpu(DType::kF32, {16}, 2), gpu(DType::kF32, {16}, 1, 16)); },
      {"argument 'out'", "partial overlap"});
}

TEST(VectorAddValidation, BadRung) {
  expect_rejected([&] { vector_add(gpu(DType::kF32, {8}, 1), gpu(DType::kF32, {8}, 2), gpu(DType::kF32, {8}, 3), nullptr, 4); },
                  {"vector_add", "argument 'rung'", "expected 1..3", "got 4"});
  expect_rejected([&] { vector_add(gpu(DType::kF32, {8}, 1), gpu(DType::kF32, {8}, 2), gpu(DType::kF32, {8}, 3), nullptr, 0); },
                  {"got 0"});
}

TEST(VectorAddValidation, DifferentDevices) {
  TensorView b(fake(0, 2), DType::kF32, {8}, Device{DeviceType::kCUDA, 1});
  expect_rejected([&] { vector_add(gpu(DType::kF32, {8}, 1), b, gpu(DType::kF32, {8}, 3)); },
                  {"argument 'b'", "expected a tensor on cuda:0", "got cuda:1"});
}

TEST(SumValidation, BadInputs) {
  expect_rejected([&] { sum(gpu(DType::kF32, {100}, 1), gpu(DType::kBF16, {1}, 2)); },
                  {"sum", "argument 'out'", "expected dtype fp32", "got bf16"});
  expect_rejected([&] { sum(gpu(DType::kF32, {100}, 1), gpu(DType::kF32, {2}, 2)); },
                  {"argument 'out'", "expected shape [1]", "got [2]"});
  expect_rejected([&] { sum(gpu(DType::kF16, {100}, 1), gpu(DType::kF32, {1}, 2)); },
                  {"argument 'x'", "expected dtype fp32 or bf16", "got fp16"});
  expect_rejected([&] { sum(gpu(DType::kF32, {0}, 1), gpu(DType::kF32, {1}, 2)); },
                  {"argument 'x'", "at least one element"});
  expect_rejected([&] { sum(TensorView(fake(0, 1), DType::kF32, {8}, kCpu), gpu(DType::kF32, {1}, 2)); },
                  {"argument 'x'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { sum(gpu(DType::kF32, {8}, 1), gpu(DType::kF32, {1}, 2), nullptr, 7); },
                  {"argument 'rung'", "expected 1..6", "got 7"});
}

TEST(RowSumValidation, BadInputs) {
  expect_rejected([&] { row_sum(gpu(DType::kF32, {8}, 1), gpu(DType::kF32, {8}, 2)); },
                  {"row_sum", "argument 'x'", "expected 2 dims", "got 1 dims"});
  expect_rejected([&] { row_sum(gpu(DType::kF32, {8, 16}, 1), gpu(DType::kF32, {16}, 2)); },
                  {"argument 'out'", "expected shape [8]", "got [16]"});
  TensorView col_strided(fake(0, 1), DType::kF32, {8, 16}, {32, 2}, kGpu);
  expect_rejected([&] { row_sum(col_strided, gpu(DType::kF32, {8}, 2)); },
                  {"argument 'x'", "unit stride in the last dim", "strides [32, 2]"});
  TensorView overlapping_rows(fake(0, 1), DType::kF32, {8, 16}, {4, 1}, kGpu);
  expect_rejected([&] { row_sum(overlapping_rows, gpu(DType::kF32, {8}, 2)); },
                  {"argument 'x'", "row stride", "got row stride 4 for cols 16"});
}

TEST(StreamsValidation, PageableHostMemoryIsRejected) {
  TensorView pageable(fake(0, 1), DType::kF32, {64}, kCpu);
  TensorView pinned(fake(0, 2), DType::kF32, {64}, kPinned);
  std::vector<cudaStream_t> streams{nullptr};
  expect_rejected([&] { streams_pipeline(pageable, pinned, gpu(DType::kF32, {64}, 3), gpu(DType::kF32, {64}, 4), streams, 4); },
                  {"streams_pipeline", "argument 'host_in'", "pinned host memory", "got cpu"});
  expect_rejected([&] { streams_pipeline(pinned, TensorView(fake(0, 5), DType::kF32, {64}, kPinned), gpu(DType::kF32, {64}, 3),
                                         gpu(DType::kF32, {64}, 4), {}, 4); },
                  {"argument 'streams'", "at least one stream"});
  expect_rejected([&] { streams_pipeline(pinned, TensorView(fake(0, 5), DType::kF32, {64}, kPinned), gpu(DType::kF32, {64}, 3),
                                         gpu(DType::kF32, {64}, 4), streams, 65); },
                  {"argument 'num_chunks'", "expected 1..64", "got 65"});
  expect_rejected([&] { streams_pipeline(pinned, TensorView(fake(0, 5), DType::kF32, {64}, kPinned), gpu(DType::kF32, {32}, 3),
                                         gpu(DType::kF32, {64}, 4), streams, 4); },
                  {"argument 'dev_in'", "expected shape [64] (same as 'host_in')", "got [32]"});
}

}  // namespace
}  // namespace flashlab
