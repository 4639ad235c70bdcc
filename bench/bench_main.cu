// flashlab_bench: peaks first, then every rung of every op in this build, one JSON out.
//   flashlab_bench [--filter SUBSTR] [--out FILE] [--reps N] [--quick]
// Case names are "<op>/<dtype>" (e.g. "vector_add/bf16", "reduce_sum/fp32", "row_sum/bf16",
// "streams_pipeline/fp32", "gemm/bf16"); --filter matches a substring of them (or any of several, comma-separated).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/cases.h"
#include "flashlab/flashlab.h"

using namespace flashlab;
using namespace flashlab::bench;

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flashlab_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--filter") opt.filter = next();
    else if (a == "--out") opt.out = next();
    else if (a == "--reps") opt.min_reps = opt.max_reps = std::stoi(next());
    else if (a == "--quick") opt.quick = true;
    else {
      std::fprintf(stderr, "usage: flashlab_bench [--filter SUBSTR] [--out FILE] [--reps N] [--quick]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "flashlab_bench: no CUDA GPU on this machine; benchmarks need one\n");
    return 1;
  }
  try {
    Harness h(opt);
    h.measure_peaks();
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::string d = dtype_name(dt);
      if (h.selected("vector_add/" + d)) bench_vector_add(h, dt);
      if (h.selected("reduce_sum/" + d)) bench_sum(h, dt);
      if (h.selected("row_sum/" + d)) bench_row_sum(h, dt);
      if (h.selected("rmsnorm/" + d) || h.selected("fused_add_rmsnorm/" + d)) bench_rmsnorm(h, dt);
      if (h.selected("layernorm/" + d)) bench_layernorm(h, dt);
      if (h.selected("softmax/" + d) || h.selected("log_softmax/" + d)) bench_softmax(h, dt);
      if (h.selected("silu_and_mul/" + d) || h.selected("gelu_and_mul/" + d) || h.selected("gelu_tanh_and_mul/" + d))
        bench_activation(h, dt);
      if (h.selected("rope/" + d)) bench_rope(h, dt);
      if (h.selected("quantize_fp8/" + d) || h.selected("quantize_int8/" + d) ||
          h.selected("quantize_fp8_per_tensor/" + d))
        bench_quant(h, dt);
      if (h.selected("gemm/" + d)) bench_gemm(h, dt);
      if (dt == DType::kBF16 && h.selected("attn_fwd/" + d)) bench_attention(h, dt);
      if (dt == DType::kBF16 && h.selected("attn_bwd/" + d)) bench_attention_bwd(h, dt);
      if (dt == DType::kBF16 && h.selected("paged_decode/" + d)) bench_paged_decode(h, dt);
      if (dt == DType::kBF16 && h.selected("paged_prefill/" + d)) bench_paged_prefill(h, dt);
    }
    if (h.selected("streams_pipeline/fp32")) bench_streams(h);
    h.write_json();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashlab_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
