// gemm on a machine with no GPU: bad input as a new user would try it, through the public C++ API
// (include/flashlab/gemm.h). Every call must throw flashlab::Error naming the argument, what was
// expected and what was given, and launch nothing. Each call here fails a check that comes before
// the one CUDA query of the validation (rung 9's compute-capability check), so none touches CUDA.
// Also: which rung takes which dtype, and the float64 reference against hand-computed products.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashlab/gemm.h"
#include "src/reference/gemm.h"
#include "tests/common/validation_utils.h"

namespace flashlab {
namespace {

using testing::fake;
using testing::gpu;
using testing::gpu_strided;
using testing::kCpu;
using testing::kGpu;

constexpr int kHopperRung = 9;  // TMA + wgmma, the only rung with 16-byte rules
static_assert(kGemmRungs == kHopperRung, "the rung list of include/flashlab/gemm.h changed: update this test");

// Asserts gemm(a, b, c) on `rung` is rejected (nothing launched) with a message that starts
// with "gemm: " and contains every piece.
void expect_rejected(const TensorView& a, const TensorView& b, const TensorView& c, int rung,
                     std::vector<std::string> pieces, const GemmEpilogue& epi = {}) {
  pieces.push_back("gemm: argument '");
  testing::expect_rejected([&] { gemm(a, b, c, nullptr, rung, epi); }, pieces);
}

// Dtype a rung takes (fp32 below the tensor-core rungs, bf16 from them on).
DType dtype_of(int rung) { return rung >= 2 && rung <= 6 ? DType::kF32 : DType::kBF16; }

// (16, 64) @ (64, 32) -> (16, 32), each in its own slot: a valid call on every rung of dt.
struct Mats {
  TensorView a, b, c;
  explicit Mats(DType dt) : a(gpu(dt, {16, 64}, 1)), b(gpu(dt, {64, 32}, 2)), c(gpu(dt, {16, 32}, 3)) {}
};

TEST(GemmValidation, RungOutOfRange) {
  const Mats m(DType::kF32);
  for (int rung : {0, -1, kGemmRungs + 1, 1000})
    expect_rejected(m.a, m.b, m.c, rung, {"argument 'rung'", "expected 1..9", "got " + std::to_string(rung)});
  // The rung is checked first: a CPU tensor with a bad rung names the rung.
  expect_rejected(TensorView(fake(0, 1), DType::kF32, {16, 64}, kCpu), m.b, m.c, 0, {"argument 'rung'", "got 0"});
}

TEST(GemmValidation, NotOnTheGpu) {
  const Mats m(DType::kF32);
  expect_rejected(TensorView(fake(0, 1), DType::kF32, {16, 64}, kCpu), m.b, m.c, 1,
                  {"argument 'a'", "expected a CUDA tensor", "got cpu tensor"});
  expect_rejected(m.a, TensorView(fake(0, 2), DType::kF32, {64, 32}, kCpu), m.c, 1,
                  {"argument 'b'", "expected a CUDA tensor", "got cpu tensor"});
  expect_rejected(m.a, m.b, TensorView(fake(0, 3), DType::kF32, {16, 32}, Device{DeviceType::kCUDAHost, 0}), 1,
                  {"argument 'c'", "expected a CUDA tensor", "got cuda_host"});
  expect_rejected(m.a, TensorView(fake(0, 2), DType::kF32, {64, 32}, Device{DeviceType::kCUDA, 1}), m.c, 1,
                  {"argument 'b'", "expected a tensor on cuda:0 (same as 'a')", "got cuda:1"});
  expect_rejected(m.a, m.b, TensorView(fake(0, 3), DType::kF32, {16, 32}, Device{DeviceType::kCUDA, 1}), 6,
                  {"argument 'c'", "expected a tensor on cuda:0 (same as 'a')", "got cuda:1"});
  expect_rejected(TensorView(fake(0, 1), DType::kBF16, {16, 64}, Device{DeviceType::kCUDA, 1}), gpu(DType::kBF16, {64, 32}, 2),
                  gpu(DType::kBF16, {16, 32}, 3), kHopperRung, {"argument 'b'", "expected a tensor on cuda:1 (same as 'a')", "got cuda:0"});
}

TEST(GemmValidation, NullAndEmpty) {
  const Mats m(DType::kF32);
  expect_rejected(TensorView(nullptr, DType::kF32, {16, 64}, kGpu), m.b, m.c, 1,
                  {"argument 'a'", "expected a non-null data pointer", "got null"});
  expect_rejected(m.a, m.b, TensorView(nullptr, DType::kF32, {16, 32}, kGpu), 1,
                  {"argument 'c'", "expected a non-null data pointer", "got null"});
  expect_rejected(gpu(DType::kF32, {0, 64}, 1), m.b, gpu(DType::kF32, {0, 32}, 3), 1,
                  {"argument 'a'", "expected at least one element", "got shape [0, 64]"});
  expect_rejected(gpu(DType::kF32, {16, 0}, 1), gpu(DType::kF32, {0, 32}, 2), m.c, 1,
                  {"argument 'a'", "expected at least one element", "got shape [16, 0]"});
  expect_rejected(m.a, gpu(DType::kF32, {64, 0}, 2), gpu(DType::kF32, {16, 0}, 3), 1,
                  {"argument 'b'", "expected at least one element", "got shape [64, 0]"});
}

TEST(GemmValidation, Rank) {
  const Mats m(DType::kBF16);
  expect_rejected(gpu(DType::kBF16, {64}, 1), m.b, m.c, 1, {"argument 'a'", "expected 2 dims", "got 1 dims, shape [64]"});
  expect_rejected(gpu(DType::kBF16, {2, 8, 64}, 1), m.b, m.c, 7,
                  {"argument 'a'", "expected 2 dims", "got 3 dims, shape [2, 8, 64]"});
  expect_rejected(m.a, gpu(DType::kBF16, {1, 64, 32}, 2), m.c, 8, {"argument 'b'", "expected 2 dims", "got 3 dims"});
  expect_rejected(m.a, m.b, gpu(DType::kBF16, {512}, 3), kHopperRung, {"argument 'c'", "expected 2 dims", "got 1 dims"});
  expect_rejected(gpu(DType::kBF16, {}, 1), m.b, m.c, 1, {"argument 'a'", "expected 2 dims", "got 0 dims, shape []"});
}

TEST(GemmValidation, Dtypes) {
  for (int rung = 1; rung <= kGemmRungs; ++rung) {
    // Not a GEMM dtype at all: the same message on every rung.
    for (DType dt : {DType::kI8, DType::kE4M3, DType::kI32}) {
      const Mats m(dt);
      expect_rejected(m.a, m.b, m.c, rung,
                      {"argument 'a'", "expected dtype fp32 or fp16 or bf16", std::string("got ") + dtype_name(dt)});
    }
    const DType dt = dtype_of(rung), other = dt == DType::kF32 ? DType::kBF16 : DType::kF32;
    const Mats m(dt);
    expect_rejected(m.a, gpu(other, {64, 32}, 2), m.c, rung,
                    {"argument 'b'", std::string("expected dtype ") + dtype_name(dt) + " (same as 'a')",
                     std::string("got ") + dtype_name(other)});
    expect_rejected(m.a, m.b, gpu(other, {16, 32}, 3), rung,
                    {"argument 'c'", std::string("expected dtype ") + dtype_name(dt) + " (same as 'a')",
                     std::string("got ") + dtype_name(other)});
  }
  // fp16 vs bf16 is a mismatch too.
  expect_rejected(gpu(DType::kF16, {16, 64}, 1), gpu(DType::kBF16, {64, 32}, 2), gpu(DType::kF16, {16, 32}, 3), 8,
                  {"argument 'b'", "expected dtype fp16 (same as 'a')", "got bf16"});
}

TEST(GemmValidation, DtypeNotTakenByTheRung) {
  for (int rung = 1; rung <= kGemmRungs; ++rung)
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (gemm_rung_supports(rung, dt)) continue;
      const Mats m(dt);
      const std::string expected =
          rung <= 6 ? "expected dtype fp32 for rung " + std::to_string(rung)
                    : "expected dtype fp16 or bf16 for rung " + std::to_string(rung);
      expect_rejected(m.a, m.b, m.c, rung, {"argument 'a'", expected, std::string("got ") + dtype_name(dt)});
    }
}

TEST(GemmValidation, RungDtypeTable) {
  // As include/flashlab/gemm.h lists them.
  for (int rung = 1; rung <= kGemmRungs; ++rung) {
    EXPECT_EQ(gemm_rung_supports(rung, DType::kF32), rung <= 6) << rung;
    EXPECT_EQ(gemm_rung_supports(rung, DType::kF16), rung == 1 || rung >= 7) << rung;
    EXPECT_EQ(gemm_rung_supports(rung, DType::kBF16), rung == 1 || rung >= 7) << rung;
    for (DType dt : {DType::kE4M3, DType::kE5M2, DType::kI8, DType::kI32, DType::kI64, DType::kU8})
      EXPECT_FALSE(gemm_rung_supports(rung, dt)) << rung << " " << dtype_name(dt);
  }
  for (int rung : {0, -1, kGemmRungs + 1})
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) EXPECT_FALSE(gemm_rung_supports(rung, dt)) << rung;
}

