// wgmma shared-memory matrix descriptors: plain integer code, built by nvcc (host and device)
// and by a host compiler (tests/cpu/test_wgmma_desc.cpp checks wgmma_desc_advance against
// rebuilding the descriptor).
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace flashlab::kernels {

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all >> 4, 14 bits each) and the swizzle mode (1 = 128-byte swizzle).
// K-major tiles (rows of 64 16-bit values = 128 bytes, 128B-swizzled): SBO = 1024 bytes
// between groups of 8 rows, LBO unused. MN-major tiles (rows of 64 values along M or N, one
// row per k): SBO = 1024 bytes between groups of 8 k, LBO = bytes between 64-wide blocks of M/N.
FLASHLAB_HD inline uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// The same for a tile whose rows are swizzle_bytes (128, 64 or 32) wide, swizzled over that width
// (mode 1, 2 or 3): K-major, SBO = 8 rows x swizzle_bytes between groups of 8 rows.
FLASHLAB_HD inline uint64_t wgmma_desc_swizzled(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                uint32_t swizzle_bytes) {
  const uint64_t mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : 3;
  return (wgmma_desc_sw128(smem_addr, lbo_bytes, sbo_bytes) & ~(3ull << 62)) | (mode << 62);
}

// desc moved `bytes` further in shared memory (a multiple of 16). The start address field is
// bits 0-13 of (address >> 4); shared addresses stay below 2^18 bytes, so the add never carries
// out of it (tests/cpu/test_wgmma_desc.cpp). One integer add per wgmma instead of rebuilding the descriptor from the
// address (mask, shift, or: ptxas cannot fold those across k-steps).
FLASHLAB_HD inline uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// A k-step's descriptor of the 128B-swizzled tile at base (SBO 1024): desc0 = wgmma_desc_sw128(
// base, lbo, 1024) advanced by `bytes`; kRebuild (an experiment's "before" form): rebuilt from
// base + bytes instead.
template <bool kRebuild = false>
FLASHLAB_HD inline uint64_t wgmma_desc_sw128_at(uint64_t desc0, uint32_t base, uint32_t lbo, uint32_t bytes) {
  return kRebuild ? wgmma_desc_sw128(base + bytes, lbo, 1024) : wgmma_desc_advance(desc0, bytes);
}

}  // namespace flashlab::kernels
