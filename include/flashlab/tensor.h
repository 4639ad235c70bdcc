// TensorView: a non-owning view of a strided tensor (pointer, dtype, shape, int64 strides,
// device). The public C++ API takes these; the Python bindings build them from DLPack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashlab {

enum class DType : int { kF32, kF16, kBF16, kE4M3, kE5M2, kI8, kI32, kI64, kU8 };

// Bytes per element.
int dtype_size(DType dt);
// Short name used in messages and results JSON: "fp32", "bf16", "e4m3", ...
const char* dtype_name(DType dt);

enum class DeviceType : int { kCPU = 1, kCUDA = 2, kCUDAHost = 3 };  // DLPack's codes

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
};
std::string device_str(Device d);  // "cpu", "cuda:0", "cuda_host"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, one per dim
  Device device{};

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, Device device);
  // Strided view; strides.size() must equal shape.size().
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
             Device device);

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;  // throws flashlab::Error on int64 overflow
  bool is_contiguous() const;
  bool is_cuda() const { return device.type == DeviceType::kCUDA; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

}  // namespace flashlab
