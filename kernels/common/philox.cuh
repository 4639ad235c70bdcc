// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator. Ten rounds of two 32 x 32 -> 64-bit multiplies mixing a 128-bit
// counter under a 64-bit key (bumped by the Weyl constants between rounds) turn any counter into
// four independent 32-bit values: no state, so any thread can regenerate any draw. Attention
// dropout (forward and backward) keys its mask by (seed, offset, batch, head, row, column) with
// it, and the host-side reference calls the very same functions.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace flashlab::kernels {

struct Philox4 {
  uint32_t x[4];
};

// One Philox4x32 round: two 64-bit products of counter words 0 and 2, their high halves XORed
// into the other words with the key.
FLASHLAB_HD inline Philox4 philox_round(const Philox4& c, uint32_t k0, uint32_t k1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  const uint64_t p0 = kM0 * c.x[0], p1 = kM1 * c.x[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
}

// Philox4x32-10 of `counter` under key (k0, k1).
FLASHLAB_HD inline Philox4 philox4x32_10(Philox4 counter, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // golden ratio, sqrt(3) - 1
  for (int r = 0; r < 10; ++r) {
    counter = philox_round(counter, k0, k1);
    k0 += kW0, k1 += kW1;
  }
  return counter;
}

// Attention dropout: the draws of (batch b, head h, row i) for columns 4 (j / 4) .. 4 (j / 4) + 3,
// word c for column 4 (j / 4) + c, for a 64-bit seed and a 32-bit offset (advanced by the caller
// between calls that must not repeat a mask): one Philox call, counter (j / 4, i, b * nheads + h,
// offset), key = seed.
FLASHLAB_HD inline Philox4 dropout_draws4(uint64_t seed, uint32_t offset, uint32_t b, uint32_t h, uint32_t nheads,
                                          uint32_t i, uint32_t j) {
  return philox4x32_10({{j / 4, i, b * nheads + h, offset}}, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The 32-bit draw of (batch b, head h, row i, column j): dropout_draws4's word j % 4.
FLASHLAB_HD inline uint32_t dropout_draw(uint64_t seed, uint32_t offset, uint32_t b, uint32_t h, uint32_t nheads,
                                         uint32_t i, uint32_t j) {
  return dropout_draws4(seed, offset, b, h, nheads, i, j).x[j % 4];
}

// The draw threshold of drop probability p in [0, 1): an entry is kept iff its draw >= the
// threshold (probability 1 - p, to within 2^-32).
FLASHLAB_HD inline uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

}  // namespace flashlab::kernels
