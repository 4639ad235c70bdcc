// The one C++ benchmark harness: timing, peaks, JSON rows.
//
// Timing: warm-up, then per repetition the L2 is flushed (a memset of a buffer larger than
// L2, outside the timed region), the work is bracketed by CUDA events on one stream, and the
// median of the repetitions is reported. Repetitions adapt to a time budget.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace flashlab::bench {

struct Options {
  std::string filter;      // run cases whose name contains this
  std::string out = "bench.json";
  int min_reps = 10;
  int max_reps = 200;
  double budget_ms = 300;  // per case, timed time
  bool quick = false;      // smaller sizes, fewer reps
};

struct Row {
  std::string op, impl, rung_name, dtype;
  int rung = 0;  // 0: not a rung (peers, copy)
  std::vector<std::pair<std::string, int64_t>> shape;
  double ms = 0, bytes = 0, flops = 0;
  std::map<std::string, double> extra;  // more numbers, e.g. speedup vs serial
  std::vector<std::pair<std::string, std::string>> shape_text;  // string-valued shape keys (GEMM's "layout")
};

class Harness {
 public:
  explicit Harness(Options opt);
  ~Harness();

  const Options& options() const { return opt_; }
  cudaStream_t stream() const { return stream_; }
  bool selected(const std::string& case_name) const;

  // Median time (ms) of fn() on stream(); fn must only enqueue work on stream().
  double time_ms(const std::function<void()>& fn);
  // Medians of several functions timed round-robin (min_reps rounds, each function once per round,
  // the order rotated every round, L2 flushed before each): for ablations, where timing variants
  // one after another let the GPU's clock history favour whichever ran first after an idle spell
  // (identical kernels up to 17% apart, H100, 2026-11-26).
  std::vector<double> time_ms_interleaved(const std::vector<std::function<void()>>& fns);

  void add(Row row);
  void measure_peaks();  // copy bandwidth and cuBLAS bf16 GEMM rate
  double copy_TBps() const { return copy_TBps_; }
  void write_json() const;

 private:
  void flush_l2();
  // ms of one fn() on stream(), after an L2 flush, between the caller's two events.
  float time_once(const std::function<void()>& fn, cudaEvent_t start, cudaEvent_t stop);
  Options opt_;
  cudaStream_t stream_ = nullptr;
  void* flush_buf_ = nullptr;
  size_t flush_bytes_ = 0;
  double copy_TBps_ = 0, gemm_TFLOPs_ = 0;
  std::vector<Row> rows_;
};

// Fills n elements of dtype (0 fp32, 1 bf16; 2 e4m3, values in [-4, 4]) with reproducible
// pseudo-random values in [-1, 1]; 3: e4m3 of standard normals.
void fill_random(void* p, int64_t n, int dtype_code, uint64_t seed, cudaStream_t s);

}  // namespace flashlab::bench
