// Benchmark cases of the RoPE family: every rung of apply_rope_pos_ids, Llama-3-8B's attention
// shape (32 q heads, 8 k heads, head_dim 128), NeoX, out of place, int32 positions.
// Bytes: q and k read once and written once, plus the positions.
#include <string>
#include <utility>
#include <vector>

#include "bench/cases.h"
#include "flashlab/rope.h"

namespace flashlab::bench {

namespace {
const char* const kRopeRungNames[] = {"", "scalar_pair", "vec16_block_per_token"};
}  // namespace

void bench_rope(Harness& h, DType dt) {
  const int64_t nnz = h.options().quick ? 4096 : 16384, hq = 32, hk = 8, d = 128;
  const int es = dtype_size(dt);
  const size_t q_bytes = static_cast<size_t>(nnz * hq * d) * es, k_bytes = static_cast<size_t>(nnz * hk * d) * es;
  DeviceMem q(q_bytes), k(k_bytes), qo(q_bytes), ko(k_bytes), pos(nnz * sizeof(int32_t));
  fill_random(q.p, nnz * hq * d, dt == DType::kBF16, 41, h.stream());
  fill_random(k.p, nnz * hk * d, dt == DType::kBF16, 42, h.stream());
  // Positions of a batch of 16 requests of nnz / 16 tokens each, as a prefill step sees them.
  std::vector<int32_t> host_pos(nnz);
  for (int64_t t = 0; t < nnz; ++t) host_pos[t] = static_cast<int32_t>(t % (nnz / 16));
  FLASHLAB_CUDA_CHECK(cudaMemcpy(pos.p, host_pos.data(), nnz * sizeof(int32_t), cudaMemcpyHostToDevice));
  const TensorView qv = view(q.p, dt, {nnz, hq, d}), kv = view(k.p, dt, {nnz, hk, d}),
                   qov = view(qo.p, dt, {nnz, hq, d}), kov = view(ko.p, dt, {nnz, hk, d}),
                   pv = view(pos.p, DType::kI32, {nnz});
  const std::vector<std::pair<std::string, int64_t>> shp{{"nnz", nnz}, {"nheads_q", hq}, {"nheads_kv", hk},
                                                         {"headdim", d}};
  const RopeOptions opt;  // NeoX, rotary_dim = head_dim, theta 1e4
  for (int rung = 1; rung <= kRopeRungs; ++rung) {
    const double ms = h.time_ms([&] { apply_rope_pos_ids(qv, kv, qov, kov, pv, opt, h.stream(), rung); });
    h.add({"rope", "flashlab", kRopeRungNames[rung], dtype_name(dt), rung, shp, ms,
           2.0 * (q_bytes + k_bytes) + nnz * sizeof(int32_t), 3.0 * nnz * (hq + hk) * d, {}});
  }
}

}  // namespace flashlab::bench
