// Loads a checkpoint directory into everything a forward pass needs (mapped checkpoint, bound weights, kernel
// tables, worker threads): the Engine (engine/engine.h) owns one; the end-to-end tests use it directly. Owns the storage; Transformer and SequenceState do the compute and hold the per-sequence state.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/compute_context.h"
#include "model/model_weights.h"
#include "model/sequence.h"
#include "model/transformer.h"

namespace dsflash {

struct RunnerOptions {
  bool reference = false;  // scalar reference kernels, single-threaded (the oracle)
  int num_threads = 0;     // fast path: 0 = one per hardware thread
};

class ModelRunner {
 public:
  // progress(stage, fraction of the load done): "checkpoint" (mapped), "weights" (bound), "kernels" (ready).
  using Progress = std::function<void(const char* stage, double fraction)>;
  static Result<std::unique_ptr<ModelRunner>> open(const std::string& checkpoint_dir, const RunnerOptions& options,
                                                   const Progress& progress = {});

  const ModelConfig& config() const { return checkpoint_.config(); }
  const ModelWeights& weights() const { return *weights_; }
  const Transformer& transformer() const { return *transformer_; }
  const ComputeContext& context() const { return ctx_; }
  Result<SequenceState> new_sequence() const { return SequenceState::create(config()); }

  // One forward call over `tokens` continuing `seq`.
  Status forward(const std::vector<int32_t>& tokens, SequenceState& seq, LogitsRows rows, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr) const {
    return transformer_->forward(tokens.data(), static_cast<int64_t>(tokens.size()), seq, ctx_, rows, logits, trace);
  }

 private:
  explicit ModelRunner(Checkpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}

  Checkpoint checkpoint_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  ComputeContext ctx_;
  std::unique_ptr<Transformer> transformer_;
};

}  // namespace dsflash
