// Host side of the reduce family: validation, then dispatch to a rung.
#include <algorithm>

#include "flashlab/reduce.h"
#include "flashlab/validate.h"
#include "kernels/reduce/02_smem_interleaved.cuh"
#include "kernels/reduce/03_smem_sequential.cuh"
#include "kernels/reduce/04_warp_shuffle.cuh"
#include "kernels/reduce/06_one_pass.cuh"
#include "kernels/reduce/row_sum.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

using namespace kernels;

// Blocks of the fixed-grid rungs (5, 6): one resident wave, never more than the final pass
// can take in one block, and at least 4 vectors per thread.
template <typename Kernel>
int fixed_grid(Kernel kernel, int64_t n) {
  const int64_t per_block = static_cast<int64_t>(kSumThreads) * kSumUnroll * 4;
  const int64_t want = std::max<int64_t>(1, detail::ceil_div(n, per_block));
  const int64_t resident = detail::resident_blocks(reinterpret_cast<const void*>(kernel), kSumThreads);
  return static_cast<int>(std::min<int64_t>({want, resident, kSumMaxBlocks}));
}

// Rungs 2-4: one element per thread, each pass shrinks n by `shrink` into the workspace,
// until one value is left, which the last pass writes to out. Passes ping-pong between two
// halves of the workspace.
template <typename T, typename KernelIn, typename KernelF32>
void sum_multipass(KernelIn first, KernelF32 rest, int64_t shrink, const void* x, int64_t n, float* out,
                   cudaStream_t stream) {
  const int64_t max_partials = detail::ceil_div(n, shrink);
  float* ws = static_cast<float*>(detail::workspace(stream, 2 * max_partials * sizeof(float)));
  float* bufs[2] = {ws, ws + max_partials};
  int64_t count = detail::ceil_div(n, shrink);
  float* dst = count == 1 ? out : bufs[0];
  const int grid0 = static_cast<int>(detail::ceil_div(n, kSumThreads));
  FLASHLAB_LAUNCH(first, grid0, kSumThreads, 0, stream, SumPassParams{x, n, dst});
  for (int pass = 1; count > 1; ++pass) {
    const float* src = dst;
    const int64_t next = detail::ceil_div(count, shrink);
    dst = next == 1 ? out : bufs[pass % 2];
    FLASHLAB_LAUNCH(rest, static_cast<int>(detail::ceil_div(count, kSumThreads)), kSumThreads, 0, stream,
                    SumPassParams{src, count, dst});
    count = next;
  }
}

template <typename T>
void launch_sum(const void* x, int64_t n, float* out, cudaStream_t stream, int rung) {
  switch (rung) {
    case 1: {
      FLASHLAB_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));
      const int grid = static_cast<int>(std::min<int64_t>(detail::ceil_div(n, kSumThreads),
                                                          static_cast<int64_t>(detail::sm_count()) * 8));
      FLASHLAB_LAUNCH(sum_atomic_kernel<T>, grid, kSumThreads, 0, stream, SumPassParams{x, n, out});
      return;
    }
    case 2:
      return sum_multipass<T>(sum_smem_interleaved_kernel<T>, sum_smem_interleaved_kernel<float>, kSumThreads,
                              x, n, out, stream);
    case 3:
      return sum_multipass<T>(sum_smem_sequential_kernel<T>, sum_smem_sequential_kernel<float>, kSumThreads, x,
                              n, out, stream);
    case 4:
      return sum_multipass<T>(sum_warp_shuffle_kernel<T>, sum_warp_shuffle_kernel<float>, kWarpSize, x, n,
                              out, stream);
    case 5: {
      const int grid = fixed_grid(sum_vec_multi_kernel<T>, n);
      if (grid == 1) {
        FLASHLAB_LAUNCH(sum_vec_multi_kernel<T>, 1, kSumThreads, 0, stream, SumPassParams{x, n, out});
        return;
      }
      float* partials = static_cast<float*>(detail::workspace(stream, kSumMaxBlocks * sizeof(float)));
      FLASHLAB_LAUNCH(sum_vec_multi_kernel<T>, grid, kSumThreads, 0, stream, SumPassParams{x, n, partials});
      FLASHLAB_LAUNCH(sum_vec_multi_kernel<float>, 1, kSumThreads, 0, stream, SumPassParams{partials, grid, out});
      return;
    }
    default: {
      auto* partials = static_cast<float*>(detail::workspace(stream, kSumMaxBlocks * sizeof(float)));
      auto* counter = static_cast<unsigned*>(
          detail::workspace(stream, sizeof(unsigned), detail::Workspace::kCounters));  // zero between calls
      const SumOnePassParams p{x, n, out, partials, counter};
      FLASHLAB_LAUNCH(sum_one_pass_kernel<T>, fixed_grid(sum_one_pass_kernel<T>, n), kSumThreads, 0, stream, p);
      return;
    }
  }
}

}  // namespace

