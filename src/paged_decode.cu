// Host side of the batch decode over a paged KV cache (include/flashlab/serving.h): the tensors'
// checks, the page table's values (read from the device unless the stream is being captured),
// rung 3's split plan (src/serving_plan.cpp) and workspace, and the launches
// (kernels/attention/decode/).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <string>
#include <type_traits>
#include <vector>

#include "flashlab/serving.h"
#include "flashlab/validate.h"
#include "kernels/attention/decode/01_naive.cuh"
#include "kernels/attention/decode/02_gqa.cuh"
#include "kernels/attention/decode/03_split.cuh"
#include "kernels/attention/decode/03_split_ws.cuh"
#include "src/attention_launch.h"
#include "src/core/launch.h"
#include "src/core/static_switch.h"
#include "src/core/tensor_map.h"
#include "src/paged_kv_validate.h"
#include "src/serving_plan.h"

namespace flashlab {

namespace {

using detail::CacheDims;

// A checked decode call: the kernels' parameters and the arguments for the later checks.
struct DecodeCall {
  kernels::PagedDecodeParams p{};
  CacheDims c{};
  int64_t batch = 0, nheads = 0;
  DType dtype = DType::kF32;  // q's and out's
  bool fp8 = false;           // the cache is e4m3 (rung 3 only, with k_scale / v_scale)
  float k_scale = 1.f, v_scale = 1.f;
};

// Every host-side check of a decode's tensors (batch_decode_paged and batch_decode_run).
DecodeCall check_decode(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                        const TensorView& out, const TensorView* lse, KvLayout layout, float softmax_scale,
                        float k_scale, float v_scale) {
  const check::Arg Q{op, "q", q}, Kc{op, "k_cache", k_cache}, Vc{op, "v_cache", v_cache}, Ind{op, "kv_indices", kv_indices},
      Ptr{op, "kv_indptr", kv_indptr}, Last{op, "kv_last_page_len", kv_last_page_len}, O{op, "out", out};
  DecodeCall call;
  const CacheDims c = call.c = detail::check_cache(Kc, Vc, layout, /*fp8_ok=*/true);
  check::vector_rows(Q, 3);
  check::same_device(Q, Kc);
  call.fp8 = k_cache.dtype == DType::kE4M3;
  if (call.fp8) {  // an FP8 cache: 16-bit queries, positive finite scales
    check::dtype_in(Q, {DType::kF16, DType::kBF16});
    FLASHLAB_CHECK(std::isfinite(k_scale) && k_scale > 0.f, op, ": argument 'k_scale': expected a positive finite value, got ",
                   k_scale);
    FLASHLAB_CHECK(std::isfinite(v_scale) && v_scale > 0.f, op, ": argument 'v_scale': expected a positive finite value, got ",
                   v_scale);
  } else {
    check::dtype_eq(Q, Kc);
    FLASHLAB_CHECK(k_scale == 1.f && v_scale == 1.f, op, ": arguments 'k_scale', 'v_scale': expected 1 for a ",
                   dtype_name(k_cache.dtype), " cache (scales are for e4m3 caches), got ", k_scale, ", ", v_scale);
  }
  call.k_scale = k_scale, call.v_scale = v_scale;
  const int64_t batch = detail::check_table(Ind, Ptr, Last, Kc);
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
    detail::check_outputs_disjoint({&L}, {&Q, &Kc, &Vc, &Ind, &Ptr, &Last, &O});
  }
  detail::check_outputs_disjoint({&O}, {&Q, &Kc, &Vc, &Ind, &Ptr, &Last});
  FLASHLAB_CHECK(std::isnan(softmax_scale) || std::isfinite(softmax_scale), op,
                 ": argument 'softmax_scale': expected a finite value, got ", softmax_scale);

