// Benchmark cases of the softmax family: every rung of softmax, the top rung of log_softmax,
// at 16384 x 4096 (many rows) and 64 x 128256 (few vocabulary-sized rows).
// Bytes: the input read once and the output written once. Next to the rungs, a device-to-device
// cudaMemcpyAsync of the same bytes (impl "cudaMemcpy") timed the same way: at 64 x 128256 the
// transfer is ~33 MB, small enough that launch, ramp-up and the L2 flush's write-backs weigh on
// any kernel, so this is the ceiling a kernel of this size can be held to on this machine.
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/softmax.h"

namespace flashlab::bench {

namespace {
const char* const kSoftmaxRungNames[] = {"", "three_pass", "two_pass_online", "online_warp_block_vec16",
                                         "long_rows_cluster"};
}  // namespace

void bench_softmax(Harness& h, DType dt) {
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      h.options().quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {64, 128256}}
                        : std::vector<std::pair<int64_t, int64_t>>{{16384, 4096}, {64, 128256}};
  const std::string d = dtype_name(dt);
  for (const auto& shape : shapes) {
    const int64_t rows = shape.first, cols = shape.second;
    const size_t bytes = static_cast<size_t>(rows * cols) * dtype_size(dt);
    DeviceMem x(bytes), out(bytes);
    fill_random(x.p, rows * cols, dt == DType::kBF16, 41, h.stream());
    const TensorView xv = view(x.p, dt, {rows, cols}), ov = view(out.p, dt, {rows, cols});
    const std::vector<std::pair<std::string, int64_t>> shp{{"rows", rows}, {"cols", cols}};
    // flops: max, subtract, exp, add, divide (softmax) or subtract twice (log_softmax), per element
    if (h.selected("softmax/" + d))
      for (int rung = 1; rung <= kSoftmaxRungs; ++rung) {
        const double ms = h.time_ms([&] { softmax(xv, ov, h.stream(), rung); });
        h.add({"softmax", "flashlab", kSoftmaxRungNames[rung], d, rung, shp, ms, 2.0 * bytes, 5.0 * rows * cols, {}});
      }
    if (h.selected("softmax/" + d)) {
      const double ms = h.time_ms(
          [&] { FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(out.p, x.p, bytes, cudaMemcpyDeviceToDevice, h.stream())); });
      h.add({"softmax", "cudaMemcpy", "", d, 0, shp, ms, 2.0 * bytes, 0.0, {}});
    }
    if (h.selected("log_softmax/" + d)) {
      const double ms = h.time_ms([&] { log_softmax(xv, ov, h.stream(), kSoftmaxRungs); });
      h.add({"log_softmax", "flashlab", kSoftmaxRungNames[kSoftmaxRungs], d, kSoftmaxRungs, shp, ms, 2.0 * bytes,
             5.0 * rows * cols, {}});
    }
  }
}

}  // namespace flashlab::bench
