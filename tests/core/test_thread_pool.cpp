// ThreadPool (src/core/thread_pool.h): coverage, grain alignment, thread indices, nesting, reuse.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace dsflash {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceInWholeGrains) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {1, 2, 7, 16, 100, 1001})
      for (int64_t grain : {1, 3, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<bool> bad_range{false}, bad_thread{false};
        pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
          if (b % grain != 0 || (e != n && e % grain != 0) || b >= e) bad_range = true;
          if (t < 0 || t >= threads) bad_thread = true;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain << " " << i;
        EXPECT_FALSE(bad_range) << n << " " << grain;
        EXPECT_FALSE(bad_thread);
      }
  }
}

TEST(ThreadPool, ZeroWorkDoesNotCall) {
  ThreadPool pool(2);
  bool called = false;
  pool.parallel_for(0, [&](int64_t, int64_t, int) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallel_for(12, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2, int t2) {
        EXPECT_EQ(b2, 0);
        EXPECT_EQ(e2, 10);
        total += e2 - b2;
        (void)t2;
      });
  });
  EXPECT_EQ(total.load(), 120);
}

// Callers on three threads share two workers. The hard moment is a job's end: its last worker has left but its
// caller has not yet woken; a second caller must not take the workers then (it would have its job cleared under
// it, or two callers would wait for one wake-up and one would sleep forever).
TEST(ThreadPool, ManyShortJobsAndConcurrentCallers) {
  ThreadPool pool(2);
  constexpr int kCallers = 3;
  constexpr int kReps = 10000;
  std::atomic<int64_t> sum{0};
  auto hammer = [&] {
    for (int rep = 0; rep < kReps; ++rep)
      pool.parallel_for(64, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
  };
  std::vector<std::thread> others;
  for (int c = 1; c < kCallers; ++c) others.emplace_back(hammer);
  hammer();
  for (auto& t : others) t.join();
  EXPECT_EQ(sum.load(), int64_t{kCallers} * kReps * (63 * 64 / 2));
}

TEST(ThreadPool, UsesTheWorkersWhenWorkIsLong) {
  ThreadPool pool(2);
  std::mutex m;
  std::vector<int> seen;
  // Each chunk takes long enough that the worker wakes and joins; it must then show up.
  pool.parallel_for(8, [&](int64_t, int64_t, int t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(m);
    seen.push_back(t);
  });
  bool worker = false;
  for (int t : seen) worker |= t == 1;
  EXPECT_TRUE(worker);
}

}  // namespace
}  // namespace dsflash
