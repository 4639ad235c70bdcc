// Backward rung 3, split form — the consumers split the head dim and the two score products.
// The library's at head dim 256; at 128 an alternative to 03_hopper.cuh (measured against it by
// bench/experiments/attention_bwd_hopper_ablation.cu).
//
// Why not 03_hopper.cuh's layout at d 256: there each consumer warpgroup owns 64 keys and keeps
// their dK and dV (64 x d fp32 each) in registers; at d 256 that is 256 registers a thread before
// any score. Here a block owns kBlockN keys (64 at d 256, 128 at d 128: one or two 64-key wgmma
// tiles, kKeyTiles) and the consumers split the work differently:
//   - dK, dV: consumer cw owns head-dim columns d / 2 cw .. d / 2 cw + d / 2 - 1 of all the
//     block's keys (64 + 64 registers a thread).
//   - The two score products, one each, both kBlockN keys x 64 query rows over the whole head dim:
//     consumer 0 computes S^T = K Q^T and P^T (with the mask, lse, ALiBi), consumer 1 computes
//     dP^T = V dO^T. Consumer 0 hands P^T (fp32, each thread's accumulator elements where the
//     same thread of consumer 1 holds the matching dP^T ones) to consumer 1 through shared memory;
//     consumer 1 forms dS^T = P^T (dP^T - D) scale and writes it (16-bit, swizzled) for both.
//   - Then each its columns: dV += P^T dO (P from registers), dK += dS^T Q, dQ = dS K (dS from
//     shared memory), so the products per step are 5 x (64 x 64 x 128) multiply-adds for each
//     consumer, none computed twice (both head dims).
//   - dQ: no room for a tile of its own (64 x 256 fp32 = 64 KB at d 256, beside two stages of Q
//     and dO of 64 KB each): each consumer stages its 64 x d / 2 fp32 in the step's own Q and dO
//     boxes once its products are done (only it reads those by then), and a producer warp adds
//     it to dq_accum by TMA reduction (kDqMode, below).
// Pipelining: the consumers meet twice a step (P^T ready; dS^T ready), and consumer 1 issues its
// products after consumer 0's, so consumer 0's next S^T runs under consumer 1's dV / dK / dQ, and
// consumer 1's dS pass under consumer 0's dV. Shared memory at d 256 (bytes): K, V 64 K; two stages
// of Q, dO, lse, D 129 K; P^T (fp32) 16 K; two dS^T buffers 16 K: 226 KB of the 227 (d 128: 194 KB).
// No softcap (its gradient factor needs S where dS is formed: rung 2 takes it); ALiBi, masks,
// windows, GQA, varlen as 03_hopper.cuh.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "kernels/attention/04_hopper.cuh"
#include "kernels/attention/backward/02_flash2.cuh"
#include "kernels/attention/backward/03_hopper.cuh"
#include "kernels/attention/backward/common.cuh"
#include "kernels/attention/common.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/dtype.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"

namespace flashlab::kernels {

template <int kHeadDim_>
struct HopperBwdSplitTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;                        // query rows per step
  static constexpr int kBlockN = kHeadDim == 256 ? 64 : 128;  // keys per block
  static constexpr int kKeyTiles = kBlockN / 64;            // 64-key wgmma tiles (M) per consumer
  static constexpr int kThreads = 384; // producer + 2 consumer warpgroups
  static constexpr int kStages = 2;    // Q, dO, lse, D
  static constexpr int kBoxes = kHeadDim / 64;             // 64-column (128-byte) TMA boxes per row
  static constexpr int kKBytes = kBoxes * kBlockN * 128;   // K (and V)
  static constexpr int kQBytes = kBoxes * kBlockM * 128;   // one stage of Q (and of dO)
  static constexpr int kPBytes = kBlockN * kBlockM * 4;    // P^T, fp32
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;   // dS^T: kBlockN keys x 128-byte rows
  static constexpr int kRowBytes = kBlockM * 4;            // lse or D of one step
  static constexpr int kStepBytes = 2 * kQBytes + 2 * kRowBytes;
  static constexpr int kCols = kHeadDim / 2;               // dK, dV, dQ columns per consumer
  static constexpr int kColBoxes = kCols / 64;             // its 64-column boxes of Q, dO, K
  static constexpr int kSmemBytes = 2 * kKBytes + kStages * kStepBytes + kPBytes + 2 * kDsBytes + 1024;
  static_assert(kHeadDim == 128 || kHeadDim == 256, "head dims 128 and 256");
  static_assert(kAttnBwdRowPad % kBlockM == 0, "whole steps of padded rows");
  static_assert(kSmemBytes <= 227 * 1024, "the shared memory of one block on sm_90");
};

