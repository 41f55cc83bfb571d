#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace mr {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 5, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e, int th) {
        EXPECT_GE(th, 0);
        EXPECT_LT(th, threads);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, DynamicChunksCoverEveryIndexOnceInChunkSizedPieces) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 5, 100, 1001}) {
      for (int64_t chunk : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> calls{0};
        pool.ParallelForDynamic(n, chunk, [&](int64_t b, int64_t e, int th) {
          EXPECT_GE(th, 0);
          EXPECT_LT(th, threads);
          if (threads == 1 || n <= chunk) {  // one call over everything: nothing to balance
            EXPECT_EQ(b, 0);
            EXPECT_EQ(e, n);
          } else {  // every piece starts on a chunk boundary and is a whole chunk, except the last
            EXPECT_EQ(b % chunk, 0) << "n " << n << " chunk " << chunk;
            EXPECT_EQ(e, std::min(b + chunk, n)) << "n " << n << " chunk " << chunk;
          }
          calls++;
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n " << n << " chunk " << chunk << " i " << i;
        EXPECT_EQ(calls.load(), threads == 1 ? 1 : (n + chunk - 1) / chunk) << "n " << n << " chunk " << chunk;
      }
    }
  }
}

TEST(ThreadPool, DynamicAndStaticRunsInterleave) {
  // The two modes share the hand-off: a static run after a dynamic one must not see its chunking.
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int k = 0; k < 500; ++k) {
    pool.ParallelForDynamic(10, 3, [&](int64_t b, int64_t e, int) { sum += e - b; });
    pool.ParallelFor(4, [&](int64_t b, int64_t e, int) {
      EXPECT_EQ(e - b, 2);
      sum += e - b;
    });
  }
  EXPECT_EQ(sum.load(), 500 * 14);
}

TEST(ThreadPool, ManyConsecutiveRuns) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int k = 0; k < 2000; ++k) pool.ParallelFor(4, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 8000);
}

}  // namespace
}  // namespace mr
