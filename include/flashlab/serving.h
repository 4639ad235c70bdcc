// Serving attention (issue 8): what a decode or prefill over split KV needs around its kernels.
// So far the merge of attention states (FlashInfer's cascade merge_state / merge_states), the
// paged KV cache's append, the batch decode over it (rungs 1-3, plan/run) and the batch
// prefill over it. Kernels: kernels/serving/,
// kernels/attention/decode/; doc: docs/ladder/attention.md (Serving).
#pragma once

#include <cuda_runtime_api.h>

#include "flashlab/tensor.h"

namespace flashlab {

// An attention state is the output v of attention over one segment of the keys and its
// log-sum-exp s (natural log, as attention_fwd's softmax_lse; -inf for a segment with no visible
// key, whose v is then ignored). Two states of the same queries over disjoint key segments merge
// into the state over their union:
//   S = log(e^{s_a} + e^{s_b}),   V = v_a e^{s_a - S} + v_b e^{s_b - S}
// (computed in fp32 with the larger s as the offset; S = -inf and V = 0 when both are -inf).
//   v_a, v_b, v_out: CUDA, (seq, nheads, headdim) contiguous, one dtype: fp32, fp16 or bf16;
//                    headdim >= 1 and a multiple of 16 bytes' worth of elements (8 for fp16/bf16,
//                    4 for fp32), 16-byte aligned.
//   s_a, s_b, s_out: fp32, (seq, nheads) contiguous, on the same device.
// An output may be identical to an input of its kind (in place: v_out = v_a, s_out = s_a) but
// must not otherwise overlap any argument. Enqueued on `stream`; throws flashlab::Error (nothing
// launched) on invalid arguments. seq = 0 or nheads = 0: nothing to do.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, cudaStream_t stream = nullptr);

// The merge of num_states states of the same queries over disjoint key segments:
//   S = log sum_i e^{s_i},   V = sum_i v_i e^{s_i - S}.
//   v: (seq, num_states, nheads, headdim) contiguous (as merge_state's v), num_states >= 1;
//   s: fp32 (seq, num_states, nheads) contiguous; v_out: (seq, nheads, headdim) like v;
//   s_out: fp32 (seq, nheads). Outputs must not overlap the inputs. Otherwise as merge_state.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  cudaStream_t stream = nullptr);

// Paged KV cache (FlashInfer's layout). The cache is a pool of pages of page_size tokens:
//   NHD: k_cache, v_cache (max_pages, page_size, nheads_kv, headdim)
//   HND: k_cache, v_cache (max_pages, nheads_kv, page_size, headdim)
// Request b of a batch owns pages kv_indices[kv_indptr[b] .. kv_indptr[b + 1]) in order, the last
// one holding kv_last_page_len[b] tokens: its KV length is (pages - 1) page_size +
// kv_last_page_len[b] (0 without pages). Token position j of request b lives in page
// kv_indices[kv_indptr[b] + j / page_size], slot j % page_size.
enum class KvLayout { kNHD, kHND };

// Writes nnz new tokens into the cache: append_k[i], append_v[i] (nheads_kv x headdim each) to
// position positions[i] of request batch_indices[i]. The page table must already cover them
// (the caller grows it first, as FlashInfer's append_paged_kv_cache): positions[i] < the
// request's KV length. Tokens of one call must not share a slot.
//   append_k, append_v: CUDA, (nnz, nheads_kv, headdim), fp16 / bf16 / fp32, the cache's dtype;
//                       head dim contiguous, rows and heads 16-byte aligned, headdim a multiple of
//                       16 bytes' worth of elements.
//   batch_indices, positions: int32 (nnz,) contiguous.
//   k_cache, v_cache: as above (page_size >= 1), head dim contiguous, 16-byte aligned strides.
//   kv_indices: int32 1-D (>= kv_indptr[batch] pages), values in [0, max_pages); kv_indptr:
//   int32 (batch + 1,), kv_indptr[0] = 0, non-decreasing; kv_last_page_len: int32 (batch,), in
//   [1, page_size] for a request with pages, 0 without. All contiguous, on one device.
// The caches are written (only the appended slots) and must not overlap the other arguments or
// each other (k_cache = t[:, 0], v_cache = t[:, 1] of one (max_pages, 2, ...) tensor interleave
// without overlapping: allowed). Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid
// arguments. The checks of the values of the int32 arrays read them from the device (and wait
// for `stream`); they are skipped while `stream` is being captured into a CUDA graph.
void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v, const TensorView& batch_indices,
                           const TensorView& positions, const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                           KvLayout layout = KvLayout::kNHD, cudaStream_t stream = nullptr);

