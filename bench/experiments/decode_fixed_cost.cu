// Experiment (not a rung): where decode rung 3's fixed cost per step lies. Batch 64 x kv_len
// keys, 32 query / 8 KV heads, d 128, bf16, page 16, the TMA path (HND and NHD), the rung's own
// kernel launched directly (no library call), timed like the benchmark (L2 flushed by a 256 MiB
// memset before each repetition, CUDA events, median of 30):
//   eager        the decode grid alone, one item per request (512 blocks), a plain launch
//   graph        the same grid as a one-node CUDA graph
//   graph+merge  the same + the merge kernel as a programmatic dependent (as batch_decode_run
//                launches it: every request whole, so its blocks return at once)
//   plan+merge   the plan's grid (capacity x 8 blocks, the items table; 512 used) + the merge:
//                what batch_decode_run replays
//   plan         the plan's grid without the merge
//   empty graph  a one-node graph of an empty kernel (the launch alone)
// Then probe kernels: trimmed copies of the rung's TMA path with one change at a time (block
// barrier vs producer warp, stages, box order, page lookups, bulk vs tensor copies, and — added at
// 87d0ec2 and not yet run — ablations of the skeleton's start chain, Q load and epilogue, to be
// run with decode_read_ceiling's `waves` kernel in the same call).
// Output: ms and K + V GB/s per variant.
// Build (not a CMake target; no library link):
//   nvcc -std=c++17 -O3 -I. -Iinclude -Isrc --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     bench/experiments/decode_fixed_cost.cu src/core/tensor_map.cpp src/core/tensor.cpp src/core/validate.cpp \
//     -o build/exp/decode_fixed_cost
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include "bench/experiments/standalone.h"
#include "kernels/attention/decode/03_split.cuh"
#include "src/core/tensor_map.h"

using namespace flashlab;
using namespace flashlab::kernels;

constexpr int kBatch = 64, kHq = 32, kHk = 8, kD = 128, kPage = 16;
using T = __nv_bfloat16;
// The rung's TMA kernel (since 99f05a4 the producer-warp kernel: 160 threads, 2 stages; the
// results files up to run 9 were measured before it, with the block-barrier kernel).
using Tr = DecodeSplitTraits<kD, 2, true>;

__global__ void empty_kernel() {}

// ---- Variants of rung 3's TMA path (bf16, d 128, 16-token pages, whole 64-key tiles: every
// request here is a multiple of 64 keys, so no tail handling), a block per (request, KV head):
//   kMode 0  the rung's structure: a block barrier per tile, warp 0 issues tile t + kStages - 1
//            after it, then every warp waits for tile t and does its math
//   kMode 1  the same without the math (waits and barriers only)
//   kMode 2  a producer warp (a 5th warp) issues tiles as soon as their stage is released, on a
//            per-stage "empty" mbarrier the 4 math warps arrive on (no block barrier per tile)
template <int kMode, int kStages, int kOrder = 0>
struct Probe {
  // kOrder 4: rows padded by 16 bytes (one bulk copy per 256-byte row).
  static constexpr int kD = 128, kTile = 64, kRows = 16, kRowElems = kD + 8, kStageElems = kTile * (kOrder == 4 ? kRowElems : kD);
  static constexpr int kThreads = kMode == 2 ? 160 : 128;
  static constexpr int kSmem = 1024 + 2 * kStages * kStageElems * 2 + kRows * kRowElems * 2;
};

// Ablations (kAblate bits, to find what the skeleton costs over decode_read_ceiling's `waves`
// kernel): 1 = no table chain at the start (every request c_keys keys, its pages consecutive
// from b x c_keys / page_size: the experiment's identity tables), 2 = no Q load, 4 = no epilogue
// (the warps' merge and the stores skipped).
__constant__ int c_keys;