TEST(GemmValidation, Shapes) {
  for (int rung : {1, 4, 8, kHopperRung}) {
    const DType dt = dtype_of(rung);
    const Mats m(dt);
    expect_rejected(m.a, gpu(dt, {63, 32}, 2), m.c, rung,
                    {"argument 'b'", "expected shape (64, N) (rows = a's cols)", "got [63, 32]"});
    expect_rejected(m.a, gpu(dt, {32, 64}, 2), m.c, rung, {"argument 'b'", "expected shape (64, N)", "got [32, 64]"});
    expect_rejected(m.a, m.b, gpu(dt, {16, 31}, 3), rung, {"argument 'c'", "expected shape (16, 32)", "got [16, 31]"});
    expect_rejected(m.a, m.b, gpu(dt, {32, 16}, 3), rung, {"argument 'c'", "expected shape (16, 32)", "got [32, 16]"});
    expect_rejected(m.a, m.b, gpu(dt, {17, 32}, 3), rung, {"argument 'c'", "expected shape (16, 32)", "got [17, 32]"});
  }
  // Dims beyond int: the kernels index with int M, N, K.
  const int64_t big = int64_t{1} << 31;
  expect_rejected(gpu(DType::kF16, {1, big}, 1), gpu(DType::kF16, {big, 1}, 5), gpu(DType::kF16, {1, 1}, 3), 1,
                  {"argument 'a'", "expected dims < 2^31", "got [1, 2147483648]"});
  expect_rejected(gpu(DType::kF16, {1, 1}, 1), gpu(DType::kF16, {1, big}, 2), gpu(DType::kF16, {1, big}, 5), 1,
                  {"argument 'b'", "expected dims < 2^31", "got [1, 2147483648]"});
}