// Batch decode over a paged KV cache: one query token per request attends to all of its keys
// (no mask: the keys are the tokens before it), o = softmax(scale q K^T) V per query head, KV
// head h / (nheads / nheads_kv) (GQA/MQA). Ladder (kernels/attention/decode/):
//   1 naive: a thread block per (request, query head), warps round-robin over the keys
//   2 GQA-aware: a block per (request, KV head, up to 8 of its query heads), each K/V row read
//     once for them, contiguous per-lane slices (vector loads)
//   3 split-KV (flash-decoding): tensor cores over the group's query heads, a 3-stage cp.async
//     pipeline of 64-key tiles, long requests cut into chunks that run in parallel (planned on
//     the host from the page counts) and merged (top; fp16/bf16 — fp32 runs rung 2)
inline constexpr int kPagedDecodeRungs = 3;
//   q, out: CUDA, (batch, nheads, headdim), fp16 / bf16 / fp32, the cache's dtype, head dim
//           contiguous, 16-byte aligned data and strides; headdim 32, 64, 96, 128, 192 or 256;
//           nheads a multiple of nheads_kv.
//   k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, layout: as append_paged_kv_cache
//           (batch = kv_last_page_len's length).
//   lse: optional fp32 (batch, nheads) contiguous: the natural-log log-sum-exp (merge_state's s).
//   softmax_scale <= 0 or NaN: 1 / sqrt(headdim).
// A request without keys gets out = 0 and lse = -inf. The outputs must not overlap the inputs or
// each other. Enqueued on `stream`; throws flashlab::Error (nothing launched) on invalid
// arguments, the page table's values included (read from the device unless capturing).
// Rung 3 runs where its shared memory fits a block (every head dim on sm_90; elsewhere rung 2
// takes over). It plans its split from the page counts it read; while `stream` is being captured there
// is no read, and every request runs as one chunk (capture batch_decode_run for a split decode).
// It uses the stream's internal workspace (as attention_bwd).
// FP8 KV cache (rung 3 only): k_cache, v_cache e4m3 with q / out fp16 or bf16; the logits use
// k_scale K and the output v_scale V (per-tensor dequantization scales, positive and finite; 1
// for fp16 / bf16 caches). The tensor cores run in fp16: the e4m3 values convert exactly, and so
// does a bf16 q whose magnitudes lie in [2^-14, 65504] (larger ones overflow: not checked; a
// multiplication by softmax_scale first cost the lse its fp32 accuracy, measured).
void batch_decode_paged(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& kv_indices, const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                        const TensorView& out, const TensorView* lse = nullptr, KvLayout layout = KvLayout::kNHD,
                        float softmax_scale = 0.f, cudaStream_t stream = nullptr, int rung = kPagedDecodeRungs,
                        float k_scale = 1.f, float v_scale = 1.f);

// Plan / run (FlashInfer's BatchDecodeWithPagedKVCacheWrapper): decode rung 3 with its split
// planned once per batch shape on the host, and launches whose addresses and grid do not change
// between plans, so a decode step captured in a CUDA graph replays correctly after a new plan of
// other lengths (same batch and heads). plan() returns what it decided; run() takes it back.
struct DecodePlanInfo {
  int64_t batch = 0, nheads = 0, nheads_kv = 0, headdim = 0, page_size = 0;
  int device = 0;
  int64_t capacity = 0;     // work items the run's grid has room for (depends on the shape only)
  int64_t chunks = 0;       // work items of this plan (<= capacity): request chunks, each for all heads
  int64_t chunk_pages = 0;  // pages per chunk (a request's last chunk may be shorter)
  bool split = false;       // some request is cut into more than one chunk
  int64_t id = 0;           // the plan's id, also in the workspace: run() rejects a workspace planned into since
};

// Bytes of the workspace of a plan for this shape on CUDA device `device` (plan metadata and
// the chunks' partial states, fp32: about (batch + 2 x SMs x 2) x nheads x headdim x 4 bytes).
// Throws when rung 3 does not fit the device (its shared memory: head dim 256 off sm_90).
int64_t batch_decode_workspace_bytes(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t headdim, int device);

