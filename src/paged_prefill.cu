// Host side of the batch prefill over a paged KV cache (include/flashlab/serving.h): the checks,
// the forward's parameters with the page table in place of cu_seqlens_k, and the launch of
// forward rung 3 or 4 with paged K/V loads (src/paged_prefill_d<D>.cu).
#include <cmath>
#include <cstdint>
#include <limits>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/common/divide.cuh"
#include "src/attention_launch.h"
#include "src/attention_validate.h"
#include "src/core/launch.h"
#include "src/paged_kv_validate.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "batch_prefill_paged";

template <int kHeadDim>
void launch_paged_prefill(const AttnFwdParams& p, DType dtype, int rung, cudaStream_t stream) {
  if (rung == 2) return detail::launch_attn_hopper_paged_hdim<kHeadDim>(p, dtype, stream);
  detail::launch_attn_flash2_paged_hdim<kHeadDim>(p, dtype, stream);
}

}  // namespace

void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, const TensorView& k_cache,
                         const TensorView& v_cache, const TensorView& kv_indices, const TensorView& kv_indptr,
                         const TensorView& kv_last_page_len, const TensorView& out, const TensorView* lse, KvLayout layout,
                         const PagedPrefillOptions& options, int64_t max_qo_len, cudaStream_t stream, int rung) {
  const char* op = kOp;
  check::rung(op, rung, kPagedPrefillRungs);
  const check::Arg Q{op, "q", q}, QP{op, "qo_indptr", qo_indptr}, Kc{op, "k_cache", k_cache}, Vc{op, "v_cache", v_cache},
      Ind{op, "kv_indices", kv_indices}, Ptr{op, "kv_indptr", kv_indptr}, Last{op, "kv_last_page_len", kv_last_page_len},
      O{op, "out", out};
  const detail::CacheDims c = detail::check_cache(Kc, Vc, layout);
  check::vector_rows(Q, 3, {DType::kF16, DType::kBF16});
  check::same_device(Q, Kc);
  check::dtype_eq(Q, Kc);
  const int64_t batch = detail::check_table(Ind, Ptr, Last, Kc);
  FLASHLAB_CHECK(batch <= 65535, op, ": argument 'kv_last_page_len': expected a batch of at most 65535 requests, got ", batch);
  detail::check_index(QP, Q);
  check::shape(QP, {batch + 1});
  const int64_t total_q = q.shape[0], nheads = q.shape[1];
  check::shape(Q, {total_q, nheads, c.d});
  if (c.d != 64 && c.d != 128 && c.d != 256) check::fail(Q, "a head dim (last dim) of 64, 128 or 256", detail::concat(c.d));
  if (c.nheads < 1 || nheads < 1 || nheads % c.nheads != 0 || nheads > 65535)
    check::fail(Q, detail::concat("nheads (dim 1) in [1, 65535], a multiple of the cache's KV heads (", c.nheads, ")"),
                detail::concat(nheads));
  FLASHLAB_CHECK(total_q <= std::numeric_limits<int>::max(), op, ": argument 'q': expected at most 2^31 - 1 rows, got ", total_q);
  check::vector_rows(O, 3, {DType::kF16, DType::kBF16});
  check::same_device(O, Q);
  check::dtype_eq(O, Q);
  check::shape_eq(O, Q);
  detail::attention_no_self_overlap(O);
  const check::Arg L{op, "lse", lse != nullptr ? *lse : out};
  if (lse != nullptr) {
    check::cuda(L);
    check::same_device(L, Q);
    check::dtype_in(L, {DType::kF32});
    check::shape(L, {total_q, nheads});
    check::contiguous(L);
    check::aligned(L, 4);
    detail::check_outputs_disjoint({&L}, {&Q, &QP, &Kc, &Vc, &Ind, &Ptr, &Last, &O});
  }
  detail::check_outputs_disjoint({&O}, {&Q, &QP, &Kc, &Vc, &Ind, &Ptr, &Last});
  FLASHLAB_CHECK(options.window_left >= -1, op, ": argument 'window_left': expected >= -1 (-1: unbounded), got ",
                 options.window_left);
  FLASHLAB_CHECK(std::isfinite(options.softcap) && options.softcap >= 0.f, op,
                 ": argument 'softcap': expected a finite value >= 0 (0: none), got ", options.softcap);
  FLASHLAB_CHECK(std::isnan(options.softmax_scale) || std::isfinite(options.softmax_scale), op,
                 ": argument 'softmax_scale': expected a finite value, got ", options.softmax_scale);
  FLASHLAB_CHECK(max_qo_len >= -1 && max_qo_len <= std::numeric_limits<int>::max(), op,
                 ": argument 'max_qo_len': expected -1 (read from qo_indptr) or a count in [0, 2^31 - 1], got ", max_qo_len);
  // The kernels' page and slot strides are 32-bit (kernels/attention/paged.cuh).
  int64_t strides[2][3];
  detail::cache_strides(k_cache, layout, strides[0][0], strides[0][1], strides[0][2]);
  detail::cache_strides(v_cache, layout, strides[1][0], strides[1][1], strides[1][2]);
  for (int x = 0; x < 2; ++x)
    if (strides[x][0] > std::numeric_limits<int>::max() || strides[x][1] > std::numeric_limits<int>::max())
      check::fail(x == 0 ? Kc : Vc, "page and slot strides below 2^31 elements",
                  detail::concat("strides ", shape_str((x == 0 ? k_cache : v_cache).strides)));
  if (rung == 2)
    for (const check::Arg* x : {&Q, &O})
      if (!detail::tma_strides(x->t))
        check::fail(*x, "positive strides on every dim of size > 1 for rung 2 (TMA)",
                    detail::concat("strides ", shape_str(x->t.strides)));
  detail::DeviceGuard guard(q.device.index);
  if (rung == 2 && detail::cc_major() != 9) rung = 1;  // rung 2 is built for sm_90a only: rung 1 takes over
  // Last: the values (device reads, waiting for `stream`), unless capturing.
  const bool capture = detail::capturing(stream);
  FLASHLAB_CHECK(!capture || max_qo_len >= 0, op, ": argument 'max_qo_len': expected the longest request's query count "
                 "while the stream is being captured (qo_indptr cannot be read), got ", max_qo_len);
  int64_t grid_rows = max_qo_len;
  if (!capture) {
    detail::check_table_values(Ind, Ptr, Last, batch, c, stream);
    const int64_t longest = detail::check_cu_seqlens_values(
        QP, Q, batch, total_q, max_qo_len >= 0 ? max_qo_len : std::numeric_limits<int64_t>::max(), "max_qo_len", stream);
    if (max_qo_len < 0) grid_rows = longest;
  }
  if (total_q == 0 || grid_rows == 0) return;

  AttnFwdParams p{};
  p.q = q.data, p.o = out.data;
  p.q_row_stride = q.strides[0], p.q_head_stride = q.strides[1];
  p.o_row_stride = out.strides[0], p.o_head_stride = out.strides[1];
  p.k = k_cache.data, p.v = v_cache.data;  // paged: batch strides = page strides, row strides = slot strides
  p.k_batch_stride = strides[0][0], p.k_row_stride = strides[0][1], p.k_head_stride = strides[0][2];
  p.v_batch_stride = strides[1][0], p.v_row_stride = strides[1][1], p.v_head_stride = strides[1][2];
  p.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  p.lse_head_stride = 1, p.lse_row_stride = nheads;  // (total_q, nheads)
  p.cu_seqlens_q = static_cast<const int*>(qo_indptr.data);
  p.kv_indptr = static_cast<const int*>(kv_indptr.data), p.kv_indices = static_cast<const int*>(kv_indices.data);
  p.kv_last_page_len = static_cast<const int*>(kv_last_page_len.data);
  p.page_size = static_cast<int>(c.page_size);
  const kernels::IntDivisor page_divisor(static_cast<uint32_t>(c.page_size));
  p.page_size_magic = page_divisor.magic, p.page_size_shift = page_divisor.shift;
  p.total_q = total_q;
  p.total_k = c.max_pages;  // paged: the pool's pages (rung 4's tensor maps over the caches)
  p.batch = static_cast<int>(batch), p.nheads = static_cast<int>(nheads), p.nheads_kv = static_cast<int>(c.nheads);
  p.headdim = static_cast<int>(c.d);
  p.seqlen_q = static_cast<int>(grid_rows);
  const float sm = options.softmax_scale;
  p.scale = std::isnan(sm) || sm <= 0.f ? 1.f / std::sqrt(static_cast<float>(c.d)) : sm;
  p.softcap = options.softcap;
  p.window_left = options.window_left;
  p.window_right = options.causal ? 0 : -1;
  switch (c.d) {
    case 64: return launch_paged_prefill<64>(p, q.dtype, rung, stream);
    case 128: return launch_paged_prefill<128>(p, q.dtype, rung, stream);
    default: return launch_paged_prefill<256>(p, q.dtype, rung, stream);
  }
}

}  // namespace flashlab
