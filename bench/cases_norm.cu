// Benchmark cases of the RMSNorm family: every rung of rmsnorm, the fused rungs of
// fused_add_rmsnorm. Bytes: each input read once, each output written once.
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/norm.h"

namespace flashlab::bench {

namespace {
const char* const kRmsNormRungNames[] = {"", "thread_per_row", "warp_per_row", "block_vec16", "block_vec16_regs"};
}  // namespace

void bench_rmsnorm(Harness& h, DType dt) {
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      h.options().quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}}
                        : std::vector<std::pair<int64_t, int64_t>>{{16384, 4096}, {16384, 8192}, {128, 4096}};
  const double eps = 1e-6;
  for (const auto& shape : shapes) {
    const int64_t rows = shape.first, hidden = shape.second;
    const int es = dtype_size(dt);
    const size_t bytes = static_cast<size_t>(rows * hidden) * es;
    DeviceMem x(bytes), res(bytes), out(bytes), w(hidden * es);
    fill_random(x.p, rows * hidden, dt == DType::kBF16, 31, h.stream());
    fill_random(res.p, rows * hidden, dt == DType::kBF16, 32, h.stream());
    fill_random(w.p, hidden, dt == DType::kBF16, 33, h.stream());
    const TensorView xv = view(x.p, dt, {rows, hidden}), rv = view(res.p, dt, {rows, hidden}),
                     ov = view(out.p, dt, {rows, hidden}), wv = view(w.p, dt, {hidden});
    const std::vector<std::pair<std::string, int64_t>> shp{{"rows", rows}, {"cols", hidden}};
    for (int rung = 1; rung <= kRmsNormRungs; ++rung) {
      const double ms = h.time_ms([&] { rmsnorm(xv, wv, ov, eps, false, h.stream(), rung); });
      h.add({"rmsnorm", "flashlab", kRmsNormRungNames[rung], dtype_name(dt), rung, shp, ms,
             2.0 * bytes + hidden * es, 4.0 * rows * hidden, {}});
    }
    // In place on x and res: the values drift over repetitions but stay finite (each call
    // normalises), which is all a timing needs.
    for (int rung = 2; rung <= kRmsNormRungs; ++rung) {
      const double ms = h.time_ms([&] { fused_add_rmsnorm(xv, rv, wv, eps, false, h.stream(), rung); });
      h.add({"fused_add_rmsnorm", "flashlab", kRmsNormRungNames[rung], dtype_name(dt), rung, shp, ms,
             4.0 * bytes + hidden * es, 5.0 * rows * hidden, {}});
    }
  }
}

}  // namespace flashlab::bench
