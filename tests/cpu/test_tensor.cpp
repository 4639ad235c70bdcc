#include <gtest/gtest.h>

#include <limits>

#include "flashlab/error.h"
#include "flashlab/tensor.h"

namespace flashlab {
namespace {

TEST(TensorView, ContiguousStridesAndNumel) {
  TensorView t(nullptr, DType::kBF16, {2, 3, 4}, Device{DeviceType::kCUDA, 0});
  EXPECT_EQ(t.strides, (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.ndim(), 3);
}

TEST(TensorView, StridedViewIsNotContiguous) {
  TensorView t(nullptr, DType::kF32, {4, 3}, {8, 1}, Device{DeviceType::kCUDA, 0});
  EXPECT_FALSE(t.is_contiguous());
  TensorView transposed(nullptr, DType::kF32, {3, 4}, {1, 3}, Device{DeviceType::kCUDA, 0});
  EXPECT_FALSE(transposed.is_contiguous());
  // Size-1 dims may carry any stride.
  TensorView unit(nullptr, DType::kF32, {1, 5}, {99, 1}, Device{DeviceType::kCUDA, 0});
  EXPECT_TRUE(unit.is_contiguous());
}

TEST(TensorView, StrideCountMustMatchShape) {
  EXPECT_THROW(TensorView(nullptr, DType::kF32, {4, 3}, {1}, Device{}), Error);
}

TEST(TensorView, NumelOverflowThrows) {
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  TensorView t(nullptr, DType::kF32, {big, 4}, {4, 1}, Device{DeviceType::kCUDA, 0});
  try {
    (void)t.numel();
    FAIL() << "expected overflow error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflows int64"), std::string::npos) << e.what();
  }
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_size(DType::kF16), 2);
  EXPECT_EQ(dtype_size(DType::kE4M3), 1);
  EXPECT_EQ(dtype_size(DType::kE5M2), 1);
  EXPECT_EQ(dtype_size(DType::kI8), 1);
  EXPECT_EQ(dtype_size(DType::kI32), 4);
  EXPECT_EQ(dtype_size(DType::kI64), 8);
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kE4M3), "e4m3");
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(device_str(Device{DeviceType::kCUDA, 1}), "cuda:1");
}

}  // namespace
}  // namespace flashlab
