// Unit tests of the device side of kernels/common/online_softmax.cuh: warp_merge and
// block_all_merge against the host fold of the same states, including -inf (masked) states,
// and the property the kernels rely on: every lane / thread gets the same state, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/online_softmax.cuh"
#include "tests/common/gpu_utils.h"

namespace flashlab {
namespace {

using kernels::OnlineSoftmaxState;
using namespace flashlab::testing;

// One state per thread in, the merged state of each thread out. kBlock: block_all_merge, else
// warp_merge (each warp on its own).
template <bool kBlock>
__global__ void merge_kernel(const OnlineSoftmaxState* in, OnlineSoftmaxState* out) {
  const OnlineSoftmaxState st = in[threadIdx.x];
  if constexpr (kBlock) out[threadIdx.x] = kernels::block_all_merge(st);
  else out[threadIdx.x] = kernels::warp_merge(st);
}

std::vector<OnlineSoftmaxState> run(bool block, const std::vector<OnlineSoftmaxState>& states) {
  const size_t bytes = states.size() * sizeof(OnlineSoftmaxState);
  DeviceBuffer din(bytes), dout(bytes);
  FLASHLAB_CUDA_CHECK(cudaMemcpy(din.ptr, states.data(), bytes, cudaMemcpyHostToDevice));
  dout.poison();
  const auto* in = static_cast<const OnlineSoftmaxState*>(din.ptr);
  auto* out = static_cast<OnlineSoftmaxState*>(dout.ptr);
  if (block) merge_kernel<true><<<1, static_cast<unsigned>(states.size())>>>(in, out);
  else merge_kernel<false><<<1, static_cast<unsigned>(states.size())>>>(in, out);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  std::vector<OnlineSoftmaxState> got(states.size());
  FLASHLAB_CUDA_CHECK(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
  return got;
}

// Host fold of states[begin, end) in order.
OnlineSoftmaxState fold(const std::vector<OnlineSoftmaxState>& states, size_t begin, size_t end) {
  OnlineSoftmaxState acc = kernels::online_softmax_empty();
  for (size_t i = begin; i < end; ++i) acc = kernels::online_softmax_merge(acc, states[i]);
  return acc;
}

// Random live states (m in [-80, 80], s in [1, 100]), with every `masked_every`-th one masked.
std::vector<OnlineSoftmaxState> random_states(int n, int masked_every, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> m(-80.f, 80.f), s(1.f, 100.f);
  std::vector<OnlineSoftmaxState> v(n);
  for (int i = 0; i < n; ++i)
    v[i] = masked_every > 0 && i % masked_every == 0 ? kernels::online_softmax_empty() : OnlineSoftmaxState{m(rng), s(rng)};
  return v;
}

void expect_group(const std::vector<OnlineSoftmaxState>& got, const OnlineSoftmaxState& want, size_t begin,
                  size_t end, const char* what) {
  for (size_t i = begin; i < end; ++i) {
    EXPECT_EQ(got[i].m, got[begin].m) << what << ": thread " << i << " differs from thread " << begin;
    EXPECT_EQ(got[i].s, got[begin].s) << what << ": thread " << i << " differs from thread " << begin;
  }
  EXPECT_EQ(got[begin].m, want.m) << what;  // the max is exact
  if (want.s == 0.f) EXPECT_EQ(got[begin].s, 0.f) << what;
  else EXPECT_NEAR(got[begin].s, want.s, 1e-5 * want.s) << what;
}

TEST(OnlineSoftmax, WarpMergeMatchesHostFold) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(41);
  for (int masked_every : {0, 3, 1}) {  // none, some, all masked
    const auto states = random_states(128, masked_every, rng);
    const auto got = run(false, states);
    for (size_t w = 0; w < 4; ++w) expect_group(got, fold(states, 32 * w, 32 * w + 32), 32 * w, 32 * w + 32, "warp");
  }
}

TEST(OnlineSoftmax, BlockMergeMatchesHostFold) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(42);
  for (int threads : {32, 96, 512, 1024})
    for (int masked_every : {0, 7, 1}) {
      const auto states = random_states(threads, masked_every, rng);
      expect_group(run(true, states), fold(states, 0, states.size()), 0, states.size(), "block");
    }
}

}  // namespace
}  // namespace flashlab