// Grid (ceil(max_sk / kBlockN), nheads_kv, batch), 384 threads, HopperBwdSplitTraits::kSmemBytes
// dynamic shared memory; args as attn_bwd_hopper_kernel's with kBlockM-row boxes for Q, dO and
// kBlockN-row boxes for K, V.
// dq_accum zeroed, dsum and lse_log2 written first (the preprocess). kAlibi: ALiBi slopes
// (softcap is not taken). kDqMode: how dQ reaches dq_accum —
//   2: TMA reductions from the step's own stage (below), issued by producer warps 1 and 2 (one per
//      consumer), which wait for them to read the stage and hand it back to the loads;
//   1: the same reductions issued by each consumer's thread 0, which waits for their reads in the
//      next step (under its score product);
//   0: red.global.add.v2.f32 from registers (dq_accum's map unused).
// kProbe (experiments only): 2 skips dQ's TMA reductions (what they cost the loop; wrong
// gradients); 3 stores the dQ tiles in column order (two-way bank conflicts; the form before
// 2026-11-27 (23)); 9 rebuilds every wgmma descriptor from its address (wgmma_desc_sw128_at; the form before
// 2026-11-27 (24)). (A probe 1 without the Q / dO reloads, 3987653, ran 1-2% faster than the
// kernel: the loads are not what it waits for.)
template <typename T, int kHeadDim, bool kAlibi, int kDqMode = 2, int kProbe = 0>
__global__ void __launch_bounds__(384, 1) attn_bwd_hopper_split_kernel(const __grid_constant__ HopperBwdArgs args) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // wgmma, TMA and setmaxnreg need sm_90a; the host launches this kernel only there
#else
  using Tr = HopperBwdSplitTraits<kHeadDim>;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kStages = Tr::kStages, kC = Tr::kCols, kKT = Tr::kKeyTiles;
  constexpr int kCB = Tr::kColBoxes;
  extern __shared__ unsigned char smem_raw[];
  // kv_full: K and V landed; full / empty: a Q / dO / lse / D stage; p_full / p_empty: P^T written
  // by consumer 0 / read by consumer 1; ds_full / ds_empty: a dS^T buffer written by consumer 1 /
  // read by both consumers' products.
  // dq_full[2 s + cw] (kDqMode 2): consumer cw's dQ tile of the step in stage s staged.
  __shared__ uint64_t kv_full, full[kStages], empty[kStages], p_full, p_empty, ds_full[2], ds_empty[2], dq_full[2 * kStages];
  constexpr bool kDqByTma = kDqMode > 0;
  static_assert(kDqMode >= 0 && kDqMode <= 2 && (kProbe == 0 || kProbe == 2 || kProbe == 3 || kProbe == 9),
                "kDqMode 0..2, kProbe 0, 2, 3 or 9");
  // A k-step's descriptor: the product's first one advanced by the k-step's offset (one add
  // instead of mask, shift and or per wgmma); kProbe 9 rebuilds it (the form before 2026-11-27 (24)).
  constexpr bool kRebuildDesc = kProbe == 9;
  // Named barriers (0 is __syncthreads): consumer cw's own 128 threads.
  const auto consumer_sync = [](int cw) { named_barrier_sync(2 + cw, 128); };
  unsigned char* smem = align_smem<1024>(smem_raw);  // 128B-swizzled tiles on 1024-byte boundaries
  unsigned char* sk = smem;                          // K: kBoxes x kN keys x 128 bytes
  unsigned char* sv = sk + Tr::kKBytes;              // V
  unsigned char* sq = sv + Tr::kKBytes;              // (kStages, kBoxes x 64 rows)
  unsigned char* sdo = sq + kStages * Tr::kQBytes;   // (kStages, kBoxes x 64 rows)
  unsigned char* sds = sdo + kStages * Tr::kQBytes;  // (2, kN keys x 128 bytes): dS^T
  float4* sp = reinterpret_cast<float4*>(sds + 2 * Tr::kDsBytes);  // P^T: (kKT x 8, 128 threads) float4
  float* slse = reinterpret_cast<float*>(sp) + kN * kM;             // (kStages, 64): lse log2(e)
  float* sdsum = slse + kStages * kM;                               // (kStages, 64): D
  const AttnBwdParams& p = args.p;

  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * kN;
  const AttnBatch sb = attn_batch(p, b);
  if (n0 >= sb.sk) return;  // varlen: this batch has fewer keys (the whole block leaves)
  const int group = p.nheads / p.nheads_kv;
  const HopperBwdSteps steps = hopper_bwd_steps<kM, kN>(p, sb, n0);
  const int m_first = steps.m_first, m_blocks = steps.m_blocks, n_steps = steps.n_steps;

  if (threadIdx.x == 0) {
    mbarrier_init(&kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);     // the producer's arrive + the copies' bytes
      // kDqByTma: once the two dQ reductions have read the stage (the reducing threads); else every
      // consumer thread (each reads lse or D itself).
      mbarrier_init(&empty[s], kDqByTma ? 2 : 256);
      for (int x = 0; x < 2; ++x) mbarrier_init(&dq_full[2 * s + x], 128);  // a consumer's threads
    }
    mbarrier_init(&p_full, 128);   // consumer 0's threads
    mbarrier_init(&p_empty, 128);  // consumer 1's threads
    for (int x = 0; x < 2; ++x) {
      mbarrier_init(&ds_full[x], 128);   // consumer 1's threads, after their dS^T writes
      mbarrier_init(&ds_empty[x], 256);  // every consumer thread, after its dK and dQ products
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup_index() == 0) {  // producer
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0 && n_steps > 0) {
      hopper_bwd_produce<Tr>(args, sb, b, hk, n0, steps, sk, sv, sq, sdo, slse, sdsum, &kv_full, full, empty);
    } else if (kDqMode == 2 && (threadIdx.x == 32 || threadIdx.x == 64)) {
      // Consumer rc's dQ tiles: once staged (in the stage's Q / dO boxes kCB rc .. kCB rc + kCB - 1),
      // added to dq_accum by TMA; the stage goes back to the loads once both reductions have read it.
      const int rc = threadIdx.x / 32 - 1;
#pragma unroll 1
      for (int st = 0; st < n_steps; ++st) {
        const int s = st % kStages;
        const int h = hk * group + st / m_blocks, m0 = m_first + kM * (st % m_blocks);
        mbarrier_wait(&dq_full[2 * s + rc], (st / kStages) & 1);
        const int row0 = static_cast<int>(attn_dq_accum_row(p, b, sb, m0));
        unsigned char* tiles[2] = {sq + s * Tr::kQBytes + kCB * rc * kM * 128, sdo + s * Tr::kQBytes + kCB * rc * kM * 128};
#pragma unroll
        for (int x = 0; x < (kProbe == 2 ? 0 : kC / 32); ++x)
          tma_reduce_add_4d(&args.dq_accum, tiles[x / kCB] + (x % kCB) * kM * 128, kC * rc + 32 * x, h, row0, 0);
        tma_store_commit();
        tma_store_wait_all<true>();
        mbarrier_arrive(&empty[s]);
      }
    }
    return;
  }

  // Consumers: cw 0 (S^T, P^T) and 1 (dP^T, dS^T); each owns head-dim columns kC cw .. + kC - 1.
  setmaxnreg_inc<240>();
  const ConsumerThread c = consumer_thread();
  const int cw = c.cw, t128 = c.t128, warp = c.warp, g = c.g, t = c.t;
  const int key_base = 16 * warp + g;  // this thread's keys (in each 64-key tile): key_base, + 8
  const int cwu = warpgroup_index() - 1;  // cw, warp-uniform: the descriptors below in uniform registers

  // dK, dV accumulators of key tile kt: d[4 j + 2 r + c] = key 64 kt + key_base + 8 r, column
  // kC cw + 8 j + 2 t + c.
  float dk[kKT][kC / 2], dv[kKT][kC / 2];