TEST(GemmValidation, OperandStrides) {
  const Mats m(DType::kF32);
  const std::string either = "expected row-major (strides (>= cols, 1)) or column-major (strides (1, >= rows))";
  // Neither dim has unit stride.
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {128, 2}, 1), m.b, m.c, 1,
                  {"argument 'a'", either, "got strides [128, 2] for shape [16, 64]"});
  // Rows that overlap (leading dim < cols), columns that overlap, negative and zero strides.
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {32, 1}, 1), m.b, m.c, 1, {"argument 'a'", either, "got strides [32, 1]"});
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {1, 8}, 1), m.b, m.c, 1, {"argument 'a'", either, "got strides [1, 8]"});
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {-64, 1}, 1), m.b, m.c, 1, {"argument 'a'", "got strides [-64, 1]"});
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {0, 1}, 1), m.b, m.c, 1, {"argument 'a'", "got strides [0, 1]"});
  expect_rejected(m.a, gpu_strided(DType::kF32, {64, 32}, {64, 2}, 2), m.c, 1,
                  {"argument 'b'", either, "got strides [64, 2] for shape [64, 32]"});
  expect_rejected(m.a, gpu_strided(DType::kF32, {64, 32}, {1, 32}, 2), m.c, 1, {"argument 'b'", either, "got strides [1, 32]"});
}

