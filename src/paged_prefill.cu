// Host side of the batch prefill over a paged KV cache (include/flashlab/serving.h): the checks,
// the forward's parameters with the page table in place of cu_seqlens_k, and the launch of
// forward rung 3 or 4 with paged K/V loads (src/paged_prefill_d<D>.cu).
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

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

// The one-shot call (plan null: the index tensors' values read from the device unless
// capturing) and the call under a plan (nothing read): every host check, then the launch.
void prefill(const char* op, const PrefillPlanInfo* plan, const TensorView& q, const TensorView& qo_indptr,
             const TensorView& k_cache, const TensorView& v_cache, const TensorView& kv_indices,
             const TensorView& kv_indptr, const TensorView& kv_last_page_len, const TensorView& out, const TensorView* lse,
             KvLayout layout, const PagedPrefillOptions& options, int64_t max_qo_len, cudaStream_t stream, int rung) {
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
  // The kernels' page and slot strides are 32-bit, and so is a key's offset within its page
  // (slot x slot stride + column: kernels/attention/paged.cuh).
  int64_t strides[2][3];
  detail::cache_strides(k_cache, layout, strides[0][0], strides[0][1], strides[0][2]);
  detail::cache_strides(v_cache, layout, strides[1][0], strides[1][1], strides[1][2]);
  constexpr int64_t kMax32 = std::numeric_limits<int>::max();
  for (int x = 0; x < 2; ++x) {
    const int64_t page = std::abs(strides[x][0]), slot = std::abs(strides[x][1]);
    if (page > kMax32 || slot > kMax32 || (c.page_size - 1) * slot + c.d > kMax32)
      check::fail(x == 0 ? Kc : Vc, "page and slot strides whose magnitude and (page_size - 1) x slot stride + head dim are below 2^31 elements",
                  detail::concat("strides ", shape_str((x == 0 ? k_cache : v_cache).strides), " at page_size ", c.page_size));
  }
  if (rung == 2)
    for (const check::Arg* x : {&Q, &O, &Kc, &Vc})
      if (!detail::tma_strides(x->t))
        check::fail(*x, "positive strides on every dim of size > 1 for rung 2 (TMA)",
                    detail::concat("strides ", shape_str(x->t.strides)));
  if (plan != nullptr) {
    FLASHLAB_CHECK(plan->device == q.device.index, op, ": argument 'plan': expected a plan of q's device (", q.device.index,
                   "), got one of device ", plan->device);
    const std::pair<const check::Arg*, uint64_t> planned[] = {
        {&QP, plan->qo_indptr}, {&Ind, plan->kv_indices}, {&Ptr, plan->kv_indptr}, {&Last, plan->kv_last_page_len}};
    for (const auto& [arg, address] : planned)
      if (reinterpret_cast<uint64_t>(arg->t.data) != address)
        check::fail(*arg, detail::concat("the tensor the plan read (address 0x", std::hex, address, ")"),
                    detail::concat("address 0x", std::hex, reinterpret_cast<uint64_t>(arg->t.data)));
    if (plan->batch != batch) check::fail(Last, detail::concat("the plan's batch of ", plan->batch), detail::concat(batch));
    if (plan->total_q != total_q) check::fail(Q, detail::concat("the plan's ", plan->total_q, " rows"), detail::concat(total_q));
    if (plan->kv_pages > kv_indices.shape[0])
      check::fail(Ind, detail::concat("at least the plan's ", plan->kv_pages, " pages"), detail::concat(kv_indices.shape[0]));
    if (plan->page_size != c.page_size)
      check::fail(Kc, detail::concat("the plan's page size ", plan->page_size), detail::concat(c.page_size));
    if (plan->pages_used > c.max_pages)
      check::fail(Kc, detail::concat("a pool of at least ", plan->pages_used, " pages (the plan's largest page index + 1)"),
                  detail::concat(c.max_pages, " pages"));
    max_qo_len = plan->max_qo_len;
  }
  detail::DeviceGuard guard(q.device.index);
  // Rung 2 is built for sm_90a only, and maps the pool with TMA (an empty pool has no map): rung 1 takes over.
  if (rung == 2 && (detail::cc_major() != 9 || c.max_pages == 0)) rung = 1;
  // Last: the values (device reads, waiting for `stream`), unless capturing or planned.
  const bool capture = plan == nullptr && detail::capturing(stream);
  FLASHLAB_CHECK(!capture || max_qo_len >= 0, op, ": argument 'max_qo_len': expected the longest request's query count "
                 "while the stream is being captured (qo_indptr cannot be read), got ", max_qo_len);
  int64_t grid_rows = max_qo_len;
  if (plan == nullptr && !capture) {
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

}  // namespace

void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, const TensorView& k_cache,
                         const TensorView& v_cache, const TensorView& kv_indices, const TensorView& kv_indptr,
                         const TensorView& kv_last_page_len, const TensorView& out, const TensorView* lse, KvLayout layout,
                         const PagedPrefillOptions& options, int64_t max_qo_len, cudaStream_t stream, int rung) {
  prefill(kOp, nullptr, q, qo_indptr, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout, options,
          max_qo_len, stream, rung);
}