  kernels::PagedDecodeParams& p = call.p;
  p.q = q.data, p.q_batch_stride = q.strides[0], p.q_head_stride = q.strides[1];
  p.k_cache = k_cache.data, p.v_cache = v_cache.data;
  detail::cache_strides(k_cache, layout, p.page_stride, p.slot_stride, p.head_stride);
  detail::cache_strides(v_cache, layout, p.v_page_stride, p.v_slot_stride, p.v_head_stride);
  p.kv_indices = static_cast<const int*>(kv_indices.data), p.kv_indptr = static_cast<const int*>(kv_indptr.data);
  p.kv_last_page_len = static_cast<const int*>(kv_last_page_len.data);
  p.out = out.data, p.out_batch_stride = out.strides[0], p.out_head_stride = out.strides[1];
  p.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  p.scale = std::isnan(softmax_scale) || softmax_scale <= 0.f ? 1.f / std::sqrt(static_cast<float>(c.d)) : softmax_scale;
  p.batch = static_cast<int>(batch), p.nheads = static_cast<int>(nheads), p.nheads_kv = static_cast<int>(c.nheads);
  p.page_size = static_cast<int>(c.page_size);
  call.batch = batch, call.nheads = nheads, call.dtype = q.dtype;
  return call;
}

// The page table's values: checked by a device read unless `stream` is being captured; the
// requests' KV lengths (empty when not read).
std::vector<int64_t> check_values(const char* op, const TensorView& kv_indices, const TensorView& kv_indptr,
                                  const TensorView& kv_last_page_len, const DecodeCall& call, cudaStream_t stream) {
  if (detail::capturing(stream)) return {};
  const check::Arg Ind{op, "kv_indices", kv_indices}, Ptr{op, "kv_indptr", kv_indptr},
      Last{op, "kv_last_page_len", kv_last_page_len};
  return detail::check_table_values(Ind, Ptr, Last, call.batch, call.c, stream);
}

// Rung 3 ----------------------------------------------------------------------------------------

// The work items of one chunk: KV heads x blocks of 16 query heads.
int64_t items_per_chunk(int64_t nheads, int64_t nheads_kv) {
  const int64_t group = nheads / nheads_kv, rows = kernels::DecodeSplitTraits<128>::kRows;
  return nheads_kv * ((group + rows - 1) / rows);
}

// Whether rung 3 has a TMA kernel for head dim d and a cache of kv_bytes-byte elements: rows of
// whole 128-byte lines, and e4m3 at head dim 128 only (at 256 its TMA kernel spilled registers).
// The shape's part of tma_box_rows' conditions (sm_90 and the cache's strides are the rest).
constexpr bool has_tma_kernel(int64_t d, int64_t kv_bytes) { return d * kv_bytes % 128 == 0 && (kv_bytes == 2 || d == 128); }

// Opts a rung 3 kernel into its shared memory (beyond 48 KB) and the largest carveout (the
// cp.async kernel: 2 blocks of 106 KB at d 128), before an occupancy query or a launch.
template <typename Kernel>
void configure_split(Kernel kernel, int smem) {
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
}

// Whether rung 3's shared memory at head dim d fits a block on the current device (16-bit
// caches: 106 KB at d 128, 206 KB at d 256 — more than sm_86 / sm_89's 99 KB and sm_80's 163 KB;
// e4m3: 70 / 138 KB).
bool split_fits(int64_t d, bool fp8) {
  return HEADDIM_SWITCH(static_cast<int>(d), kD, [&] {
    return (fp8 ? kernels::DecodeSplitTraits<kD, 1>::kSmemBytes : kernels::DecodeSplitTraits<kD>::kSmemBytes) <=
           detail::max_smem_optin();
  });
}

// The persistent kernel's (03_split_ws.cuh) blocks resident at once on the current device at
// head dim kD (a multiple of 64), opted into its shared memory first.
template <int kD>
int64_t persistent_slots() {
  using Ws = kernels::DecodeWsTraits<kD>;
  const auto kernel = kernels::paged_decode_split_ws_kernel<__nv_bfloat16, kD>;
  configure_split(kernel, Ws::kSmemBytes);
  int per_sm = 0;
  FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Ws::kThreads, Ws::kSmemBytes));
  return static_cast<int64_t>(std::max(per_sm, 1)) * detail::sm_count();
}

// Blocks of rung 3 resident at once on the current device (`device`, the cache's key) at head
// dim d for a 16-bit or an e4m3 cache, cached per (device, d, fp8): the occupancy of the
// bf16-query kernel (fp16's is the same) that a cache with TMA-able strides runs on this device
// (sm_90 at head dims whose rows are whole 128-byte lines: the TMA kernels, the 16-bit one the
// persistent kernel of 03_split_ws.cuh — 1 block an SM at d 128, by registers — whose grid these
// slots are), else the cp.async kernel (2 at d 128, by shared memory). Only for a kernel that
// fits (split_fits).
int64_t split_slots(int64_t d, int device, bool fp8) {
  static std::mutex mu;
  static std::map<std::tuple<int, int64_t, bool>, int64_t> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find({device, d, fp8});
    if (it != cache.end()) return it->second;
  }
  const int64_t slots = HEADDIM_SWITCH(static_cast<int>(d), kD, [&] {
    const auto occupancy = [&](auto kv_tag) {
      using KV = typename decltype(kv_tag)::type;
      const auto blocks = [&](auto tma_tag) {
        constexpr bool kTma = decltype(tma_tag)::value;
        using Tr = kernels::DecodeSplitTraits<kD, static_cast<int>(sizeof(KV)), kTma>;
        const auto kernel = kernels::paged_decode_split_kernel<__nv_bfloat16, kD, KV, kTma>;
        constexpr int smem = kTma ? Tr::kSmemBytesTma : Tr::kSmemBytes;
        configure_split(kernel, smem);
        int per_sm = 0;
        FLASHLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, smem));
        return static_cast<int64_t>(std::max(per_sm, 1)) * detail::sm_count();
      };
      // (The same shared-memory rule as tma_box_rows: where the TMA kernel does not fit, cp.async runs.)
      if constexpr (has_tma_kernel(kD, sizeof(KV))) {
        if (detail::cc_major() >= 9) {
          if constexpr (sizeof(KV) == 2) {  // the persistent kernel's grid, where it fits (else cp.async runs)
            if (kernels::DecodeWsTraits<kD>::kSmemBytes <= detail::max_smem_optin()) return persistent_slots<kD>();
          } else {
            return blocks(std::true_type{});
          }
        }
      }
      return blocks(std::false_type{});
    };
    return fp8 ? occupancy(detail::TypeTag<__nv_fp8_e4m3>{}) : occupancy(detail::TypeTag<__nv_bfloat16>{});
  });
  std::lock_guard<std::mutex> lock(mu);
  cache[{device, d, fp8}] = slots;
  return slots;
}