TEST(GemmValidation, OutputMustBeRowMajor) {
  for (int rung : {1, 5, 7, kHopperRung}) {
    const DType dt = dtype_of(rung);
    const Mats m(dt);
    // Column-major C (a transposed view): rejected on every rung.
    expect_rejected(m.a, m.b, gpu_strided(dt, {16, 32}, {1, 16}, 3), rung,
                    {"argument 'c'", "expected row-major (strides (>= N, 1))", "got strides [1, 16]"});
    expect_rejected(m.a, m.b, gpu_strided(dt, {16, 32}, {1, 24}, 3), rung, {"argument 'c'", "got strides [1, 24]"});
    // Overlapping rows, or no unit stride at all.
    expect_rejected(m.a, m.b, gpu_strided(dt, {16, 32}, {16, 1}, 3), rung, {"argument 'c'", "got strides [16, 1]"});
    expect_rejected(m.a, m.b, gpu_strided(dt, {16, 32}, {64, 2}, 3), rung, {"argument 'c'", "got strides [64, 2]"});
  }
}

TEST(GemmValidation, BothOperandsColumnMajor) {
  for (int rung : {1, kHopperRung}) {
    const DType dt = dtype_of(rung);
    expect_rejected(gpu_strided(dt, {16, 64}, {1, 16}, 1), gpu_strided(dt, {64, 32}, {1, 64}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'a'", "expected layout NN, NT or TN (a and b not both column-major)",
                     "got a and b both column-major"});
  }
}

