// Benchmark cases of the gated activations: every rung of silu_and_mul, gelu_and_mul and
// gelu_tanh_and_mul at [rows, 2d] -> [rows, d]. Bytes: the input read once + the output written
// once = rows * 3d * sizeof(dtype); shape keys rows, cols = d (the output width). FLOPs: one
// multiply per output (the activation's transcendental is not counted).
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/activation.h"

namespace flashlab::bench {

namespace {

const char* const kActivationRungNames[] = {"", "scalar", "vec16"};

using ActFn = void (*)(const TensorView&, const TensorView&, cudaStream_t, int);
struct ActOp {
  const char* name;
  ActFn fn;
};
const ActOp kActOps[] = {{"silu_and_mul", silu_and_mul}, {"gelu_and_mul", gelu_and_mul},
                         {"gelu_tanh_and_mul", gelu_tanh_and_mul}};

}  // namespace

void bench_activation(Harness& h, DType dt) {
  const int64_t rows = h.options().quick ? 4096 : 16384, d = 4096;
  const int es = dtype_size(dt);
  DeviceMem in(static_cast<size_t>(rows * 2 * d) * es), out(static_cast<size_t>(rows * d) * es);
  fill_random(in.p, rows * 2 * d, dt == DType::kBF16, 41, h.stream());
  const TensorView iv = view(in.p, dt, {rows, 2 * d}), ov = view(out.p, dt, {rows, d});
  const std::vector<std::pair<std::string, int64_t>> shp{{"rows", rows}, {"cols", d}};
  const double bytes = static_cast<double>(rows) * 3 * d * es;
  for (const ActOp& op : kActOps) {
    if (!h.selected(std::string(op.name) + "/" + dtype_name(dt))) continue;
    for (int rung = 1; rung <= kActivationRungs; ++rung) {
      const double ms = h.time_ms([&] { op.fn(iv, ov, h.stream(), rung); });
      h.add({op.name, "flashlab", kActivationRungNames[rung], dtype_name(dt), rung, shp, ms, bytes,
             static_cast<double>(rows * d), {}});
    }
  }
}

}  // namespace flashlab::bench