// A plan's workspace: [header: num_items, batch, plan id (int32 each), padded to 16 | items int4 x capacity | request_items
// int32 x (batch + 1), padded | claims int32 x 2 (the persistent kernel's counts, 0 between
// launches), padded | partial lse fp32 x capacity x nheads, padded | partial O fp32 x capacity x
// nheads x d]. The plan copies everything before the partial states (the claims as 0). The
// capacity (the run's item grid) depends on the shape only: the batch plus room for two waves'
// worth of extra chunks.
struct SplitLayout {
  int64_t slots = 0, capacity = 0, items = 0, request_items = 0, claims = 0, lse = 0, o = 0, bytes = 0;
};
int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }
// `fp8`: the planner's slots are the e4m3 kernel's; the capacity (and so the workspace) is sized
// for the larger of the two slot counts, so one workspace size serves either cache.
SplitLayout split_layout(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t d, int device, bool fp8 = false) {
  SplitLayout s;
  detail::DeviceGuard guard(device);
  // A kernel whose shared memory does not fit this device has no slots (e4m3 fits more often).
  const int64_t slots16 = split_fits(d, false) ? split_slots(d, device, false) : 0,
                slots8 = split_fits(d, true) ? split_slots(d, device, true) : 0;
  s.slots = fp8 ? slots8 : slots16;
  const int64_t cap_slots = std::max(slots16, slots8);
  FLASHLAB_CHECK(cap_slots > 0, "batch_decode: decode rung 3 at head dim ", d,
                 " needs more shared memory per block than this device allows (", detail::max_smem_optin(), " bytes)");
  const int64_t per = items_per_chunk(nheads, nheads_kv);
  s.capacity = batch + 2 * ((cap_slots + per - 1) / per);
  FLASHLAB_CHECK(s.capacity * per <= 0x7fffffff && nheads <= 65535, "batch_decode_paged / batch_decode_plan: expected fewer than 2^31 work items and ",
                 "at most 65535 query heads, got ", s.capacity, " x ", per, " items, ", nheads, " heads");
  s.items = 16;
  s.request_items = s.items + s.capacity * 16;
  s.claims = s.request_items + pad16((batch + 1) * 4);
  s.lse = s.claims + 16;
  s.o = s.lse + pad16(s.capacity * nheads * 4);
  s.bytes = s.o + s.capacity * nheads * d * 4;
  return s;
}

