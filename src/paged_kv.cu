// Host side of the paged KV cache's ops (include/flashlab/serving.h): the append and the batch
// decode. The tensors' checks, then the page table's (and the tokens') values, read from the
// device unless the stream is being captured, then one launch (kernels/serving/paged_kv.cuh,
// kernels/attention/decode/).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/attention/decode/01_naive.cuh"
#include "kernels/attention/decode/02_gqa.cuh"
#include "kernels/serving/paged_kv.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "append_paged_kv_cache";

// int32 index arrays: CUDA, on `ref`'s device, 1-D contiguous.
void check_index(const check::Arg& a, const check::Arg& ref) {
  check::cuda(a);
  check::same_device(a, ref);
  check::dtype_in(a, {DType::kI32});
  check::ndim(a, 1);
  check::contiguous(a);
}

// The caches: rank 4, one dtype and shape, page_size >= 1; their dims by layout.
struct CacheDims {
  int64_t max_pages, page_size, nheads, d;
};
CacheDims check_cache(const check::Arg& Kc, const check::Arg& Vc, KvLayout layout) {
  FLASHLAB_CHECK(layout == KvLayout::kNHD || layout == KvLayout::kHND, Kc.op, ": argument 'layout': expected NHD or HND, got ",
                 static_cast<int>(layout));
  check::vector_rows(Kc, 4);
  check::vector_rows(Vc, 4);
  check::same_device(Vc, Kc);
  check::dtype_eq(Vc, Kc);
  check::shape_eq(Vc, Kc);
  const std::vector<int64_t>& shape = Kc.t.shape;
  const bool nhd = layout == KvLayout::kNHD;
  const CacheDims c{shape[0], shape[nhd ? 1 : 2], shape[nhd ? 2 : 1], shape[3]};
  FLASHLAB_CHECK(c.page_size >= 1 && c.page_size <= 0x7fffffff && c.nheads <= 0x7fffffff && c.d <= 0x7fffffff, Kc.op,
                 ": argument 'k_cache': expected page_size >= 1 and every size < 2^31, got ", shape_str(shape));
  return c;
}

// The page table's tensors (host checks): int32, 1-D, kv_indptr (batch + 1,) for kv_last_page_len
// (batch,); returns batch.
int64_t check_table(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, const check::Arg& ref) {
  check_index(Ind, ref);
  check_index(Ptr, ref);
  check_index(Last, ref);
  const int64_t batch = Last.t.shape[0];
  check::shape(Ptr, {batch + 1});
  return batch;
}

// The page table's values (read from the device): kv_indptr from 0 and non-decreasing, page
// indices in [0, max_pages), kv_last_page_len in [1, page_size] (0 without pages). Returns each
// request's KV length.
std::vector<int64_t> check_table_values(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, int64_t batch,
                                        const CacheDims& c, cudaStream_t stream) {
  const std::vector<int> ptr = detail::read_int32(Ptr.t, stream), last = detail::read_int32(Last.t, stream),
                         ind = detail::read_int32(Ind.t, stream);
  if (ptr[0] != 0) check::fail(Ptr, "kv_indptr[0] = 0", detail::concat("kv_indptr[0] = ", ptr[0]));
  std::vector<int64_t> len(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    if (ptr[b + 1] < ptr[b])
      check::fail(Ptr, "non-decreasing values", detail::concat("kv_indptr[", b + 1, "] = ", ptr[b + 1], " < kv_indptr[", b, "] = ", ptr[b]));
    const int64_t pages = ptr[b + 1] - ptr[b];
    if (pages > 0 ? last[b] < 1 || last[b] > c.page_size : last[b] != 0)
      check::fail(Last, pages > 0 ? detail::concat("values in [1, page_size = ", c.page_size, "] for requests with pages")
                                  : std::string("0 for a request without pages"),
                  detail::concat("kv_last_page_len[", b, "] = ", last[b], " (", pages, " pages)"));
    len[b] = pages > 0 ? (pages - 1) * c.page_size + last[b] : 0;
    if (len[b] > 0x7fffffff)
      check::fail(Ptr, "requests of fewer than 2^31 tokens", detail::concat("request ", b, ": ", pages, " pages of ", c.page_size));
  }
  if (ptr[batch] > Ind.t.shape[0])
    check::fail(Ind, detail::concat("at least kv_indptr[", batch, "] = ", ptr[batch], " pages"), detail::concat(Ind.t.shape[0]));
  for (int64_t x = 0; x < ptr[batch]; ++x)
    if (ind[x] < 0 || ind[x] >= c.max_pages)
      check::fail(Ind, detail::concat("page indices in [0, ", c.max_pages, ") (the pages of 'k_cache')"),
                  detail::concat("kv_indices[", x, "] = ", ind[x]));
  return len;
}

// Element strides (page, slot, head) of a cache in `layout`.
void cache_strides(const TensorView& t, KvLayout layout, int64_t& page, int64_t& slot, int64_t& head) {
  const bool nhd = layout == KvLayout::kNHD;
  page = t.strides[0], slot = t.strides[nhd ? 1 : 2], head = t.strides[nhd ? 2 : 1];
}

