// Loads a checkpoint directory into everything a forward pass needs (mapped checkpoint, bound weights, kernel
// tables, worker threads): the Engine (engine/engine.h) owns one; the end-to-end tests use it directly.
// Owns the storage; the forward (model/forward.h) computes and SequenceState holds the per-sequence state.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "kv/kv_cache.h"
#include "model/compute_context.h"
#include "model/model_weights.h"
#include "model/csa2.h"
#include "model/forward.h"

namespace dsflash {

struct RunnerOptions {
  bool reference = false;  // scalar reference kernels, single-threaded (the oracle)
  int num_threads = 0;     // fast path: 0 = one per hardware thread
  std::string backend;     // fast path: the kernel table by name (kernels/backend.h find_backend); empty: the default
  bool pin_threads = false;  // pin each worker to one CPU, spread over the NUMA nodes (core/numa_topology.h)
  int64_t kv_budget_bytes = int64_t{8} << 30;  // the runner's own sequences (new_sequence)
  bool lock_weights = false;  // mlock the checkpoint's mappings (Checkpoint::lock_in_memory)
  // Rewrite FP8/MXFP4 weights in tile-major order at load when the kernels prefer it (ModelWeights::to_tile_major;
  // results within the kernels' reordering bound, a faster decode). false keeps the checkpoint's order (to compare).
  bool tile_major_weights = true;
};

class ModelRunner {
 public:
  // progress(stage, fraction of the load done): "checkpoint" (mapped), "weights" (bound), "kernels" (ready).
  using Progress = std::function<void(const char* stage, double fraction)>;
  static Result<std::unique_ptr<ModelRunner>> open(const std::string& checkpoint_dir, const RunnerOptions& options,
                                                   const Progress& progress = {});

  const ModelConfig& config() const { return checkpoint_.config(); }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const ModelWeights& weights() const { return *weights_; }
  // FP8/MXFP4 linears rewritten in tile-major order at load (RunnerOptions::tile_major_weights); 0 when none.
  int64_t tile_major_linears() const { return tile_major_linears_; }
  const ComputeContext& context() const { return ctx_; }
  // A new sequence from the runner's own KV cache manager (tests, benchmarks, one-off runs; the Engine's
  // scheduler has its own), released when the lease goes. fork: an independent copy of a sequence's state.
  Result<kv::SequenceLease> new_sequence() const;
  Result<kv::SequenceLease> fork(const SequenceState& seq) const;
  kv::KvCacheManager& kv() const { return *kv_; }

  // The official forward (every layer on every row) over `tokens` continuing `seq`: one segment of the one
  // forward. logits: [rows, vocab] where rows is 0, 1 or tokens.size() by `rows`.
  Status forward(const std::vector<int32_t>& tokens, SequenceState& seq, LogitsRows rows, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr) const;

 private:
  explicit ModelRunner(Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}

  Checkpoint checkpoint_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  int64_t tile_major_linears_ = 0;
  ComputeContext ctx_;  // its workspace is workspace_: one thread at a time runs forwards on context()
  std::unique_ptr<Workspace> workspace_ = std::make_unique<Workspace>();
  std::unique_ptr<kv::KvCacheManager> kv_;  // budget RunnerOptions::kv_budget_bytes; memory is taken on first use
};

}  // namespace dsflash
