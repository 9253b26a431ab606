// ThreadPool (src/core/thread_pool.h): coverage, grain alignment, thread indices, nesting, reuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/numa_topology.h"
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

// A nested call runs inline as the calling thread (its own index), so a kernel called from a body keeps that
// thread's scratch arena: ThreadScratch(pool) nests in the body's instead of taking another (or allocating).
TEST(ThreadPool, NestedCallRunsInlineAsTheCallingThread) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.this_thread_index(), 0);
  std::atomic<int64_t> total{0};
  std::atomic<bool> wrong_thread{false}, other_arena{false}, on_a_worker{false};
  pool.parallel_for(12, [&](int64_t b, int64_t e, int t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // long enough for the workers to join
    on_a_worker = on_a_worker || t != 0;
    ThreadScratch body(&pool, t);
    if (pool.this_thread_index() != t) wrong_thread = true;
    for (int64_t i = b; i < e; ++i)
      for (int64_t n : {1, 10}) {  // one grain (run inline anyway) and a splittable job
        pool.parallel_for(n, [&](int64_t b2, int64_t e2, int t2) {
          EXPECT_EQ(b2, 0);
          EXPECT_EQ(e2, n);
          total += e2 - b2;
          if (t2 != t) wrong_thread = true;
          ThreadScratch kernel(&pool);
          if (&kernel.arena() != &body.arena()) other_arena = true;
        });
      }
  });
  EXPECT_EQ(total.load(), 12 * 11);
  EXPECT_TRUE(on_a_worker);
  EXPECT_FALSE(wrong_thread);
  EXPECT_FALSE(other_arena);
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

