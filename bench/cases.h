// Benchmark cases, one file per op family (bench/cases_<family>.cu), all run by flashlab_bench.
// Each case function measures every rung of its op for one dtype and adds one row per rung.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench/harness.h"
#include "flashlab/error.h"
#include "flashlab/tensor.h"

namespace flashlab::bench {

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { FLASHLAB_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

// The current device is a Hopper (compute capability 9.x): the TMA / wgmma rungs run.
inline bool on_hopper() {
  int dev = 0, major = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}

inline TensorView view(void* p, DType dt, std::vector<int64_t> shape) {
  return TensorView(p, dt, std::move(shape), Device{DeviceType::kCUDA, 0});
}

// bench/cases_basic.cu
void bench_vector_add(Harness& h, DType dt);
void bench_sum(Harness& h, DType dt);
void bench_row_sum(Harness& h, DType dt);
void bench_streams(Harness& h);

// bench/cases_norm.cu
void bench_rmsnorm(Harness& h, DType dt);

// bench/cases_layernorm.cu
void bench_layernorm(Harness& h, DType dt);

// bench/cases_softmax.cu: softmax (every rung), log_softmax (top rung)
void bench_softmax(Harness& h, DType dt);

// bench/cases_activation.cu: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul (each op checks its own filter)
void bench_activation(Harness& h, DType dt);

// bench/cases_rope.cu
void bench_rope(Harness& h, DType dt);

// bench/cases_quant.cu: quantize_fp8, quantize_int8, quantize_fp8_per_tensor (each op checks its own filter)
void bench_quant(Harness& h, DType dt);

// bench/cases_gemm.cu: cuBLAS (rung 0) and every rung of the GEMM ladder that takes dt (fp32 or bf16)
void bench_gemm(Harness& h, DType dt);
// max |got - want| / max |want| over n device elements of dt (fp32 or bf16), synchronous on s.
double relative_difference(const void* got, const void* want, int64_t n, DType dt, cudaStream_t s);

// bench/cases_attention.cu: attention forward, every rung (op attn_fwd)
void bench_attention(Harness& h, DType dt);
void bench_attention_bwd(Harness& h, DType dt);

// bench/cases_serving.cu: batch decode over a paged KV cache (op paged_decode)
void bench_paged_decode(Harness& h, DType dt);
void bench_paged_prefill(Harness& h, DType dt);

}  // namespace flashlab::bench