// Plans on the host and enqueues the copy of the plan's metadata (everything before the partial
// states) to `ws` on `stream`.
DecodePlanInfo plan_into(const std::vector<int64_t>& pages, int64_t page_size, int64_t nheads, int64_t nheads_kv,
                         int64_t d, int device, bool fp8, void* ws, cudaStream_t stream) {
  const auto batch = static_cast<int64_t>(pages.size());
  const SplitLayout s = split_layout(batch, nheads, nheads_kv, d, device, fp8);
  FLASHLAB_CHECK(s.slots > 0, "batch_decode_plan: decode rung 3 at head dim ", d, " with ", fp8 ? "an e4m3" : "a 16-bit",
                 " cache needs more shared memory per block than this device allows");
  // An item's fixed cost (its start, the first tiles' latency, the merge's share) ~ 64 keys.
  const int64_t overhead = (64 + page_size - 1) / page_size;
  const detail::DecodePlan plan =
      detail::plan_decode(pages, items_per_chunk(nheads, nheads_kv), s.slots, s.capacity, overhead);
  std::vector<unsigned char> host(static_cast<size_t>(s.lse), 0);
  // The header: the item count the kernel reads, and the batch and a plan id that run() checks
  // (a workspace planned into by another plan since is rejected, not read).
  static std::atomic<int32_t> next_id{1};
  const int32_t header[3] = {static_cast<int32_t>(plan.chunks.size()), static_cast<int32_t>(batch),
                             next_id.fetch_add(1) & 0x7fffffff};
  std::memcpy(host.data(), header, sizeof(header));
  const int32_t chunks = header[0];
  // Items longest first (the order the grid starts them in); chunk i of a split request writes
  // partial row i, a whole request writes out directly; a request's last chunk runs to its end
  // as run() finds it.
  for (size_t x = 0; x < plan.order.size(); ++x) {
    const int32_t i = plan.order[x];
    const detail::DecodeChunk& ch = plan.chunks[i];
    const int32_t first = plan.request_chunks[ch.request], last = plan.request_chunks[ch.request + 1];
    const int32_t item[4] = {ch.request, ch.page_begin, i + 1 == last ? -1 : ch.page_end, last - first > 1 ? i : -1};
    std::memcpy(host.data() + s.items + 16 * static_cast<int64_t>(x), item, 16);
  }
  std::memcpy(host.data() + s.request_items, plan.request_chunks.data(), plan.request_chunks.size() * 4);
  FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(ws, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
  DecodePlanInfo info;
  info.batch = batch, info.nheads = nheads, info.nheads_kv = nheads_kv, info.headdim = d, info.page_size = page_size;
  info.device = device, info.capacity = s.capacity, info.chunks = chunks, info.chunk_pages = plan.chunk_pages;
  info.split = plan.split;
  info.id = header[2];
  return info;
}

// Rung 3's TMA path (kernels/attention/decode/03_split.cuh, DecodeTmaMaps): the box's slots, or 0
// where it does not apply (16-bit caches at head dims not a multiple of 64, e4m3 caches at head
// dims other than 128, a page size not a multiple of 8 that divides the 64-key tile or is a
// multiple of it, a cache whose base or strides are not 16-byte multiples: those take the cp.async
// path).
static_assert(kernels::DecodeWsTraits<128>::kTileKeys == kernels::DecodeSplitTraits<128>::kTileKeys,
              "one tile size for the box rule below (the persistent and the block-per-item kernels)");
int tma_box_rows(const DecodeCall& call) {
  const kernels::PagedDecodeParams& p = call.p;
  const int64_t ps = call.c.page_size, tile = kernels::DecodeSplitTraits<128>::kTileKeys, es = call.fp8 ? 1 : 2;
  if (!has_tma_kernel(call.c.d, es) || detail::cc_major() < 9) return 0;
  // An empty pool (every request empty) has no map (TMA needs non-zero dims); the TMA kernel's
  // shared memory (e4m3: the block-per-item kernel's; 16-bit: the persistent kernel's) must fit the device.
  if (call.c.max_pages < 1) return 0;
  const bool fits = HEADDIM_SWITCH(static_cast<int>(call.c.d), kD, [&] {
    if (call.fp8) return kernels::DecodeSplitTraits<kD, 1, true>::kSmemBytesTma <= detail::max_smem_optin();
    if constexpr (kD % 64 == 0) return kernels::DecodeWsTraits<kD>::kSmemBytes <= detail::max_smem_optin();  // the persistent kernel
    return false;
  });
  if (!fits) return 0;
  const int64_t box = ps % 8 == 0 && tile % ps == 0 ? ps : ps % tile == 0 ? tile : 0;
  if (box == 0 || reinterpret_cast<uintptr_t>(p.k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(p.v_cache) % 16 != 0)
    return 0;
  // Strides of the dims TMA steps (elements of es bytes): a KV-head or page dim of size 1 is never stepped.
  const auto ok = [&](int64_t stride, int64_t size) {
    return size == 1 || (stride > 0 && stride * es % 16 == 0 && stride < (int64_t{1} << 38));
  };
  const int64_t nkv = call.c.nheads, pages = call.c.max_pages;
  if (!ok(p.slot_stride, ps) || !ok(p.head_stride, nkv) || !ok(p.page_stride, pages) || !ok(p.v_slot_stride, ps) ||
      !ok(p.v_head_stride, nkv) || !ok(p.v_page_stride, pages))
    return 0;
  // cache_map's stride for a dim of size 1 (ps x slot stride) within TMA's 2^40 bytes too.
  if (ps * std::max(p.slot_stride, p.v_slot_stride) * es >= (int64_t{1} << 40)) return 0;
  return static_cast<int>(box);
}

// A cache as (128-byte lines, page slots, lines of a row, KV heads, pages), boxes of box_rows
// slots x whole rows, 128B-swizzled. Dims of size 1 get a valid stride (TMA never steps them).
CUtensorMap cache_map(const void* base, DType dtype, const CacheDims& c, int64_t page_stride, int64_t slot_stride,
                      int64_t head_stride, int box_rows) {
  const int64_t es = dtype_size(dtype), line = 128 / es, filler = c.page_size * slot_stride * es;
  const int64_t dims[5] = {line, c.page_size, c.d / line, c.nheads, c.max_pages};
  const int64_t strides[4] = {slot_stride * es, 128, c.nheads > 1 ? head_stride * es : filler,
                              c.max_pages > 1 ? page_stride * es : filler};
  const int box[5] = {static_cast<int>(line), box_rows, static_cast<int>(c.d / line), 1, 1};
  return detail::make_tensor_map_5d(base, dtype, dims, strides, box);
}

// The persistent kernel (16-bit caches by TMA): a block per resident slot (split_slots: the
// planner's slots are these), at most one per work item, claiming the items.
template <typename T, int kD>
void launch_persistent(int64_t blocks, const DecodeCall& call, const kernels::PagedDecodeSplit& sp,
                       const kernels::DecodeTmaMaps& maps, cudaStream_t stream) {
  using Ws = kernels::DecodeWsTraits<kD>;
  const auto kernel = kernels::paged_decode_split_ws_kernel<T, kD>;
  configure_split(kernel, Ws::kSmemBytes);
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks, split_slots(kD, device, false))));
  FLASHLAB_LAUNCH(kernel, grid, Ws::kThreads, Ws::kSmemBytes, stream, call.p, sp, maps);
}

