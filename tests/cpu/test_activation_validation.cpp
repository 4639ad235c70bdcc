// silu_and_mul / gelu_and_mul / gelu_tanh_and_mul: bad input as a new user would try it, through
// the public C++ API, on a machine with no GPU. Every call must throw flashlab::Error naming the
// op, the argument, what was expected and what was given, before any CUDA call (no launch is
// counted). Also the float64 references of the three activations against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "flashlab/flashlab.h"
#include "src/reference/activation.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::fake;
using testing::gpu;
using testing::gpu_strided;
using testing::kCpu;
using testing::kGpu;

using ActFn = void (*)(const TensorView&, const TensorView&, cudaStream_t, int);
struct Op {
  const char* name;
  ActFn fn;
};
const Op kOps[] = {{"silu_and_mul", silu_and_mul}, {"gelu_and_mul", gelu_and_mul},
                   {"gelu_tanh_and_mul", gelu_tanh_and_mul}};

// Asserts `call(op)` is rejected for every op (nothing launched), with a message that starts
// with the op's name and contains every piece.
void expect_rejected(const std::function<void(const Op&)>& call, const std::vector<std::string>& pieces) {
  for (const Op& op : kOps) {
    std::vector<std::string> with_name = pieces;
    with_name.push_back(std::string(op.name) + ": ");
    testing::expect_rejected([&] { call(op); }, with_name);
  }
}

TEST(ActivationValidation, NotOnTheGpu) {
  expect_rejected([](const Op& op) { op.fn(TensorView(fake(0, 1), DType::kF32, {4, 16}, kCpu), gpu(DType::kF32, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected a CUDA tensor", "got cpu tensor"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), TensorView(fake(0, 2), DType::kF32, {4, 8}, kCpu), nullptr, 2); },
                  {"argument 'out'", "expected a CUDA tensor", "got cpu tensor"});
  expect_rejected([](const Op& op) {
    op.fn(gpu(DType::kF32, {4, 16}, 1), TensorView(fake(0, 2), DType::kF32, {4, 8}, Device{DeviceType::kCUDA, 1}), nullptr, 2);
  }, {"argument 'out'", "expected a tensor on cuda:0 (same as 'input')", "got cuda:1"});
}

TEST(ActivationValidation, NullAndEmpty) {
  expect_rejected([](const Op& op) { op.fn(TensorView(nullptr, DType::kBF16, {4, 16}, kGpu), gpu(DType::kBF16, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected a non-null data pointer", "got null"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kBF16, {4, 16}, 1), TensorView(nullptr, DType::kBF16, {4, 8}, kGpu), nullptr, 1); },
                  {"argument 'out'", "expected a non-null data pointer", "got null"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {0, 16}, 1), gpu(DType::kF32, {0, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected at least one element", "got shape [0, 16]"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 0}, 1), gpu(DType::kF32, {4, 0}, 2), nullptr, 2); },
                  {"argument 'input'", "expected at least one element", "got shape [4, 0]"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {}, 1), gpu(DType::kF32, {}, 2), nullptr, 2); },
                  {"argument 'input'", "expected at least 1 dim", "got a 0-dim tensor"});
}

TEST(ActivationValidation, OddLastDim) {
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kBF16, {4, 7}, 1), gpu(DType::kBF16, {4, 3}, 2), nullptr, 2); },
                  {"argument 'input'", "expected an even last dim", "got shape [4, 7]"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {1}, 1), gpu(DType::kF32, {0}, 2), nullptr, 1); },
                  {"argument 'input'", "expected an even last dim", "got shape [1]"});
}

TEST(ActivationValidation, Dtypes) {
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kI32, {4, 16}, 1), gpu(DType::kI32, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected dtype fp32 or fp16 or bf16", "got int32"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kE4M3, {4, 16}, 1), gpu(DType::kE4M3, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "got e4m3"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kBF16, {4, 8}, 2), nullptr, 2); },
                  {"argument 'out'", "expected dtype fp32 (same as 'input')", "got bf16"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF16, {4, 16}, 1), gpu(DType::kBF16, {4, 8}, 2), nullptr, 2); },
                  {"argument 'out'", "expected dtype fp16 (same as 'input')", "got bf16"});
}

TEST(ActivationValidation, OutShape) {
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 16}, 2), nullptr, 2); },
                  {"argument 'out'", "expected shape [4, 8] ('input' with the last dim halved)", "got [4, 16]"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {2, 3, 16}, 1), gpu(DType::kF32, {6, 8}, 2), nullptr, 2); },
                  {"argument 'out'", "expected shape [2, 3, 8]", "got [6, 8]"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu_strided(DType::kF32, {4, 8}, {16, 1}, 2), nullptr, 2); },
                  {"argument 'out'", "expected a contiguous tensor", "strides [16, 1] for shape [4, 8]"});
}

