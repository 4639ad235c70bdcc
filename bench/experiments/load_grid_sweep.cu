// Experiment (not a rung): which 128-bit load flavour (plain, .nc, .cs, .lu) and which grid
// (one resident wave, four waves, one block per tile) let the vector add and sum bodies reach
// the copy ceiling. Built as build/*/bench/experiment_load_grid_sweep; its output on an H100 is
// quoted in docs/ladder/elementwise.md and docs/ladder/reduce.md. Inputs are constant bytes
// (0x3c3c3c3c), fine for a bandwidth question, not for correctness.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "kernels/common/dtype.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/common/reduce.cuh"

using namespace flashlab::kernels;

enum Load { kPlain, kNc, kCs, kLu };

template <int L>
__device__ __forceinline__ int4 ld(const int4* p) {
  if constexpr (L == kPlain) return *p;
  else if constexpr (L == kNc) return __ldg(p);
  else if constexpr (L == kCs) return __ldcs(p);
  else return __ldlu(p);
}

template <typename T, int L, int U>
__global__ void __launch_bounds__(256) add_k(const T* a, const T* b, T* out, int64_t nvec) {
  using V = Vec<T>;
  const int64_t tile = (int64_t)U * blockDim.x;
  const int64_t full = nvec / tile;
  for (int64_t t = blockIdx.x; t < full; t += gridDim.x) {
    const int64_t base = t * tile + threadIdx.x;
    int4 ra[U], rb[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      ra[k] = ld<L>(reinterpret_cast<const int4*>(a) + base + k * blockDim.x);
      rb[k] = ld<L>(reinterpret_cast<const int4*>(b) + base + k * blockDim.x);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      V x = *reinterpret_cast<V*>(&ra[k]), y = *reinterpret_cast<V*>(&rb[k]), r;
#pragma unroll
      for (int j = 0; j < V::kN; ++j) r.v[j] = from_float<T>(to_float(x.v[j]) + to_float(y.v[j]));
      __stcs(reinterpret_cast<int4*>(out) + base + k * blockDim.x, *reinterpret_cast<int4*>(&r));
    }
  }
}

template <typename T, int L, int U>
__global__ void __launch_bounds__(256) sum_k(const T* x, int64_t nvec, float* partial) {
  using V = Vec<T>;
  float acc[U] = {};
  const int64_t nth = (int64_t)gridDim.x * blockDim.x;
  for (int64_t base = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; base + (U - 1) * nth < nvec; base += U * nth) {
    int4 r[U];
#pragma unroll
    for (int k = 0; k < U; ++k) r[k] = ld<L>(reinterpret_cast<const int4*>(x) + base + k * nth);
#pragma unroll
    for (int k = 0; k < U; ++k) {
      V v = *reinterpret_cast<V*>(&r[k]);
#pragma unroll
      for (int j = 0; j < V::kN; ++j) acc[k] += to_float(v.v[j]);
    }
  }
  float s = 0;
#pragma unroll
  for (int k = 0; k < U; ++k) s += acc[k];
  s = block_reduce_sum<256>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <typename F>
float time_ms(F f, void* flush, size_t flush_bytes) {
  cudaEvent_t s, e;
  cudaEventCreate(&s); cudaEventCreate(&e);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 30; ++i) {
    cudaMemset(flush, 0, flush_bytes);
    cudaEventRecord(s); f(); cudaEventRecord(e); cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, s, e); t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

const char* kLoadNames[] = {"plain", "nc", "cs", "lu"};

template <typename T, int L, int U>
void sweep(const char* dt, void* a, void* b, void* o, int64_t n, void* flush, size_t fb, double copy_tbps, int sms) {
  const int64_t nvec = n / Vec<T>::kN;
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, add_k<T, L, U>, 256, 0);
  for (int64_t grid : {(int64_t)per_sm * sms, (int64_t)per_sm * sms * 4, nvec / (U * 256)}) {
    float ms = time_ms([&] { add_k<T, L, U><<<(unsigned)grid, 256>>>((T*)a, (T*)b, (T*)o, nvec); }, flush, fb);
    double tb = 3.0 * n * sizeof(T) / (ms * 1e-3) / 1e12;
    printf("add %s load=%-5s unroll=%d grid=%8lld  %.4f ms  %.3f TB/s  %.1f%% copy\n", dt, kLoadNames[L], U, (long long)grid, ms, tb, 100 * tb / copy_tbps);
  }
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sum_k<T, L, U>, 256, 0);
  for (int64_t grid : {(int64_t)per_sm * sms, (int64_t)std::min<int64_t>(1024, per_sm * sms * 2)}) {
    float ms = time_ms([&] { sum_k<T, L, U><<<(unsigned)grid, 256>>>((T*)a, nvec, (float*)o); }, flush, fb);
    double tb = 1.0 * n * sizeof(T) / (ms * 1e-3) / 1e12;
    printf("sum %s load=%-5s unroll=%d grid=%8lld  %.4f ms  %.3f TB/s  %.1f%% copy\n", dt, kLoadNames[L], U, (long long)grid, ms, tb, 100 * tb / copy_tbps);
  }
}

int main() {
  const int64_t n = 1 << 28;
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  void *a, *b, *o, *flush; size_t fb = 256 << 20;
  cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&o, n * 4); cudaMalloc(&flush, fb);
  cudaMemset(a, 0x3c, n * 4); cudaMemset(b, 0x3d, n * 4);
  float cms = time_ms([&] { cudaMemcpyAsync(o, a, n * 4, cudaMemcpyDeviceToDevice); }, flush, fb);
  double copy_tbps = 2.0 * n * 4 / (cms * 1e-3) / 1e12;
  printf("copy %.3f TB/s\n", copy_tbps);
  sweep<float, kPlain, 4>("fp32", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<float, kNc, 4>("fp32", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<float, kCs, 4>("fp32", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<float, kLu, 4>("fp32", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<float, kPlain, 8>("fp32", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<__nv_bfloat16, kPlain, 4>("bf16", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<__nv_bfloat16, kNc, 4>("bf16", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<__nv_bfloat16, kCs, 4>("bf16", a, b, o, n, flush, fb, copy_tbps, sms);
  sweep<__nv_bfloat16, kPlain, 2>("bf16", a, b, o, n, flush, fb, copy_tbps, sms);
  printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
}