// Rung 3's launches: the chunks (grid_items items; with `ws`, a plan's workspace, else one
// item per request) and, when `merge`, the merge of split requests.
void launch_split(const DecodeCall& call, const void* ws, const SplitLayout* s, bool merge, cudaStream_t stream) {
  kernels::PagedDecodeSplit sp{};
  sp.page_size = kernels::IntDivisor(static_cast<uint32_t>(call.c.page_size));
  sp.kv_same_strides = call.p.page_stride == call.p.v_page_stride && call.p.slot_stride == call.p.v_slot_stride;
  int64_t grid_items = call.batch;
  if (ws != nullptr) {
    const auto* base = static_cast<const unsigned char*>(ws);
    sp.num_items = reinterpret_cast<const int*>(base);
    sp.items = reinterpret_cast<const int4*>(base + s->items);
    sp.request_items = reinterpret_cast<const int*>(base + s->request_items);
    sp.claims = reinterpret_cast<int*>(const_cast<unsigned char*>(base) + s->claims);
    sp.partial_lse = reinterpret_cast<float*>(const_cast<unsigned char*>(base) + s->lse);
    sp.partial_o = reinterpret_cast<float*>(const_cast<unsigned char*>(base) + s->o);
    grid_items = s->capacity;
  }
  const int64_t blocks = grid_items * items_per_chunk(call.nheads, call.c.nheads);
  FLASHLAB_CHECK(blocks <= 0x7fffffff, "batch_decode_paged: expected fewer than 2^31 thread blocks (batch x KV heads x ",
                 "16-head blocks), got ", blocks);
  const dim3 grid(static_cast<unsigned>(blocks));
  sp.k_scale = call.k_scale, sp.v_scale = call.v_scale;
  kernels::DecodeTmaMaps maps{};
  maps.box_rows = tma_box_rows(call);
  if (maps.box_rows > 0) {
    const DType cache_dtype = call.fp8 ? DType::kE4M3 : call.dtype;
    maps.k = cache_map(call.p.k_cache, cache_dtype, call.c, call.p.page_stride, call.p.slot_stride, call.p.head_stride,
                       maps.box_rows);
    maps.v = cache_map(call.p.v_cache, cache_dtype, call.c, call.p.v_page_stride, call.p.v_slot_stride,
                       call.p.v_head_stride, maps.box_rows);
  }
  HALF_DTYPE_SWITCH(call.dtype, T, [&] {
    HEADDIM_SWITCH(static_cast<int>(call.c.d), kD, [&] {
      const auto launch = [&](auto kv_tag, auto tma_tag) {
        using KV = typename decltype(kv_tag)::type;
        // (tma_box_rows is 0 where there is no TMA kernel)
        constexpr bool kTma = decltype(tma_tag)::value && has_tma_kernel(kD, sizeof(KV));
        if constexpr (kTma && sizeof(KV) == 2) {
          launch_persistent<T, kD>(blocks, call, sp, maps, stream);  // (q's rows: 16-byte aligned, checked)
        } else {  // a block per item: cp.async, or TMA with an e4m3 cache
          using Tr = kernels::DecodeSplitTraits<kD, static_cast<int>(sizeof(KV)), kTma>;
          constexpr int smem = kTma ? Tr::kSmemBytesTma : Tr::kSmemBytes;
          const auto kernel = kernels::paged_decode_split_kernel<T, kD, KV, kTma>;
          configure_split(kernel, smem);
          FLASHLAB_LAUNCH(kernel, grid, Tr::kThreads, smem, stream, call.p, sp, maps);
        }
      };
      const auto with_kv = [&](auto kv_tag) {
        if (maps.box_rows > 0) launch(kv_tag, std::true_type{});
        else launch(kv_tag, std::false_type{});
      };
      if (call.fp8) with_kv(detail::TypeTag<__nv_fp8_e4m3>{});
      else with_kv(detail::TypeTag<T>{});
      if (merge) {
        // Programmatic dependent launch: the merge's blocks start during the decode grid's tail
        // (those of unsplit requests exit at once; the others wait for the grid: griddepcontrol).
        detail::launch_programmatic(kernels::paged_decode_merge_kernel<T, kD>,
                                    dim3(static_cast<unsigned>(call.batch), static_cast<unsigned>(call.nheads)), dim3(128), 0,
                                    stream, call.p, sp);
      }
    });
  });
}

