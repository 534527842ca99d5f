// The grid schedule generated CPU kernels run (dt::GridQueue in the runtime header): every step
// handed out exactly once, in chunks of consecutive steps no longer than the cap, shrinking to
// single steps at the end, also when threads claim concurrently.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "backends/cpu/runtime/deuteron_cpu.h"

namespace {

TEST(GridQueue, ChunksCoverTheGridInOrderAndShrinkAtTheEnd) {
  for (int64_t size : {1, 7, 256, 1001}) {
    dt::GridQueue q(size, 2);
    EXPECT_EQ(q.max_chunk, size >= 16 ? size / 16 : 1) << size;  // about 8 chunks a thread
    std::vector<int64_t> sizes;
    int64_t begin = -1, end = -1, expect = 0;
    while (q.claim(&begin, &end)) {
      ASSERT_EQ(begin, expect) << size;
      ASSERT_GT(end, begin) << size;
      ASSERT_LE(end - begin, q.max_chunk) << size;
      sizes.push_back(end - begin);
      expect = end;
    }
    EXPECT_EQ(expect, size);
    EXPECT_EQ(sizes.back(), 1) << size;  // the last chunk is one step: no thread waits out a long one
    EXPECT_EQ(sizes.front(), q.max_chunk) << size;  // full chunks while much is left
    for (size_t i = 1; i < sizes.size(); ++i) EXPECT_LE(sizes[i], sizes[i - 1]) << size;
  }
  dt::GridQueue empty(0, 2);
  int64_t b = 0, e = 0;
  EXPECT_FALSE(empty.claim(&b, &e));
}

TEST(GridQueue, ConcurrentClaimsHandOutEachStepOnce) {
  const int64_t size = 100003;
  std::vector<int> taken(size_t(size), 0);
  dt::GridQueue q(size, 4);
#pragma omp parallel num_threads(4)
  {
    for (int64_t first = 0, last = 0; q.claim(&first, &last);)
      for (int64_t pid = first; pid < last; ++pid) ++taken[size_t(pid)];  // each step by one thread only
  }
  for (int64_t i = 0; i < size; ++i) ASSERT_EQ(taken[size_t(i)], 1) << "step " << i;
}

}  // namespace
