// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into contiguous
// chunks (whole grains) that the caller's thread and the workers take in turn, so a worker that the OS
// runs late does not hold the others up; it returns when every chunk is done. The pool also keeps one scratch
// arena per thread index for the kernels' per-thread buffers (ThreadScratch), so a step allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "core/function_ref.h"
#include "core/workspace.h"

namespace dsflash {

class ThreadPool {
 public:
  // num_threads <= 0: one per hardware thread. cpus (optional, [num_threads]): worker i pins itself to cpus[i] when
  // it starts (core/numa_topology.h place_threads; entry 0 is the caller's, which the caller pins if it wants).
  // node_of_thread (optional, [num_threads], non-decreasing from node 0: ThreadPlacement::node_of_thread): the NUMA
  // node of each thread, for parallel_for_nodes; empty: one node.
  explicit ThreadPool(int num_threads = 0, std::vector<int> cpus = {}, std::vector<int> node_of_thread = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
  // The calling thread's index: i for the worker that runs as thread i, 0 for any thread outside the pool.
  int this_thread_index() const;

  // fn(begin, end, thread_index) over disjoint ranges covering [0, n); a thread may get several ranges.
  // Ranges are multiples of `grain` (except the last) so kernels can keep blocks whole. thread_index is in
  // [0, num_threads()) and 0 is the caller. A call made while another parallel_for of this pool runs (from
  // inside fn, or from another thread) runs fn(0, n, this_thread_index()) on the calling thread, so a body that
  // calls kernels keeps its own thread's scratch (ThreadScratch) for them.
  // fn is only referenced (FunctionRef: no copy, no allocation), so a lambda may capture anything.
  using RangeFn = FunctionRef<void(int64_t, int64_t, int)>;
  void parallel_for(int64_t n, RangeFn fn, int64_t grain = 1);

  // parallel_for for work that maps to rows of a weight: [0, n) is cut into one contiguous range per NUMA node, in
  // proportion to its threads (node_row_ranges of core/numa_topology.h), and only the node's threads run its
  // range. The same n and grain always give a node the same range, so the load-time copy of a weight's rows
  // (whose writes place the pages: first touch) and the kernels that read them every step split alike, and each
  // node reads its own memory. One node: parallel_for.
  // chunks_per_thread: how finely each share is cut for its threads to claim. Several per thread rebalance a thread
  // that runs late; one keeps each thread's reads one contiguous stream, which memory-bound decode kernels want.
  void parallel_for_nodes(int64_t n, RangeFn fn, int64_t grain = 1, int chunks_per_thread = kChunksPerThread);
  static constexpr int kChunksPerThread = 4;
  // parallel_for_nodes with the caller's cut: node k's threads run grains [node_bounds[k], node_bounds[k + 1]),
  // node_bounds [num_nodes() + 1] non-decreasing from 0 to ceil(n / grain). For one job over several weights, each
  // cut as parallel_for_nodes cuts it alone, the pieces of each node put side by side.
  void parallel_for_node_ranges(int64_t n, std::span<const int64_t> node_bounds, RangeFn fn, int64_t grain = 1,
                                int chunks_per_thread = kChunksPerThread);
  int num_nodes() const { return static_cast<int>(node_first_thread_.size()) - 1; }
  // [num_nodes() + 1]: node k owns threads [node_first_thread()[k], node_first_thread()[k + 1]).
  const std::vector<int>& node_first_thread() const { return node_first_thread_; }

  // Grows every thread's scratch arena to the largest one's size. Which thread runs which chunk changes from call
  // to call, so after a warm-up step this (forward() calls it first) keeps a later step from growing the arena
  // of a thread that happened to run less before. Arenas in use by another thread are skipped.
  void balance_scratch();

 private:
  void worker_loop(int index);
  void run_chunks(int index);
  // Sets up and runs the current job; chunks are taken per node (one node: all threads share them).
  // node_bounds: the by-node cut (grains, [num_nodes() + 1]); empty: node_row_range's.
  void run_job(int64_t n, RangeFn& fn, int64_t grain, bool by_node, int chunks_per_thread,
               std::span<const int64_t> node_bounds = {});

  // Per node: its threads, and the current job's share: [begin, end) in grains' units, chunk size, next chunk.
  struct NodeShare {
    int64_t begin = 0, end = 0, chunk_grains = 1, chunks = 0;
    std::atomic<int64_t> next_chunk{0};
  };
  std::vector<int> node_of_thread_;     // [threads]
  std::vector<int> node_first_thread_;  // [nodes + 1]
  std::unique_ptr<NodeShare[]> node_shares_;  // [nodes]; one share for all threads when a job is not by node
  bool job_by_node_ = false;

  std::vector<std::thread> workers_;
  // The job word, one atomic: generation (bits 63-32, one per job), open (bit 31: workers may still join), and the
  // workers inside the job (bits 30-0). A worker joins by one compare-exchange that succeeds only while the
  // generation it saw is open, and leaves by one fetch_sub; the caller opens a job by one store and closes it by
  // clearing the bit, then waits for the count to reach 0. So dispatching a job takes no lock: with many threads,
  // a mutex taken by every worker to join and to leave serialises them all through it twice per job (and its
  // futex sleeps and wakes once they contend), and a decode step runs about 15 jobs per layer.
  std::atomic<uint64_t> job_state_{0};
  static constexpr uint64_t kOpenBit = uint64_t{1} << 31;
  static constexpr uint64_t kActiveMask = kOpenBit - 1;
  // A caller owns the workers, from its job's setup until its last worker has left; another caller (nested in a
  // body, or on another thread) then runs its job inline.
  std::atomic<bool> busy_{false};
  std::atomic<bool> stopping_{false};
  // Sleeping, only after polling for a while (spin_until): workers on work_ready_ (counted, so that a job wakes
  // them only when some sleep), the caller on work_done_ (flagged, so that the last worker to leave wakes it only
  // then). Each side writes its count or flag and then reads the job word, the other writes the job word and then
  // reads the count or flag (all sequentially consistent): one of them sees the other, so no wake-up is lost.
  std::mutex sleep_mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  // The current job; written only by its caller while no worker is inside a job (busy_ held, the previous job's
  // count at 0), read by workers that joined it.
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;

  friend class ThreadScratch;
  struct ScratchSlot {
    Arena arena;
    std::atomic<bool> leased{false};
    std::atomic<std::thread::id> holder{};  // the thread holding the lease (set after taking it)
  };
  std::unique_ptr<ScratchSlot[]> scratch_;  // [num_threads()]
};

// Scratch memory for code running as `thread_index` of `pool` (a parallel_for body; outside one, the calling
// thread's own index: the one-argument form): the pool's arena of that index for the scope's lifetime, reset by
// the outermost scope. A scope opened on the thread that already holds the arena (a kernel called by a kernel, a
// body run inline on the caller) nests in it, stack-ordered. When another thread holds it (a second thread driving
// the same pool) or there is no pool, a private arena of the scope is used instead: always correct, but that one
// allocates.
class ThreadScratch {
 public:
  ThreadScratch(ThreadPool* pool, int thread_index);
  // The calling thread's (ThreadPool::this_thread_index): a kernel's own buffers, whether it is called from
  // outside the pool or inline from inside a parallel_for body.
  explicit ThreadScratch(ThreadPool* pool) : ThreadScratch(pool, pool != nullptr ? pool->this_thread_index() : 0) {}
  ~ThreadScratch();
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  Arena& arena() { return slot_ != nullptr ? slot_->arena : own_; }
  template <class T>
  std::span<T> take(size_t n) {
    return arena().take<T>(n);
  }

 private:
  ThreadPool::ScratchSlot* slot_ = nullptr;
  bool nested_ = false;  // inside an outer scope of the same thread: rewind to mark_ instead of releasing
  Arena::Mark mark_;
  Arena own_;
};

}  // namespace dsflash
