// What the attention experiments (attention_hopper_ablation.cu, attention_bwd_hopper_ablation.cu)
// share: their shapes (16k tokens, model dim 2048, self-attention; FLASHLAB_HEADS overrides the heads), a bf16 download, and the
// results row of one variant.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "bench/harness.h"
#include "flashlab/error.h"

namespace flashlab::bench::attention_experiment {

// FLASHLAB_HEADS=n: n heads instead of model dim 2048's (e.g. a tile count that fills every wave).
inline int64_t heads_override() {
  static const int64_t n = [] {
    const char* s = std::getenv("FLASHLAB_HEADS");
    return s != nullptr ? std::atoll(s) : 0;
  }();
  return n;
}

struct Config {
  int64_t seqlen, headdim;
  bool causal;
  int64_t batch() const { return 16384 / seqlen; }
  int64_t heads() const { return heads_override() > 0 ? heads_override() : 2048 / headdim; }
  int64_t elements() const { return batch() * seqlen * heads() * headdim; }  // of q (= k, v, out)
};

inline std::vector<float> download_bf16(const void* p, int64_t n) {
  std::vector<uint16_t> raw(n);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(raw.data(), p, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

// A bf16 row of op for variant `impl` at c, timed ms.
inline Row variant_row(const char* op, const char* impl, const Config& c, double ms, double flops, double bytes) {
  Row r;
  r.op = op;
  r.impl = impl;
  r.dtype = "bf16";
  r.shape = {{"batch", c.batch()}, {"seqlen_q", c.seqlen}, {"seqlen_k", c.seqlen}, {"nheads_q", c.heads()},
             {"nheads_kv", c.heads()}, {"headdim", c.headdim}, {"causal", c.causal ? 1 : 0}};
  r.ms = ms;
  r.flops = flops;
  r.bytes = bytes;
  return r;
}

}  // namespace flashlab::bench::attention_experiment
