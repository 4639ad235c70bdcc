// wgmma_desc_advance (kernels/common/wgmma_desc.h), which rung 4 of attention uses for every
// k-step's shared-memory descriptor, against rebuilding the descriptor from the advanced address:
// equal for every 16-byte-aligned address and offset that stay inside the shared memory a block
// can have, and not equal once the address passes the 2^18-byte range of the descriptor's field
// (the add carries into the reserved bits 14-15).
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/common/wgmma_desc.h"

namespace flashlab {
namespace {

using kernels::wgmma_desc_advance;
using kernels::wgmma_desc_sw128;
using kernels::wgmma_desc_swizzled;

constexpr uint32_t kMaxSharedBytes = 227 * 1024 + 1024;  // a block's dynamic shared memory on sm_90, + static

TEST(WgmmaDesc, AdvanceEqualsRebuild) {
  // LBOs rung 4 uses: 16 (K-major), 64-column boxes of 128 and 176 rows (MN-major V), 2048 (paged).
  for (uint32_t lbo : {16u, 128u * 128u, 176u * 128u, 2048u}) {
    int64_t checked = 0, wrong = 0;
    for (uint32_t addr = 0; addr < kMaxSharedBytes; addr += 16)
      for (uint32_t off = 0; addr + off < kMaxSharedBytes && off < 64 * 1024; off += 16) {
        ++checked;
        wrong += wgmma_desc_advance(wgmma_desc_sw128(addr, lbo, 1024), off) != wgmma_desc_sw128(addr + off, lbo, 1024);
      }
    EXPECT_GT(checked, 100'000'000 / 16);
    EXPECT_EQ(wrong, 0) << "lbo " << lbo;
  }
}

// wgmma_desc_sw128_at (backward rung 3's k-step descriptors, its kProbe 9 the rebuilt form): both
// forms equal at the LBOs and offsets the backward uses.
TEST(WgmmaDesc, StepFormsAgree) {
  using kernels::wgmma_desc_sw128_at;
  for (uint32_t lbo : {16u, 64u * 128u, 128u * 128u})
    for (uint32_t base = 0; base < 200 * 1024; base += 1024)
      for (uint32_t off = 0; base + off < kMaxSharedBytes && off < 32 * 1024; off += 32) {
        const uint64_t d0 = wgmma_desc_sw128(base, lbo, 1024);
        ASSERT_EQ(wgmma_desc_sw128_at<false>(d0, base, lbo, off), wgmma_desc_sw128_at<true>(d0, base, lbo, off))
            << "lbo " << lbo << " base " << base << " offset " << off;
        ASSERT_EQ(wgmma_desc_sw128_at<true>(d0, base, lbo, off), wgmma_desc_sw128(base + off, lbo, 1024));
      }
}

TEST(WgmmaDesc, AdvancePastTheAddressFieldCarries) {
  const uint64_t last = wgmma_desc_sw128(0x3FFF0, 16, 1024);  // the field's largest address
  EXPECT_NE(wgmma_desc_advance(last, 16), wgmma_desc_sw128(0x40000, 16, 1024));
  EXPECT_EQ(wgmma_desc_advance(last, 16) & 0xFFFFu, 0x4000u);  // the carry, in a reserved bit
}

// The swizzle mode in bits 62-63 (PTX ISA: 1 = 128-byte, 2 = 64-byte, 3 = 32-byte swizzle), the
// other fields as wgmma_desc_sw128's; the FP8 attention's V^T chunks of 64 and 32 keys use modes 2, 3.
TEST(WgmmaDesc, SwizzleModes) {
  for (uint32_t addr : {0u, 1024u, 0x3FFF0u}) {
    const uint64_t sw128 = wgmma_desc_sw128(addr, 16, 512);
    EXPECT_EQ(wgmma_desc_swizzled(addr, 16, 512, 128), sw128);
    EXPECT_EQ(wgmma_desc_swizzled(addr, 16, 512, 64), (sw128 & ~(3ull << 62)) | (2ull << 62));
    EXPECT_EQ(wgmma_desc_swizzled(addr, 16, 512, 32), sw128 | (3ull << 62));
    EXPECT_EQ(wgmma_desc_swizzled(addr, 16, 512, 64) >> 62, 2u);
  }
  // Advancing keeps the mode (the add stays in the address field).
  EXPECT_EQ(wgmma_desc_advance(wgmma_desc_swizzled(2048, 16, 512, 64), 32) >> 62, 2u);
}

}  // namespace
}  // namespace flashlab
