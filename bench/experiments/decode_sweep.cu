// Experiment (not a rung): decode rung 3's time over batch and KV length, to split a step's time
// into a fixed part and a per-key part (time = a + b x keys) and to see how the items' waves
// cost. Rung 3's own TMA kernel launched directly (a block per (request, KV head), every request
// whole, no merge), bf16, 32 query / 8 KV heads, d 128, pages of 16 in order, HND; L2 flushed
// by a 256 MiB memset before each repetition, CUDA events, median of 30.
// Shapes: batch 64 at 1k .. 16k keys; batch 33 / 66 at 4k (2 / 4 whole waves of 132 slots against
// 64's 3.88); batch 16 and 8 at 16k (one wave on 128 / 64 SMs: the rate one block an SM reaches);
// the bytes of 64 x 4k in 128 .. 4096 items (16 x 16k .. 512 x 512: the cost of an item's start).
// Each shape with three kernels: "block" (rung 3's block-per-item producer kernel, 03_split.cuh),
// "ws" and "ws-static" (the persistent kernel, 03_split_ws.cuh, items claimed in order / every
// gridDim.x-th; an experiment in decode_ws_kernel.cuh until 2026-11-26). Then the
// plan's path (items table, capacity grid, merge kernel) against the direct grid at batch 64.
// argv[2] = "ncu": batch 8 x 16k once per kernel, for a profiler.
// Build it once per configuration of the producer kernel (stages, math warps) to compare them;
// argv[1] adds dynamic shared memory per block to hold fewer blocks an SM:
//   nvcc -std=c++17 -O3 -I. -Iinclude -Isrc --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     [-DFLASHLAB_DECODE_PRODUCER_STAGES=3] [-DFLASHLAB_DECODE_PRODUCER_WARPS=2] bench/experiments/decode_sweep.cu src/core/tensor_map.cpp \
//     src/core/tensor.cpp src/core/validate.cpp -o build/exp/decode_sweep
// Output: the check of one shape against a float64 reference, then per shape ms and K + V GB/s.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench/experiments/standalone.h"
#include "kernels/attention/decode/03_split.cuh"
#include "kernels/attention/decode/03_split_ws.cuh"
#include "src/core/tensor_map.h"

using namespace flashlab;
using namespace flashlab::kernels;

constexpr int kHq = 32, kHk = 8, kD = 128, kPage = 16;
using T = __nv_bfloat16;
using Tr = DecodeSplitTraits<kD, 2, true>;

__global__ void fill_kernel(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 32768.f - 1.f);
  }
}