#pragma unroll
  for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
    for (int e = 0; e < kC / 2; ++e) dk[kt][e] = dv[kt][e] = 0.f;

  // This consumer's columns of K, Q, dO: boxes kCB cw .. kCB cw + kCB - 1.
  const uint32_t k_cols = smem_u32(sk) + kCB * cwu * kN * 128;
  const uint32_t score_a = smem_u32(cwu == 0 ? sk : sv);  // S^T = K Q^T or dP^T = V dO^T

  if (n_steps > 0) mbarrier_wait(&kv_full, 0);
  for (int st = 0; st < n_steps; ++st) {
    const int s = st % kStages;
    const int h = hk * group + st / m_blocks, m0 = m_first + kM * (st % m_blocks);
    const uint32_t q_base = smem_u32(sq + s * Tr::kQBytes), do_base = smem_u32(sdo + s * Tr::kQBytes);
    unsigned char* ds_buf = sds + (st % 2) * Tr::kDsBytes;
    const uint32_t ds_base = smem_u32(ds_buf);
    mbarrier_wait(&full[s], (st / kStages) & 1);

    // The score product, kN keys x 64 rows over the head dim (both K-major), one 64-key tile kt at a
    // time: acc[kt][4 j + 2 r + c] = key 64 kt + key_base + 8 r, query row m0 + 8 j + 2 t + c.
    float acc[kKT][kM / 2];
    {
      const uint32_t b_rows = cwu == 0 ? q_base : do_base;
      const uint64_t da0 = wgmma_desc_sw128(score_a, 16, 1024), db0 = wgmma_desc_sw128(b_rows, 16, 1024);
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt) wgmma_fence_operands(acc[kt]);
      wgmma_fence();
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk) {
          const uint32_t a_off = (kk / 4) * kN * 128 + kt * 64 * 128 + (kk % 4) * 32, b_off = (kk / 4) * kM * 128 + (kk % 4) * 32;
          Wgmma<T, kM>::template mma<0, 0>(acc[kt], wgmma_desc_sw128_at<kRebuildDesc>(da0, score_a, 16, a_off),
                                           wgmma_desc_sw128_at<kRebuildDesc>(db0, b_rows, 16, b_off), kk > 0 ? 1 : 0);
        }
      wgmma_commit();
      // kDqMode 1: the previous step's dQ reduction has read its stage (under this product).
      if (kDqMode == 1 && st > 0 && t128 == 0) {
        tma_store_wait_all<true>();
        mbarrier_arrive(&empty[(st - 1) % kStages]);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt) wgmma_fence_operands(acc[kt]);
    }

    // P^T in dV's register A fragments, per key tile (the accumulator's n8 tiles 2 kk, 2 kk + 1
    // are k-step kk).
    uint32_t pa[kKT][kM / 16][4];
    const auto pack_p = [&](int kt, int j, float p0, float p1, float p2, float p3) {
      pa[kt][j / 2][2 * (j % 2)] = pack2<T>(p0, p1), pa[kt][j / 2][2 * (j % 2) + 1] = pack2<T>(p2, p3);
    };
    const AttnBwdScore score(attn_score_mod(p, b, h, sb));
    if (cw == 0) {
      // P^T = exp2(S^T scale log2(e) - lse log2(e)), 0 where masked.
      const AttnScoreMod& mod = score.mod;
      const bool need_mask = attn_bwd_step_needs_mask(mod, m0, kM, n0, kN, sb.sk);
      // The rows that see key 64 kt + key_base + 8 r, from this thread's first row m0 + 2 t.
      AttnBwdRowBounds seen[kKT][2];
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int r = 0; r < 2; ++r) seen[kt][r] = attn_bwd_row_bounds(mod, n0 + 64 * kt + key_base + 8 * r, m0 + 2 * t, sb.sk);
      const float* lse_s = slse + s * kM;
      const auto p_pass = [&](auto mask_tag) {
        constexpr bool kMask = decltype(mask_tag)::value;
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) {
          const float2 lse2 = *reinterpret_cast<const float2*>(lse_s + 8 * j + 2 * t);
#pragma unroll
          for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const AttnBwdRowBounds& rows = seen[kt][e / 2];
              const bool visible = !kMask || (8 * j + e % 2 >= rows.lo && 8 * j + e % 2 <= rows.hi);
              const float lse_e = e % 2 ? lse2.y : lse2.x;
              float x = acc[kt][4 * j + e] * score.scale_log2;
              if constexpr (kAlibi) {
                const int key = n0 + 64 * kt + key_base + 8 * (e / 2), i = m0 + 8 * j + 2 * t + e % 2;
                x -= score.slope_log2 * fabsf(static_cast<float>(i + mod.diag - key));
              }
              acc[kt][4 * j + e] = visible ? exp2_approx_ftz(x - lse_e) : 0.f;
            }
        }
      };
      if (need_mask) p_pass(std::true_type{});
      else p_pass(std::false_type{});
      if (st > 0) mbarrier_wait(&p_empty, (st - 1) & 1);  // consumer 1 has read the previous P^T
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) {
          const float* a = acc[kt] + 4 * j;
          sp[(kt * (kM / 8) + j) * 128 + t128] = make_float4(a[0], a[1], a[2], a[3]);
          pack_p(kt, j, a[0], a[1], a[2], a[3]);
        }
      mbarrier_arrive(&p_full);
    } else {
      // dS^T = P^T (dP^T scale - D scale), into shared memory (one 128-byte row per key, its 64
      // query rows, swizzled like a TMA box), P^T read as it goes.
      mbarrier_wait(&p_full, st & 1);
      if (st >= 2) mbarrier_wait(&ds_empty[st % 2], ((st - 2) / 2) & 1);  // both consumers' products of step st - 2 done
      const float* dsum_s = sdsum + s * kM;
#pragma unroll
      for (int j = 0; j < kM / 8; ++j) {
        const float2 dsum = *reinterpret_cast<const float2*>(dsum_s + 8 * j + 2 * t);
        const float dsum_g[2] = {dsum.x * score.mod.scale, dsum.y * score.mod.scale};
#pragma unroll
        for (int kt = 0; kt < kKT; ++kt) {
          const float4 v = sp[(kt * (kM / 8) + j) * 128 + t128];
          const float pr[4] = {v.x, v.y, v.z, v.w};
          float ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[e] = pr[e] * fmaf(acc[kt][4 * j + e], score.mod.scale, -dsum_g[e % 2]);
          const int key = 64 * kt + key_base;
          *reinterpret_cast<uint32_t*>(ds_buf + hopper_attn_swizzle(key, 8 * j + 2 * t, kN)) = pack2<T>(ds[0], ds[1]);
          *reinterpret_cast<uint32_t*>(ds_buf + hopper_attn_swizzle(key + 8, 8 * j + 2 * t, kN)) = pack2<T>(ds[2], ds[3]);
          pack_p(kt, j, pr[0], pr[1], pr[2], pr[3]);
        }
      }
      mbarrier_arrive(&p_empty);
      fence_proxy_async_smem();  // the dS^T writes before the tensor cores read them
      mbarrier_arrive(&ds_full[st % 2]);
      consumer_sync(1);  // all of consumer 1's dS^T written (its own products read it)
    }

    // dV[:, cols] += P^T dO[:, cols] (B MN-major: 16 rows of 128 bytes per k-step, boxes kM rows apart).
    const uint32_t do_cols = do_base + kCB * cwu * kM * 128, q_cols = q_base + kCB * cwu * kM * 128;
    const uint64_t do0 = wgmma_desc_sw128(do_cols, kM * 128, 1024);
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt) {
      wgmma_fence_operands(dv[kt]);
      wgmma_fence_operands(pa[kt]);
    }
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk)
        WgmmaRs<T, kC>::template mma<1>(dv[kt], pa[kt][kk], wgmma_desc_sw128_at<kRebuildDesc>(do0, do_cols, kM * 128, kk * 16 * 128), 1);
    wgmma_commit();
    if (cw == 0) mbarrier_wait(&ds_full[st % 2], (st / 2) & 1);
    // dK[:, cols] += dS^T Q[:, cols] (A = dS^T K-major: 16 rows are 32 bytes along a key's row);
    // dQ[:, cols] = dS K[:, cols] (A = dS, MN-major; B = K, MN-major; 16 keys per k-step).
    float dq[kC / 2];
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt) wgmma_fence_operands(dk[kt]);
    wgmma_fence_operands(dq);
    wgmma_fence();
    const uint64_t dsk0 = wgmma_desc_sw128(ds_base, 16, 1024), q0 = wgmma_desc_sw128(q_cols, kM * 128, 1024),
                   dsq0 = wgmma_desc_sw128(ds_base, kN * 128, 1024), k0 = wgmma_desc_sw128(k_cols, kN * 128, 1024);
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk)
        Wgmma<T, kC>::template mma<0, 1>(dk[kt], wgmma_desc_sw128_at<kRebuildDesc>(dsk0, ds_base, 16, kt * 64 * 128 + kk * 32),
                                         wgmma_desc_sw128_at<kRebuildDesc>(q0, q_cols, kM * 128, kk * 16 * 128), 1);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      Wgmma<T, kC>::template mma<1, 1>(dq, wgmma_desc_sw128_at<kRebuildDesc>(dsq0, ds_base, kN * 128, kk * 16 * 128),
                                       wgmma_desc_sw128_at<kRebuildDesc>(k0, k_cols, kN * 128, kk * 16 * 128), kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt) {
      wgmma_fence_operands(dv[kt]);
      wgmma_fence_operands(pa[kt]);
      wgmma_fence_operands(dk[kt]);
    }
    wgmma_fence_operands(dq);
    mbarrier_arrive(&ds_empty[st % 2]);
    if constexpr (kDqByTma) {
      // dQ[:, cols] (64 rows x kC fp32) as kC / 32 32-column, 128B-swizzled boxes in this stage's
      // Q boxes kCB cw .. and dO boxes kCB cw .. (8 KB each, as a dQ box): by now only this
      // consumer reads those (the other consumer's products take its own boxes; both score
      // products are done: consumer 1 waited for P^T, consumer 0 for dS^T), and once all four of
      // its warps are past their wait (a warp's wgmma_wait covers its own part of the products,
      // whose B operands are these boxes), none does. The TMA reductions add the tiles to
      // dq_accum (in L2): kDqMode 2 by producer warp 1 + cw, which hands the stage back once they
      // have read it; 1 by this consumer's thread 0, which waits for the reads in the next step.
      // Rows past the sequence's end carry dS = 0: they add 0 to the rows after it.
      consumer_sync(cw);
      unsigned char* dq_boxes[2] = {sq + s * Tr::kQBytes + kCB * cw * kM * 128, sdo + s * Tr::kQBytes + kCB * cw * kM * 128};
      store_acc_f32_sw128<kC / 8, kProbe == 3>(dq, [&](int x) { return dq_boxes[x / kCB] + (x % kCB) * kM * 128; }, warp, g, t);
      fence_proxy_async_smem();
      if constexpr (kDqMode == 2) {
        mbarrier_arrive(&dq_full[2 * s + cw]);  // producer warp 1 + cw takes it from here
        continue;
      }
      consumer_sync(cw);
      if (t128 == 0) {
        const int row0 = static_cast<int>(attn_dq_accum_row(p, b, sb, m0));
#pragma unroll
        for (int x = 0; x < (kProbe == 2 ? 0 : kC / 32); ++x)
          tma_reduce_add_4d(&args.dq_accum, dq_boxes[x / kCB] + (x % kCB) * kM * 128, kC * cw + 32 * x, h, row0, 0);
        tma_store_commit();
      }
      continue;
    }
    mbarrier_arrive(&empty[s]);  // Q, dO, lse, D of this stage read

    // dQ into the fp32 workspace, an n8 tile at a time (red_add_tile_f32); rows past the
    // sequence's end (dS = 0 there, so dQ = 0) added to its last row.
    const AttnDqAccumRows rows = attn_dq_accum_rows(p, b, sb, h, m0 + 16 * warp + g, Tr::kHeadDim, kC * cw + 2 * t);