// Plans the decode of a batch whose page counts are given on the host and enqueues the copy of
// the plan into `workspace` on `stream` (call it outside a graph capture; the host data is
// copied before it returns).
//   kv_indptr_host: CPU (or CUDA-host) int32 (batch + 1,) contiguous, kv_indptr[0] = 0,
//                   non-decreasing, batch <= 65535: the kv_indptr that run() will read.
//   page_size >= 1; nheads a multiple of nheads_kv >= 1; headdim as batch_decode_paged.
//   workspace: CUDA uint8 1-D contiguous, 16-byte aligned, at least
//              batch_decode_workspace_bytes(...) bytes; it holds the plan until run() (keep it),
//              and run()'s state (partial states, the persistent kernel's claim counts): one
//              run at a time per workspace (runs on two streams at once need two workspaces).
// Each request's last chunk extends to the request's end when run() reads the page table, so a
// request that grew since plan() is still decoded whole (less evenly spread).
// kv_dtype: the cache's dtype run() will get (e4m3 caches run a kernel of other occupancy; the
// plan balances for it; any dtype's plan is correct for any cache).
DecodePlanInfo batch_decode_plan(const TensorView& kv_indptr_host, int64_t page_size, int64_t nheads, int64_t nheads_kv,
                                 int64_t headdim, const TensorView& workspace, cudaStream_t stream = nullptr,
                                 DType kv_dtype = DType::kBF16);

// Decode rung 3 under a plan: the arguments as batch_decode_paged (q fp16 / bf16; the cache the
// same or e4m3 with its scales), their
// batch, heads, head dim and page size those of the plan, `workspace` the plan's (on the plan's
// device). Two launches (the chunks, then the merge of split requests), neither reading the
// host; unless capturing, the page table's values and the workspace's plan id are checked by a
// device read (a workspace that another plan wrote since is rejected).
void batch_decode_run(const DecodePlanInfo& plan, const TensorView& workspace, const TensorView& q,
                      const TensorView& k_cache, const TensorView& v_cache, const TensorView& kv_indices,
                      const TensorView& kv_indptr, const TensorView& kv_last_page_len, const TensorView& out,
                      const TensorView* lse = nullptr, KvLayout layout = KvLayout::kNHD, float softmax_scale = 0.f,
                      cudaStream_t stream = nullptr, float k_scale = 1.f, float v_scale = 1.f);

// Batch prefill / append over a paged KV cache (FlashInfer's BatchPrefillWithPagedKVCacheWrapper;
// flash_attn_varlen_func with a block table): request b's queries, the packed rows
// qo_indptr[b] .. qo_indptr[b + 1] of q, attend to the request's keys in the cache (its KV length
// sk as batch_decode_paged), query row i at position sk - sq + i (bottom-right aligned: the
// queries are the request's last sq tokens, already appended). Per query head h, KV head
// h / (nheads / nheads_kv):
//   o_i = sum_j softmax_j(s_ij) v_j,  s_ij = scale q_i . k_j (softcap: softcap tanh(s / softcap)),
// over the keys j visible to row i: j <= i + sk - sq when causal, j >= i + sk - sq - window_left
// when window_left >= 0. A row that sees no key gets o = 0, lse = -inf.
// Ladder (the attention forward's tiled rungs with K and V reached through the page table; keys
// past a request's end zero-filled; the results are the contiguous forward's, bit for bit):
//   1 FlashAttention-2 (forward rung 3: mma.sync, a 2-stage cp.async pipeline, each row's page
//     looked up per key block), any sm_80+;
//   2 Hopper (forward rung 4: wgmma, warp specialization; whole key blocks by TMA, a box per page,
//     where the page size tiles the 128-key block or holds whole blocks; a request's last block
//     and other page sizes by the producer warpgroup's cp.async copies), sm_90a (top; elsewhere
//     rung 1 takes over).
inline constexpr int kPagedPrefillRungs = 2;
struct PagedPrefillOptions {
  bool causal = false;
  int window_left = -1;       // >= 0: keys at most window_left positions before the diagonal
  float softcap = 0.f;        // > 0: logits softcap tanh(s / softcap); 0: none
  float softmax_scale = 0.f;  // <= 0 or NaN: 1 / sqrt(headdim)
};
//   q, out: CUDA, (total_q, nheads, headdim), fp16 / bf16, the cache's dtype, head dim
//           contiguous, 16-byte aligned data and strides, positive strides; headdim 64, 128 or
//           256; nheads a multiple of nheads_kv.
//   qo_indptr: int32 (batch + 1,) contiguous on q's device: qo_indptr[0] = 0, non-decreasing,
//              qo_indptr[batch] = total_q.
//   k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, layout: as batch_decode_paged
//           (16-bit caches; batch = kv_last_page_len's length, at most 65535).
//   lse: optional fp32 (total_q, nheads) contiguous: the natural-log log-sum-exp of each row.
//   max_qo_len: the longest request's query count, or -1: read from qo_indptr. The grid covers
//           max_qo_len rows per request: under CUDA-graph capture (no device reads) it must be
//           given, and replays must not exceed it.
// The outputs must not overlap the inputs or each other. Enqueued on `stream`; throws
// flashlab::Error (nothing launched) on invalid arguments, qo_indptr's and the page table's
// values included (read from the device unless capturing).
void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, const TensorView& k_cache,
                         const TensorView& v_cache, const TensorView& kv_indices, const TensorView& kv_indptr,
                         const TensorView& kv_last_page_len, const TensorView& out, const TensorView* lse = nullptr,
                         KvLayout layout = KvLayout::kNHD, const PagedPrefillOptions& options = {},
                         int64_t max_qo_len = -1, cudaStream_t stream = nullptr, int rung = kPagedPrefillRungs);