// Outputs written by a kernel: disjoint from every input.
void check_outputs_disjoint(std::initializer_list<const check::Arg*> outs, std::initializer_list<const check::Arg*> ins) {
  for (const check::Arg* out : outs)
    for (const check::Arg* in : ins) check::disjoint(*out, *in);
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v, const TensorView& batch_indices,
                           const TensorView& positions, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                           KvLayout layout, cudaStream_t stream) {
  const check::Arg Ak{kOp, "append_k", append_k}, Av{kOp, "append_v", append_v}, Bi{kOp, "batch_indices", batch_indices},
      Pos{kOp, "positions", positions}, Kc{kOp, "k_cache", k_cache}, Vc{kOp, "v_cache", v_cache},
      Ind{kOp, "kv_indices", kv_indices}, Ptr{kOp, "kv_indptr", kv_indptr}, Last{kOp, "kv_last_page_len", kv_last_page_len};
  const CacheDims c = check_cache(Kc, Vc, layout);
  const int64_t nheads = c.nheads, d = c.d;
  check::vector_rows(Ak, 3);
  check::vector_rows(Av, 3);
  for (const check::Arg* a : {&Ak, &Av}) {
    check::same_device(*a, Kc);
    check::dtype_eq(*a, Kc);
  }
  const int64_t nnz = append_k.shape[0];
  check::shape(Ak, {nnz, nheads, d});
  check::shape(Av, {nnz, nheads, d});
  check_index(Bi, Kc);
  check_index(Pos, Kc);
  check::shape(Bi, {nnz});
  check::shape(Pos, {nnz});
  const int64_t batch = check_table(Ind, Ptr, Last, Kc);
  check_outputs_disjoint({&Kc, &Vc}, {&Ak, &Av, &Bi, &Pos, &Ind, &Ptr, &Last});
  check::disjoint(Vc, Kc);  // k and v of one (max_pages, 2, ...) tensor interleave: allowed

  detail::DeviceGuard guard(k_cache.device.index);
  if (!detail::capturing(stream)) {
    // The values: the page table, then each token's request and position against it.
    const std::vector<int64_t> len = check_table_values(Ind, Ptr, Last, batch, c, stream);
    const std::vector<int> bi = detail::read_int32(batch_indices, stream), pos = detail::read_int32(positions, stream);
    for (int64_t i = 0; i < nnz; ++i) {
      if (bi[i] < 0 || bi[i] >= batch)
        check::fail(Bi, detail::concat("requests in [0, ", batch, ")"), detail::concat("batch_indices[", i, "] = ", bi[i]));
      if (pos[i] < 0 || pos[i] >= len[bi[i]])
        check::fail(Pos, detail::concat("positions inside the request's KV length (the page table covers the new tokens)"),
                    detail::concat("positions[", i, "] = ", pos[i], " for request ", bi[i], " of length ", len[bi[i]]));
    }
  }
  if (nnz == 0 || nheads == 0) return;

  kernels::PagedKvAppendParams p{};
  p.append_k = append_k.data, p.append_v = append_v.data;
  p.append_row_stride = append_k.strides[0], p.append_head_stride = append_k.strides[1];
  p.append_v_row_stride = append_v.strides[0], p.append_v_head_stride = append_v.strides[1];
  p.batch_indices = static_cast<const int*>(batch_indices.data), p.positions = static_cast<const int*>(positions.data);
  p.k_cache = k_cache.data, p.v_cache = v_cache.data;
  cache_strides(k_cache, layout, p.page_stride, p.slot_stride, p.head_stride);
  cache_strides(v_cache, layout, p.v_page_stride, p.v_slot_stride, p.v_head_stride);
  p.kv_indices = static_cast<const int*>(kv_indices.data), p.kv_indptr = static_cast<const int*>(kv_indptr.data);
  p.nnz = nnz, p.nheads = static_cast<int>(nheads), p.headdim = static_cast<int>(d), p.page_size = static_cast<int>(c.page_size);
  const int64_t vectors = nnz * nheads * (d * dtype_size(k_cache.dtype) / 16);
  FLASHLAB_CHECK(vectors / 256 < 0x7fffffff, kOp, ": argument 'append_k': expected fewer than 2^31 x 256 16-byte vectors, got ",
                 vectors);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(vectors, 256)));
  DTYPE_SWITCH(k_cache.dtype, T, [&] { FLASHLAB_LAUNCH(kernels::paged_kv_append_kernel<T>, grid, 256, 0, stream, p); });
}

