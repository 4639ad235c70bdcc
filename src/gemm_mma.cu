// Launchers of the 16-bit tensor-core GEMM rungs (src/gemm_launch.h): rung 7 (WMMA) and
// rung 8 (mma.sync + ldmatrix + cp.async). src/gemm.cu has validated the arguments (layout NN).
#include <climits>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

#include "flashlab/error.h"
#include "kernels/gemm/07_wmma.cuh"
#include "kernels/gemm/08_mma_sync.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/gemm_launch.h"

namespace flashlab::detail {

namespace {

using namespace kernels;

// Every row of A and B starts on a 16-byte boundary (a single row: only its start counts).
template <typename T>
bool operands_vec16(const GemmParams& p) {
  return rows_vec16_aligned<T>(p.a, p.M > 1 ? p.a_row : 0) && rows_vec16_aligned<T>(p.b, p.K > 1 ? p.b_row : 0);
}

unsigned tile_grid(int64_t tiles_m, int64_t tiles_n) {
  const int64_t tiles = tiles_m * tiles_n;
  if (tiles > INT_MAX) throw Error(concat("gemm: ", tiles, " output tiles exceed the grid limit of ", INT_MAX));
  return static_cast<unsigned>(tiles);
}

// Opts `kernel` in to `bytes` of dynamic shared memory, once per (device, kernel).
void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> done;
  int dev = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({dev, kernel})) return;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({dev, kernel});
}

template <typename T>
void launch_wmma(const GemmParams& p, cudaStream_t stream) {
  const unsigned grid = tile_grid(ceil_div(p.M, kGemmWmmaBM), ceil_div(p.N, kGemmWmmaBN));
  if (operands_vec16<T>(p))
    FLASHLAB_LAUNCH((gemm_wmma_kernel<T, true>), grid, kGemmWmmaThreads, 0, stream, p);
  else
    FLASHLAB_LAUNCH((gemm_wmma_kernel<T, false>), grid, kGemmWmmaThreads, 0, stream, p);
}

template <typename T, class Tr, bool kAsync>
void launch_mma_sync_variant(const GemmParams& p, cudaStream_t stream) {
  const auto kernel = gemm_mma_sync_kernel<T, Tr, kAsync>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
  const unsigned grid = tile_grid(ceil_div(p.M, Tr::kBM), ceil_div(p.N, Tr::kBN));
  FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, p);
}

// (128, 256, 64) tiles in 4 stages (192 KB) fit Hopper's 227 KB of shared memory per block;
// A100's 163 KB takes 3 (144 KB). Not yet measured: 3 against 4 on H100 is for
// bench/experiments to settle. The element-load fallback (unaligned A or B) takes (128, 128,
// 64) tiles, 2 stages: its loads are synchronous, so depth buys nothing. It is also what a
// device with less shared memory per block than 3 stages need (sm_86 / sm_89: 99 KB) runs.
template <typename T>
void launch_mma_sync(const GemmParams& p, cudaStream_t stream) {
  using Four = GemmMmaSyncTraits<256, 4>;
  using Three = GemmMmaSyncTraits<256, 3>;
  const int smem = max_smem_optin();
  if (!operands_vec16<T>(p) || smem < Three::kSmemBytes)
    return launch_mma_sync_variant<T, GemmMmaSyncTraits<128, 2>, false>(p, stream);
  if (smem >= Four::kSmemBytes) return launch_mma_sync_variant<T, Four, true>(p, stream);
  launch_mma_sync_variant<T, Three, true>(p, stream);
}

template <typename T>
void launch(const GemmParams& p, int rung, cudaStream_t stream) {
  if (rung == 7) return launch_wmma<T>(p, stream);
  launch_mma_sync<T>(p, stream);
}

}  // namespace

void launch_gemm_tensor_core(const GemmParams& p, DType dtype, int rung, cudaStream_t stream) {
  if (rung != 7 && rung != 8) throw Error(concat("launch_gemm_tensor_core: rung ", rung, " is not 7 or 8"));
  HALF_DTYPE_SWITCH(dtype, T, [&] { launch<T>(p, rung, stream); });
}

}  // namespace flashlab::detail
