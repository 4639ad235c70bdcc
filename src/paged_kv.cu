// Host side of the paged KV cache's append (include/flashlab/serving.h): the tensors' checks, the
// page table's and the tokens' values (read from the device unless the stream is being captured),
// then one launch of kernels/serving/paged_kv.cuh.
#include <cstdint>
#include <vector>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/serving/paged_kv.cuh"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "append_paged_kv_cache";

// K/V-like tensors: CUDA, fp16 / bf16 / fp32, rank `rank`, a contiguous head dim of whole
// 16-byte vectors, 16-byte aligned data and strides.
void check_rows(const check::Arg& a, int rank) {
  check::cuda(a);
  check::dtype_in(a, {DType::kF16, DType::kBF16, DType::kF32});
  check::ndim(a, rank);
  check::last_dim_contiguous(a);
  const int per16 = 16 / dtype_size(a.t.dtype);
  const int64_t d = a.t.shape.back();
  if (d < 1 || d % per16 != 0)
    check::fail(a, detail::concat("a head dim (last dim) that is a positive multiple of ", per16, " (16-byte vectors)"),
                detail::concat(d));
  check::aligned(a, 16);
  for (int dim = 0; dim + 1 < rank; ++dim)
    if (a.t.shape[dim] > 1 && a.t.strides[dim] % per16 != 0)
      check::fail(a, detail::concat("strides that are multiples of ", per16, " elements (16-byte aligned rows)"),
                  detail::concat("strides ", shape_str(a.t.strides)));
}

// int32 index arrays: CUDA, on `ref`'s device, 1-D contiguous.
void check_index(const check::Arg& a, const check::Arg& ref) {
  check::cuda(a);
  check::same_device(a, ref);
  check::dtype_in(a, {DType::kI32});
  check::ndim(a, 1);
  check::contiguous(a);
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v, const TensorView& batch_indices,
                           const TensorView& positions, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                           KvLayout layout, cudaStream_t stream) {
  const check::Arg Ak{kOp, "append_k", append_k}, Av{kOp, "append_v", append_v}, Bi{kOp, "batch_indices", batch_indices},
      Pos{kOp, "positions", positions}, Kc{kOp, "k_cache", k_cache}, Vc{kOp, "v_cache", v_cache},
      Ind{kOp, "kv_indices", kv_indices}, Ptr{kOp, "kv_indptr", kv_indptr}, Last{kOp, "kv_last_page_len", kv_last_page_len};
  FLASHLAB_CHECK(layout == KvLayout::kNHD || layout == KvLayout::kHND, kOp, ": argument 'layout': expected NHD or HND, got ",
                 static_cast<int>(layout));
  check_rows(Kc, 4);
  check_rows(Vc, 4);
  check::same_device(Vc, Kc);
  check::dtype_eq(Vc, Kc);
  check::shape_eq(Vc, Kc);
  const bool nhd = layout == KvLayout::kNHD;
  const int64_t max_pages = k_cache.shape[0], page_size = k_cache.shape[nhd ? 1 : 2];
  const int64_t nheads = k_cache.shape[nhd ? 2 : 1], d = k_cache.shape[3];
  FLASHLAB_CHECK(page_size >= 1 && page_size <= 0x7fffffff && nheads <= 0x7fffffff && d <= 0x7fffffff, kOp,
                 ": argument 'k_cache': expected page_size >= 1 and every size < 2^31, got ", shape_str(k_cache.shape));
  check_rows(Ak, 3);
  check_rows(Av, 3);
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
  check_index(Ind, Kc);
  check_index(Ptr, Kc);
  check_index(Last, Kc);
  const int64_t batch = kv_last_page_len.shape[0];
  check::shape(Ptr, {batch + 1});
  // The caches are written: disjoint from every input and from each other.
  for (const check::Arg* out : {&Kc, &Vc}) {
    for (const check::Arg* in : {&Ak, &Av, &Bi, &Pos, &Ind, &Ptr, &Last}) {
      check::no_overlap(*out, *in);
      if (out->t.numel() > 0 && in->t.numel() > 0 && out->t.data == in->t.data)
        check::fail(*out, detail::concat("memory disjoint from '", in->name, "'"), detail::concat("the same memory as '", in->name, "'"));
    }
  }
  check::no_overlap(Kc, Vc);
  if (k_cache.data == v_cache.data) check::fail(Vc, "memory disjoint from 'k_cache'", "the same memory as 'k_cache'");

  detail::DeviceGuard guard(k_cache.device.index);
  if (!detail::capturing(stream)) {
    // The values: the page table, then each token's request and position against it.
    const std::vector<int> ptr = detail::read_int32(kv_indptr, stream), last = detail::read_int32(kv_last_page_len, stream),
                           ind = detail::read_int32(kv_indices, stream), bi = detail::read_int32(batch_indices, stream),
                           pos = detail::read_int32(positions, stream);
    if (ptr[0] != 0) check::fail(Ptr, "kv_indptr[0] = 0", detail::concat("kv_indptr[0] = ", ptr[0]));
    std::vector<int64_t> len(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      if (ptr[b + 1] < ptr[b])
        check::fail(Ptr, "non-decreasing values", detail::concat("kv_indptr[", b + 1, "] = ", ptr[b + 1], " < kv_indptr[", b, "] = ", ptr[b]));
      const int64_t pages = ptr[b + 1] - ptr[b];
      if (pages > 0 ? last[b] < 1 || last[b] > page_size : last[b] != 0)
        check::fail(Last, pages > 0 ? detail::concat("values in [1, page_size = ", page_size, "] for requests with pages")
                                    : std::string("0 for a request without pages"),
                    detail::concat("kv_last_page_len[", b, "] = ", last[b], " (", pages, " pages)"));
      len[b] = pages > 0 ? (pages - 1) * page_size + last[b] : 0;
    }
    if (ptr[batch] > kv_indices.shape[0])
      check::fail(Ind, detail::concat("at least kv_indptr[", batch, "] = ", ptr[batch], " pages"), detail::concat(kv_indices.shape[0]));
    for (int64_t x = 0; x < ptr[batch]; ++x)
      if (ind[x] < 0 || ind[x] >= max_pages)
        check::fail(Ind, detail::concat("page indices in [0, ", max_pages, ") (the pages of 'k_cache')"),
                    detail::concat("kv_indices[", x, "] = ", ind[x]));
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
  const int slot_dim = nhd ? 1 : 2, head_dim = nhd ? 2 : 1;
  p.page_stride = k_cache.strides[0], p.slot_stride = k_cache.strides[slot_dim], p.head_stride = k_cache.strides[head_dim];
  p.v_page_stride = v_cache.strides[0], p.v_slot_stride = v_cache.strides[slot_dim], p.v_head_stride = v_cache.strides[head_dim];
  p.kv_indices = static_cast<const int*>(kv_indices.data), p.kv_indptr = static_cast<const int*>(kv_indptr.data);
  p.nnz = nnz, p.nheads = static_cast<int>(nheads), p.headdim = static_cast<int>(d), p.page_size = static_cast<int>(page_size);
  const int64_t vectors = nnz * nheads * (d * dtype_size(k_cache.dtype) / 16);
  FLASHLAB_CHECK(vectors / 256 < 0x7fffffff, kOp, ": argument 'append_k': expected fewer than 2^31 x 256 16-byte vectors, got ",
                 vectors);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(vectors, 256)));
  DTYPE_SWITCH(k_cache.dtype, T, [&] { FLASHLAB_LAUNCH(kernels::paged_kv_append_kernel<T>, grid, 256, 0, stream, p); });
}

}  // namespace flashlab
