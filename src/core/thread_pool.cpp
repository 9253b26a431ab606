#include "core/thread_pool.h"

#include "core/numa_topology.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dsflash {

namespace {
// How long a thread polls before sleeping: an idle worker for the next job, a caller for the workers to leave
// the job. Decode issues hundreds to thousands of short parallel_for calls per step, and a futex sleep and wake
// cost tens of microseconds (more on virtual machines).
constexpr auto kSpinTime = std::chrono::microseconds(200);
constexpr int kPausesPerClockRead = 64;  // reading the clock is not free either (a vDSO call, slower under a VM)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Polls done() for up to kSpinTime; true when it became true.
template <class Done>
bool spin_until(const Done& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < kPausesPerClockRead; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() - start > kSpinTime) return done();
  }
}
}  // namespace

ThreadPool::ThreadPool(int num_threads, std::vector<int> cpus, std::vector<int> node_of_thread) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A node layout that is not one contiguous run of threads per node, from node 0 up, is ignored (one node).
  bool layout_ok = static_cast<int>(node_of_thread.size()) == num_threads && node_of_thread[0] == 0;
  for (size_t i = 1; layout_ok && i < node_of_thread.size(); ++i)
    layout_ok = node_of_thread[i] == node_of_thread[i - 1] || node_of_thread[i] == node_of_thread[i - 1] + 1;
  node_of_thread_ = layout_ok ? std::move(node_of_thread) : std::vector<int>(static_cast<size_t>(num_threads), 0);
  node_first_thread_.push_back(0);
  for (int i = 1; i < num_threads; ++i)
    if (node_of_thread_[static_cast<size_t>(i)] != node_of_thread_[static_cast<size_t>(i - 1)]) node_first_thread_.push_back(i);
  node_first_thread_.push_back(num_threads);
  node_shares_ = std::make_unique<NodeShare[]>(static_cast<size_t>(num_nodes()));
  scratch_ = std::make_unique<ScratchSlot[]>(static_cast<size_t>(num_threads));
  for (int i = 1; i < num_threads; ++i) {
    const int cpu = static_cast<size_t>(i) < cpus.size() ? cpus[static_cast<size_t>(i)] : -1;
    workers_.emplace_back([this, i, cpu] {
      if (cpu >= 0) (void)pin_current_thread(cpu);  // refused (CPU outside the mask): runs unpinned
      worker_loop(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);  // a worker between its check and its wait sees stopping_ then
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(int index) {
  auto run_share = [&](NodeShare& share) {
    for (;;) {
      const int64_t c = share.next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= share.chunks) return;
      const int64_t first = share.begin + c * share.chunk_grains;
      const int64_t last = std::min(share.end, first + share.chunk_grains);
      (*job_)(first * job_grain_, std::min(job_n_, last * job_grain_), index);
    }
  };
  const int own = job_by_node_ ? node_of_thread_[static_cast<size_t>(index)] : 0;
  run_share(node_shares_[static_cast<size_t>(own)]);
  // The caller then finishes whatever other nodes' threads have not taken (late, or not woken yet), so a job
  // always completes; workers keep to their node.
  if (index == 0 && job_by_node_)
    for (int k = 0; k < num_nodes(); ++k) run_share(node_shares_[static_cast<size_t>(k)]);
}

int ThreadPool::this_thread_index() const {
  const std::thread::id self = std::this_thread::get_id();
  for (size_t w = 0; w < workers_.size(); ++w)
    if (workers_[w].get_id() == self) return static_cast<int>(w) + 1;  // workers_[w] runs as thread w + 1
  return 0;
}

void ThreadPool::parallel_for(int64_t n, RangeFn fn, int64_t grain) { run_job(n, fn, grain, false, kChunksPerThread); }

void ThreadPool::parallel_for_nodes(int64_t n, RangeFn fn, int64_t grain, int chunks_per_thread) {
  run_job(n, fn, grain, num_nodes() > 1, chunks_per_thread);
}

void ThreadPool::parallel_for_node_ranges(int64_t n, std::span<const int64_t> node_bounds, RangeFn fn, int64_t grain,
                                          int chunks_per_thread) {
  run_job(n, fn, grain, num_nodes() > 1, chunks_per_thread, node_bounds);
}

void ThreadPool::run_job(int64_t n, RangeFn& fn, int64_t grain, bool by_node, int chunks_per_thread,
                         std::span<const int64_t> node_bounds) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t grains = (n + grain - 1) / grain;
  if (workers_.empty() || grains <= 1) {
    fn(0, n, workers_.empty() ? 0 : this_thread_index());
    return;
  }
  bool idle = false;
  if (!busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
    // Nested or concurrent use: the workers belong to the running job.
    fn(0, n, this_thread_index());
    return;
  }
  // Node k's grains [begin, end): the caller's cut, or in proportion to its threads (node_row_ranges' split); one share
  // when not by node.
  // chunks_per_thread chunks per thread (a few by default: enough to rebalance when one thread runs late, few
  // enough to stay cheap).
  const int shares = by_node ? num_nodes() : 1;
  for (int k = 0; k < shares; ++k) {
    const int first = by_node ? node_first_thread_[static_cast<size_t>(k)] : 0;
    const int last = by_node ? node_first_thread_[static_cast<size_t>(k) + 1] : num_threads();
    RowRange range{0, grains};
    if (by_node) {
      const bool given = node_bounds.size() == static_cast<size_t>(num_nodes()) + 1;
      range = given ? RowRange{node_bounds[k], node_bounds[k + 1]} : node_row_range(grains, node_first_thread_, k);
    }
    NodeShare& share = node_shares_[static_cast<size_t>(k)];
    share.begin = range.begin;
    share.end = range.end;
    const int64_t share_grains = range.end - range.begin;
    const int64_t target_chunks = std::max<int64_t>(1, std::min<int64_t>(share_grains, std::max(1, chunks_per_thread) * (last - first)));
    share.chunk_grains = std::max<int64_t>(1, (share_grains + target_chunks - 1) / target_chunks);
    share.chunks = (share_grains + share.chunk_grains - 1) / share.chunk_grains;
    share.next_chunk.store(0, std::memory_order_relaxed);
  }
  job_by_node_ = by_node;
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  // Open the next generation (the previous job is closed with no worker inside, so no compare-exchange can change
  // the word meanwhile); the store publishes the fields above to the workers that join.
  const uint64_t generation = (job_state_.load(std::memory_order_relaxed) >> 32) + 1;
  job_state_.store((generation << 32) | kOpenBit);
  if (sleeping_workers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(sleep_mutex_); }  // a worker between its check and its wait sees the job
    work_ready_.notify_all();
  }

  run_chunks(0);

  // Close: no worker joins from now on; then wait for those inside to leave. They are usually microseconds from
  // done: poll before sleeping.
  const auto workers_inside = [this] { return job_state_.load() & kActiveMask; };
  if ((job_state_.fetch_and(~kOpenBit) & kActiveMask) != 0 && !spin_until([&] { return workers_inside() == 0; })) {
    caller_sleeping_.store(true);
    std::unique_lock<std::mutex> lock(sleep_mutex_);
    work_done_.wait(lock, [&] { return workers_inside() == 0; });
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  job_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;  // the last generation this worker saw
  uint64_t state = 0;
  const auto news = [&] {
    state = job_state_.load();
    return (state >> 32) != seen || stopping_.load(std::memory_order_relaxed);
  };
  for (;;) {
    if (!spin_until(news)) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleeping_workers_.fetch_add(1);
      work_ready_.wait(lock, news);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stopping_.load()) return;
    seen = state >> 32;
    // Join the job of the generation seen while it is open (a failed exchange reloads the word: a closed job or a
    // later one, which the next round of the loop sees).
    bool joined = false;
    while (!joined && (state >> 32) == seen && (state & kOpenBit) != 0) {
      joined = job_state_.compare_exchange_weak(state, state + 1);
    }
    if (!joined) continue;
    run_chunks(index);
    const uint64_t left = job_state_.fetch_sub(1) - 1;
    if ((left & (kActiveMask | kOpenBit)) == 0 && caller_sleeping_.load()) {
      { std::lock_guard<std::mutex> lock(sleep_mutex_); }  // the caller between its check and its wait sees the count
      work_done_.notify_one();
    }
  }
}

