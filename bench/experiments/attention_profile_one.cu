// Experiment helper (not a rung): one attention shape through the public API, a few launches, for
// Nsight Compute to profile (`ncu -k regex:attn_hopper_kernel --launch-skip 1 --launch-count 1`).
// bf16, (batch, seqlen, heads, d) contiguous, 16k tokens and model dim 2048 as the benchmark.
// fp8: the forward on e4m3 q, k, v in [-4, 4] (no descale factors), bf16 out.
// Usage: experiment_attention_profile_one fwd|fwd-nolse|bwd|bwd2|fp8 HEADDIM SEQLEN CAUSAL(0|1) [LAUNCHES=3]
// (fwd-nolse: the forward without its LSE; bwd: the automatic backward rung; bwd2: backward rung 2)
// Prints the median of the launches' CUDA-event times (no L2 flush: a profiling aid, not a
// benchmark figure).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cases.h"
#include "bench/harness.h"
#include "bench/experiments/attention_experiment.h"
#include "flashlab/attention.h"

using namespace flashlab;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s fwd|fwd-nolse|bwd|bwd2|fp8 HEADDIM SEQLEN CAUSAL(0|1) [LAUNCHES=3]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const bench::attention_experiment::Config c{std::atoll(argv[3]), std::atoll(argv[2]), std::atoi(argv[4]) != 0};
  const int launches = argc > 5 ? std::atoi(argv[5]) : 3;
  if ((dir != "fwd" && dir != "fwd-nolse" && dir != "bwd" && dir != "bwd2" && dir != "fp8") || c.seqlen < 1 || 16384 % c.seqlen != 0 || 2048 % c.headdim != 0 || launches < 1) {
    std::fprintf(stderr, "bad arguments: direction fwd|fwd-nolse|bwd|bwd2|fp8, seqlen dividing 16384, head dim dividing 2048, launches >= 1\n");
    return 2;
  }
  const int64_t n = c.elements(), batch = c.batch(), heads = c.heads();
  const std::vector<int64_t> shape = {batch, c.seqlen, heads, c.headdim};
  bench::DeviceMem q(n * 2), k(n * 2), v(n * 2), o(n * 2), dout(n * 2), dq(n * 2), dk(n * 2), dv(n * 2),
      lse(batch * heads * c.seqlen * 4);
  bench::fill_random(q.p, n, 1, 81, nullptr);
  bench::fill_random(k.p, n, 1, 82, nullptr);
  bench::fill_random(v.p, n, 1, 83, nullptr);
  bench::fill_random(dout.p, n, 1, 84, nullptr);
  const auto bf16 = [&](void* p) { return bench::view(p, DType::kBF16, shape); };
  const auto e4m3 = [&](void* p) { return bench::view(p, DType::kE4M3, shape); };
  // fp8: e4m3 copies of the inputs' sizes (the bf16 buffers' first halves).
  if (dir == "fp8")
    for (void* p : {q.p, k.p, v.p}) bench::fill_random(p, n, 2, 85, nullptr);
  const TensorView lse_view = bench::view(lse.p, DType::kF32, {batch, heads, c.seqlen});
  AttnBwdOptions opt;
  opt.causal = c.causal;
  opt.softmax_lse = dir == "fwd-nolse" ? nullptr : &lse_view;  // fwd-nolse: the forward without its LSE
  const bool bwd = dir == "bwd" || dir == "bwd2";
  if (bwd) attention_fwd(bf16(q.p), bf16(k.p), bf16(v.p), bf16(o.p), nullptr, kAttnFwdRungAuto, opt);  // o, lse
  cudaEvent_t e0, e1;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&e0));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < launches; ++i) {
    FLASHLAB_CUDA_CHECK(cudaEventRecord(e0));
    if (dir == "fp8")
      attention_fwd(e4m3(q.p), e4m3(k.p), e4m3(v.p), bf16(o.p), nullptr, kAttnFwdRungAuto, opt);
    else if (dir == "fwd" || dir == "fwd-nolse")
      attention_fwd(bf16(q.p), bf16(k.p), bf16(v.p), bf16(o.p), nullptr, kAttnFwdRungAuto, opt);
    else
      attention_bwd(bf16(q.p), bf16(k.p), bf16(v.p), bf16(o.p), bf16(dout.p), bf16(dq.p), bf16(dk.p), bf16(dv.p),
                    nullptr, dir == "bwd2" ? 2 : kAttnBwdRungAuto, opt);
    FLASHLAB_CUDA_CHECK(cudaEventRecord(e1));
    FLASHLAB_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s d %lld seqlen %lld causal %d: median %.4f ms over %d launches\n", dir.c_str(),
              static_cast<long long>(c.headdim), static_cast<long long>(c.seqlen), c.causal ? 1 : 0, ms[ms.size() / 2],
              launches);
  return 0;
}