template <int kMode, int kStages, int kOrder, int kIdx = 0, int kAblate = 0>
__global__ void __launch_bounds__(Probe<kMode, kStages>::kThreads)
    probe_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ PagedDecodeSplit s,
                 const __grid_constant__ DecodeTmaMaps maps) {
  using P = Probe<kMode, kStages, kOrder>;
  constexpr int kD = P::kD, kTile = P::kTile, kRows = P::kRows, kRowElems = P::kRowElems;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const stages = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023));
  T* sk = reinterpret_cast<T*>(stages);
  T* sv = sk + kStages * P::kStageElems;
  T* sq = sv + kStages * P::kStageElems;
  __shared__ uint64_t full[kStages], empty[kStages];
  const int group = p.nheads / p.nheads_kv;
  const int b = blockIdx.x / p.nheads_kv, hk = blockIdx.x % p.nheads_kv, h0 = hk * group, ng = group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int first, len;
  if constexpr ((kAblate & 1) != 0) {
    first = b * (c_keys / p.page_size), len = c_keys;
  } else {
    first = p.kv_indptr[b];
    const int pages = p.kv_indptr[b + 1] - first;
    len = pages > 0 ? (pages - 1) * p.page_size + p.kv_last_page_len[b] : 0;
  }
  const int tiles = (len + kTile - 1) / kTile;
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) mbarrier_init(&full[st], 1), mbarrier_init(&empty[st], 4);
    fence_barrier_init();
  }
  __syncthreads();
  const int box_rows = maps.box_rows, boxes = kTile / box_rows;
  const auto page_of = [&](int t) {  // this lane's box of tile t
    const int key = t * kTile + lane * box_rows;
    return lane < boxes && t < tiles ? p.kv_indices[first + s.page_size.div(key)] : -1;
  };
  const auto issue = [&](int t, int page) {
    uint64_t* bar = &full[t % kStages];
    if (lane == 0) mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(boxes * box_rows * kD * 2 * 2));
    if (lane < boxes) {
      const int key = t * kTile + lane * box_rows, slot = s.page_size.mod(key, s.page_size.div(key));
      const int at = (t % kStages) * P::kStageElems + lane * box_rows * kD;
      if constexpr (kOrder == 5 || kOrder == 6) {  // HND only: 2-D map of 128-byte lines, a box = a page's 32 lines of a head
        const int line0 = static_cast<int>((static_cast<int64_t>(page) * p.page_stride + hk * p.head_stride + slot * p.slot_stride) / 64);
        tma_load_2d(sk + at, &maps.k, 0, line0, bar);
        tma_load_2d(sv + at, &maps.v, 0, line0, bar);
      } else if constexpr (kOrder == 2 || kOrder == 3) {  // HND only: a page's rows of one head are one 4 KB run (bulk copy, no swizzle)
        const int64_t off = (static_cast<int64_t>(page) * p.page_stride + hk * p.head_stride + slot * p.slot_stride) * 2;
        bulk_load(sk + at, static_cast<const unsigned char*>(p.k_cache) + off, box_rows * kD * 2, bar);
        bulk_load(sv + at, static_cast<const unsigned char*>(p.v_cache) + off, box_rows * kD * 2, bar);
      } else if constexpr (kOrder == 1) {
        tma_load_5d(sk + at, &maps.k, 0, 0, slot, hk, page, bar);
        tma_load_5d(sv + at, &maps.v, 0, 0, slot, hk, page, bar);
      } else {
        tma_load_5d(sk + at, &maps.k, 0, slot, 0, hk, page, bar);
        tma_load_5d(sv + at, &maps.v, 0, slot, 0, hk, page, bar);
      }
    }
  };
  // kIdx 1: the page computed (identity tables here: an upper bound, no table read); kIdx 2: the
  // warp's lanes hold the pages of 32 boxes (cur) and of the next 32 (nxt), loaded a batch ahead.
  const auto box_load = [&](int box) {
    const int key = box * box_rows;
    return key < len ? p.kv_indices[first + s.page_size.div(key)] : -1;
  };
  int cur = -1, nxt = -1;
  if (kIdx == 2 && warp == (kMode == 2 ? 4 : 0)) cur = box_load(lane), nxt = box_load(32 + lane);
  const auto page_get = [&](int t) {  // warp-collective for kIdx 2; tiles in increasing order
    if constexpr (kIdx == 0) return page_of(t);
    if constexpr (kIdx == 1) return lane < boxes && t < tiles ? first + (t * kTile + lane * box_rows) / p.page_size : -1;
    const int box0 = t * boxes;
    if (box0 % 32 == 0 && box0 > 0) cur = nxt, nxt = box_load(box0 + 32 + lane);
    const int pg = __shfl_sync(0xffffffffu, cur, (box0 + lane) % 32);
    return lane < boxes && t < tiles ? pg : -1;
  };
  if constexpr (kOrder == 4) {
    if (kMode == 2 && warp == 4) {  // the producer: lane l copies rows l and l + 32 of K and V (pages computed)
      for (int t = 0; t < tiles; ++t) {
        if (t >= kStages) mbarrier_wait(&empty[t % kStages], (t / kStages - 1) & 1);
        uint64_t* bar = &full[t % kStages];
        if (lane == 0) mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(kTile * kD * 2 * 2));
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = lane + 32 * h, key = t * kTile + r, page = first + key / p.page_size, slot = key % p.page_size;
          const int64_t off = (static_cast<int64_t>(page) * p.page_stride + hk * p.head_stride + slot * p.slot_stride) * 2;
          const int at = (t % kStages) * P::kStageElems + r * kRowElems;
          bulk_load(sk + at, static_cast<const unsigned char*>(p.k_cache) + off, kD * 2, bar);
          bulk_load(sv + at, static_cast<const unsigned char*>(p.v_cache) + off, kD * 2, bar);
        }
      }
      return;
    }
  }
  if (kMode == 2 && warp == 4) {  // the producer
    int pg = page_get(0);
    for (int t = 0; t < tiles; ++t) {
      const int next = t + 1 < tiles ? page_get(t + 1) : -1;
      if (t >= kStages) mbarrier_wait(&empty[t % kStages], (t / kStages - 1) & 1);
      issue(t, pg);
      pg = next;
    }
    return;
  }
  for (int i = tid; i < kRows * kD / 8 && (kAblate & 2) == 0; i += 128) {
    const int r = i / (kD / 8), c = i % (kD / 8);
    const bool ok = r < ng;
    const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + (h0 + (ok ? r : 0)) * p.q_head_stride + c * 8;
    cp_async_16(sq + r * kRowElems + c * 8, src, ok ? 16 : 0);
  }
  cp_async_commit();
  int pg_next = -1;
  if (kMode != 2 && warp == 0) {
    int fp[kStages];
#pragma unroll
    for (int t = 0; t < kStages; ++t) fp[t] = page_get(t);
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t)
      if (t < tiles) issue(t, fp[t]);
    pg_next = fp[kStages - 1];
  }
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * kLog2e;
  const uint32_t q_base = smem_u32(sq);
  uint32_t qa[kD / 16][4];
  const int box_shift = __ffs(box_rows) - 1;
  const uint32_t line_stride = static_cast<uint32_t>(box_rows) * 128;
  const auto line_of = [&](int r) {
    return static_cast<uint32_t>((((r >> box_shift) * 2 << box_shift) + (r & (box_rows - 1))) * 128);
  };
  const auto swz = [&](uint32_t line, int r, int c) {
    const int byte = c * 2;
    if constexpr (kOrder == 3 || kOrder == 6) return static_cast<uint32_t>(r * 256 + byte);  // dense rows (bank conflicts)
    if constexpr (kOrder == 4) return static_cast<uint32_t>(r * kRowElems * 2 + byte);  // padded rows
    if constexpr (kOrder == 1 || kOrder == 5)  // dense 256-byte rows; the 128B swizzle XORs a chunk with its line (2 r + half) mod 8
      return static_cast<uint32_t>(r * 256 + (byte / 128) * 128 + (((byte % 128 / 16) ^ ((2 * r + byte / 128) & 7)) * 16) + byte % 16);
    return line + static_cast<uint32_t>(byte / 128) * line_stride + static_cast<uint32_t>(((byte % 128 / 16) ^ (r % 8)) * 16 + byte % 16);
  };
  const int k_row = warp * 16 + (lane / 16) * 8 + lane % 8, v_row = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
  const uint32_t k_line = line_of(k_row), v_line = line_of(v_row);
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kStages;
    if constexpr (kMode != 2) {
      __syncthreads();
      if (warp == 0) {
        if (t + kStages - 1 < tiles) issue(t + kStages - 1, pg_next);
        if (t + kStages < tiles) pg_next = page_get(t + kStages);
      }
    }
    mbarrier_wait(&full[st], (t / kStages) & 1);
    if (t == 0) {
      cp_async_wait<0>();
      if constexpr (kMode == 2) named_barrier_sync(1, 128);
      else __syncthreads();
    }
    if constexpr (kMode != 1) {
      const uint32_t k_base = smem_u32(sk + st * P::kStageElems), v_base = smem_u32(sv + st * P::kStageElems);
      if (t == 0) {
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) ldmatrix_x4(qa[kk], q_base + ((lane % 16) * kRowElems + kk * 16 + (lane / 16) * 8) * 2);
      }
      float sc[2][4] = {}, sc2[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t bk[4];
        ldmatrix_x4(bk, k_base + swz(k_line, k_row, kk * 16 + ((lane / 8) % 2) * 8));
        if (kk % 2 == 0) mma_m16n8k16_x2<T>(sc[0], sc[1], qa[kk], bk);
        else mma_m16n8k16_x2<T>(sc2[0], sc2[1], qa[kk], bk);
      }
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = (sc[nt][e] + sc2[nt][e]) * scale_log2, mx[e / 2] = fmaxf(mx[e / 2], sc[nt][e]);
      float corr[2], base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        corr[r] = exp2f(m[r] - base[r]);
        m[r] = mx[r];
        l[r] *= corr[r];
      }
      uint32_t pa[4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float pr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[e] = exp2f(sc[nt][e] - base[e / 2]), l[e / 2] += pr[e];
        pa[2 * nt] = pack2<T>(pr[0], pr[1]);
        pa[2 * nt + 1] = pack2<T>(pr[2], pr[3]);
      }
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
      }
