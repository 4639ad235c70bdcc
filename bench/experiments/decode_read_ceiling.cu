// Experiment (not a rung): the read bandwidth a decode step's access pattern allows, without the
// attention arithmetic. Batch 64 x 16k keys, 8 KV heads, d 128, bf16 (K and V 2.15 GB each):
//   contiguous  one grid-stride stream over K then V (the ceiling for reads)
//   bhnd        an item per (request, KV head) whose K and V are each one contiguous 4 MB run
//               (torch SDPA's contiguous (b, h, n, d) cache, what cuDNN reads)
//   hnd         pages of 16 tokens, layout (page, head, token, d): an item reads a 4 KB run per page
//   nhd         layout (page, token, head, d): an item reads 256-byte runs 2 KB apart
// Each item streams 64-key tiles of K and V, each thread 16 16-byte loads per tile (8 of K, 8 of
// V), all issued before any is used (as the decode's cp.async stages hold about a tile and a half
// in flight), XOR-folded into one word so the loads are not removed. Blocks of 128 threads;
// `per_sm` blocks per SM loop over the 512 items (item = block, block + grid, ...).
// Then the decode kernel's load structure without its math (`staged`): a block per item (512
// blocks, 2 resident per SM by shared memory, as decode rung 3) or 264 persistent blocks, 3
// stages of a 64-key K and V tile in shared memory, the loads of tile t + 2 issued before the
// wait for tile t; the loads by cp.async (.L2::256B, rows padded to 272 bytes: decode rung 3
// before TMA), by ld.global into registers stored after tile t's reads, or by one bulk copy per
// page run (4 KB) completing on the stage's mbarrier; `consume` also reads each tile back from
// shared memory (16 LDS.128 per thread).
// Last (`waves`): bulk copies per page (hnd, 16-token pages) at 4k and 16k keys, a block per item:
// 64-key tiles, 4 warps, ~106 KB a block (2 an SM: 512 items in two waves, as decode rung 3) against
// 32-key tiles, 2 warps, ~53 KB (4 an SM: one wave of 528 slots).
// Output: GB/s of K + V bytes for each pattern and grid.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

#include <cuda_runtime.h>

#include "kernels/common/tma.cuh"

using namespace flashlab::kernels;

constexpr int kBatch = 64, kHeads = 8, kKeys = 16384, kD = 128, kPage = 16, kTile = 64, kThreads = 128;
constexpr int64_t kRowBytes = kD * 2;                                   // 256
constexpr int64_t kBytesPerKV = int64_t(kBatch) * kHeads * kKeys * kRowBytes;  // 2 GiB
enum Pattern { kBhnd, kHnd, kNhd };

__device__ __forceinline__ uint4 ld_stream(const void* p, bool hint) {
  uint4 v;
  if (hint)
    asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Byte offset of key row `t` of item (b, h) in a K or V pool of the given pattern.
__device__ __forceinline__ int64_t row_offset(int pattern, int b, int h, int t) {
  if (pattern == kBhnd) return ((int64_t(b) * kHeads + h) * kKeys + t) * kRowBytes;
  const int64_t page = int64_t(b) * (kKeys / kPage) + t / kPage, slot = t % kPage;
  if (pattern == kHnd) return ((page * kHeads + h) * kPage + slot) * kRowBytes;
  return ((page * kPage + slot) * kHeads + h) * kRowBytes;  // kNhd
}

__global__ void __launch_bounds__(kThreads) item_read_kernel(const unsigned char* k, const unsigned char* v, int pattern,
                                                            bool hint, unsigned* sink) {
  unsigned acc = 0;
  // A tile is 64 rows x 256 bytes = 1024 pieces of 16 bytes; thread i takes pieces i + 128 j.
  for (int item = blockIdx.x; item < kBatch * kHeads; item += gridDim.x) {
    const int b = item / kHeads, h = item % kHeads;
    for (int t0 = 0; t0 < kKeys; t0 += kTile) {
      uint4 r[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int piece = threadIdx.x + kThreads * j, row = piece / 16, col = piece % 16;
        const int64_t off = row_offset(pattern, b, h, t0 + row) + col * 16;
        r[j] = ld_stream(k + off, hint);
        r[8 + j] = ld_stream(v + off, hint);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
    }
  }
  if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads
}

__global__ void contiguous_read_kernel(const uint4* a, int64_t n, bool hint, unsigned* sink) {
  unsigned acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 r[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) r[j] = ld_stream(a + i + j * stride, hint);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 r = ld_stream(a + i, hint);
    acc ^= r.x ^ r.y ^ r.z ^ r.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

constexpr int kStages = 3, kRowPad = 272, kTileBytes = kTile * kRowPad;  // one K or V tile in shared memory

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool hint) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (hint) asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src));
  else asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending)); }

