// Paged KV cache helpers of the GPU tests (tests/gpu/test_paged_kv.cpp, test_paged_prefill.cpp):
// where a token of a cache lives, and page tables over a shuffled pool that grow in place.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "flashlab/serving.h"

namespace flashlab::testing {

// Where (page, slot, KV head h) of a cache starts, in elements.
inline int64_t cache_offset(KvLayout layout, int64_t page_size, int64_t nheads_kv, int64_t d, int64_t page, int64_t slot, int64_t h) {
  return layout == KvLayout::kNHD ? ((page * page_size + slot) * nheads_kv + h) * d : ((page * nheads_kv + h) * page_size + slot) * d;
}

// A page table over a pool of pages taken in a shuffled order: request b owns pages[b]. grow()
// lengthens requests in place (their pages kept, new ones from the pool), as a server appends.
struct PageTable {
  int64_t page_size = 1;
  std::vector<int64_t> lens;
  std::vector<std::vector<int>> pages;
  std::vector<int> pool;  // unused pages, taken from the front
  size_t next = 0;
  std::vector<int> indptr, indices, last;  // the flattened table

  PageTable(int64_t ps, int64_t max_pages, size_t batch, std::mt19937_64& rng)
      : page_size(ps), lens(batch, 0), pages(batch), pool(static_cast<size_t>(max_pages)) {
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
  }
  void grow(const std::vector<int64_t>& new_lens) {
    ASSERT_EQ(new_lens.size(), lens.size());
    indptr.assign(1, 0), indices.clear(), last.clear();
    for (size_t b = 0; b < lens.size(); ++b) {
      ASSERT_GE(new_lens[b], lens[b]) << "requests only grow";
      lens[b] = new_lens[b];
      const auto want = static_cast<size_t>((lens[b] + page_size - 1) / page_size);
      while (pages[b].size() < want) pages[b].push_back(pool.at(next++));
      indices.insert(indices.end(), pages[b].begin(), pages[b].end());
      indptr.push_back(static_cast<int>(indices.size()));
      last.push_back(static_cast<int>(want > 0 ? lens[b] - static_cast<int64_t>(want - 1) * page_size : 0));
    }
  }
  int64_t total_pages() const { return static_cast<int64_t>(indices.size()); }
};

inline int64_t pages_for(const std::vector<int64_t>& lens, int64_t page_size) {
  int64_t n = 0;
  for (int64_t l : lens) n += (l + page_size - 1) / page_size;
  return n;
}

}  // namespace flashlab::testing