// Workspace tensor of a plan: CUDA uint8 1-D contiguous, 16-byte aligned, >= bytes, on `device`.
void check_workspace(const char* op, const TensorView& workspace, int64_t bytes, int device) {
  const check::Arg W{op, "workspace", workspace};
  check::cuda(W);
  check::dtype_in(W, {DType::kU8});
  check::ndim(W, 1);
  check::contiguous(W);
  check::aligned(W, 16);
  if (workspace.device.index != device)
    check::fail(W, detail::concat("the plan's device cuda:", device), device_str(workspace.device));
  if (workspace.shape[0] < bytes)
    check::fail(W, detail::concat("at least ", bytes, " bytes (batch_decode_workspace_bytes)"),
                detail::concat(workspace.shape[0], " bytes"));
}

}  // namespace

void batch_decode_paged(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                        const TensorView& out, const TensorView* lse, KvLayout layout, float softmax_scale,
                        cudaStream_t stream, int rung, float k_scale, float v_scale) {
  constexpr const char* op = "batch_decode_paged";
  check::rung(op, rung, kPagedDecodeRungs);
  const DecodeCall call = check_decode(op, q, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout,
                                       softmax_scale, k_scale, v_scale);
  if (call.fp8 && rung != 3)
    check::fail(check::Arg{op, "k_cache", k_cache}, "an fp16 / bf16 cache at rungs 1-2 (e4m3 caches: rung 3)", "e4m3");
  detail::DeviceGuard guard(q.device.index);
  if (call.fp8 && !split_fits(call.c.d, true))
    check::fail(check::Arg{op, "k_cache", k_cache}, "a head dim whose e4m3 kernel's shared memory fits this device",
                detail::concat("head dim ", call.c.d, " (", detail::max_smem_optin(), " bytes a block)"));
  const std::vector<int64_t> len = check_values(op, kv_indices, kv_indptr, kv_last_page_len, call, stream);
  if (call.batch == 0 || call.nheads == 0) return;
  const kernels::PagedDecodeParams& p = call.p;
  if (rung == 3 && call.dtype != DType::kF32 && split_fits(call.c.d, call.fp8)) {
    if (len.empty() && call.batch > 0) {  // capturing: no page counts to plan with, one item per request
      launch_split(call, nullptr, nullptr, false, stream);
      return;
    }
    std::vector<int64_t> pages(len.size());
    for (size_t b = 0; b < len.size(); ++b) pages[b] = (len[b] + call.c.page_size - 1) / call.c.page_size;
    const SplitLayout s = split_layout(call.batch, call.nheads, call.c.nheads, call.c.d, q.device.index, call.fp8);
    void* ws = detail::workspace(stream, s.bytes);
    const DecodePlanInfo info =
        plan_into(pages, call.c.page_size, call.nheads, call.c.nheads, call.c.d, q.device.index, call.fp8, ws, stream);
    launch_split(call, ws, &s, info.split, stream);
    return;
  }
  const int64_t group = call.nheads / call.c.nheads;
  // Rung 2 (and rung 3 in fp32 or where its shared memory does not fit): kG query heads a block, the smallest power of two >= the group, at most 8.
  const int kg = group >= 5 ? 8 : group >= 3 ? 4 : static_cast<int>(group);
  DTYPE_SWITCH(call.dtype, T, [&] {
    HEADDIM_SWITCH(static_cast<int>(call.c.d), kD, [&] {
      if (rung == 1) {
        const dim3 grid(static_cast<unsigned>(call.nheads), static_cast<unsigned>(call.batch));
        FLASHLAB_LAUNCH((kernels::paged_decode_naive_kernel<T, kD>), grid, 128, 0, stream, p);
        return;
      }
      const auto launch = [&](auto kg_tag) {
        constexpr int kG = decltype(kg_tag)::value;
        const dim3 grid(static_cast<unsigned>(call.c.nheads * ((group + kG - 1) / kG)), static_cast<unsigned>(call.batch));
        FLASHLAB_LAUNCH((kernels::paged_decode_gqa_kernel<T, kD, kG>), grid, 128, 0, stream, p);
      };
      if (kg == 8) launch(std::integral_constant<int, 8>{});
      else if (kg == 4) launch(std::integral_constant<int, 4>{});
      else if (kg == 2) launch(std::integral_constant<int, 2>{});
      else launch(std::integral_constant<int, 1>{});
    });
  });
}