TEST(ActivationValidation, InputStrides) {
  expect_rejected([](const Op& op) { op.fn(gpu_strided(DType::kF32, {4, 16}, {32, 2}, 1), gpu(DType::kF32, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected unit stride in the last dim", "got strides [32, 2]"});
  expect_rejected([](const Op& op) { op.fn(gpu_strided(DType::kF32, {4, 16}, {8, 1}, 1), gpu(DType::kF32, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected >= 2d row stride (rows must not overlap)", "got row stride 8 for last dim 16"});
  expect_rejected([](const Op& op) { op.fn(gpu_strided(DType::kF32, {4, 16}, {-32, 1}, 1), gpu(DType::kF32, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "got row stride -32 for last dim 16"});
  // Rows 32 apart inside each group of 3, but groups 100 apart: no single row stride.
  expect_rejected([](const Op& op) { op.fn(gpu_strided(DType::kF32, {2, 3, 16}, {100, 32, 1}, 1), gpu(DType::kF32, {2, 3, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected leading dims that flatten to one row stride",
                   "got strides [100, 32, 1] for shape [2, 3, 16]"});
}

TEST(ActivationValidation, AlignmentAndOverlap) {
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kBF16, {4, 16}, 1, 1), gpu(DType::kBF16, {4, 8}, 2), nullptr, 2); },
                  {"argument 'input'", "expected a data pointer aligned to 2 bytes", "(offset 1)"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 8}, 2, 2), nullptr, 1); },
                  {"argument 'out'", "expected a data pointer aligned to 4 bytes", "(offset 2)"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 8}, 1), nullptr, 2); },
                  {"argument 'out'", "expected memory disjoint from 'input'", "got the same data pointer"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 8}, 1, 64), nullptr, 2); },
                  {"argument 'out'", "expected memory disjoint from 'input' or identical to it", "got a partial overlap"});
}

TEST(ActivationValidation, BadRung) {
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 8}, 2), nullptr, 3); },
                  {"argument 'rung'", "expected 1..2", "got 3"});
  expect_rejected([](const Op& op) { op.fn(gpu(DType::kF32, {4, 16}, 1), gpu(DType::kF32, {4, 8}, 2), nullptr, 0); },
                  {"argument 'rung'", "got 0"});
}

// ---- the float64 references

TEST(ActivationReference, ClosedForms) {
  using namespace reference;
  EXPECT_EQ(silu(0.0), 0.0);
  EXPECT_NEAR(silu(std::log(3.0)), 0.75 * std::log(3.0), 1e-15);  // sigmoid(ln 3) = 3/4
  EXPECT_NEAR(gelu(1.0), 0.8413447460685429, 1e-15);              // Phi(1)
  EXPECT_NEAR(gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(gelu_tanh(2.0), 1.954597694087775, 1e-14);
  for (double x : {0.1, 0.7, 1.5, 3.0, 12.0}) {
    EXPECT_NEAR(silu(x) - silu(-x), x, 1e-15 * x) << x;       // x sigmoid(x) + x sigmoid(-x) = x
    EXPECT_NEAR(gelu(x) - gelu(-x), x, 1e-15 * x) << x;       // Phi(x) + Phi(-x) = 1
    EXPECT_NEAR(gelu_tanh(x) - gelu_tanh(-x), x, 1e-15 * x) << x;
  }
  // Far left tails: tiny negative values, no NaN, no cancellation to exactly 0 while representable.
  EXPECT_LT(gelu(-10.0), 0.0);
  EXPECT_NEAR(gelu(-10.0) / (-10.0 * 7.619853024160593e-24), 1.0, 1e-9);  // Phi(-10)
  EXPECT_LT(gelu_tanh(-6.0), 0.0);
  EXPECT_EQ(silu(-1000.0), -0.0);
}

TEST(ActivationReference, GateThenUpLayout) {
  // rows = 2, d = 2: row r is [gate0, gate1, up0, up1].
  const std::vector<double> x = {1.0, -2.0, 3.0, 4.0, 0.5, 0.0, -1.0, 7.0};
  const auto out = reference::act_and_mul(reference::Act::kSilu, x, 2, 2);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_DOUBLE_EQ(out[0], reference::silu(1.0) * 3.0);
  EXPECT_DOUBLE_EQ(out[1], reference::silu(-2.0) * 4.0);
  EXPECT_DOUBLE_EQ(out[2], reference::silu(0.5) * -1.0);
  EXPECT_DOUBLE_EQ(out[3], 0.0);
}

}  // namespace
}  // namespace flashlab