// kind 0: cp.async per 16 bytes (decode rung 3); 1: ld.global into registers for tile t + 2,
// stored to shared memory after tile t's reads (register staging); 2: one cp.async.bulk per
// page run of 16 rows (4 KB contiguous in bhnd and hnd) completing on the stage's mbarrier,
// issued by thread 0. persistent: gridDim.x blocks loop over the items (else a block per item).
__global__ void __launch_bounds__(kThreads) staged_read_kernel(const unsigned char* k, const unsigned char* v, int pattern,
                                                              bool hint, bool consume, int kind, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t full[kStages];
  unsigned char* sk = smem;
  unsigned char* sv = smem + kStages * kTileBytes;
  unsigned acc = 0;
  constexpr int tiles = kKeys / kTile;
  if (kind == 2 && threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) mbarrier_init(&full[i], 1);
    fence_barrier_init();
  }
  __syncthreads();
  uint32_t phase_bits = 0;  // kind 2: the parity each stage's barrier is at
  for (int item = blockIdx.x; item < kBatch * kHeads; item += gridDim.x) {
    const int b = item / kHeads, h = item % kHeads;
    const auto piece_of = [&](int t, int j, int64_t& off, int& so) {
      const int piece = threadIdx.x + kThreads * j, row = piece / 16, col = piece % 16;
      off = row_offset(pattern, b, h, t * kTile + row) + col * 16;
      so = (t % kStages) * kTileBytes + row * kRowPad + col * 16;
    };
    const auto load = [&](int t) {
      if (kind == 2) {
        if (threadIdx.x == 0) {
          uint64_t* bar = &full[t % kStages];
          mbarrier_arrive_expect_tx(bar, 2 * kTile * kRowBytes);
          for (int pg = 0; pg < kTile / kPage; ++pg) {
            const int64_t off = row_offset(pattern, b, h, t * kTile + pg * kPage);
            const int so = (t % kStages) * kTileBytes + pg * kPage * kRowBytes;
            bulk_load(sk + so, k + off, kPage * kRowBytes, bar);
            bulk_load(sv + so, v + off, kPage * kRowBytes, bar);
          }
        }
        return;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int64_t off;
        int so;
        piece_of(t, j, off, so);
        cp_async16(sk + so, k + off, hint);
        cp_async16(sv + so, v + off, hint);
      }
    };
    const auto read_tile = [&](int t) {
      if (!consume) return;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int so = (t % kStages) * kTileBytes + (kind == 2 ? (threadIdx.x + kThreads * j) * 16
                                                               : ((threadIdx.x + kThreads * j) / 16) * kRowPad +
                                                                     ((threadIdx.x + kThreads * j) % 16) * 16);
        const uint4 a = *reinterpret_cast<const uint4*>(sk + so), c = *reinterpret_cast<const uint4*>(sv + so);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ c.x ^ c.y ^ c.z ^ c.w;
      }
    };
    if (kind == 1) {
      for (int t = 0; t < kStages - 1; ++t)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          int64_t off;
          int so;
          piece_of(t, j, off, so);
          *reinterpret_cast<uint4*>(sk + so) = ld_stream(k + off, hint);
          *reinterpret_cast<uint4*>(sv + so) = ld_stream(v + off, hint);
        }
      __syncthreads();
      for (int t = 0; t < tiles; ++t) {
        uint4 r[16];
        const bool next = t + kStages - 1 < tiles;
        if (next)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            int64_t off;
            int so;
            piece_of(t + kStages - 1, j, off, so);
            r[j] = ld_stream(k + off, hint);
            r[8 + j] = ld_stream(v + off, hint);
          }
        read_tile(t);
        if (next)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            int64_t off;
            int so;
            piece_of(t + kStages - 1, j, off, so);
            *reinterpret_cast<uint4*>(sk + so) = r[j];
            *reinterpret_cast<uint4*>(sv + so) = r[8 + j];
          }
        __syncthreads();
      }
      continue;
    }
    for (int t = 0; t < kStages - 1; ++t) {
      load(t);
      asm volatile("cp.async.commit_group;");
    }
    for (int t = 0; t < tiles; ++t) {
      __syncthreads();
      if (t + kStages - 1 < tiles) load(t + kStages - 1);
      if (kind == 2) {
        const int st = t % kStages;
        mbarrier_wait(&full[st], (phase_bits >> st) & 1);
        phase_bits ^= 1u << st;
      } else {
        asm volatile("cp.async.commit_group;");
        cp_async_wait<kStages - 1>();
        __syncthreads();
      }
      read_tile(t);
    }
    __syncthreads();
  }
  if (acc == 0x12345678u) *sink = acc;
}

