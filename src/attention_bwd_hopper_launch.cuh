// Backward rung 3's launch of one kernel variant (Hopper): the tensor maps of q, k, v, dout and
// the dq accumulator, the grid. Included by src/attention_bwd_hopper.cu (the library's variants)
// and bench/experiments/attention_bwd_hopper_ablation.cu (the others).
#pragma once

#include <algorithm>
#include <climits>

#include "kernels/attention/backward/03_hopper.cuh"
#include "kernels/attention/backward/03_hopper_split.cuh"
#include "src/attention_hopper_hdim.cuh"
#include "src/core/launch.h"
#include "src/core/tensor_map.h"

namespace flashlab::detail {

// The tensor maps of q, dout (boxes of q_box_rows rows) and k, v (k_box_rows rows), 64 columns
// of 16-bit values each; with_dq_accum: dq_accum's map too (the kernels that add dQ by TMA).
inline kernels::HopperBwdArgs attn_bwd_hopper_args(const AttnBwdParams& p, DType dtype, int q_box_rows, int k_box_rows,
                                                   bool with_dq_accum) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t batch = varlen ? 1 : p.batch;  // varlen: packed rows, one "batch" in the maps
  const int d = p.headdim;
  kernels::HopperBwdArgs args{};
  args.p = p;
  args.q = attn_tensor_map(p.q, dtype, d, p.total_q, p.nheads, batch, p.q_row_stride, p.q_head_stride, p.q_batch_stride,
                           q_box_rows);
  args.dout = attn_tensor_map(p.dout, dtype, d, p.total_q, p.nheads, batch, p.dout_row_stride, p.dout_head_stride,
                              p.dout_batch_stride, q_box_rows);
  args.k = attn_tensor_map(p.k, dtype, d, p.total_k, p.nheads_kv, batch, p.k_row_stride, p.k_head_stride, p.k_batch_stride,
                           k_box_rows);
  args.v = attn_tensor_map(p.v, dtype, d, p.total_k, p.nheads_kv, batch, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                           k_box_rows);
  // dq_accum (fp32): row attn_dq_accum_row(b, i) of head h at (row nheads + h) d, as a 4-D view
  // (head dim, heads, rows, 1); TMA coordinates are 32-bit.
  const int64_t rows = varlen ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
  FLASHLAB_CHECK(rows <= INT_MAX, "attention_bwd: argument 'q': expected at most 2^31 - 1 query rows in all for rung 3, got ",
                 rows);
  if (with_dq_accum) {
    const int64_t dq_dims[4] = {d, p.nheads, rows, 1};
    const int64_t dq_strides[3] = {d * 4, p.nheads * d * 4, rows * p.nheads * d * 4};
    args.dq_accum = make_tensor_map_4d(p.dq_accum, DType::kF32, dq_dims, dq_strides, {32, 1, 64, 1});
  }
  // dk, dv for the epilogue's TMA stores: fixed lengths (a varlen box would run into the next
  // sequence's rows) and strides positive on every dim of size > 1 (tma_strides' rule; their
  // 16-byte alignment is attention_bwd's check::aligned_rows).
  const auto positive = [&](int64_t row, int64_t head, int64_t bat) {
    return (p.seqlen_k <= 1 || row > 0) && (p.nheads_kv <= 1 || head > 0) && (p.batch <= 1 || bat > 0);
  };
  if (!varlen && positive(p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride) &&
      positive(p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride)) {
    args.dk = attn_tensor_map(p.dk, dtype, d, p.seqlen_k, p.nheads_kv, p.batch, p.dk_row_stride, p.dk_head_stride,
                              p.dk_batch_stride, 64);
    args.dv = attn_tensor_map(p.dv, dtype, d, p.seqlen_k, p.nheads_kv, p.batch, p.dv_row_stride, p.dv_head_stride,
                              p.dv_batch_stride, 64);
    args.dkdv_tma = 1;
  }
  return args;
}

// kStages, kSharedSpace, kDqFirst, kDqByProducer, kProbe: attn_bwd_hopper_kernel's
// (kernels/attention/backward/03_hopper.cuh). kPersistent: the kernel's; a block per SM walking the
// tiles (key block, KV head, batch) in the grid's order (not with the timeline probe, kProbe 6: it
// picks its blocks by grid position).
template <typename T, int kHeadDim, bool kScoreMod, int kStages = 2, bool kSharedSpace = false, bool kDqFirst = false,
          bool kDqByProducer = false, int kProbe = 0, bool kPersistent = false>
void launch_attn_bwd_hopper_variant(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  static_assert(!(kPersistent && kProbe == 6), "the timeline probe runs one block per tile");
  using Tr = kernels::HopperBwdTraits<kHeadDim, kStages, kDqByProducer>;
  kernels::HopperBwdArgs args = attn_bwd_hopper_args(p, dtype, Tr::kBlockM, Tr::kBlockN, true);
  const auto kernel =
      kernels::attn_bwd_hopper_kernel<T, kHeadDim, kScoreMod, kStages, kSharedSpace, kDqFirst, kDqByProducer, kProbe, kPersistent>;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const int64_t n_blocks = ceil_div(p.seqlen_k, Tr::kBlockN);
  const int64_t tiles = n_blocks * p.nheads_kv * p.batch;
  if (kPersistent) {
    FLASHLAB_CHECK(tiles <= INT_MAX, "attention_bwd: expected at most 2^31 - 1 key blocks x KV heads x batch for the persistent "
                   "kernel, got ", tiles);
    args.tiles = static_cast<int>(tiles);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, sm_count())));
    FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, args);
    return;
  }
  const dim3 grid(static_cast<unsigned>(n_blocks), p.nheads_kv, p.batch);
  FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, args);
}

// The split form (kernels/attention/backward/03_hopper_split.cuh; the library's at head dim 256):
// kBlockN-key blocks, 64-row steps; kDqMode, kProbe: the kernel's.
template <typename T, int kHeadDim, bool kAlibi, int kDqMode = 2, int kProbe = 0>
void launch_attn_bwd_hopper_split(const AttnBwdParams& p, DType dtype, cudaStream_t stream) {
  using Tr = kernels::HopperBwdSplitTraits<kHeadDim>;
  FLASHLAB_CHECK(!(p.softcap > 0.f), "attention_bwd: argument 'softcap': expected 0 for rung 3's split kernel (head dim ",
                 kHeadDim, "), got ", p.softcap);
  const kernels::HopperBwdArgs args = attn_bwd_hopper_args(p, dtype, Tr::kBlockM, Tr::kBlockN, kDqMode > 0);
  const auto kernel = kernels::attn_bwd_hopper_split_kernel<T, kHeadDim, kAlibi, kDqMode, kProbe>;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.seqlen_k, Tr::kBlockN)), p.nheads_kv, p.batch);
  FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, Tr::kSmemBytes, stream, args);
}

}  // namespace flashlab::detail
