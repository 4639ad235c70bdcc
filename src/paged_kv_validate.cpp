// Checks shared by the paged KV cache's ops (src/paged_kv.cu, src/paged_decode.cu).
#include "src/paged_kv_validate.h"

#include <algorithm>
#include <string>

#include "src/core/launch.h"

namespace flashlab::detail {

void check_index(const check::Arg& a, const check::Arg& ref) {
  check::cuda(a);
  check::same_device(a, ref);
  check::dtype_in(a, {DType::kI32});
  check::ndim(a, 1);
  check::contiguous(a);
}

CacheDims check_cache(const check::Arg& Kc, const check::Arg& Vc, KvLayout layout, bool fp8_ok) {
  FLASHLAB_CHECK(layout == KvLayout::kNHD || layout == KvLayout::kHND, Kc.op, ": argument 'layout': expected NHD or HND, got ",
                 static_cast<int>(layout));
  if (fp8_ok) {
    check::vector_rows(Kc, 4, {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3});
  } else {
    check::vector_rows(Kc, 4);
  }
  check::vector_rows(Vc, 4, {Kc.t.dtype});
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

int64_t check_table(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, const check::Arg& ref) {
  check_index(Ind, ref);
  check_index(Ptr, ref);
  check_index(Last, ref);
  const int64_t batch = Last.t.shape[0];
  check::shape(Ptr, {batch + 1});
  return batch;
}

std::vector<int64_t> check_table_values(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last, int64_t batch,
                                        const CacheDims& c, cudaStream_t stream) {
  const std::vector<int> ptr = detail::read_int32(Ptr.t, stream), last = detail::read_int32(Last.t, stream),
                         ind = detail::read_int32(Ind.t, stream);
  return check_table_host_values(Ind, Ptr, Last, ptr, last, ind, batch, c.page_size, c.max_pages, nullptr);
}

std::vector<int64_t> check_table_host_values(const check::Arg& Ind, const check::Arg& Ptr, const check::Arg& Last,
                                             const std::vector<int>& ptr, const std::vector<int>& last,
                                             const std::vector<int>& ind, int64_t batch, int64_t page_size,
                                             int64_t max_pages, int64_t* max_index) {
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
    if (len[b] > 0x7fffffff)
      check::fail(Ptr, "requests of fewer than 2^31 tokens", detail::concat("request ", b, ": ", pages, " pages of ", page_size));
  }
  if (ptr[batch] > Ind.t.shape[0])
    check::fail(Ind, detail::concat("at least kv_indptr[", batch, "] = ", ptr[batch], " pages"), detail::concat(Ind.t.shape[0]));
  int64_t largest = -1;
  for (int64_t x = 0; x < ptr[batch]; ++x) {
    if (ind[x] < 0 || (max_pages >= 0 && ind[x] >= max_pages))
      check::fail(Ind, max_pages >= 0 ? detail::concat("page indices in [0, ", max_pages, ") (the pages of 'k_cache')")
                                      : std::string("page indices >= 0"),
                  detail::concat("kv_indices[", x, "] = ", ind[x]));
    largest = std::max<int64_t>(largest, ind[x]);
  }
  if (max_index != nullptr) *max_index = largest;
  return len;
}

void cache_strides(const TensorView& t, KvLayout layout, int64_t& page, int64_t& slot, int64_t& head) {
  const bool nhd = layout == KvLayout::kNHD;
  page = t.strides[0], slot = t.strides[nhd ? 1 : 2], head = t.strides[nhd ? 2 : 1];
}

void check_outputs_disjoint(std::initializer_list<const check::Arg*> outs, std::initializer_list<const check::Arg*> ins) {
  for (const check::Arg* out : outs)
    for (const check::Arg* in : ins) check::disjoint(*out, *in);
}

}  // namespace flashlab::detail