void batch_prefill_paged_run(const PrefillPlanInfo& plan, const TensorView& q, const TensorView& qo_indptr,
                             const TensorView& k_cache, const TensorView& v_cache, const TensorView& kv_indices,
                             const TensorView& kv_indptr, const TensorView& kv_last_page_len, const TensorView& out,
                             const TensorView* lse, KvLayout layout, const PagedPrefillOptions& options,
                             cudaStream_t stream, int rung) {
  prefill("batch_prefill_paged_run", &plan, q, qo_indptr, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out,
          lse, layout, options, plan.max_qo_len, stream, rung);
}

PrefillPlanInfo batch_prefill_paged_plan(const TensorView& qo_indptr, const TensorView& kv_indices,
                                         const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                                         int64_t page_size, cudaStream_t stream) {
  const char* op = "batch_prefill_paged_plan";
  const check::Arg QP{op, "qo_indptr", qo_indptr}, Ind{op, "kv_indices", kv_indices}, Ptr{op, "kv_indptr", kv_indptr},
      Last{op, "kv_last_page_len", kv_last_page_len};
  const bool host = qo_indptr.device.type == DeviceType::kCPU || qo_indptr.device.type == DeviceType::kCUDAHost;
  for (const check::Arg* a : {&QP, &Ind, &Ptr, &Last}) {
    if (!host) {
      detail::check_index(*a, QP);
      continue;
    }
    FLASHLAB_CHECK(a->t.device.type == qo_indptr.device.type, op, ": argument '", a->name, "': expected a tensor on ",
                   device_str(qo_indptr.device), " (as 'qo_indptr'), got ", device_str(a->t.device));
    check::dtype_in(*a, {DType::kI32});
    check::ndim(*a, 1);
    check::contiguous(*a);
  }
  const int64_t batch = kv_last_page_len.shape[0];
  check::shape(Ptr, {batch + 1});
  FLASHLAB_CHECK(batch <= 65535, op, ": argument 'kv_last_page_len': expected a batch of at most 65535 requests, got ", batch);
  check::shape(QP, {batch + 1});
  FLASHLAB_CHECK(page_size >= 1 && page_size <= std::numeric_limits<int>::max(), op,
                 ": argument 'page_size': expected a value in [1, 2^31), got ", page_size);
  std::vector<int> qo, ptr, last, ind;
  if (host) {
    const auto copy = [](const TensorView& t) {
      const int* x = static_cast<const int*>(t.data);
      return std::vector<int>(x, x + t.numel());
    };
    qo = copy(qo_indptr), ptr = copy(kv_indptr), last = copy(kv_last_page_len), ind = copy(kv_indices);
  } else {
    detail::DeviceGuard guard(qo_indptr.device.index);
    FLASHLAB_CHECK(!detail::capturing(stream), op, ": argument 'stream': expected a stream that is not being captured "
                   "(the plan reads the index tensors), got a capturing one");
    qo = detail::read_int32(qo_indptr, stream), ptr = detail::read_int32(kv_indptr, stream);
    last = detail::read_int32(kv_last_page_len, stream), ind = detail::read_int32(kv_indices, stream);
  }
  PrefillPlanInfo plan;
  int64_t largest = -1;
  detail::check_table_host_values(Ind, Ptr, Last, ptr, last, ind, batch, page_size, -1, &largest);
  plan.max_qo_len = detail::cu_seqlens_longest(QP, qo, batch);
  plan.batch = batch, plan.total_q = qo[batch], plan.page_size = page_size, plan.kv_pages = ptr[batch];
  plan.pages_used = largest + 1;
  plan.device = host ? -1 : qo_indptr.device.index;
  plan.qo_indptr = reinterpret_cast<uint64_t>(qo_indptr.data), plan.kv_indices = reinterpret_cast<uint64_t>(kv_indices.data);
  plan.kv_indptr = reinterpret_cast<uint64_t>(kv_indptr.data);
  plan.kv_last_page_len = reinterpret_cast<uint64_t>(kv_last_page_len.data);
  return plan;
}

}  // namespace flashlab