void batch_decode_paged(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                        const TensorView& out, const TensorView* lse, KvLayout layout, float softmax_scale,
                        cudaStream_t stream, int rung) {
  constexpr const char* op = "batch_decode_paged";
  check::rung(op, rung, kPagedDecodeRungs);
  const check::Arg Q{op, "q", q}, Kc{op, "k_cache", k_cache}, Vc{op, "v_cache", v_cache}, Ind{op, "kv_indices", kv_indices},
      Ptr{op, "kv_indptr", kv_indptr}, Last{op, "kv_last_page_len", kv_last_page_len}, O{op, "out", out};
  const CacheDims c = check_cache(Kc, Vc, layout);
  check::vector_rows(Q, 3);
  check::same_device(Q, Kc);
  check::dtype_eq(Q, Kc);
  const int64_t batch = check_table(Ind, Ptr, Last, Kc);
  const int64_t nheads = q.shape[1];
  check::shape(Q, {batch, nheads, c.d});
  if (c.d != 32 && c.d != 64 && c.d != 96 && c.d != 128 && c.d != 192 && c.d != 256)
    check::fail(Q, "a head dim (last dim) of 32, 64, 96, 128, 192 or 256", detail::concat(c.d));
  if (c.nheads < 1 || nheads % c.nheads != 0 || nheads > 0x7fffffff || c.nheads * nheads > 0x7fffffff)
    check::fail(Q, detail::concat("nheads (dim 1) a multiple of the cache's KV heads (", c.nheads, ")"), detail::concat(nheads));
  FLASHLAB_CHECK(batch <= 65535, op, ": argument 'kv_last_page_len': expected a batch of at most 65535 requests, got ", batch);
  check::vector_rows(O, 3);
  check::same_device(O, Q);
  check::dtype_eq(O, Q);
  check::shape_eq(O, Q);
  const check::Arg L{op, "lse", lse != nullptr ? *lse : out};
  if (lse != nullptr) {
    check::cuda(L);
    check::same_device(L, Q);
    check::dtype_in(L, {DType::kF32});
    check::shape(L, {batch, nheads});
    check::contiguous(L);
    check::aligned(L, 4);
    check_outputs_disjoint({&L}, {&Q, &Kc, &Vc, &Ind, &Ptr, &Last, &O});
  }
  check_outputs_disjoint({&O}, {&Q, &Kc, &Vc, &Ind, &Ptr, &Last});
  FLASHLAB_CHECK(std::isnan(softmax_scale) || std::isfinite(softmax_scale), op,
                 ": argument 'softmax_scale': expected a finite value, got ", softmax_scale);

  detail::DeviceGuard guard(q.device.index);
  if (!detail::capturing(stream)) check_table_values(Ind, Ptr, Last, batch, c, stream);
  if (batch == 0 || nheads == 0) return;

  kernels::PagedDecodeParams p{};
  p.q = q.data, p.q_batch_stride = q.strides[0], p.q_head_stride = q.strides[1];
  p.k_cache = k_cache.data, p.v_cache = v_cache.data;
  cache_strides(k_cache, layout, p.page_stride, p.slot_stride, p.head_stride);
  cache_strides(v_cache, layout, p.v_page_stride, p.v_slot_stride, p.v_head_stride);
  p.kv_indices = static_cast<const int*>(kv_indices.data), p.kv_indptr = static_cast<const int*>(kv_indptr.data);
  p.kv_last_page_len = static_cast<const int*>(kv_last_page_len.data);
  p.out = out.data, p.out_batch_stride = out.strides[0], p.out_head_stride = out.strides[1];
  p.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  p.scale = std::isnan(softmax_scale) || softmax_scale <= 0.f ? 1.f / std::sqrt(static_cast<float>(c.d)) : softmax_scale;
  p.batch = static_cast<int>(batch), p.nheads = static_cast<int>(nheads), p.nheads_kv = static_cast<int>(c.nheads);
  p.page_size = static_cast<int>(c.page_size);
  const int64_t group = nheads / c.nheads;
  // Rung 2: kG query heads a block, the smallest power of two >= the group, at most 8.
  const int kg = group >= 5 ? 8 : group >= 3 ? 4 : static_cast<int>(group);
  DTYPE_SWITCH(q.dtype, T, [&] {
    HEADDIM_SWITCH(static_cast<int>(c.d), kD, [&] {
      if (rung == 1) {
        const dim3 grid(static_cast<unsigned>(nheads), static_cast<unsigned>(batch));
        FLASHLAB_LAUNCH((kernels::paged_decode_naive_kernel<T, kD>), grid, 128, 0, stream, p);
        return;
      }
      const auto launch = [&](auto kg_tag) {
        constexpr int kG = decltype(kg_tag)::value;
        const dim3 grid(static_cast<unsigned>(c.nheads * ((group + kG - 1) / kG)), static_cast<unsigned>(batch));
        FLASHLAB_LAUNCH((kernels::paged_decode_gqa_kernel<T, kD, kG>), grid, 128, 0, stream, p);
      };
      if (kg == 8) launch(std::integral_constant<int, 8>{});
      else if (kg == 4) launch(std::integral_constant<int, 4>{});
      else if (kg == 2) launch(std::integral_constant<int, 2>{});
      else launch(std::integral_constant<int, 1>{});
    });
  });
}

}  // namespace flashlab
