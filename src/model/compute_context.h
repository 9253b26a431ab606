// What every model component needs to run its kernels: the kernel table (kernels/backend.h: the scalar oracle,
// or the fastest this CPU runs) and the worker threads. Owned by the caller (the model runner).
#pragma once

#include <chrono>
#include <cstdint>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "kernels/backend.h"

namespace dsflash {

// Optional wall-clock split of a forward call (`dsflash bench`), by phase, and the routed expert bytes it read.
// Phases are exclusive: a phase opened inside another (the indexer's projections inside the indexer) charges its
// time to itself and the time is not counted twice. Time outside every opened phase goes to kOther. Only the
// calling thread opens phases (the pool's workers run inside them), so no locking. Numerics are untouched.
enum class ProfilePhase : int {
  kOther = 0,      // norms, mHC, rope, Engram lookups, compressor arithmetic, routing glue, ...
  kLinear = 1,     // every linear layer / matmul (the Backend's linears, with their activation quantisation)
  kIndexer = 2,    // indexer scoring + top-k (and the candidate-pool selection), without its projections
  kAttention = 3,  // sparse attention: window / top-k row gathers + the attention kernel
};
inline constexpr int kNumProfilePhases = 4;

struct StepProfile {
  int64_t ns[kNumProfilePhases] = {};
  // Weight bytes of the distinct routed experts the step's MoE layers ran (each expert's weights are read once
  // per step however many rows it gets): what a batched step touches beyond the dense weights.
  int64_t routed_expert_bytes = 0;
  // Bookkeeping of the open phase (ProfileScope).
  ProfilePhase current = ProfilePhase::kOther;
  std::chrono::steady_clock::time_point mark = std::chrono::steady_clock::now();

  int64_t total_ns() const {
    int64_t t = 0;
    for (int64_t v : ns) t += v;
    return t;
  }
  // Charge the time since the last phase change to the open phase (call before reading the sums).
  void flush() {
    const auto now = std::chrono::steady_clock::now();
    ns[static_cast<int>(current)] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count();
    mark = now;
  }
  // Zero the sums; the time until the next phase change is charged to kOther.
  void reset() {
    for (int64_t& v : ns) v = 0;
    routed_expert_bytes = 0;
    current = ProfilePhase::kOther;
    mark = std::chrono::steady_clock::now();
  }
};

// RAII: charges the time since the last phase change to the phase that was open, opens `phase`, and on exit
// charges its own time to `phase` and reopens the previous one. A null profile costs one branch.
class ProfileScope {
 public:
  ProfileScope(StepProfile* profile, ProfilePhase phase) : profile_(profile) {
    if (profile_ == nullptr) return;
    switch_to(phase, &saved_);
  }
  ~ProfileScope() {
    if (profile_ == nullptr) return;
    ProfilePhase ignored;
    switch_to(saved_, &ignored);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  void switch_to(ProfilePhase phase, ProfilePhase* previous) {
    const auto now = std::chrono::steady_clock::now();
    profile_->ns[static_cast<int>(profile_->current)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - profile_->mark).count();
    profile_->mark = now;
    *previous = profile_->current;
    profile_->current = phase;
  }
  StepProfile* profile_;
  ProfilePhase saved_ = ProfilePhase::kOther;
};

struct ComputeContext {
  const Backend* backend = nullptr;  // reference_backend() or best_backend(); every kernel call goes through it
  ThreadPool* pool = nullptr;        // nullptr: single-threaded
  StepProfile* profile = nullptr;    // nullptr: no timing (the default)
  // The step's scratch memory (core/workspace.h), owned by the caller (the scheduler, the ModelRunner) and used by
  // one thread at a time: forward() starts a step on it and every layer takes its buffers from it, so after one
  // step of a shape the next takes no heap memory. nullptr: each call uses a private workspace (correct, but
  // it allocates every call).
  Workspace* workspace = nullptr;

  // The context running `backend` on `pool` (nullptr: single-threaded).
  static ComputeContext for_backend(const Backend& backend, ThreadPool* pool = nullptr) {
    ComputeContext ctx;
    ctx.backend = &backend;
    ctx.pool = pool;
    return ctx;
  }
};

// body(begin, end) over ranges of [0, n) (whole multiples of grain but the last) on ctx's pool, or on this thread
// without one (or when there is a single grain): for independent rows.
template <class Body>
void parallel_rows(const ComputeContext& ctx, int64_t n, const Body& body, int64_t grain = 1) {
  if (ctx.pool != nullptr && n > grain) {
    ctx.pool->parallel_for(n, [&](int64_t begin, int64_t end, int) { body(begin, end); }, grain);
  } else {
    body(0, n);
  }
}

}  // namespace dsflash
