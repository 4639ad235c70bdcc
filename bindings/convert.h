// What every binding file shares: DLPack tensor -> flashlab::TensorView, the caller's current
// stream, and flashlab::Error -> Python exception.
//
// A binding converts its arguments, then calls the public C++ API, which validates them (device
// included) before touching CUDA; so a CPU (numpy) tensor handed to a GPU op gets the C++ message
// even on a machine without a GPU.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include "flashlab/error.h"
#include "flashlab/tensor.h"
#include "flashlab/validate.h"

namespace flashlab::bindings {

// DLPack dtype -> flashlab dtype; throws flashlab::Error naming the argument when unsupported.
inline DType to_dtype(DLDataType t, const char* op, const char* name) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 32) return DType::kF32;
        if (t.bits == 16) return DType::kF16;
        break;
      case kDLBfloat:
        if (t.bits == 16) return DType::kBF16;
        break;
      case kDLFloat8_e4m3fn:
        if (t.bits == 8) return DType::kE4M3;
        break;
      case kDLFloat8_e5m2:
        if (t.bits == 8) return DType::kE5M2;
        break;
      case kDLInt:
        if (t.bits == 8) return DType::kI8;
        if (t.bits == 32) return DType::kI32;
        if (t.bits == 64) return DType::kI64;
        break;
      case kDLUInt:
        if (t.bits == 8) return DType::kU8;
        break;
      default:
        break;
    }
  }
  throw Error(detail::concat(op, ": argument '", name,
                             "': expected a dtype flashlab knows (fp32, fp16, bf16, e4m3, e5m2, "
                             "int8, uint8, int32, int64), got ",
                             std::string(tvm::ffi::DLDataTypeToString(t))));
}

inline Device to_device(DLDevice d, const char* op, const char* name) {
  switch (d.device_type) {
    case kDLCPU: return Device{DeviceType::kCPU, 0};
    case kDLCUDA: return Device{DeviceType::kCUDA, d.device_id};
    case kDLCUDAHost: return Device{DeviceType::kCUDAHost, 0};
    default:
      throw Error(detail::concat(op, ": argument '", name,
                                 "': expected a cpu, cuda or cuda_host tensor, got DLPack device type ",
                                 static_cast<int>(d.device_type), " (id ", d.device_id, ")"));
  }
}

// The DLTensor behind a TVM-FFI TensorView (its strides may be null, which TensorView::strides()
// refuses); AnyView hands back the address of the view's own DLTensor.
inline const DLTensor* dltensor(const tvm::ffi::TensorView& t) {
  return tvm::ffi::AnyView(t).cast<DLTensor*>();
}

// A non-owning flashlab view of the same memory: data + byte_offset, strides in elements
// (null strides = contiguous).
inline TensorView to_flashlab(const tvm::ffi::TensorView& tv, const char* op, const char* name) {
  const DLTensor* t = dltensor(tv);
  const DType dtype = to_dtype(t->dtype, op, name);
  const Device device = to_device(t->device, op, name);
  void* data = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset;
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  std::vector<int64_t> strides =
      t->strides == nullptr ? contiguous_strides(shape) : std::vector<int64_t>(t->strides, t->strides + t->ndim);
  return TensorView(data, dtype, std::move(shape), std::move(strides), device);
}

// The caller's current stream for the tensor's CUDA device (torch's current stream when called
// from torch: TVM-FFI's Python side sets it before the call); null for non-CUDA tensors, which
// the C++ API rejects before using a stream.
inline cudaStream_t current_stream(const TensorView& t) {
  if (!t.is_cuda()) return nullptr;
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device.index));
}

using OptTensor = tvm::ffi::Optional<tvm::ffi::TensorView>;

// The flashlab view of an optional tensor; an empty view (unused) when None.
inline TensorView to_flashlab_opt(const OptTensor& t, const char* op, const char* name) {
  return t.has_value() ? to_flashlab(t.value(), op, name) : TensorView{};
}

// A rung from Python (int64) as the C++ API's int; the C++ API checks its range, this only
// keeps a value beyond int from wrapping into a valid one.
inline int to_rung(const char* op, int64_t rung, int num_rungs) {
  if (rung < std::numeric_limits<int>::min() || rung > std::numeric_limits<int>::max())
    throw Error(detail::concat(op, ": argument 'rung': expected 1..", num_rungs, ", got ", rung));
  return static_cast<int>(rung);
}

// Runs `body`, turning flashlab::Error into the Python exception with the same message:
// ValueError for invalid arguments, RuntimeError for CUDA failures.
template <typename F>
void call(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("CUDA error ", 0) == 0) TVM_FFI_THROW(RuntimeError) << msg;
    TVM_FFI_THROW(ValueError) << msg;
  }
}

}  // namespace flashlab::bindings