template <int kTileT, int kThreadsT>
__global__ void __launch_bounds__(kThreadsT) wave_read_kernel(const unsigned char* k, const unsigned char* v, int keys,
                                                              unsigned* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t full[kStages];
  constexpr int kStageBytes = kTileT * int(kRowBytes);
  unsigned char* sk = smem;
  unsigned char* sv = smem + kStages * kStageBytes;
  const int item = blockIdx.x, b = item / kHeads, h = item % kHeads, tiles = keys / kTileT;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) mbarrier_init(&full[i], 1);
    fence_barrier_init();
  }
  __syncthreads();
  const auto load = [&](int t) {
    if (threadIdx.x == 0) {
      uint64_t* bar = &full[t % kStages];
      mbarrier_arrive_expect_tx(bar, 2 * kStageBytes);
      for (int pg = 0; pg < kTileT / kPage; ++pg) {
        const int tok = t * kTileT + pg * kPage;
        const int64_t off = ((int64_t(b) * (keys / kPage) + tok / kPage) * kHeads + h) * kPage * kRowBytes;
        const int so = (t % kStages) * kStageBytes + pg * kPage * int(kRowBytes);
        bulk_load(sk + so, k + off, kPage * kRowBytes, bar);
        bulk_load(sv + so, v + off, kPage * kRowBytes, bar);
      }
    }
  };
  unsigned acc = 0;
  for (int t = 0; t < kStages - 1 && t < tiles; ++t) load(t);
  for (int t = 0; t < tiles; ++t) {
    __syncthreads();
    if (t + kStages - 1 < tiles) load(t + kStages - 1);
    mbarrier_wait(&full[t % kStages], (t / kStages) & 1);
    const uint4 a = *reinterpret_cast<const uint4*>(sk + (t % kStages) * kStageBytes + threadIdx.x * 16);
    acc ^= a.x ^ a.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

template <typename F>
float time_ms(F f, void* flush, size_t flush_bytes) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int rep = 0; rep < 12; ++rep) {
    cudaMemsetAsync(flush, rep, flush_bytes);
    cudaEventRecord(e0);
    f();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned char* pool = nullptr;
  unsigned* sink = nullptr;
  void* flush = nullptr;
  const size_t flush_bytes = 256u << 20;
  if (cudaMalloc(&pool, 2 * kBytesPerKV) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess ||
      cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    std::printf("allocation failed\n");
    return 1;
  }
  cudaMemset(pool, 1, 2 * kBytesPerKV);
  const unsigned char* k = pool;
  const unsigned char* v = pool + kBytesPerKV;
  const double bytes = 2.0 * kBytesPerKV;
  std::printf("K + V = %.2f GB, %d SMs\n", bytes / 1e9, sms);
  for (int hint = 0; hint < 2; ++hint) {
    for (int per_sm : {4, 8, 16}) {
      const float ms = time_ms([&] {
        contiguous_read_kernel<<<sms * per_sm, 256>>>(reinterpret_cast<const uint4*>(pool), 2 * kBytesPerKV / 16, hint, sink);
      }, flush, flush_bytes);
      std::printf("contiguous      hint=%d blocks/SM=%2d  %.4f ms  %.1f GB/s\n", hint, per_sm, ms, bytes / ms / 1e6);
    }
    const char* names[] = {"bhnd", "hnd", "nhd"};
    for (int pattern = 0; pattern < 3; ++pattern)
      for (int per_sm : {2, 3, 4}) {
        const float ms = time_ms([&] { item_read_kernel<<<sms * per_sm, kThreads>>>(k, v, pattern, hint, sink); }, flush,
                                 flush_bytes);
        std::printf("items %-9s hint=%d blocks/SM=%2d  %.4f ms  %.1f GB/s\n", names[pattern], hint, per_sm, ms,
                    bytes / ms / 1e6);
      }
    {
      const float ms = time_ms([&] { item_read_kernel<<<kBatch * kHeads, kThreads>>>(k, v, kHnd, hint, sink); }, flush,
                               flush_bytes);
      std::printf("items hnd       hint=%d one block per item (512)  %.4f ms  %.1f GB/s\n", hint, ms, bytes / ms / 1e6);
    }
  }
  const int smem = 2 * kStages * kTileBytes + 4096;  // ~106 KB: 2 blocks per SM, as decode rung 3
  cudaFuncSetAttribute(staged_read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const char* kinds[] = {"cp.async", "ldg->sts", "bulk/page"};
  for (int kind = 0; kind < 3; ++kind)
    for (int persistent = 0; persistent < 2; ++persistent)
      for (int consume = 0; consume < 2; ++consume)
        for (int pattern : {kBhnd, kHnd}) {
          const int grid = persistent ? 2 * sms : kBatch * kHeads;
          const float ms = time_ms([&] {
            staged_read_kernel<<<grid, kThreads, smem>>>(k, v, pattern, true, consume, kind, sink);
          }, flush, flush_bytes);
          std::printf("staged %-9s %-4s consume=%d grid %4d%s  %.4f ms  %.1f GB/s\n", kinds[kind],
                      pattern == kBhnd ? "bhnd" : "hnd", consume, grid, persistent ? " (persistent)" : "", ms, bytes / ms / 1e6);
        }
  {
    auto k64 = wave_read_kernel<64, 128>;
    auto k32 = wave_read_kernel<32, 64>;
    const int smem64 = 106 * 1024, smem32 = 53 * 1024;  // decode rung 3's footprint, and half of it
    cudaFuncSetAttribute(k64, cudaFuncAttributeMaxDynamicSharedMemorySize, smem64);
    cudaFuncSetAttribute(k32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem32);
    int per64 = 0, per32 = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per64, k64, 128, smem64);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per32, k32, 64, smem32);
    for (int keys : {4096, 16384}) {
      const double kv_bytes = 2.0 * kBatch * kHeads * keys * kRowBytes;
      for (int rep = 0; rep < 2; ++rep) {
        const float ms64 = time_ms([&] { k64<<<kBatch * kHeads, 128, smem64>>>(k, v, keys, sink); }, flush, flush_bytes);
        const float ms32 = time_ms([&] { k32<<<kBatch * kHeads, 64, smem32>>>(k, v, keys, sink); }, flush, flush_bytes);
        std::printf("waves keys %5d: 64-key tiles, %d blocks/SM %.4f ms %.1f GB/s | 32-key tiles, %d blocks/SM %.4f ms %.1f GB/s\n",
                    keys, per64, ms64, kv_bytes / ms64 / 1e6, per32, ms32, kv_bytes / ms32 / 1e6);
      }
    }
  }
  std::printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
