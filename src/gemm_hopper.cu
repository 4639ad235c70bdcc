// Rung 9's launcher: tensor maps for A, B and C, the tile width, CTA pairs or single CTAs, and
// a persistent grid of as many CTAs (pairs) as are resident at once (fewer with fewer tiles).
#include <algorithm>

#include "kernels/gemm/09_hopper_ws.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/core/tensor_map.h"
#include "src/gemm_launch.h"

namespace flashlab::detail {

namespace {

using namespace kernels;

template <typename T, int kBN, bool kTransA, bool kTransB, int kCluster>
void launch(const HopperGemmArgs& args, int units, cudaStream_t stream) {
  const auto kernel = gemm_hopper_ws_kernel<T, kBN, kTransA, kTransB, kCluster>;
  constexpr int smem = HopperTile<kBN>::kSmemBytes;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Pairs must sit in one GPC each: size the persistent grid by the pairs that fit at once.
  const int resident = kCluster > 1 ? resident_clusters(reinterpret_cast<const void*>(kernel), kCluster, kHopperThreads, smem)
                                    : sm_count();
  const int grid = std::min(units, resident) * kCluster;
  FLASHLAB_LAUNCH(kernel, grid, kHopperThreads, smem, stream, args);
}

template <typename T, int kBN, int kCluster>
void launch_layout(const HopperGemmArgs& args, bool trans_a, bool trans_b, int units, cudaStream_t stream) {
  if (!trans_a && !trans_b) return launch<T, kBN, false, false, kCluster>(args, units, stream);  // NT
  if (!trans_a && trans_b) return launch<T, kBN, false, true, kCluster>(args, units, stream);    // NN
  launch<T, kBN, true, true, kCluster>(args, units, stream);                                     // TN
}

}  // namespace

void launch_gemm_hopper(const GemmParams& p, DType dtype, cudaStream_t stream, bool cluster_pairs) {
  const int es = dtype_size(dtype);
  // Operand storage (validated by gemm()): A is K-major when its k stride is 1, B is K-major
  // when its k stride is 1 (an (N, K) weight seen through .t()).
  const bool trans_a = p.a_col != 1, trans_b = p.b_row != 1;
  const int64_t lda = trans_a ? p.a_col : p.a_row, ldb = trans_b ? p.b_row : p.b_col;
  // 256-wide tiles unless that leaves SMs idle (few tiles: M = 128 LLM decode-like shapes).
  const int sms = sm_count();
  const int tiles_m = static_cast<int>(ceil_div(p.M, kHopperBM));
  const bool wide = tiles_m * ceil_div(p.N, 256) >= sms;
  const int bn = wide ? 256 : 128;
  // Pairs of CTAs (clusters of 2) on tile rows 2q, 2q + 1 share each B tile: each loads half
  // and multicasts it, when there are at least two tile rows.
  const bool pairs = cluster_pairs && tiles_m >= 2;
  const int cluster = pairs ? 2 : 1;
  // Row strides in bytes; gemm() let through a leading dim off 16 bytes only for an operand of
  // one stored row, whose stride TMA never steps over: pad it to 16.
  const auto stride = [&](int64_t ld) { return ceil_div(ld * es, 16) * 16; };
  HopperGemmArgs args{};
  args.a = trans_a ? make_tensor_map_2d(p.a, dtype, p.M, p.K, stride(lda), 64, 64, true)
                   : make_tensor_map_2d(p.a, dtype, p.K, p.M, stride(lda), 64, kHopperBM, true);
  args.b = trans_b ? make_tensor_map_2d(p.b, dtype, p.N, p.K, stride(ldb), 64, 64, true)
                   : make_tensor_map_2d(p.b, dtype, p.K, p.N, stride(ldb), 64, bn / cluster, true);
  args.c = make_tensor_map_2d(p.c, dtype, p.N, p.M, stride(p.ldc), 64, 64, true);
  args.p = p;
  args.tiles_m = tiles_m;
  args.tiles_n = static_cast<int>(ceil_div(p.N, bn));
  const int units = static_cast<int>(ceil_div(tiles_m, cluster)) * args.tiles_n;
  HALF_DTYPE_SWITCH(dtype, T, [&] {
    if (wide && pairs) launch_layout<T, 256, 2>(args, trans_a, trans_b, units, stream);
    else if (wide) launch_layout<T, 256, 1>(args, trans_a, trans_b, units, stream);
    else if (pairs) launch_layout<T, 128, 2>(args, trans_a, trans_b, units, stream);
    else launch_layout<T, 128, 1>(args, trans_a, trans_b, units, stream);
  });
}

}  // namespace flashlab::detail
