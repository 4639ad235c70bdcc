// cp.async (sm_80+): a 16-byte copy from global to shared memory that does not pass through
// registers. A thread issues many and goes on; commit groups them, wait_group waits for all
// but the newest N groups of this thread (other threads' copies need a barrier after).
#pragma once

#include <cstdint>

namespace flashlab::kernels {

// 16 bytes global -> shared, cached in L2 only (.cg). When src_bytes < 16 the rest of the
// 16 shared bytes is zero-filled (src_bytes = 0: nothing is read).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}

// As cp_async_16, with the L2 told to fetch the whole 256-byte block around the address from
// DRAM on a miss (.L2::256B): streams of rows of 256 bytes or more read as larger DRAM bursts.
__device__ __forceinline__ void cp_async_16_l2_256(void* smem, const void* gmem, int src_bytes = 16) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}

// An arrive on the mbarrier `bar` once every cp.async this thread issued so far has landed
// (not ordered by commit groups). .noinc: the arrive is one of the barrier's expected arrivals
// (initialise it with one per arriving thread).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  const auto b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(b) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Waits until at most `pending` of this thread's groups are outstanding; counts past 7 wait
// for 7 (more than asked, never less).
__device__ __forceinline__ void cp_async_wait_at_most(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
  }
}

}  // namespace flashlab::kernels
