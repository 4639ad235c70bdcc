// Host side of the softmax family: validation, then dispatch to a rung.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "flashlab/softmax.h"
#include "flashlab/validate.h"
#include "kernels/softmax/01_three_pass.cuh"
#include "kernels/softmax/02_two_pass.cuh"
#include "kernels/softmax/03_online_warp_block_vec16.cuh"
#include "kernels/softmax/04_long_rows.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// The 16-byte vector rungs need every row of input and out to start on a 16-byte boundary.
template <typename T>
bool vec16_ok(const SoftmaxParams& p) {
  auto aligned = detail::rows_vec16_aligned<T>;
  return p.cols % Vec<T>::kN == 0 && aligned(p.input, p.input_stride) && aligned(p.out, p.out_stride);
}

// Rung 4 splits rows over a cluster when one block per row leaves SMs idle (fewer than two rows
// per SM) or a row is past one block's registers. Not yet measured: the threshold is a guess
// for bench/experiments to settle. Clusters need sm_90: older devices keep rung 3's kernels.
bool split_rows(const SoftmaxParams& p, bool fits_block) {
  if (detail::cc_major() < 9) return false;
  if (p.rows > 0x7fffffff / kSoftmaxClusterBlocks) return false;  // grid.x = rows * cluster
  return !fits_block || p.rows < 2 * static_cast<int64_t>(detail::sm_count());
}

template <typename T, bool kLog>
void launch_softmax(const SoftmaxParams& p, cudaStream_t stream, int rung) {
  const int grid_rows = static_cast<int>(p.rows);  // rows <= 2^31 - 1 checked by the caller
  if (rung == 1) {
    FLASHLAB_LAUNCH((softmax_three_pass_kernel<T, kLog>), grid_rows, kSoftmaxRowThreads, 0, stream, p);
    return;
  }
  if (rung == 2 || !vec16_ok<T>(p)) {
    FLASHLAB_LAUNCH((softmax_two_pass_kernel<T, kLog>), grid_rows, kSoftmaxRowThreads, 0, stream, p);
    return;
  }
  if (p.cols <= kSoftmaxWarpMaxCols) {
    FLASHLAB_LAUNCH((softmax_online_warp_kernel<T, kLog>),
                    static_cast<int>(detail::ceil_div(p.rows, kSoftmaxWarpThreads / kWarpSize)), kSoftmaxWarpThreads,
                    0, stream, p);
    return;
  }
  const int64_t nvec = p.cols / Vec<T>::kN;
  const bool fits_block = nvec <= static_cast<int64_t>(kSoftmaxBlockVpt) * kSoftmaxBlockMaxThreads;
  if (rung == 4 && split_rows(p, fits_block)) {
    const int64_t chunk_vecs = detail::ceil_div(nvec, kSoftmaxClusterBlocks);
    const int64_t smem = chunk_vecs * static_cast<int64_t>(sizeof(Vec<T>));
    const int grid = grid_rows * kSoftmaxClusterBlocks;  // a multiple of the cluster size
    const int64_t vpt = detail::ceil_div(chunk_vecs, kSoftmaxSplitThreads);  // vectors per thread
    if (vpt <= kSoftmaxRowsVpt[2]) {
      // Persistent clusters (the rung's kernel for rows up to 262144 bf16 values): as many as
      // are resident at once, each taking rows c, c + C, ...
      const auto launch_rows = [&](auto vpt_c) {
        const auto kernel = softmax_rows_cluster_kernel<T, kLog, decltype(vpt_c)::value>;
        FLASHLAB_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSplitMaxSmemBytes));
        const int resident = detail::resident_clusters(reinterpret_cast<const void*>(kernel), kSoftmaxClusterBlocks,
                                                       kSoftmaxSplitThreads, static_cast<int>(smem));
        const int clusters = static_cast<int>(std::min<int64_t>(p.rows, std::max(resident, 1)));
        FLASHLAB_LAUNCH(kernel, clusters * kSoftmaxClusterBlocks, kSoftmaxSplitThreads, static_cast<size_t>(smem),
                        stream, p, chunk_vecs);
      };
      if (vpt <= kSoftmaxRowsVpt[0]) launch_rows(std::integral_constant<int, kSoftmaxRowsVpt[0]>{});
      else if (vpt <= kSoftmaxRowsVpt[1]) launch_rows(std::integral_constant<int, kSoftmaxRowsVpt[1]>{});
      else launch_rows(std::integral_constant<int, kSoftmaxRowsVpt[2]>{});
    } else if (smem <= kSoftmaxSplitMaxSmemBytes) {
      const auto kernel = softmax_split_cluster_kernel<T, kLog, true>;
      // Past 48 KB of dynamic shared memory needs the opt-in. Always the same value (the most
      // this path launches with), so calls from several host threads cannot undo each other.
      FLASHLAB_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSoftmaxSplitMaxSmemBytes));
      FLASHLAB_LAUNCH(kernel, grid, kSoftmaxSplitThreads, static_cast<size_t>(smem), stream, p, chunk_vecs);
    } else {
      FLASHLAB_LAUNCH((softmax_split_cluster_kernel<T, kLog, false>), grid, kSoftmaxSplitThreads, 0, stream, p,
                      chunk_vecs);
    }
    return;
  }
  if (fits_block)
    FLASHLAB_LAUNCH((softmax_online_block_kernel<T, kLog, true>), grid_rows,
                    detail::cover_threads(nvec, kSoftmaxBlockVpt, kWarpSize, kSoftmaxBlockMaxThreads), 0, stream, p);
  else
    FLASHLAB_LAUNCH((softmax_online_block_kernel<T, kLog, false>), grid_rows, kSoftmaxBlockMaxThreads, 0, stream, p);
}

void run(const char* op, bool log, const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  const check::Arg I{op, "input", input}, O{op, "out", out};
  check::rung(op, rung, kSoftmaxRungs);
  check::row_input(I, "cols");
  check::rows_like(O, I, "cols");
  if (out.data == input.data && detail::row_stride(out) != detail::row_stride(input))
    check::fail(O, detail::concat("the row stride of 'input' (", detail::row_stride(input), ") when in place"),
                detail::concat("row stride ", detail::row_stride(out)));
  check::no_overlap(O, I);
  detail::DeviceGuard guard(input.device.index);
  const SoftmaxParams p{input.data, out.data, input.shape[0], input.shape[1], detail::row_stride(input), detail::row_stride(out)};
  DTYPE_SWITCH(input.dtype, T, [&] {
    BOOL_SWITCH(log, kLog, [&] { launch_softmax<T, kLog>(p, stream, rung); });
  });
}

}  // namespace

void softmax(const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  run("softmax", false, input, out, stream, rung);
}

void log_softmax(const TensorView& input, const TensorView& out, cudaStream_t stream, int rung) {
  run("log_softmax", true, input, out, stream, rung);
}

}  // namespace flashlab
