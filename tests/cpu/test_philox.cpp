// Philox4x32-10 (kernels/common/philox.cuh) against the known-answer vectors of its authors'
// Random123 distribution, and the attention dropout draws built on it: every (b, h, i, j) gets
// its own value, and the keep rate of a threshold matches 1 - p within statistical bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

#include "kernels/common/philox.cuh"

namespace flashlab {
namespace {

using kernels::Philox4;

void expect_kat(Philox4 ctr, uint32_t k0, uint32_t k1, Philox4 want) {
  const Philox4 got = kernels::philox4x32_10(ctr, k0, k1);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(got.x[w], want.x[w]) << "word " << w;
}

TEST(Philox, KnownAnswers) {
  expect_kat({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
             {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
             {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, DropoutDrawsAreDistinctPerEntry) {
  std::set<uint32_t> seen;
  int n = 0;
  for (uint32_t b = 0; b < 2; ++b)
    for (uint32_t h = 0; h < 3; ++h)
      for (uint32_t i = 0; i < 17; ++i)
        for (uint32_t j = 0; j < 33; ++j, ++n) seen.insert(kernels::dropout_draw(42, 7, b, h, 3, i, j));
  // 3366 draws of 32 bits: a collision has probability ~1e-3; more than one means a broken map.
  EXPECT_GE(static_cast<int>(seen.size()), n - 1);
  // Another seed or offset gives other draws.
  EXPECT_NE(kernels::dropout_draw(42, 7, 0, 0, 3, 0, 0), kernels::dropout_draw(43, 7, 0, 0, 3, 0, 0));
  EXPECT_NE(kernels::dropout_draw(42, 7, 0, 0, 3, 0, 0), kernels::dropout_draw(42, 8, 0, 0, 3, 0, 0));
  EXPECT_NE(kernels::dropout_draw(1ull << 32, 0, 0, 0, 1, 0, 0), kernels::dropout_draw(0, 0, 0, 0, 1, 0, 0));
}

TEST(Philox, KeepRateMatchesOneMinusP) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t t = kernels::dropout_threshold(p);
    int64_t kept = 0, n = 0;
    for (uint32_t i = 0; i < 256; ++i)
      for (uint32_t j = 0; j < 256; ++j, ++n) kept += kernels::dropout_draw(2024, 0, 1, 2, 4, i, j) >= t;
    const double rate = static_cast<double>(kept) / n, sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(rate, 1.0 - p, 5 * sd) << "p " << p;  // 5 standard deviations
  }
  EXPECT_EQ(kernels::dropout_threshold(0.f), 0u);  // p = 0 keeps everything
}

}  // namespace
}  // namespace flashlab