TEST(GemmValidation, TransposedLayoutsOnlyOnRungs1And9) {
  for (int rung = 2; rung <= 8; ++rung) {
    const DType dt = dtype_of(rung);
    const std::string expected =
        "expected row-major a and b (layout NN) for rung " + std::to_string(rung) + " (rungs 1 and 9 take NT, TN)";
    // NT: b is a transposed view of an (N, K) row-major weight.
    expect_rejected(gpu(dt, {16, 64}, 1), gpu_strided(dt, {64, 32}, {1, 64}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'a'", expected, "got column-major b"});
    // TN: a is a transposed view of a (K, M) row-major tensor.
    expect_rejected(gpu_strided(dt, {16, 64}, {1, 16}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'a'", expected, "got column-major a"});
    // Column-major with padded leading dims.
    expect_rejected(gpu_strided(dt, {16, 64}, {1, 24}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'a'", expected, "got column-major a"});
  }
}

TEST(GemmValidation, Bias) {
  for (int rung : {1, 6, 8, kHopperRung}) {
    const DType dt = dtype_of(rung), other = dt == DType::kF32 ? DType::kBF16 : DType::kF32;
    const Mats m(dt);
    auto with_bias = [&](const TensorView& bias, std::vector<std::string> pieces, float beta = 0.f) {
      GemmEpilogue epi;
      epi.alpha = 2.f;
      epi.beta = beta;
      epi.bias = &bias;
      expect_rejected(m.a, m.b, m.c, rung, std::move(pieces), epi);
    };
    with_bias(gpu(dt, {31}, 4), {"argument 'bias'", "expected shape [32]", "got [31]"});
    with_bias(gpu(dt, {16}, 4), {"argument 'bias'", "expected shape [32]", "got [16]"}, 1.f);  // M, not N
    with_bias(gpu(dt, {1, 32}, 4), {"argument 'bias'", "expected shape [32]", "got [1, 32]"});
    with_bias(gpu(dt, {16, 32}, 4), {"argument 'bias'", "expected shape [32]", "got [16, 32]"});
    with_bias(gpu(other, {32}, 4), {"argument 'bias'", std::string("expected dtype ") + dtype_name(dt) + " (same as 'c')",
                                    std::string("got ") + dtype_name(other)});
    with_bias(gpu_strided(dt, {32}, {2}, 4), {"argument 'bias'", "expected a contiguous tensor", "got strides [2] for shape [32]"});
    with_bias(TensorView(fake(0, 4), dt, {32}, kCpu), {"argument 'bias'", "expected a CUDA tensor", "got cpu tensor"});
    with_bias(TensorView(fake(0, 4), dt, {32}, Device{DeviceType::kCUDA, 1}),
              {"argument 'bias'", "expected a tensor on cuda:0 (same as 'c')", "got cuda:1"});
    with_bias(TensorView(nullptr, dt, {32}, kGpu), {"argument 'bias'", "expected a non-null data pointer", "got null"});
    // The bias inside C's memory: C is written while the bias is read.
    with_bias(gpu(dt, {32}, 3, 64), {"argument 'c'", "expected memory disjoint from 'bias' or identical to it",
                                     "got a partial overlap"});
  }
}

TEST(GemmValidation, ElementAlignment) {
  for (int rung : {1, 2, 7}) {
    const DType dt = dtype_of(rung);
    const int es = dtype_size(dt);
    const std::string aligned = "expected a data pointer aligned to " + std::to_string(es) + " bytes";
    expect_rejected(gpu(dt, {16, 64}, 1, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'a'", aligned, "(offset 1)"});
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2, es + 1), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'b'", aligned, "(offset 1)"});
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3, 1), rung,
                    {"argument 'c'", aligned, "(offset 1)"});
  }
  expect_rejected(gpu(DType::kF32, {16, 64}, 1, 2), gpu(DType::kF32, {64, 32}, 2), gpu(DType::kF32, {16, 32}, 3), 3,
                  {"argument 'a'", "expected a data pointer aligned to 4 bytes", "(offset 2)"});
}

TEST(GemmValidation, HopperRungNeeds16ByteAlignment) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::string aligned = "expected a data pointer aligned to 16 bytes";
    // Element-aligned, not 16-byte aligned pointers.
    expect_rejected(gpu(dt, {16, 64}, 1, 8), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3), kHopperRung,
                    {"argument 'a'", aligned, "(offset 8)"});
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2, 2), gpu(dt, {16, 32}, 3), kHopperRung,
                    {"argument 'b'", aligned, "(offset 2)"});
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3, 4), kHopperRung,
                    {"argument 'c'", aligned, "(offset 4)"});
    const std::string ld = "expected a leading dim of a multiple of 16 bytes for rung 9 (TMA)";
    // K = 36: a's rows are 72 bytes apart.
    expect_rejected(gpu(dt, {16, 36}, 1), gpu(dt, {36, 32}, 2), gpu(dt, {16, 32}, 3), kHopperRung,
                    {"argument 'a'", ld, "got leading dim 36 x 2 bytes"});
    // A padded leading dim that is still not a multiple of 8 elements.
    expect_rejected(gpu_strided(dt, {16, 32}, {36, 1}, 1), gpu(dt, {32, 32}, 2), gpu(dt, {16, 32}, 3), kHopperRung,
                    {"argument 'a'", ld, "got leading dim 36 x 2 bytes"});
    // b: N = 20 (b's rows 40 bytes apart); as a column-major view (NT) with leading dim 44.
    expect_rejected(gpu(dt, {16, 32}, 1), gpu(dt, {32, 20}, 2), gpu_strided(dt, {16, 20}, {24, 1}, 3), kHopperRung,
                    {"argument 'b'", ld, "got leading dim 20 x 2 bytes"});
    expect_rejected(gpu(dt, {16, 40}, 1), gpu_strided(dt, {40, 32}, {1, 44}, 2), gpu(dt, {16, 32}, 3), kHopperRung,
                    {"argument 'b'", ld, "got leading dim 44 x 2 bytes"});
    // a column-major (TN) with M = 20 as its leading dim.
    expect_rejected(gpu_strided(dt, {20, 32}, {1, 20}, 1), gpu(dt, {32, 32}, 2), gpu(dt, {20, 32}, 3), kHopperRung,
                    {"argument 'a'", ld, "got leading dim 20 x 2 bytes"});
    // c: N = 20 contiguous, while b has a padded, aligned leading dim of 24.
    expect_rejected(gpu(dt, {16, 32}, 1), gpu_strided(dt, {32, 20}, {24, 1}, 2), gpu(dt, {16, 20}, 3), kHopperRung,
                    {"argument 'c'", ld, "got leading dim 20 x 2 bytes"});
  }
}