void sum(const TensorView& x, const TensorView& out, cudaStream_t stream, int rung) {
  constexpr const char* op = "sum";
  const check::Arg X{op, "x", x}, O{op, "out", out};
  check::rung(op, rung, kSumRungs);
  check::cuda(X);
  check::cuda(O);
  check::same_device(O, X);
  check::dtype_in(X, {DType::kF32, DType::kBF16});
  check::dtype_in(O, {DType::kF32});
  check::contiguous(X);
  check::nonempty(X);
  check::shape(O, {1});
  check::aligned(X, dtype_size(x.dtype));
  check::aligned(O, sizeof(float));
  check::no_overlap(O, X);
  detail::DeviceGuard guard(x.device.index);
  DTYPE_SWITCH(x.dtype, T, [&] { launch_sum<T>(x.data, x.numel(), out.ptr<float>(), stream, rung); });
}

void row_sum(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  constexpr const char* op = "row_sum";
  const check::Arg X{op, "x", x}, O{op, "out", out};
  check::cuda(X);
  check::cuda(O);
  check::same_device(O, X);
  check::dtype_in(X, {DType::kF32, DType::kBF16});
  check::dtype_in(O, {DType::kF32});
  check::ndim(X, 2);
  check::nonempty(X);
  check::last_dim_contiguous(X);
  check::rows_disjoint(X, "cols");
  check::contiguous(O);
  check::shape(O, {x.shape[0]});
  check::aligned(X, dtype_size(x.dtype));
  check::aligned(O, sizeof(float));
  check::no_overlap(O, X);
  detail::DeviceGuard guard(x.device.index);
  const RowSumParams p{x.data, x.shape[0], x.shape[1], detail::row_stride(x),
                       out.ptr<float>()};
  DTYPE_SWITCH(x.dtype, T, [&] {
    auto launch = [&](auto kernel, const RowSumParams& params, int threads, int64_t rows_per_block) {
      const int64_t want = detail::ceil_div(params.rows, rows_per_block);
      const int grid = static_cast<int>(
          std::min<int64_t>(want, detail::resident_blocks(reinterpret_cast<const void*>(kernel), threads)));
      FLASHLAB_LAUNCH(kernel, grid, threads, 0, stream, params);
    };
    if (p.cols <= kRowSumWarpMaxCols) return launch(row_sum_warp_kernel<T, 256>, p, 256, 256 / kWarpSize);
    // Few long rows: split each row over several blocks so that one wave of blocks has work.
    const int64_t wave = detail::resident_blocks(reinterpret_cast<const void*>(row_sum_split_kernel<T, 256>), 256);
    const int64_t splits = std::min(detail::ceil_div(wave, p.rows), p.cols / kRowSumMinChunk);
    if (splits >= 2) {
      const int64_t chunk = detail::ceil_div(detail::ceil_div(p.cols, splits), 64) * 64;  // whole 16-byte vectors
      const int64_t items = p.rows * splits;
      const RowSumSplit split{
          splits, chunk, static_cast<float*>(detail::workspace(stream, items * sizeof(float))),
          static_cast<unsigned*>(detail::workspace(stream, p.rows * sizeof(unsigned), detail::Workspace::kCounters))};
      FLASHLAB_LAUNCH((row_sum_split_kernel<T, 256>), static_cast<int>(std::min(items, wave)), 256, 0, stream, p,
                      split);
      return;
    }
    if (p.cols <= 4096) return launch(row_sum_block_kernel<T, 128>, p, 128, 1);
    launch(row_sum_block_kernel<T, 256>, p, 256, 1);
  });
}

}  // namespace flashlab
