// RMSNorm family: bad input through the public C++ API on a machine with no GPU; each call
// throws flashlab::Error naming the argument and launches nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "flashlab/norm.h"
#include "flashlab/validate.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::expect_rejected;
using testing::gpu;
using testing::kGpu;

TEST(RmsNormValidation, BadInputs) {
  const auto x = gpu(DType::kBF16, {4, 64}, 1), out = gpu(DType::kBF16, {4, 64}, 2);
  expect_rejected([&] { rmsnorm(x, gpu(DType::kBF16, {63}, 3), out, 1e-6); },
                  {"rmsnorm", "argument 'weight'", "expected shape [64]", "got [63]"});
  expect_rejected([&] { rmsnorm(x, gpu(DType::kF32, {64}, 3), out, 1e-6); },
                  {"argument 'weight'", "expected dtype bf16 (same as 'input')", "got fp32"});
  expect_rejected([&] { rmsnorm(x, gpu(DType::kBF16, {64}, 3), out, -1e-6); },
                  {"argument 'eps'", "expected a finite value >= 0", "got -1e-06"});
  expect_rejected([&] { rmsnorm(x, gpu(DType::kBF16, {64}, 3), out, NAN); }, {"argument 'eps'", "got nan"});
  expect_rejected([&] { rmsnorm(gpu(DType::kBF16, {256}, 1), gpu(DType::kBF16, {256}, 3), gpu(DType::kBF16, {256}, 2), 1e-6); },
                  {"argument 'input'", "expected 2 dims", "got 1 dims"});
  expect_rejected([&] { rmsnorm(x, gpu(DType::kBF16, {64}, 3), gpu(DType::kBF16, {4, 32}, 2), 1e-6); },
                  {"argument 'out'", "expected shape [4, 64] (same as 'input')", "got [4, 32]"});
  expect_rejected([&] { rmsnorm(gpu(DType::kI8, {4, 64}, 1), gpu(DType::kI8, {64}, 3), gpu(DType::kI8, {4, 64}, 2), 1e-6); },
                  {"argument 'input'", "expected dtype fp32 or fp16 or bf16", "got int8"});
  expect_rejected([&] { rmsnorm(TensorView(x.data, DType::kBF16, {4, 64}, Device{}), gpu(DType::kBF16, {64}, 3), out, 1e-6); },
                  {"argument 'input'", "expected a CUDA tensor", "got cpu"});
  expect_rejected([&] { rmsnorm(gpu(DType::kBF16, {0, 64}, 1), gpu(DType::kBF16, {64}, 3), gpu(DType::kBF16, {0, 64}, 2), 1e-6); },
                  {"argument 'input'", "expected at least one element"});
  TensorView overlapping_rows(x.data, DType::kBF16, {4, 64}, {32, 1}, kGpu);
  expect_rejected([&] { rmsnorm(overlapping_rows, gpu(DType::kBF16, {64}, 3), out, 1e-6); },
                  {"argument 'input'", "row stride", "got row stride 32 for hidden 64"});
  expect_rejected([&] { rmsnorm(x, gpu(DType::kBF16, {64}, 3), out, 1e-6, false, nullptr, 5); },
                  {"argument 'rung'", "expected 1..4", "got 5"});
}

TEST(FusedAddRmsNormValidation, BadInputs) {
  const auto x = gpu(DType::kF16, {8, 128}, 1), res = gpu(DType::kF16, {8, 128}, 2), w = gpu(DType::kF16, {128}, 3);
  expect_rejected([&] { fused_add_rmsnorm(x, x, w, 1e-6); },
                  {"fused_add_rmsnorm", "argument 'residual'", "expected memory disjoint from 'input'"});
  expect_rejected([&] { fused_add_rmsnorm(x, gpu(DType::kF16, {8, 64}, 2), w, 1e-6); },
                  {"argument 'residual'", "expected shape [8, 128] (same as 'input')", "got [8, 64]"});
  expect_rejected([&] { fused_add_rmsnorm(x, gpu(DType::kBF16, {8, 128}, 2), w, 1e-6); },
                  {"argument 'residual'", "expected dtype fp16 (same as 'input')", "got bf16"});
  expect_rejected([&] { fused_add_rmsnorm(x, res, w, 1e-6, false, nullptr, 1); },
                  {"argument 'rung'", "expected 2..4 (rung 1 has no fused variant)", "got 1"});
  expect_rejected([&] { fused_add_rmsnorm(x, res, gpu(DType::kF16, {127}, 3), 1e-6); },
                  {"argument 'weight'", "expected shape [128]", "got [127]"});
}

}  // namespace
}  // namespace flashlab