// argv[1]: extra dynamic shared memory per block (bytes), to hold fewer blocks an SM.
int main(int argc, char** argv) {
  const int pad = argc > 1 ? std::atoi(argv[1]) : 0;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  FlushedTimer time(st);
  const auto kernel = paged_decode_split_kernel<T, kD, T, true>;
  const int smem = Tr::kSmemBytesTma + pad;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, smem));
  std::printf("producer stages %d, %d math warps, %d threads, %d bytes of shared memory, %d blocks an SM\n", Tr::kStages,
              Tr::kWarps, Tr::kThreads, smem, per_sm);

  // One pool for the largest shape (64 x 16k tokens), HND: (page, head, slot, d).
  const int64_t max_tokens = int64_t(64) * 16384, max_pages = max_tokens / kPage;
  const size_t cache_elems = size_t(max_tokens) * kHk * kD;
  T *kc, *vc, *q, *out;
  float* lse;
  int *ind, *ptr, *last;
  CK(cudaMalloc(&kc, cache_elems * 2));
  CK(cudaMalloc(&vc, cache_elems * 2));
  fill_kernel<<<1024, 256>>>(kc, cache_elems, 1u);
  fill_kernel<<<1024, 256>>>(vc, cache_elems, 2u);
  constexpr int kMaxBatch = 512;
  CK(cudaMalloc(&q, kMaxBatch * kHq * kD * 2));
  fill_kernel<<<64, 256>>>(q, kMaxBatch * kHq * kD, 3u);
  CK(cudaMalloc(&out, kMaxBatch * kHq * kD * 2));
  CK(cudaMalloc(&lse, kMaxBatch * kHq * 4));
  std::vector<int> h_ind(max_pages);
  for (int64_t i = 0; i < max_pages; ++i) h_ind[i] = static_cast<int>(i);
  CK(cudaMalloc(&ind, max_pages * 4));
  CK(cudaMalloc(&ptr, (kMaxBatch + 1) * 4));
  CK(cudaMalloc(&last, kMaxBatch * 4));
  CK(cudaMemcpy(ind, h_ind.data(), max_pages * 4, cudaMemcpyHostToDevice));

  PagedDecodeParams p{};
  p.q = q, p.q_batch_stride = kHq * kD, p.q_head_stride = kD;
  p.k_cache = kc, p.v_cache = vc;
  p.page_stride = int64_t(kPage) * kHk * kD, p.slot_stride = kD, p.head_stride = kPage * kD;
  p.v_page_stride = p.page_stride, p.v_slot_stride = p.slot_stride, p.v_head_stride = p.head_stride;
  p.kv_indices = ind, p.kv_indptr = ptr, p.kv_last_page_len = last;
  p.out = out, p.out_batch_stride = kHq * kD, p.out_head_stride = kD, p.lse = lse;
  p.scale = 0.08838834764831845f, p.nheads = kHq, p.nheads_kv = kHk, p.page_size = kPage;
  PagedDecodeSplit s{};
  s.page_size = IntDivisor(kPage), s.k_scale = s.v_scale = 1.f, s.kv_same_strides = true;
  DecodeTmaMaps maps{};
  maps.box_rows = kPage;
  const int64_t es = 2, line = 64;
  const int64_t dims[5] = {line, kPage, kD / line, kHk, max_pages};
  const int64_t strides[4] = {p.slot_stride * es, 128, p.head_stride * es, p.page_stride * es};
  const int box[5] = {int(line), kPage, kD / int(line), 1, 1};
  maps.k = detail::make_tensor_map_5d(kc, DType::kBF16, dims, strides, box);
  maps.v = detail::make_tensor_map_5d(vc, DType::kBF16, dims, strides, box);

  // The kernels: "block" (rung 3's, a block per item), "ws" (03_split_ws.cuh: persistent, a block
  // per resident slot claiming items in order), "ws-static" (the same, item u + gridDim.x next).
  using Ws = DecodeWsTraits<kD>;
  const auto ws_kernel = paged_decode_split_ws_kernel<T, kD>;
  CK(cudaFuncSetAttribute(ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Ws::kSmemBytes));
  CK(cudaFuncSetAttribute(ws_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  int ws_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ws_per_sm, ws_kernel, Ws::kThreads, Ws::kSmemBytes));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int ws_slots = ws_per_sm * sms;
  int* sched;
  CK(cudaMalloc(&sched, 8));
  CK(cudaMemset(sched, 0, 8));
  std::printf("persistent kernel: %d blocks an SM, %d slots, %d bytes of shared memory\n", ws_per_sm, ws_slots, Ws::kSmemBytes);
  const char* const modes[] = {"block", "ws", "ws-static"};
  const auto launch = [&](int mode, const PagedDecodeSplit& sp, int blocks) {
    if (mode == 0) {
      kernel<<<blocks, Tr::kThreads, smem, st>>>(p, sp, maps);
    } else {
      PagedDecodeSplit x = sp;
      x.claims = mode == 1 ? sched : nullptr;
      ws_kernel<<<std::min(blocks, ws_slots), Ws::kThreads, Ws::kSmemBytes, st>>>(p, x, maps);
    }
  };

  struct Shape {
    int batch, keys;
  };
  // argv[2] = "ncu": batch 8 x 16k once per kernel (block, ws), for a profiler.
  if (argc > 2 && std::string(argv[2]) == "ncu") {
    const int batch = 8, keys = 16384, per_req = keys / kPage;
    std::vector<int> h_ptr(batch + 1), h_last(batch, kPage);
    for (int b = 0; b <= batch; ++b) h_ptr[b] = b * per_req;
    CK(cudaMemcpy(ptr, h_ptr.data(), h_ptr.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(last, h_last.data(), h_last.size() * 4, cudaMemcpyHostToDevice));
    p.batch = batch;
    for (int mode = 0; mode < 2; ++mode) launch(mode, s, batch * kHk);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  const Shape shapes[] = {{64, 1024}, {64, 2048}, {64, 4096}, {64, 8192}, {64, 16384},
                          {33, 4096}, {66, 4096}, {16, 16384}, {8, 16384},
                          // the same bytes in more, shorter items: the cost of an item's start
                          {32, 8192}, {128, 2048}, {256, 1024}, {512, 512}};
  // Correctness first (batch 64 x 1k, requests 0 and 37, every head): against a float64
  // reference on the host, outputs poisoned before the launch.
  for (int mode = 0; mode < 3; ++mode) {
    const int batch = 64, keys = 1024, per_req = keys / kPage;
    std::vector<int> h_ptr(batch + 1), h_last(batch, kPage);
    for (int b = 0; b <= batch; ++b) h_ptr[b] = b * per_req;
    CK(cudaMemcpy(ptr, h_ptr.data(), h_ptr.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(last, h_last.data(), h_last.size() * 4, cudaMemcpyHostToDevice));
    p.batch = batch;
    CK(cudaMemset(out, 0xff, size_t(batch) * kHq * kD * 2));
    launch(mode, s, batch * kHk);
    CK(cudaStreamSynchronize(st));
    std::vector<T> h_out(size_t(batch) * kHq * kD), h_q(h_out.size());
    CK(cudaMemcpy(h_out.data(), out, h_out.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h_q.data(), q, h_q.size() * 2, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int b : {0, 37}) {
      const size_t elems = size_t(per_req) * kPage * kHk * kD, at = size_t(b) * elems;  // the request's pages (HND)
      std::vector<T> hk(elems), hv(elems);
      CK(cudaMemcpy(hk.data(), kc + at, elems * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hv.data(), vc + at, elems * 2, cudaMemcpyDeviceToHost));
      for (int h = 0; h < kHq; ++h) {
        const int g = h / (kHq / kHk);
        std::vector<double> sc(keys);
        double mx = -1e300;
        for (int t = 0; t < keys; ++t) {
          const size_t row = ((size_t(t / kPage) * kHk + g) * kPage + t % kPage) * kD;
          double d = 0;
          for (int c = 0; c < kD; ++c)
            d += double(__bfloat162float(h_q[(size_t(b) * kHq + h) * kD + c])) * __bfloat162float(hk[row + c]);
          sc[t] = d * p.scale, mx = std::max(mx, sc[t]);
        }
        double sum = 0;
        for (double& x : sc) sum += x = std::exp(x - mx);
        for (int c = 0; c < kD; ++c) {
          double o = 0;
          for (int t = 0; t < keys; ++t)
            o += sc[t] * __bfloat162float(hv[((size_t(t / kPage) * kHk + g) * kPage + t % kPage) * kD + c]);
          const double got = __bfloat162float(h_out[(size_t(b) * kHq + h) * kD + c]);
          const double err = std::fabs(got - o / sum);
          worst = std::isnan(got) ? INFINITY : std::max(worst, err);
        }
      }
    }
    std::printf("%s: max |out - reference| (batch 64 x 1k, requests 0 and 37): %.3g%s\n", modes[mode], worst,
                worst < 4e-3 ? "" : "  FAILED");
  }
  for (int round = 0; round < 2; ++round)
    for (const Shape& sh : shapes) {
      const int per_req = sh.keys / kPage;
      std::vector<int> h_ptr(sh.batch + 1), h_last(sh.batch, kPage);
      for (int b = 0; b <= sh.batch; ++b) h_ptr[b] = b * per_req;
      CK(cudaMemcpy(ptr, h_ptr.data(), h_ptr.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(last, h_last.data(), h_last.size() * 4, cudaMemcpyHostToDevice));
      p.batch = sh.batch;
      const int blocks = sh.batch * kHk;
      const double gb = 2.0 * sh.batch * sh.keys * kHk * kD * 2 / 1e9;
      for (int mode = 0; mode < 3; ++mode) {
        const double ms = time([&] { launch(mode, s, blocks); });
        std::printf("%-9s warps %d stages %d per_sm %d batch %2d keys %5d items %3d  %8.4f ms %7.1f GB/s\n", modes[mode],
                    Tr::kWarps, Tr::kStages, per_sm, sh.batch, sh.keys, blocks, ms, gb / ms * 1e3);
      }
    }
  // The plan's path against the direct grid (batch 64, every request one item): the items table
  // read per block (identity order), the grid of the plan's capacity (64 + 2 x 17 items x 8
  // heads: 272 blocks that exit at once), and the merge kernel as a programmatic dependent (what
  // batch_decode_run launches).
  {
    const int batch = 64, capacity = 164;  // 64 + 2 x 50 (the workspace's: the e4m3 kernel's 396 slots / 8)
    std::vector<int4> h_items(capacity, make_int4(0, 0, 0, -1));
    for (int i = 0; i < batch; ++i) h_items[i] = make_int4(i, 0, -1, -1);
    std::vector<int> h_req(batch + 1);
    for (int b = 0; b <= batch; ++b) h_req[b] = b;
    int4* items;
    int *num, *req;
    float *part_o, *part_lse;
    CK(cudaMalloc(&items, capacity * 16));
    CK(cudaMalloc(&num, 4));
    CK(cudaMalloc(&req, (batch + 1) * 4));
    CK(cudaMalloc(&part_o, size_t(capacity) * kHq * kD * 4));
    CK(cudaMalloc(&part_lse, size_t(capacity) * kHq * 4));
    CK(cudaMemcpy(items, h_items.data(), capacity * 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(num, &batch, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(req, h_req.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    PagedDecodeSplit plan = s;
    plan.items = items, plan.num_items = num, plan.request_items = req, plan.partial_o = part_o, plan.partial_lse = part_lse;
    const auto merge = [&] {
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(batch, kHq);
      config.blockDim = dim3(128);
      config.stream = st;
      config.attrs = &attr;
      config.numAttrs = 1;
      CK(cudaLaunchKernelEx(&config, paged_decode_merge_kernel<T, kD>, p, plan));
    };
    for (int round = 0; round < 2; ++round)
      for (int keys : {1024, 4096, 16384}) {
        const int per_req = keys / kPage;
        std::vector<int> h_ptr(batch + 1), h_last(batch, kPage);
        for (int b = 0; b <= batch; ++b) h_ptr[b] = b * per_req;
        CK(cudaMemcpy(ptr, h_ptr.data(), h_ptr.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(last, h_last.data(), h_last.size() * 4, cudaMemcpyHostToDevice));
        p.batch = batch;
        const double gb = 2.0 * batch * keys * kHk * kD * 2 / 1e9;
        const auto row = [&](const char* name, double ms) {
          std::printf("path %-22s batch %d keys %5d  %8.4f ms %7.1f GB/s\n", name, batch, keys, ms, gb / ms * 1e3);
        };
        row("direct 512", time([&] { kernel<<<batch * kHk, Tr::kThreads, smem, st>>>(p, s, maps); }));
        row("items 512", time([&] { kernel<<<batch * kHk, Tr::kThreads, smem, st>>>(p, plan, maps); }));
        row("items 784", time([&] { kernel<<<98 * kHk, Tr::kThreads, smem, st>>>(p, plan, maps); }));
        row("items 784 + merge", time([&] {
              kernel<<<98 * kHk, Tr::kThreads, smem, st>>>(p, plan, maps);
              merge();
            }));
        row("items 1312 + merge", time([&] {
              kernel<<<capacity * kHk, Tr::kThreads, smem, st>>>(p, plan, maps);
              merge();
            }));
        row("ws items + merge", time([&] {
              launch(1, plan, 98 * kHk);
              merge();
            }));
        row("direct 512 + merge", time([&] {
              kernel<<<batch * kHk, Tr::kThreads, smem, st>>>(p, s, maps);
              merge();
            }));
      }
  }
  CK(cudaDeviceSynchronize());
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
