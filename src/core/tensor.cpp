#include "flashlab/tensor.h"

#include <limits>

#include "flashlab/error.h"

namespace flashlab {

int dtype_size(DType dt) {
  switch (dt) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kE4M3: case DType::kE5M2: case DType::kI8: case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  throw Error("dtype_size: unknown dtype");
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
    case DType::kI8: return "int8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
  }
  return "unknown";
}

std::string device_str(Device d) {
  switch (d.type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda:" + std::to_string(d.index);
    case DeviceType::kCUDAHost: return "cuda_host (pinned cpu)";
  }
  return "unknown device";
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

TensorView::TensorView(void* data_, DType dtype_, std::vector<int64_t> shape_, Device device_)
    : data(data_), dtype(dtype_), shape(std::move(shape_)), device(device_) {
  strides = contiguous_strides(shape);
}

TensorView::TensorView(void* data_, DType dtype_, std::vector<int64_t> shape_,
                       std::vector<int64_t> strides_, Device device_)
    : data(data_), dtype(dtype_), shape(std::move(shape_)), strides(std::move(strides_)),
      device(device_) {
  FLASHLAB_CHECK(strides.size() == shape.size(), "TensorView: expected ", shape.size(),
                 " strides (one per dim), got ", strides.size());
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    FLASHLAB_CHECK(d >= 0, "TensorView: expected non-negative sizes, got shape ", shape_str(shape));
    FLASHLAB_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d,
                   "TensorView: element count of shape ", shape_str(shape), " overflows int64");
    n *= d;
  }
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace flashlab