TEST(GemmValidation, OutputOverlapsAnInput) {
  for (int rung : {1, 4, 7, kHopperRung}) {
    const DType dt = dtype_of(rung);
    // c starts inside a's (16, 64) / b's (64, 32) memory.
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 1, 256), rung,
                    {"argument 'c'", "expected memory disjoint from 'a' or identical to it", "got a partial overlap"});
    expect_rejected(gpu(dt, {16, 64}, 1), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 2, 1024), rung,
                    {"argument 'c'", "expected memory disjoint from 'b' or identical to it", "got a partial overlap"});
    // a starts inside c.
    expect_rejected(gpu(dt, {16, 64}, 3, 512), gpu(dt, {64, 32}, 2), gpu(dt, {16, 32}, 3), rung,
                    {"argument 'c'", "expected memory disjoint from 'a' or identical to it", "got a partial overlap"});
    // c is a itself, or b itself (square shapes so every shape check passes).
    expect_rejected(gpu(dt, {32, 32}, 1), gpu(dt, {32, 32}, 2), gpu(dt, {32, 32}, 1), rung,
                    {"argument 'c'", "expected memory disjoint from 'a' and 'b'", "got a shared data pointer"});
    expect_rejected(gpu(dt, {32, 32}, 1), gpu(dt, {32, 32}, 2), gpu(dt, {32, 32}, 2), rung,
                    {"argument 'c'", "expected memory disjoint from 'a' and 'b'", "got a shared data pointer"});
  }
  // A column-major a whose columns run into c.
  expect_rejected(gpu_strided(DType::kF32, {16, 64}, {1, 16}, 1), gpu(DType::kF32, {64, 32}, 2),
                  gpu(DType::kF32, {16, 32}, 1, 4 * 16 * 63), 1,
                  {"argument 'c'", "expected memory disjoint from 'a' or identical to it", "got a partial overlap"});
}

// ---- the float64 reference

TEST(GemmReference, HandComputed) {
  // a (2, 2) @ b (2, 3) = [[21, 24, 27], [47, 54, 61]].
  const std::vector<double> a = {1, 2, 3, 4}, b = {5, 6, 7, 8, 9, 10};
  EXPECT_EQ(reference::gemm(a, b, 2, 3, 2), (std::vector<double>{21, 24, 27, 47, 54, 61}));
  // 2 * a @ b + 0.5 * c + bias.
  const std::vector<double> c = {1, 1, 1, 2, 2, 2}, bias = {1, -1, 0.5};
  EXPECT_EQ(reference::gemm(a, b, 2, 3, 2, 2.0, 0.5, c, bias), (std::vector<double>{43.5, 47.5, 55, 96, 108, 123.5}));
  // beta = 0 ignores c_in (empty is fine); alpha = 0 leaves beta * c + bias.
  EXPECT_EQ(reference::gemm(a, b, 2, 3, 2, 1.0, 0.0, {}, bias), (std::vector<double>{22, 23, 27.5, 48, 53, 61.5}));
  EXPECT_EQ(reference::gemm(a, b, 2, 3, 2, 0.0, -1.0, c, {}), (std::vector<double>{-1, -1, -1, -2, -2, -2}));
  // Row and column vectors: an outer product and a dot product.
  EXPECT_EQ(reference::gemm({1, -2, 3}, {4, 5}, 3, 2, 1), (std::vector<double>{4, 5, -8, -10, 12, 15}));
  EXPECT_EQ(reference::gemm({1, -2, 3}, {4, 5, 6}, 1, 1, 3), (std::vector<double>{12}));
}

