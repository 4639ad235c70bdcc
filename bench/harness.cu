#include "bench/harness.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "flashlab/error.h"

namespace flashlab::bench {

namespace {

__global__ void fill_kernel(void* p, int64_t n, int dtype_code, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float v = static_cast<float>(h >> 40) / static_cast<float>(1 << 23) * 2.f - 1.f;  // [-1, 1)
    if (dtype_code == 0) static_cast<float*>(p)[i] = v;
    else if (dtype_code == 2) static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(4.f * v);  // e4m3 in [-4, 4]
    else if (dtype_code == 3) {  // e4m3 of a standard normal (Box-Muller: v and a second hash)
      uint64_t h2 = h * 0x94D049BB133111EBull;
      h2 ^= h2 >> 31;
      const float u1 = (static_cast<float>(h2 >> 40) + 1.f) / static_cast<float>(1 << 24);  // (0, 1]
      static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(sqrtf(-2.f * logf(u1)) * cospif(v));
    }
    else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

#define CUBLAS_OK(call)                                                                   \
  do {                                                                                    \
    const cublasStatus_t st_ = (call);                                                    \
    FLASHLAB_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error ", static_cast<int>(st_), " from " #call); \
  } while (0)

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The median of times (sorted in place).
double median(std::vector<float>& times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

void fill_random(void* p, int64_t n, int dtype_code, uint64_t seed, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(p, n, dtype_code, seed);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
}

Harness::Harness(Options opt) : opt_(std::move(opt)) {
  FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  int dev = 0, l2 = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  flush_bytes_ = std::max<size_t>(static_cast<size_t>(l2) * 4, 256u << 20);
  FLASHLAB_CUDA_CHECK(cudaMalloc(&flush_buf_, flush_bytes_));
}

Harness::~Harness() {
  cudaFree(flush_buf_);
  cudaStreamDestroy(stream_);
}

// The filter is one substring or several separated by commas ("softmax,gemm"): any may match.
bool Harness::selected(const std::string& name) const {
  if (opt_.filter.empty()) return true;
  size_t begin = 0;
  while (begin <= opt_.filter.size()) {
    const size_t end = std::min(opt_.filter.find(',', begin), opt_.filter.size());
    const std::string part = opt_.filter.substr(begin, end - begin);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    begin = end + 1;
  }
  return false;
}

void Harness::flush_l2() { FLASHLAB_CUDA_CHECK(cudaMemsetAsync(flush_buf_, 0, flush_bytes_, stream_)); }

float Harness::time_once(const std::function<void()>& fn, cudaEvent_t start, cudaEvent_t stop) {
  flush_l2();
  FLASHLAB_CUDA_CHECK(cudaEventRecord(start, stream_));
  fn();
  FLASHLAB_CUDA_CHECK(cudaEventRecord(stop, stream_));
  FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

double Harness::time_ms(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
  // Warm-up: module load, workspace allocation, clocks up.
  for (int i = 0; i < 3; ++i) fn();
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<float> times;
  double spent = 0;
  const int max_reps = opt_.quick ? std::min(opt_.max_reps, 20) : opt_.max_reps;
  while (static_cast<int>(times.size()) < max_reps &&
         (static_cast<int>(times.size()) < opt_.min_reps || spent < opt_.budget_ms)) {
    times.push_back(time_once(fn, start, stop));
    spent += times.back();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

std::vector<double> Harness::time_ms_interleaved(const std::vector<std::function<void()>>& fns) {
  cudaEvent_t start, stop;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
  for (const auto& fn : fns)
    for (int i = 0; i < 3; ++i) fn();  // warm-up
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const size_t n = fns.size();
  std::vector<std::vector<float>> times(n);
  for (int round = 0; round < opt_.min_reps; ++round)
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (k + static_cast<size_t>(round)) % n;
      times[i].push_back(time_once(fns[i], start, stop));
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> medians(n);
  for (size_t i = 0; i < n; ++i) medians[i] = median(times[i]);
  return medians;
}

void Harness::add(Row row) {
  const double tbps = row.bytes / (row.ms * 1e-3) / 1e12;
  std::printf("%-18s %-16s rung %d %-14s %-5s %10.4f ms %7.3f TB/s %6.1f%% copy", row.op.c_str(),
              row.impl.c_str(), row.rung, row.rung_name.c_str(), row.dtype.c_str(), row.ms, tbps,
              copy_TBps_ > 0 ? 100.0 * tbps / copy_TBps_ : 0.0);
  if (row.flops > row.bytes) std::printf(" %8.2f TFLOP/s", row.flops / (row.ms * 1e-3) / 1e12);  // compute-bound ops
  std::printf("\n");
  std::fflush(stdout);
  rows_.push_back(std::move(row));
}

void Harness::measure_peaks() {
  // Copy bandwidth: a 1 GiB device-to-device cudaMemcpy, bytes read + written.
  const size_t bytes = opt_.quick ? (256u << 20) : (1u << 30);
  void *src = nullptr, *dst = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMalloc(&src, bytes));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&dst, bytes));
  fill_random(src, static_cast<int64_t>(bytes / 4), 0, 1, stream_);
  const double copy_ms =
      time_ms([&] { FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_)); });
  copy_TBps_ = 2.0 * bytes / (copy_ms * 1e-3) / 1e12;
  Row copy{"copy", "cudaMemcpy", "", "fp32", 0, {{"n", static_cast<int64_t>(bytes / 4)}}, copy_ms, 2.0 * bytes, 0, {}};
  add(copy);
  cudaFree(src);
  cudaFree(dst);

  // bf16 GEMM rate through cuBLAS, random operands, fp32 accumulation.
  const int n = opt_.quick ? 4096 : 8192;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  const size_t mat = static_cast<size_t>(n) * n * 2;
  FLASHLAB_CUDA_CHECK(cudaMalloc(&a, mat));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&b, mat));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&c, mat));
  fill_random(a, static_cast<int64_t>(n) * n, 1, 2, stream_);
  fill_random(b, static_cast<int64_t>(n) * n, 1, 3, stream_);
  cublasHandle_t h;
  CUBLAS_OK(cublasCreate(&h));
  CUBLAS_OK(cublasSetStream(h, stream_));
  const float alpha = 1.f, beta = 0.f;
  const double gemm_ms = time_ms([&] {
    CUBLAS_OK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta,
                           c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  const double flops = 2.0 * n * n * static_cast<double>(n);
  gemm_TFLOPs_ = flops / (gemm_ms * 1e-3) / 1e12;
  Row gemm{"gemm", "cublas", "", "bf16", 0, {{"m", n}, {"n", n}, {"k", n}}, gemm_ms, 3.0 * mat, flops, {}};
  add(gemm);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  std::printf("peaks: copy %.3f TB/s, bf16 GEMM %.1f TFLOP/s\n", copy_TBps_, gemm_TFLOPs_);
}

void Harness::write_json() const {
  int dev = 0, driver = 0, runtime = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ostringstream os;
  os.precision(6);
  os << "{\n  \"device\": \"" << json_escape(prop.name) << "\",\n"
     << "  \"date\": \"" << date << "\",\n"
     << "  \"commit\": \"" << json_escape(env_or("FLASHLAB_COMMIT", "unknown")) << "\",\n"
     << "  \"cuda\": \"" << runtime / 1000 << "." << (runtime % 1000) / 10 << "\",\n"
     << "  \"driver\": \"" << json_escape(env_or("FLASHLAB_DRIVER", std::to_string(driver))) << "\",\n"
     << "  \"sm_count\": " << prop.multiProcessorCount << ",\n"
     << "  \"peaks\": {\"copy_TBps\": " << copy_TBps_ << ", \"gemm_bf16_TFLOPs\": " << gemm_TFLOPs_ << "},\n"
     << "  \"rows\": [\n";
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    os << "    {\"op\": \"" << r.op << "\", \"impl\": \"" << r.impl << "\", ";
    if (r.rung > 0) os << "\"rung\": " << r.rung << ", \"rung_name\": \"" << r.rung_name << "\", ";
    os << "\"dtype\": \"" << r.dtype << "\", \"shape\": {";
    for (size_t j = 0; j < r.shape.size(); ++j)
      os << (j ? ", " : "") << "\"" << r.shape[j].first << "\": " << r.shape[j].second;
    for (size_t j = 0; j < r.shape_text.size(); ++j)
      os << (j || !r.shape.empty() ? ", " : "") << "\"" << r.shape_text[j].first << "\": \""
         << json_escape(r.shape_text[j].second) << "\"";
    const double tbps = r.bytes / (r.ms * 1e-3) / 1e12, tflops = r.flops / (r.ms * 1e-3) / 1e12;
    os << "}, \"ms\": " << r.ms << ", \"TBps\": " << tbps << ", \"TFLOPs\": " << tflops << ", \"bytes\": " << r.bytes
       << ", \"flops\": " << r.flops;
    for (const auto& [k, v] : r.extra) os << ", \"" << k << "\": " << v;
    os << "}" << (i + 1 < rows_.size() ? "," : "") << "\n";
  }
  os << "  ]\n}\n";
  std::ofstream f(opt_.out);
  FLASHLAB_CHECK(f.good(), "bench: cannot write ", opt_.out);
  f << os.str();
  std::printf("wrote %s (%zu rows)\n", opt_.out.c_str(), rows_.size());
}

}  // namespace flashlab::bench
