// Launchers of the FP32 GEMM rungs 2-6 (src/gemm_launch.h). Arguments are already validated
// by src/gemm.cu: fp32, layout NN (a_col == b_col == 1), M, N, K >= 1.
#include <climits>
#include <cstdint>

#include "kernels/gemm/02_coalesced.cuh"
#include "kernels/gemm/03_smem_tiled.cuh"
#include "kernels/gemm/04_register_blocking.cuh"
#include "kernels/gemm/05_vec16_transposed_a.cuh"
#include "kernels/gemm/06_warp_tiling.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/gemm_launch.h"

namespace flashlab::detail {

namespace {

using namespace kernels;

// One block per (bm, bn) tile of C, on a 1-D grid (kernels decode it with gemm_block_tile).
int tile_grid(const GemmParams& p, int bm, int bn) {
  const int64_t tiles = ceil_div(p.M, bm) * ceil_div(p.N, bn);
  FLASHLAB_CHECK(tiles <= INT_MAX, "gemm: ", tiles, " tiles of ", bm, "x", bn, " exceed the grid limit");
  return static_cast<int>(tiles);
}

// The 16-byte load paths (rungs 5, 6) need every row of A and of B to start on a 16-byte
// boundary; otherwise the same kernels run with scalar loads.
bool operands_vec16(const GemmParams& p) {
  return rows_vec16_aligned<float>(p.a, p.a_row) && rows_vec16_aligned<float>(p.b, p.b_row);
}

template <typename Cfg, bool kVec16>
void launch_warp_tiling(const GemmParams& p, cudaStream_t stream) {
  if constexpr (Cfg::kSmemBytes > 48 * 1024) {  // past 48 KiB of dynamic shared memory needs the opt-in
    FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(gemm_warp_tiling_kernel<Cfg, kVec16>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  }
  FLASHLAB_LAUNCH((gemm_warp_tiling_kernel<Cfg, kVec16>), tile_grid(p, Cfg::kBM, Cfg::kBN), Cfg::kThreads,
                  Cfg::kSmemBytes, stream, p);
}

}  // namespace

void launch_gemm_fp32(const GemmParams& p, int rung, cudaStream_t stream) {
  switch (rung) {
    case 2: {
      constexpr int kBM = kGemmCoalescedTileM, kBN = kGemmCoalescedTileN;
      FLASHLAB_LAUNCH((gemm_coalesced_kernel<kBM, kBN>), tile_grid(p, kBM, kBN), kGemmCoalescedThreads, 0, stream, p);
      return;
    }
    case 3: {
      constexpr int kT = kGemmSmemTile;
      FLASHLAB_LAUNCH(gemm_smem_tiled_kernel<kT>, tile_grid(p, kT, kT), kGemmSmemThreads, 0, stream, p);
      return;
    }
    case 4: {
      constexpr int kBM = kGemmRegBM, kBN = kGemmRegBN;
      FLASHLAB_LAUNCH((gemm_register_blocking_kernel<kBM, kBN, kGemmRegBK, kGemmRegTM, kGemmRegTN>),
                      tile_grid(p, kBM, kBN), kGemmRegThreads, 0, stream, p);
      return;
    }
    case 5:
      BOOL_SWITCH(operands_vec16(p), kVec16, [&] {
        FLASHLAB_LAUNCH(gemm_vec16_transposed_a_kernel<kVec16>, tile_grid(p, kGemmVecBM, kGemmVecBN), kGemmVecThreads,
                        0, stream, p);
      });
      return;
    case 6:
      BOOL_SWITCH(operands_vec16(p), kVec16, [&] { launch_warp_tiling<GemmWarpTilingConfig, kVec16>(p, stream); });
      return;
    default:
      throw Error(concat("gemm: rung ", rung, " is not an FP32 rung (2-6)"));
  }
}

}  // namespace flashlab::detail
