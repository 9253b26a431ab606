// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into contiguous
// chunks (whole grains) that the caller's thread and the workers take in turn, so a worker that the OS
// runs late does not hold the others up; it returns when every chunk is done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsflash {

class ThreadPool {
 public:
  // num_threads <= 0: one per hardware thread.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end, thread_index) over disjoint ranges covering [0, n); a thread may get several ranges.
  // Ranges are multiples of `grain` (except the last) so kernels can keep blocks whole. thread_index is in
  // [0, num_threads()) and 0 is the caller. A call made while another parallel_for of this pool runs (from
  // inside fn, or from another thread) runs fn(0, n, 0) on the calling thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  void run_chunks(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  // The current job; written only by parallel_for while no worker is inside it.
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  int64_t job_chunk_grains_ = 1;
  int64_t job_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<uint64_t> generation_{0};  // bumped (under mutex_) for each job; workers spin on it briefly
  std::atomic<bool> stopping_{false};
  bool open_ = false;  // guarded by mutex_: workers may still join the current job
  int active_ = 0;     // guarded by mutex_: workers inside the current job
};

}  // namespace dsflash