int64_t batch_decode_workspace_bytes(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t headdim, int device) {
  constexpr const char* op = "batch_decode_workspace_bytes";
  FLASHLAB_CHECK(batch >= 0 && batch <= 65535, op, ": argument 'batch': expected 0 .. 65535, got ", batch);
  FLASHLAB_CHECK(nheads_kv >= 1 && nheads_kv <= 0x7fffffff, op, ": argument 'nheads_kv': expected 1 .. 2^31 - 1, got ",
                 nheads_kv);
  FLASHLAB_CHECK(nheads >= 1 && nheads % nheads_kv == 0 && nheads * nheads_kv <= 0x7fffffff, op,
                 ": argument 'nheads': expected a multiple of nheads_kv (", nheads_kv, "), at least 1, got ", nheads);
  FLASHLAB_CHECK(headdim == 32 || headdim == 64 || headdim == 96 || headdim == 128 || headdim == 192 || headdim == 256, op,
                 ": argument 'headdim': expected 32, 64, 96, 128, 192 or 256, got ", headdim);
  int count = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDeviceCount(&count));
  FLASHLAB_CHECK(device >= 0 && device < count, op, ": argument 'device': expected a CUDA device in [0, ", count, "), got ",
                 device);
  return split_layout(batch, nheads, nheads_kv, headdim, device).bytes;
}

DecodePlanInfo batch_decode_plan(const TensorView& kv_indptr_host, int64_t page_size, int64_t nheads, int64_t nheads_kv,
                                 int64_t headdim, const TensorView& workspace, cudaStream_t stream, DType kv_dtype) {
  constexpr const char* op = "batch_decode_plan";
  const check::Arg Ptr{op, "kv_indptr_host", kv_indptr_host};
  FLASHLAB_CHECK(kv_indptr_host.device.type == DeviceType::kCPU || kv_indptr_host.device.type == DeviceType::kCUDAHost, op,
                 ": argument 'kv_indptr_host': expected a host tensor (cpu or cuda_host), got ", device_str(kv_indptr_host.device));
  check::dtype_in(Ptr, {DType::kI32});
  check::ndim(Ptr, 1);
  check::contiguous(Ptr);
  FLASHLAB_CHECK(kv_indptr_host.shape[0] >= 1, op, ": argument 'kv_indptr_host': expected (batch + 1,) values, got none");
  const int64_t batch = kv_indptr_host.shape[0] - 1;
  FLASHLAB_CHECK(page_size >= 1 && page_size <= 0x7fffffff, op, ": argument 'page_size': expected >= 1, got ", page_size);
  FLASHLAB_CHECK(workspace.is_cuda(), op, ": argument 'workspace': expected a CUDA tensor, got ", device_str(workspace.device));
  const int device = workspace.device.index;
  const int64_t bytes = batch_decode_workspace_bytes(batch, nheads, nheads_kv, headdim, device);
  check_workspace(op, workspace, bytes, device);
  const auto* ptr = static_cast<const int32_t*>(kv_indptr_host.data);
  if (ptr[0] != 0) check::fail(Ptr, "kv_indptr[0] = 0", detail::concat("kv_indptr[0] = ", ptr[0]));
  std::vector<int64_t> pages(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    if (ptr[b + 1] < ptr[b])
      check::fail(Ptr, "non-decreasing values", detail::concat("kv_indptr[", b + 1, "] = ", ptr[b + 1], " < kv_indptr[", b, "] = ", ptr[b]));
    pages[b] = ptr[b + 1] - ptr[b];
  }
  detail::DeviceGuard guard(device);
  FLASHLAB_CHECK(!detail::capturing(stream), op, ": argument 'stream': expected a stream that is not being captured (the "
                 "plan's copy reads host memory at once; plan outside the graph, then replay), got one being captured");
  return plan_into(pages, page_size, nheads, nheads_kv, headdim, device, kv_dtype == DType::kE4M3, workspace.data, stream);
}