// The sleeping paths: jobs far enough apart that the workers stop polling and sleep (the next job must wake
// them), and workers slow enough that the caller stops polling for them and sleeps (the last to leave must wake
// it). A lost wake-up hangs here; the ranges must still cover each index once, on 2 and on 5 threads.
TEST(ThreadPool, WakesSleepingWorkersAndASleepingCaller) {
  for (int threads : {2, 5}) {
    ThreadPool pool(threads);
    std::atomic<bool> worker_ran{false};
    for (int rep = 0; rep < 40; ++rep) {
      std::this_thread::sleep_for(std::chrono::microseconds(rep % 2 == 0 ? 1000 : 50));  // past the pool's polling
      std::vector<std::atomic<int>> hits(16);
      pool.parallel_for(16, [&](int64_t b, int64_t e, int t) {
        if (t == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));  // time for a sleeping worker to wake and join
        } else {
          worker_ran = true;
          if (rep % 4 < 2) std::this_thread::sleep_for(std::chrono::microseconds(600));  // the caller waits
        }
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (int i = 0; i < 16; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "rep " << rep << " index " << i;
    }
    EXPECT_TRUE(worker_ran) << threads;
  }
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

// A simulated 2-node pool (threads 0-2 on node 0, 3-4 on node 1): parallel_for_nodes cuts [0, n) as
// node_row_ranges does, every range stays inside one node's part, workers only run their node's part (the caller
// may finish any node's leftovers), and everything is covered once. Repeated, so that late workers happen.
TEST(ThreadPool, ParallelForNodesKeepsWorkersToTheirNodesRows) {
  ThreadPool pool(5, {}, {0, 0, 0, 1, 1});
  ASSERT_EQ(pool.num_nodes(), 2);
  EXPECT_EQ(pool.node_first_thread(), (std::vector<int>{0, 3, 5}));
  ThreadPlacement placement;
  placement.node_of_thread = {0, 0, 0, 1, 1};
  placement.first_thread = pool.node_first_thread();
  for (int repeat = 0; repeat < 50; ++repeat)
    for (const auto& [n, grain] : std::vector<std::pair<int64_t, int64_t>>{{1000, 1}, {333, 8}, {7, 1}, {64, 16}}) {
      const std::vector<RowRange> nodes = node_row_ranges(n, placement, grain);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex mutex;
      std::vector<std::string> problems;
      pool.parallel_for_nodes(n, [&](int64_t begin, int64_t end, int thread) {
        int node = -1;
        for (int k = 0; k < 2; ++k)
          if (begin >= nodes[static_cast<size_t>(k)].begin && end <= nodes[static_cast<size_t>(k)].end) node = k;
        const int own = thread < 3 ? 0 : 1;
        if (node < 0 || (thread != 0 && node != own)) {
          std::lock_guard<std::mutex> lock(mutex);
          problems.push_back("thread " + std::to_string(thread) + " got [" + std::to_string(begin) + ", " +
                             std::to_string(end) + ")");
        }
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      }, grain);
      ASSERT_TRUE(problems.empty()) << "n " << n << ": " << problems.front();
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
    }
}

// parallel_for_node_ranges takes the caller's cut instead: the same checks with uneven bounds (node 1's part first
// empty, then most of it), grains of 1 and 4, one chunk per thread and the default.
TEST(ThreadPool, ParallelForNodeRangesKeepsWorkersToTheGivenParts) {
  ThreadPool pool(5, {}, {0, 0, 0, 1, 1});
  for (int repeat = 0; repeat < 50; ++repeat)
    for (const auto& [n, grain, bounds] : std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>>{
             {100, 1, {0, 100, 100}}, {100, 1, {0, 10, 100}}, {30, 4, {0, 2, 8}}, {9, 1, {0, 0, 9}}}) {
      for (int chunks : {1, ThreadPool::kChunksPerThread}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mutex;
        std::vector<std::string> problems;
        pool.parallel_for_node_ranges(n, bounds, [&](int64_t begin, int64_t end, int thread) {
          int node = -1;
          for (int k = 0; k < 2; ++k)
            if (begin >= bounds[static_cast<size_t>(k)] * grain && end <= std::min(n, bounds[static_cast<size_t>(k) + 1] * grain))
              node = k;
          if (node < 0 || (thread != 0 && node != (thread < 3 ? 0 : 1))) {
            std::lock_guard<std::mutex> lock(mutex);
            problems.push_back("thread " + std::to_string(thread) + " got [" + std::to_string(begin) + ", " +
                               std::to_string(end) + ")");
          }
          for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        }, grain, chunks);
        ASSERT_TRUE(problems.empty()) << "n " << n << ": " << problems.front();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
      }
    }
}

// chunks_per_thread cuts each node's share into that many chunks per thread (the last may be short), in grains:
// one per thread gives each thread at most one contiguous range per node.
TEST(ThreadPool, ParallelForNodesCutsChunksPerThread) {
  for (const auto& [node_of_thread, chunks] :
       std::vector<std::pair<std::vector<int>, int>>{{{0, 0}, 1}, {{0, 0}, 4}, {{0, 0, 1}, 1}, {{0, 0, 1}, 3}}) {
    ThreadPool pool(static_cast<int>(node_of_thread.size()), {}, node_of_thread);
    const int nodes = pool.num_nodes();
    for (const auto& [n, grain] : std::vector<std::pair<int64_t, int64_t>>{{144, 1}, {1000, 4}, {9, 2}}) {
      std::mutex mutex;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for_nodes(n, [&](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        ranges.emplace_back(begin, end);
      }, grain, chunks);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
      // Node k's share is node_row_range's; its chunks are ceil(share grains / chunk count) grains each.
      int64_t expected = 0;
      for (int k = 0; k < nodes; ++k) {
        const RowRange share = node_row_range((n + grain - 1) / grain, pool.node_first_thread(), k);
        const int64_t threads = pool.node_first_thread()[static_cast<size_t>(k) + 1] - pool.node_first_thread()[static_cast<size_t>(k)];
        const int64_t grains = share.end - share.begin;
        const int64_t target = std::max<int64_t>(1, std::min<int64_t>(grains, chunks * threads));
        const int64_t per = std::max<int64_t>(1, (grains + target - 1) / target);
        expected += grains == 0 ? 0 : (grains + per - 1) / per;
      }
      EXPECT_EQ(static_cast<int64_t>(ranges.size()), expected) << "n " << n << " chunks " << chunks << " nodes " << nodes;
    }
  }
}

// A layout that is not one contiguous run per node from node 0 (or of the wrong size) means one node.
TEST(ThreadPool, MalformedNodeLayoutsAreOneNode) {
  EXPECT_EQ(ThreadPool(3, {}, {0, 1, 0}).num_nodes(), 1);
  EXPECT_EQ(ThreadPool(3, {}, {1, 1, 1}).num_nodes(), 1);
  EXPECT_EQ(ThreadPool(3, {}, {0, 1}).num_nodes(), 1);
  EXPECT_EQ(ThreadPool(3, {}, {0, 2, 2}).num_nodes(), 1);
  EXPECT_EQ(ThreadPool(3).num_nodes(), 1);
}

}  // namespace
}  // namespace dsflash