#pragma unroll
      for (int j = 0; j < kD / 16; ++j) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, v_base + swz(v_line, v_row, j * 16 + (lane / 16) * 8));
        mma_m16n8k16_x2<T>(o[2 * j], o[2 * j + 1], pa, bv);
      }
    }
    if constexpr (kMode == 2) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&empty[st]);
    }
  }
  if constexpr ((kAblate & 4) != 0) {
    if (tid == 0 && m[0] == 12345.f) static_cast<T*>(p.out)[0] = __float2bfloat16(l[0] + o[0][0]);  // keeps the loop's results live
    return;
  }
  if constexpr (kMode == 2) named_barrier_sync(1, 128);
  else __syncthreads();
  float* s_m = reinterpret_cast<float*>(stages);
  float* s_l = s_m + 4 * kRows;
  float* s_o = s_l + 4 * kRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int g = lane / 4;
  if (lane % 4 == 0) {
    s_m[warp * kRows + g] = m[0], s_m[warp * kRows + g + 8] = m[1];
    s_l[warp * kRows + g] = l[0], s_l[warp * kRows + g + 8] = l[1];
  }
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    float* dst = s_o + (warp * kRows + g) * kD + j * 8 + 2 * (lane % 4);
    *reinterpret_cast<float2*>(dst) = make_float2(o[j][0], o[j][1]);
    *reinterpret_cast<float2*>(dst + 8 * kD) = make_float2(o[j][2], o[j][3]);
  }
  if constexpr (kMode == 2) named_barrier_sync(1, 128);
  else __syncthreads();
  for (int x = tid; x < ng * kD; x += 128) {
    const int r = x / kD, c = x % kD;
    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) big = fmaxf(big, s_m[w * kRows + r]);
    const float off = big == -INFINITY ? 0.f : big;
    float wsum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float wt = exp2f(s_m[w * kRows + r] - off);
      wsum += s_l[w * kRows + r] * wt, acc += s_o[(w * kRows + r) * kD + c] * wt;
    }
    const int h = h0 + r;
    static_cast<T*>(p.out)[b * p.out_batch_stride + h * p.out_head_stride + c] = __float2bfloat16(wsum > 0.f ? acc / wsum : 0.f);
    if (c == 0 && p.lse != nullptr) p.lse[static_cast<int64_t>(b) * p.nheads + h] = (off + log2f(wsum)) * 0.6931471805599453f;
  }
}

