// Benchmark cases of the first ladders: vector add, sum, row-wise sum, streams pipeline.
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "flashlab/flashlab.h"

namespace flashlab::bench {

namespace {

const char* const kVectorAddRungNames[] = {"", "grid_stride", "vec16", "vec16_tail"};
const char* const kSumRungNames[] = {"", "atomic", "smem_interleaved", "smem_sequential", "warp_shuffle",
                                     "vec16_multi", "one_pass"};

}  // namespace

void bench_vector_add(Harness& h, DType dt) {
  const int64_t n = h.options().quick ? (1 << 24) : (1 << 28);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  DeviceMem a(bytes), b(bytes), out(bytes);
  fill_random(a.p, n, dt == DType::kBF16, 11, h.stream());
  fill_random(b.p, n, dt == DType::kBF16, 12, h.stream());
  for (int rung = 1; rung <= kVectorAddRungs; ++rung) {
    const double ms = h.time_ms([&] {
      vector_add(view(a.p, dt, {n}), view(b.p, dt, {n}), view(out.p, dt, {n}), h.stream(), rung);
    });
    h.add({"vector_add", "flashlab", kVectorAddRungNames[rung], dtype_name(dt), rung, {{"n", n}}, ms, 3.0 * bytes,
           static_cast<double>(n), {}});
  }
}

void bench_sum(Harness& h, DType dt) {
  const int64_t n = h.options().quick ? (1 << 24) : (1 << 28);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  DeviceMem x(bytes), out(4);
  fill_random(x.p, n, dt == DType::kBF16, 13, h.stream());
  for (int rung = 1; rung <= kSumRungs; ++rung) {
    const double ms = h.time_ms([&] { sum(view(x.p, dt, {n}), view(out.p, DType::kF32, {1}), h.stream(), rung); });
    h.add({"reduce_sum", "flashlab", kSumRungNames[rung], dtype_name(dt), rung, {{"n", n}}, ms, bytes + 4.0,
           static_cast<double>(n), {}});
  }
}

void bench_row_sum(Harness& h, DType dt) {
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      h.options().quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}}
                        : std::vector<std::pair<int64_t, int64_t>>{{16384, 4096}, {64, 128256}, {65536, 128}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape.first, cols = shape.second;
    const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(dt);
    DeviceMem x(bytes), out(rows * 4);
    fill_random(x.p, rows * cols, dt == DType::kBF16, 14, h.stream());
    const double ms =
        h.time_ms([&] { row_sum(view(x.p, dt, {rows, cols}), view(out.p, DType::kF32, {rows}), h.stream()); });
    h.add({"row_sum", "flashlab", "vec16_rows", dtype_name(dt), 1, {{"rows", rows}, {"cols", cols}}, ms,
           bytes + 4.0 * rows, static_cast<double>(rows * cols), {}});
  }
}

// Serial (1 stream, 1 chunk) against chunks over several streams. Times span the first
// stream's start event to the moment every stream has finished (the others wait on the start
// and are joined back before the stop event).
void bench_streams(Harness& h) {
  const int64_t n = h.options().quick ? (1 << 24) : (1 << 26);
  const size_t bytes = static_cast<size_t>(n) * 4;
  float *hin = nullptr, *hout = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&hin), bytes));
  FLASHLAB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&hout), bytes));
  for (int64_t i = 0; i < n; ++i) hin[i] = static_cast<float>((i * 2654435761u) % 2000001) / 1e6f - 1.f;
  DeviceMem din(bytes), dout(bytes);
  std::vector<cudaStream_t> workers(8);
  for (auto& s : workers) FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t fork, join[8];
  FLASHLAB_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (auto& e : join) FLASHLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const TensorView hi(hin, DType::kF32, {n}, Device{DeviceType::kCUDAHost, 0});
  const TensorView ho(hout, DType::kF32, {n}, Device{DeviceType::kCUDAHost, 0});

  double serial_ms = 0;
  struct Config { int rung, streams; int64_t chunks; const char* name; };
  for (const Config c : {Config{1, 1, 1, "serial"}, Config{2, 2, 8, "streams2_chunks8"},
                         Config{2, 4, 16, "streams4_chunks16"}, Config{2, 4, 64, "streams4_chunks64"}}) {
    const std::vector<cudaStream_t> use(workers.begin(), workers.begin() + c.streams);
    const double ms = h.time_ms([&] {
      FLASHLAB_CUDA_CHECK(cudaEventRecord(fork, h.stream()));
      for (auto s : use) FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(s, fork));
      streams_pipeline(hi, ho, view(din.p, DType::kF32, {n}), view(dout.p, DType::kF32, {n}), use, c.chunks);
      for (int i = 0; i < c.streams; ++i) {
        FLASHLAB_CUDA_CHECK(cudaEventRecord(join[i], use[i]));
        FLASHLAB_CUDA_CHECK(cudaStreamWaitEvent(h.stream(), join[i]));
      }
    });
    if (c.rung == 1) serial_ms = ms;
    h.add({"streams_pipeline", "flashlab", c.name, "fp32", c.rung,
           {{"n", n}, {"streams", c.streams}, {"chunks", c.chunks}}, ms, 2.0 * bytes,
           2.0 * 65 * 32 * static_cast<double>(n), {{"speedup_vs_serial", serial_ms / ms}}});
  }
  for (auto s : workers) cudaStreamDestroy(s);
  cudaEventDestroy(fork);
  for (auto& e : join) cudaEventDestroy(e);
  cudaFreeHost(hin);
  cudaFreeHost(hout);
}

}  // namespace flashlab::bench