void ThreadPool::balance_scratch() {
  size_t largest = 0;
  for (int i = 0; i < num_threads(); ++i) {
    ScratchSlot& slot = scratch_[static_cast<size_t>(i)];
    if (slot.leased.exchange(true, std::memory_order_acquire)) continue;
    largest = std::max(largest, slot.arena.capacity_bytes());
    slot.leased.store(false, std::memory_order_release);
  }
  for (int i = 0; i < num_threads(); ++i) {
    ScratchSlot& slot = scratch_[static_cast<size_t>(i)];
    if (slot.leased.exchange(true, std::memory_order_acquire)) continue;
    if (slot.arena.capacity_bytes() < largest) slot.arena.reserve(largest);
    slot.leased.store(false, std::memory_order_release);
  }
}

ThreadScratch::ThreadScratch(ThreadPool* pool, int thread_index) {
  if (pool == nullptr || thread_index < 0 || thread_index >= pool->num_threads()) return;
  ThreadPool::ScratchSlot& slot = pool->scratch_[static_cast<size_t>(thread_index)];
  const std::thread::id self = std::this_thread::get_id();
  if (slot.leased.exchange(true, std::memory_order_acquire)) {
    // Held: by this thread (nest in it) or by another one (the private arena).
    if (slot.holder.load(std::memory_order_relaxed) != self) return;
    slot_ = &slot;
    nested_ = true;
    mark_ = slot.arena.mark();
    return;
  }
  slot.holder.store(self, std::memory_order_relaxed);
  slot_ = &slot;
  slot_->arena.reset();
}

ThreadScratch::~ThreadScratch() {
  if (slot_ == nullptr) return;
  if (nested_) {
    slot_->arena.rewind(mark_);
    return;
  }
  slot_->holder.store(std::thread::id(), std::memory_order_relaxed);
  slot_->leased.store(false, std::memory_order_release);
}

}  // namespace dsflash