__global__ void fill_kernel(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 32768.f - 1.f);
  }
}

template <int kMode, int kStages, int kOrder, int kIdx, int kAblate = 0>
void setup_probe() {
  const auto k = probe_kernel<kMode, kStages, kOrder, kIdx, kAblate>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Probe<kMode, kStages, kOrder>::kSmem));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  FlushedTimer time(st);
  const auto graph_of = [&](const std::function<void()>& fn) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fn();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    return x;
  };
  const auto kernel = paged_decode_split_kernel<T, kD, T, true>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytesTma));
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));

  setup_probe<1, 3, 0, 1, 1>();
  setup_probe<1, 3, 0, 1, 3>();
  setup_probe<1, 3, 0, 1, 7>();
  setup_probe<2, 2, 0, 1, 0>();
  setup_probe<2, 2, 0, 1, 1>();
  setup_probe<2, 2, 0, 1, 3>();
  setup_probe<0, 3, 0, 0>();
  setup_probe<1, 3, 0, 0>();
  setup_probe<1, 3, 0, 1>();
  setup_probe<1, 3, 0, 2>();
  setup_probe<0, 3, 0, 1>();
  setup_probe<0, 3, 0, 2>();
  setup_probe<2, 3, 0, 2>();
  setup_probe<2, 2, 0, 2>();
  setup_probe<2, 2, 1, 2>();
  setup_probe<2, 2, 1, 1>();
  setup_probe<1, 3, 2, 0>();
  setup_probe<2, 2, 2, 0>();
  setup_probe<0, 3, 2, 0>();
  setup_probe<1, 3, 5, 0>();
  setup_probe<1, 3, 6, 0>();
  setup_probe<0, 3, 5, 0>();
  setup_probe<2, 2, 5, 0>();
  setup_probe<2, 3, 5, 0>();
  for (int kv_len : {4096, 16384}) {
    CK(cudaMemcpyToSymbol(c_keys, &kv_len, sizeof(int)));
    const int per_req = kv_len / kPage, pages = kBatch * per_req;
    const size_t cache_elems = size_t(pages) * kPage * kHk * kD;
    T *kc, *vc, *q, *out;
    float* lse;
    int *ind, *ptr, *last;
    CK(cudaMalloc(&kc, cache_elems * 2));
    CK(cudaMalloc(&vc, cache_elems * 2));
    fill_kernel<<<1024, 256>>>(kc, cache_elems, 1u);
    fill_kernel<<<1024, 256>>>(vc, cache_elems, 2u);
    CK(cudaMalloc(&q, kBatch * kHq * kD * 2));
    fill_kernel<<<64, 256>>>(q, kBatch * kHq * kD, 3u);
    CK(cudaMalloc(&out, kBatch * kHq * kD * 2));
    CK(cudaMalloc(&lse, kBatch * kHq * 4));
    std::vector<int> h_ind(pages), h_ptr(kBatch + 1), h_last(kBatch, kPage);
    for (int i = 0; i < pages; ++i) h_ind[i] = i;
    for (int b = 0; b <= kBatch; ++b) h_ptr[b] = b * per_req;
    CK(cudaMalloc(&ind, pages * 4));
    CK(cudaMalloc(&ptr, (kBatch + 1) * 4));
    CK(cudaMalloc(&last, kBatch * 4));
    CK(cudaMemcpy(ind, h_ind.data(), pages * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ptr, h_ptr.data(), (kBatch + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(last, h_last.data(), kBatch * 4, cudaMemcpyHostToDevice));
    // The plan's tables: capacity 130 (64 + 2 x ceil(264 / 8)), 64 items used, each a whole request.
    const int capacity = 130;
    std::vector<int4> h_items(capacity);
    for (int i = 0; i < kBatch; ++i) h_items[i] = make_int4(i, 0, -1, -1);
    std::vector<int> h_req(kBatch + 1);
    for (int b = 0; b <= kBatch; ++b) h_req[b] = b;
    int4* items;
    int *num, *req;
    float *part_o, *part_lse;
    CK(cudaMalloc(&items, capacity * 16));
    CK(cudaMalloc(&num, 4));
    CK(cudaMalloc(&req, (kBatch + 1) * 4));
    CK(cudaMalloc(&part_o, size_t(capacity) * kHq * kD * 4));
    CK(cudaMalloc(&part_lse, size_t(capacity) * kHq * 4));
    CK(cudaMemcpy(items, h_items.data(), capacity * 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(num, &kBatch, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(req, h_req.data(), (kBatch + 1) * 4, cudaMemcpyHostToDevice));
    for (int hnd = 0; hnd < 2; ++hnd) {
      PagedDecodeParams p{};
      p.q = q, p.q_batch_stride = kHq * kD, p.q_head_stride = kD;
      p.k_cache = kc, p.v_cache = vc;
      // NHD: (page, slot, head, d); HND: (page, head, slot, d).
      p.page_stride = int64_t(kPage) * kHk * kD;
      p.slot_stride = hnd ? kD : kHk * kD;
      p.head_stride = hnd ? kPage * kD : kD;
      p.v_page_stride = p.page_stride, p.v_slot_stride = p.slot_stride, p.v_head_stride = p.head_stride;
      p.kv_indices = ind, p.kv_indptr = ptr, p.kv_last_page_len = last;
      p.out = out, p.out_batch_stride = kHq * kD, p.out_head_stride = kD, p.lse = lse;
      p.scale = 0.08838834764831845f, p.batch = kBatch, p.nheads = kHq, p.nheads_kv = kHk, p.page_size = kPage;
      PagedDecodeSplit direct{};
      direct.page_size = IntDivisor(kPage), direct.k_scale = direct.v_scale = 1.f, direct.kv_same_strides = true;
      direct.request_items = req, direct.partial_o = part_o, direct.partial_lse = part_lse;
      PagedDecodeSplit plan = direct;
      plan.items = items, plan.num_items = num;
      DecodeTmaMaps maps{};
      maps.box_rows = kPage;
      const int64_t es = 2, line = 64, filler = kPage * p.slot_stride * es;
      const int64_t dims[5] = {line, kPage, kD / line, kHk, pages};
      const int64_t strides[4] = {p.slot_stride * es, 128, p.head_stride * es, p.page_stride * es};
      const int box[5] = {int(line), kPage, kD / int(line), 1, 1};
      (void)filler;
      maps.k = detail::make_tensor_map_5d(kc, DType::kBF16, dims, strides, box);
      maps.v = detail::make_tensor_map_5d(vc, DType::kBF16, dims, strides, box);
      // Order 1: (line, half of the row, slot, head, page): a box walks each row's 256 bytes in order.
      DecodeTmaMaps maps1 = maps;
      const int64_t dims1[5] = {line, kD / line, kPage, kHk, pages};
      const int64_t strides1[4] = {128, p.slot_stride * es, p.head_stride * es, p.page_stride * es};
      const int box1[5] = {int(line), kD / int(line), kPage, 1, 1};
      maps1.k = detail::make_tensor_map_5d(kc, DType::kBF16, dims1, strides1, box1);
      maps1.v = detail::make_tensor_map_5d(vc, DType::kBF16, dims1, strides1, box1);
      // 2-D: the cache as 128-byte lines (HND: a page's head block is 32 consecutive lines), swizzled or not.
      DecodeTmaMaps maps2s = maps, maps2n = maps;
      const int64_t lines = int64_t(cache_elems) / line;
      maps2s.k = detail::make_tensor_map_2d(kc, DType::kBF16, line, lines, 128, int(line), 2 * kPage, true);
      maps2s.v = detail::make_tensor_map_2d(vc, DType::kBF16, line, lines, 128, int(line), 2 * kPage, true);
      maps2n.k = detail::make_tensor_map_2d(kc, DType::kBF16, line, lines, 128, int(line), 2 * kPage, false);
      maps2n.v = detail::make_tensor_map_2d(vc, DType::kBF16, line, lines, 128, int(line), 2 * kPage, false);
      const auto decode = [&](const PagedDecodeSplit& s, int blocks) {
        kernel<<<blocks, Tr::kThreads, Tr::kSmemBytesTma, st>>>(p, s, maps);
      };
      const auto merge = [&](const PagedDecodeSplit& s) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(kBatch, kHq);
        config.blockDim = dim3(128);
        config.stream = st;
        config.attrs = &attr;
        config.numAttrs = 1;
        CK(cudaLaunchKernelEx(&config, paged_decode_merge_kernel<T, kD>, p, s));
      };
      const double gb = 2.0 * cache_elems * 2 / 1e9;
      const auto report = [&](const char* name, double ms) {
        std::printf("keys %5d %s %-12s %8.4f ms %7.1f GB/s\n", kv_len, hnd ? "HND" : "NHD", name, ms, gb / ms * 1e3);
      };
      const int direct_blocks = kBatch * kHk, plan_blocks = capacity * kHk;
      cudaGraphExec_t g_direct = graph_of([&] { decode(direct, direct_blocks); });
      cudaGraphExec_t g_direct_merge = graph_of([&] { decode(direct, direct_blocks); merge(direct); });
      cudaGraphExec_t g_plan_merge = graph_of([&] { decode(plan, plan_blocks); merge(plan); });
      cudaGraphExec_t g_plan = graph_of([&] { decode(plan, plan_blocks); });
      cudaGraphExec_t g_empty = graph_of([&] { empty_kernel<<<1, 32, 0, st>>>(); });
      // The probe variants: outputs against the rung's kernel (max |difference|), then timed.
      std::vector<T> ref(kBatch * kHq * kD), got(ref.size());
      CK(cudaDeviceSynchronize());
      decode(direct, direct_blocks);
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(ref.data(), out, ref.size() * 2, cudaMemcpyDeviceToHost));
      const auto probe = [&](auto mode_tag, auto stages_tag, auto order_tag, auto idx_tag, const char* name,
                             auto ablate_tag) {
        constexpr int kMode = decltype(mode_tag)::value, kStages = decltype(stages_tag)::value;
        constexpr int kOrder = decltype(order_tag)::value, kIdx = decltype(idx_tag)::value;
        constexpr int kAblate = decltype(ablate_tag)::value;
        using P = Probe<kMode, kStages, kOrder>;
        const DecodeTmaMaps& m = kOrder == 1 ? maps1 : kOrder == 5 ? maps2s : kOrder == 6 ? maps2n : maps;
        const auto run = [&] { probe_kernel<kMode, kStages, kOrder, kIdx, kAblate><<<direct_blocks, P::kThreads, P::kSmem, st>>>(p, direct, m); };
        CK(cudaMemsetAsync(out, 0xff, ref.size() * 2, st));
        run();
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
        double diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          const double d = std::fabs(__bfloat162float(ref[i]) - __bfloat162float(got[i]));
          diff = std::isnan(d) ? INFINITY : std::max(diff, d);
        }
        const double ms = time(run);
        std::printf("keys %5d %s %-18s %8.4f ms %7.1f GB/s  max|diff| %.3g\n", kv_len, hnd ? "HND" : "NHD", name, ms,
                    gb / ms * 1e3, diff);
      };
      using I0 = std::integral_constant<int, 0>;
      using I1 = std::integral_constant<int, 1>;
      using I2 = std::integral_constant<int, 2>;
      using S2 = std::integral_constant<int, 2>;
      using S3 = std::integral_constant<int, 3>;
      using O0 = std::integral_constant<int, 0>;
      using O1 = std::integral_constant<int, 1>;
      using O2 = std::integral_constant<int, 2>;
      using O3 = std::integral_constant<int, 3>;
      using O4 = std::integral_constant<int, 4>;
      using O5 = std::integral_constant<int, 5>;
      using O6 = std::integral_constant<int, 6>;
      using X0 = std::integral_constant<int, 0>;
      using X1 = std::integral_constant<int, 1>;
      using X2 = std::integral_constant<int, 2>;
      for (int round = 0; round < 2; ++round) {
        // Ablations of the skeleton (no math) and of the producer kernel: arithmetic pages, then no
        // table chain at the start, no Q, no epilogue (outputs wrong where Q or the epilogue is cut).
        probe(I1{}, S3{}, O0{}, X1{}, "nomath/3/arith", std::integral_constant<int, 0>{});
        probe(I1{}, S3{}, O0{}, X1{}, "nomath/3/-chain", std::integral_constant<int, 1>{});
        probe(I1{}, S3{}, O0{}, X1{}, "nomath/3/-chain-q", std::integral_constant<int, 3>{});
        probe(I1{}, S3{}, O0{}, X1{}, "nomath/3/-chain-q-epi", std::integral_constant<int, 7>{});
        probe(I2{}, S2{}, O0{}, X1{}, "prod/2/arith", std::integral_constant<int, 0>{});
        probe(I2{}, S2{}, O0{}, X1{}, "prod/2/-chain", std::integral_constant<int, 1>{});
        probe(I2{}, S2{}, O0{}, X1{}, "prod/2/-chain-q*", std::integral_constant<int, 3>{});
        probe(I0{}, S3{}, O0{}, X0{}, "sync/3", std::integral_constant<int, 0>{});
        probe(I1{}, S3{}, O0{}, X0{}, "nomath/3", std::integral_constant<int, 0>{});

        probe(I2{}, S2{}, O1{}, X2{}, "prod/2/o1/batch", std::integral_constant<int, 0>{});
        if (hnd) {  // bulk copies, unswizzled (the math reads them as swizzled: outputs wrong, timing only)
          probe(I1{}, S3{}, O2{}, X0{}, "nomath/3/bulk", std::integral_constant<int, 0>{});
          probe(I0{}, S3{}, O2{}, X0{}, "sync/3/bulk*", std::integral_constant<int, 0>{});
          probe(I2{}, S2{}, O2{}, X0{}, "prod/2/bulk*", std::integral_constant<int, 0>{});
          probe(I1{}, S3{}, O5{}, X0{}, "nomath/3/2d-swz", std::integral_constant<int, 0>{});
          probe(I1{}, S3{}, O6{}, X0{}, "nomath/3/2d-noswz", std::integral_constant<int, 0>{});
          probe(I0{}, S3{}, O5{}, X0{}, "sync/3/2d-swz", std::integral_constant<int, 0>{});
          probe(I2{}, S2{}, O5{}, X0{}, "prod/2/2d-swz", std::integral_constant<int, 0>{});
          probe(I2{}, S3{}, O5{}, X0{}, "prod/3/2d-swz", std::integral_constant<int, 0>{});
        }
      }
      for (int round = 0; round < 1; ++round) {
        report("eager", time([&] { decode(direct, direct_blocks); }));
        report("graph", time([&] { CK(cudaGraphLaunch(g_direct, st)); }));
        report("graph+merge", time([&] { CK(cudaGraphLaunch(g_direct_merge, st)); }));
        report("plan+merge", time([&] { CK(cudaGraphLaunch(g_plan_merge, st)); }));
        report("plan", time([&] { CK(cudaGraphLaunch(g_plan, st)); }));
        report("empty graph", time([&] { CK(cudaGraphLaunch(g_empty, st)); }));
      }
      CK(cudaGetLastError());
    }
    CK(cudaDeviceSynchronize());
    for (void* ptr_ : {(void*)kc, (void*)vc, (void*)q, (void*)out, (void*)lse, (void*)ind, (void*)ptr, (void*)last,
                       (void*)items, (void*)num, (void*)req, (void*)part_o, (void*)part_lse})
      CK(cudaFree(ptr_));
  }
  CK(cudaDeviceSynchronize());
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