#pragma unroll
    for (int j = 0; j < kC / 8; ++j) red_add_tile_f32(rows, 8 * j, dq + 4 * j);
  }

  if (kDqMode == 1 && t128 == 0) tma_store_wait_all<true>();  // shared memory must outlive the reductions' reads

  // dK, dV of this consumer's columns of the block's keys, written once (0 where no step ran). With
  // args.dkdv_tma (fixed lengths) and steps run: staged in this consumer's column boxes of the K and
  // V tiles once both consumers are done with them (the score products read every column) and
  // stored by TMA (attn_bwd_hopper_kernel's epilogue, 2026-11-27 (26)).
  if (args.dkdv_tma != 0 && n_steps > 0) {
    named_barrier_sync(6, 256);
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt) hopper_bwd_stage_dkdv<T, kN, kC>(sk, sv, dk[kt], dv[kt], 64 * kt + key_base, kC * cw, t);
    fence_proxy_async_smem();  // the writes above before the TMA engine reads them
    consumer_sync(cw);
    if (t128 == 0) hopper_bwd_store_dkdv<kN, kKT>(args, sk, sv, kC * cw / 64, kC * (cw + 1) / 64, 0, n0, hk, b);
    return;
  }
  T* dk_out = static_cast<T*>(p.dk) + attn_offset(p, b, sb.k_row0, 0, hk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  T* dv_out = static_cast<T*>(p.dv) + attn_offset(p, b, sb.k_row0, 0, hk, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
#pragma unroll
  for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n0 + 64 * kt + key_base + 8 * r;
      if (key >= sb.sk) continue;
#pragma unroll
      for (int j = 0; j < kC / 8; ++j) {
        const int col = kC * cw + 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            pack2<T>(dk[kt][4 * j + 2 * r], dk[kt][4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            pack2<T>(dv[kt][4 * j + 2 * r], dv[kt][4 * j + 2 * r + 1]);
      }
    }
#endif
}

}  // namespace flashlab::kernels