// Plan / run (FlashInfer's BatchPrefillWithPagedKVCacheWrapper): the index tensors' values read
// from the device and checked once per batch by plan(), so that the calls under the plan (one a
// layer) read nothing and never wait for the stream. The plan holds what the checks found and
// the four tensors' addresses; run() checks the tensors it gets against them on the host, and
// trusts the values at those addresses not to change until the next plan (FlashInfer's contract).
struct PrefillPlanInfo {
  int64_t batch = 0, total_q = 0, max_qo_len = 0, page_size = 0;
  int64_t kv_pages = 0;    // kv_indptr[batch]: the table's page count
  int64_t pages_used = 0;  // the pool pages the table reaches: its largest page index + 1 (0: none)
  int device = 0;         // the index tensors' CUDA device (-1: they were host tensors)
  uint64_t qo_indptr = 0, kv_indices = 0, kv_indptr = 0, kv_last_page_len = 0;  // the planned tensors' addresses
};

// Reads qo_indptr, kv_indptr, kv_last_page_len and kv_indices (waits for `stream`; not while it
// is being captured) and checks them as batch_prefill_paged does: qo_indptr[0] = kv_indptr[0] = 0,
// both non-decreasing, kv_last_page_len in [1, page_size] (0 for a request without pages), page
// indices >= 0, requests shorter than 2^31 tokens. Tensors: int32 1-D contiguous on one CUDA device,
// qo_indptr and kv_indptr (batch + 1,), kv_last_page_len (batch,), batch <= 65535; page_size the
// cache's, in [1, 2^31). Host tensors (all cpu or all cuda_host) are read directly: their plan
// checks their values (device -1) but no run takes it (a run's tensors are on a CUDA device).
PrefillPlanInfo batch_prefill_paged_plan(const TensorView& qo_indptr, const TensorView& kv_indices,
                                         const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                                         int64_t page_size, cudaStream_t stream = nullptr);

// batch_prefill_paged under a plan: the same arguments (max_qo_len is the plan's), the index
// tensors those planned (same addresses and lengths), q's rows the plan's total_q, the cache's page
// size the plan's and its pool at least pages_used pages. Reads nothing from the device (so it
// may be captured); throws flashlab::Error (nothing launched) on invalid arguments.
void batch_prefill_paged_run(const PrefillPlanInfo& plan, const TensorView& q, const TensorView& qo_indptr,
                             const TensorView& k_cache, const TensorView& v_cache, const TensorView& kv_indices,
                             const TensorView& kv_indptr, const TensorView& kv_last_page_len, const TensorView& out,
                             const TensorView* lse = nullptr, KvLayout layout = KvLayout::kNHD,
                             const PagedPrefillOptions& options = {}, cudaStream_t stream = nullptr,
                             int rung = kPagedPrefillRungs);

}  // namespace flashlab