TEST(GemmReference, MatchesDotProducts) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> dist(-1, 1);
  const int64_t M = 5, N = 7, K = 13;
  std::vector<double> a(M * K), b(K * N), c(M * N), bias(N);
  for (auto* v : {&a, &b, &c, &bias})
    for (double& x : *v) x = dist(rng);
  const auto out = reference::gemm(a, b, M, N, K, 0.75, -1.5, c, bias);
  ASSERT_EQ(out.size(), static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0;
      for (int64_t k = 0; k < K; ++k) dot += a[m * K + k] * b[k * N + n];
      EXPECT_NEAR(out[m * N + n], 0.75 * dot - 1.5 * c[m * N + n] + bias[n], 1e-14) << m << "," << n;
    }
}

TEST(GemmReference, IntegerProductsAreExact) {
  // Long dot products of small integers: every partial sum is exact in double.
  const int64_t M = 3, N = 4, K = 4099;
  std::vector<double> a(M * K), b(K * N);
  for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<double>(i % 7) - 3;
  for (int64_t i = 0; i < K * N; ++i) b[i] = static_cast<double>(i % 5) - 2;
  const auto out = reference::gemm(a, b, M, N, K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int64_t dot = 0;
      for (int64_t k = 0; k < K; ++k) dot += static_cast<int64_t>(a[m * K + k]) * static_cast<int64_t>(b[k * N + n]);
      EXPECT_EQ(out[m * N + n], static_cast<double>(dot)) << m << "," << n;
    }
}

TEST(GemmReference, RejectsMismatchedSizes) {
  const std::vector<double> a(6), b(6), c(4);
  EXPECT_THROW(reference::gemm(a, b, 2, 2, 2), std::invalid_argument);         // a is 2 x 3
  EXPECT_THROW(reference::gemm(a, b, 2, 2, 3, 1.0, 1.0, {}), std::invalid_argument);  // beta != 0 needs c_in
  EXPECT_THROW(reference::gemm(a, b, 2, 2, 3, 1.0, 0.0, {}, {1, 2, 3}), std::invalid_argument);  // bias is (N,)
  EXPECT_NO_THROW(reference::gemm(a, b, 2, 2, 3, 1.0, 1.0, c));
}

}  // namespace
}  // namespace flashlab

namespace flashlab {
namespace {

// gemm_best_rung: the highest rung whose checks pass, found without launching. On a machine
// without an sm_90 GPU rung 9's device check fails, so 16-bit NN operands get rung 8 there.
TEST(GemmValidation, BestRungTakesTheArguments) {
  int count = 0, major = 0;
  const bool sm90 = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major == 9;
  const int64_t before = check::launch_count();
  const Mats f32(DType::kF32), bf16(DType::kBF16);
  EXPECT_EQ(gemm_best_rung(f32.a, f32.b, f32.c), 6);  // NN fp32: the FP32 top rung
  EXPECT_EQ(gemm_best_rung(bf16.a, bf16.b, bf16.c), sm90 ? 9 : 8);
  // NT (b a column-major view): fp32 only on rung 1; 16-bit on rung 9 (sm_90) else rung 1.
  const TensorView b_nt_f32 = gpu_strided(DType::kF32, {64, 32}, {1, 64}, 2);
  const TensorView b_nt_bf16 = gpu_strided(DType::kBF16, {64, 32}, {1, 64}, 2);
  EXPECT_EQ(gemm_best_rung(f32.a, b_nt_f32, f32.c), 1);
  EXPECT_EQ(gemm_best_rung(bf16.a, b_nt_bf16, bf16.c), sm90 ? 9 : 1);
  // A leading dim that breaks rung 9's 16-byte rule (36 x 2 bytes): rung 8 on any machine.
  const TensorView a36 = gpu_strided(DType::kBF16, {16, 36}, {36, 1}, 1), b36 = gpu(DType::kBF16, {36, 32}, 2);
  EXPECT_EQ(gemm_best_rung(a36, b36, bf16.c), 8);
  // Nothing takes both operands column-major: the dtype's top rung, whose gemm() says why.
  const TensorView a_col = gpu_strided(DType::kF32, {16, 64}, {1, 16}, 1);
  EXPECT_EQ(gemm_best_rung(a_col, b_nt_f32, f32.c), 6);
  EXPECT_EQ(check::launch_count(), before) << "gemm_best_rung launched a kernel";
}

}  // namespace
}  // namespace flashlab
