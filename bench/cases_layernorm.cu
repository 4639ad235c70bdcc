// Benchmark cases of the LayerNorm family: every rung of layernorm, with bias.
// Bytes: the input read once, the output written once, plus the weight and the bias.
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/layernorm.h"

namespace flashlab::bench {

namespace {
const char* const kLayerNormRungNames[] = {"", "two_pass_warp", "welford_warp", "welford_block_vec16_regs"};
}  // namespace

void bench_layernorm(Harness& h, DType dt) {
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      h.options().quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}}
                        : std::vector<std::pair<int64_t, int64_t>>{{16384, 4096}, {16384, 8192}};
  const double eps = 1e-5;
  for (const auto& shape : shapes) {
    const int64_t rows = shape.first, hidden = shape.second;
    const int es = dtype_size(dt);
    const size_t bytes = static_cast<size_t>(rows * hidden) * es;
    DeviceMem x(bytes), out(bytes), w(hidden * es), b(hidden * es);
    fill_random(x.p, rows * hidden, dt == DType::kBF16, 41, h.stream());
    fill_random(w.p, hidden, dt == DType::kBF16, 42, h.stream());
    fill_random(b.p, hidden, dt == DType::kBF16, 43, h.stream());
    const TensorView xv = view(x.p, dt, {rows, hidden}), ov = view(out.p, dt, {rows, hidden}),
                     wv = view(w.p, dt, {hidden}), bv = view(b.p, dt, {hidden});
    const std::vector<std::pair<std::string, int64_t>> shp{{"rows", rows}, {"cols", hidden}};
    for (int rung = 1; rung <= kLayerNormRungs; ++rung) {
      const double ms = h.time_ms([&] { layernorm(xv, wv, bv, ov, eps, h.stream(), rung); });
      h.add({"layernorm", "flashlab", kLayerNormRungNames[rung], dtype_name(dt), rung, shp, ms,
             2.0 * bytes + 2.0 * hidden * es, 7.0 * rows * hidden, {}});
    }
  }
}

}  // namespace flashlab::bench
