// The streams pipeline: serial and overlapped give the reference result, chunk boundaries and
// stream counts included.
#include <gtest/gtest.h>

#include <random>

#include "flashlab/streams.h"
#include "kernels/streams/pipeline_math.h"
#include "src/reference/reference.h"
#include "tests/common/gpu_utils.h"
#include "tests/common/test_utils.h"

namespace flashlab {
namespace {

using namespace flashlab::testing;

TEST(StreamsPipeline, SerialAndOverlappedMatchReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(8);
  std::vector<cudaStream_t> streams(4);
  for (auto& s : streams) FLASHLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int64_t n : {1, 1000, (1 << 18) + 7}) {
    const auto x = random_tensor(DType::kF32, n, rng);
    float *hin = nullptr, *hout = nullptr;
    FLASHLAB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&hin), n * 4));
    FLASHLAB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&hout), n * 4));
    std::memcpy(hin, x.bytes.data(), n * 4);
    DeviceBuffer din(n * 4), dout(n * 4);
    const auto ref = reference::pipeline_f(x.values);
    std::vector<double> naive(n);  // the same f in fp32 on the host
    for (int64_t i = 0; i < n; ++i) naive[i] = kernels::pipeline_f(static_cast<float>(x.values[i]));
    for (auto [ns, chunks] : std::vector<std::pair<int, int64_t>>{{1, 1}, {2, 3}, {4, 16}, {4, n}}) {
      if (chunks > n || (chunks > 64 && n > 64 * 1024)) continue;
      std::memset(hout, 0xff, n * 4);
      din.poison();
      dout.poison();
      const std::vector<cudaStream_t> use(streams.begin(), streams.begin() + ns);
      TensorView hi(hin, DType::kF32, {n}, Device{DeviceType::kCUDAHost, 0});
      TensorView ho(hout, DType::kF32, {n}, Device{DeviceType::kCUDAHost, 0});
      streams_pipeline(hi, ho, device_view(din.ptr, DType::kF32, {n}), device_view(dout.ptr, DType::kF32, {n}), use,
                       chunks);
      for (auto s : use) FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<double> got(hout, hout + n);
      expect_within_tolerance(got, naive, ref, 4 * unit_roundoff(DType::kF32),
                              ::testing::Message() << "n=" << n << " streams=" << ns << " chunks=" << chunks);
    }
    cudaFreeHost(hin);
    cudaFreeHost(hout);
  }
  for (auto s : streams) cudaStreamDestroy(s);
}

}  // namespace
}  // namespace flashlab
