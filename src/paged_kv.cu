// Host side of the paged KV cache's append (include/flashlab/serving.h): the tensors' checks,
// then the page table's and the tokens' values, read from the device unless the stream is being
// captured, then one launch (kernels/serving/paged_kv.cuh). The decode: src/paged_decode.cu.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/serving/paged_kv.cuh"
#include "src/paged_kv_validate.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"

namespace flashlab {

namespace {

constexpr const char* kOp = "append_paged_kv_cache";

}  // namespace

using detail::cache_strides;
using detail::CacheDims;
using detail::check_cache;
using detail::check_index;
using detail::check_outputs_disjoint;
using detail::check_table;
using detail::check_table_values;

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

}  // namespace flashlab