void batch_decode_run(const DecodePlanInfo& plan, const TensorView& workspace, const TensorView& q,
                      const TensorView& k_cache, const TensorView& v_cache, const TensorView& kv_indices,
                      const TensorView& kv_indptr, const TensorView& kv_last_page_len, const TensorView& out,
                      const TensorView* lse, KvLayout layout, float softmax_scale, cudaStream_t stream, float k_scale,
                      float v_scale) {
  constexpr const char* op = "batch_decode_run";
  const DecodeCall call = check_decode(op, q, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, lse, layout,
                                       softmax_scale, k_scale, v_scale);
  const check::Arg Q{op, "q", q};
  if (call.dtype != DType::kF16 && call.dtype != DType::kBF16) check::fail(Q, "fp16 or bf16 (decode rung 3)", dtype_name(call.dtype));
  if (call.batch != plan.batch || call.nheads != plan.nheads || call.c.nheads != plan.nheads_kv || call.c.d != plan.headdim ||
      call.c.page_size != plan.page_size)
    FLASHLAB_CHECK(false, op, ": argument 'plan': expected the shape of the call (batch ", call.batch, ", nheads ", call.nheads,
                   ", nheads_kv ", call.c.nheads, ", headdim ", call.c.d, ", page_size ", call.c.page_size, "), got a plan for (",
                   plan.batch, ", ", plan.nheads, ", ", plan.nheads_kv, ", ", plan.headdim, ", ", plan.page_size, ")");
  if (q.device.index != plan.device)
    check::fail(Q, detail::concat("the plan's device cuda:", plan.device), device_str(q.device));
  detail::DeviceGuard guard(q.device.index);
  const SplitLayout s = split_layout(plan.batch, plan.nheads, plan.nheads_kv, plan.headdim, plan.device);
  FLASHLAB_CHECK(s.capacity == plan.capacity, op, ": argument 'plan': expected a plan of this device's capacity (", s.capacity,
                 " items), got ", plan.capacity);
  check_workspace(op, workspace, s.bytes, plan.device);
  FLASHLAB_CHECK(split_fits(call.c.d, call.fp8), op, ": decode rung 3 at head dim ", call.c.d, " with ",
                 call.fp8 ? "an e4m3" : "a 16-bit", " cache needs more shared memory per block than this device allows");
  const check::Arg W{op, "workspace", workspace}, Kc{op, "k_cache", k_cache}, Vc{op, "v_cache", v_cache},
      Ind{op, "kv_indices", kv_indices}, Ptr{op, "kv_indptr", kv_indptr}, Last{op, "kv_last_page_len", kv_last_page_len},
      O{op, "out", out}, L{op, "lse", lse != nullptr ? *lse : out};
  detail::check_outputs_disjoint({&W}, {&Q, &Kc, &Vc, &Ind, &Ptr, &Last, &O, &L});
  check_values(op, kv_indices, kv_indptr, kv_last_page_len, call, stream);
  if (!detail::capturing(stream)) {  // the workspace still holds this plan (not another's since)
    const std::vector<int> header =
        detail::read_int32(TensorView(workspace.data, DType::kI32, {3}, workspace.device), stream);
    if (header[1] != plan.batch || header[2] != plan.id)
      check::fail(W, detail::concat("the metadata of this plan (id ", plan.id, ", batch ", plan.batch,
                                    "): plan into it again, or give each plan its own workspace"),
                  detail::concat("plan id ", header[2], ", batch ", header[1]));
    // The persistent kernel's claim counts, back at 0 after every launch (read after this stream's
    // earlier runs): not 0 means another run of this workspace is in flight on another stream, or
    // one stopped part way.
    const std::vector<int> claims = detail::read_int32(
        TensorView(static_cast<unsigned char*>(workspace.data) + s.claims, DType::kI32, {2}, workspace.device), stream);
    if (claims[0] != 0 || claims[1] != 0)
      check::fail(W, "claim counts at 0 (one run at a time per workspace; plan again after a failed run)",
                  detail::concat("claim counts ", claims[0], ", ", claims[1]));
  }
  if (call.batch == 0 || call.nheads == 0) return;
  // The merge launches whatever this plan decided: a graph captured now replays later plans.
  launch_split(call, workspace.data, &s, true, stream);
}

}  // namespace flashlab
