// Benchmark cases of the quantize family: every rung of per-token e4m3 ("quantize_fp8"), per-token
// int8 ("quantize_int8") and per-tensor e4m3 ("quantize_fp8_per_tensor", absmax launch included).
// Bytes: the input read once + the codes written once + the fp32 scales written (the per-tensor
// path reads the input twice, but the roofline counts the bytes the op must move, once).
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/quant.h"

namespace flashlab::bench {

namespace {

const char* const kQuantRungNames[] = {"", "scalar", "vec16_regs"};

struct QuantCase {
  const char* op;
  DType fmt;
  QuantScheme scheme;
};
const QuantCase kQuantCases[] = {{"quantize_fp8", DType::kE4M3, QuantScheme::kPerToken},
                                 {"quantize_int8", DType::kI8, QuantScheme::kPerToken},
                                 {"quantize_fp8_per_tensor", DType::kE4M3, QuantScheme::kPerTensor}};

}  // namespace

void bench_quant(Harness& h, DType dt) {
  const int64_t rows = h.options().quick ? 4096 : 16384, cols = 4096;
  const int es = dtype_size(dt);
  DeviceMem in(static_cast<size_t>(rows * cols) * es), q(static_cast<size_t>(rows * cols)), scales(rows * sizeof(float));
  fill_random(in.p, rows * cols, dt == DType::kBF16, 51, h.stream());
  const TensorView iv = view(in.p, dt, {rows, cols});
  const std::vector<std::pair<std::string, int64_t>> shp{{"rows", rows}, {"cols", cols}};
  for (const QuantCase& c : kQuantCases) {
    if (!h.selected(std::string(c.op) + "/" + dtype_name(dt))) continue;
    const int64_t nscales = c.scheme == QuantScheme::kPerToken ? rows : 1;
    const TensorView qv = view(q.p, c.fmt, {rows, cols}), sv = view(scales.p, DType::kF32, {nscales});
    const double bytes = static_cast<double>(rows) * cols * (es + 1) + 4.0 * nscales;
    for (int rung = 1; rung <= kQuantRungs; ++rung) {
      const double ms = h.time_ms([&] { quantize(iv, qv, sv, c.scheme, h.stream(), rung); });
      h.add({c.op, "flashlab", kQuantRungNames[rung], dtype_name(dt), rung, shp, ms, bytes, 2.0 * rows * cols, {}});
    }
  }
}

}  // namespace flashlab::bench
