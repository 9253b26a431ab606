// ThreadPool (src/core/thread_pool.h): what one parallel_for costs besides its work. A decode step runs about 15
// pool jobs per layer (116 per step on the 8-layer wide preset; ~600 on the 40-layer model), most of them
// microseconds of work each, so the dispatch (wake, join, claim chunks, leave, the caller's wait) is paid that
// often. Rows: a job of one chunk per thread whose body does nothing, one of four chunks per thread (the default),
// and the same with parallel_for_nodes on a simulated 2-node layout; the time per job, and jobs/s. Threads past the
// machine's cores only show that nothing stalls (they time the OS scheduler, not the pool).
//   bench_thread_pool [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace dsflash {
namespace {

void bm_empty_job(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int chunks_per_thread = static_cast<int>(state.range(1));
  const bool two_nodes = state.range(2) != 0;
  std::vector<int> node_of_thread;
  if (two_nodes) {
    for (int t = 0; t < threads; ++t) node_of_thread.push_back(t < (threads + 1) / 2 ? 0 : 1);
  }
  ThreadPool pool(threads, {}, node_of_thread);
  std::atomic<int64_t> ranges{0};
  const int64_t n = int64_t{threads} * chunks_per_thread;
  for (auto _ : state) {
    pool.parallel_for_nodes(
        n, [&](int64_t, int64_t, int) { ranges.fetch_add(1, std::memory_order_relaxed); }, 1, chunks_per_thread);
  }
  benchmark::DoNotOptimize(ranges.load());
  state.counters["jobs/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK(bm_empty_job)
    ->ArgNames({"threads", "chunks_per_thread", "two_nodes"})
    ->ArgsProduct({{2, 4}, {1, 4}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

}  // namespace
}  // namespace dsflash

BENCHMARK_MAIN();
