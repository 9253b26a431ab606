// Loads a checkpoint directory into everything a forward pass needs (mapped checkpoint, bound weights, kernel
// tables, worker threads) and runs prompts: used by `dsflash logits`, `dsflash generate` and the end-to-end
// tests. Owns the storage; Transformer and SequenceState do the compute and hold the per-sequence state.
#pragma once

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
  static Result<std::unique_ptr<ModelRunner>> open(const std::string& checkpoint_dir, const RunnerOptions& options);

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

// Index of the largest value; ties to the lowest index (torch argmax), NaN never chosen over a number.
int32_t argmax(const float* values, int64_t n);

// Greedy run of the `dsflash logits` contract: prefill on `prompt`, then `decode_steps` single-token steps whose
// inputs are `follow[i]` when given (teacher forcing) or the previous greedy id. logits: rows [rows, vocab]
// (exact: every prompt position, else the last one; then one per decode step), positions: their absolute
// positions, generated: the greedy id after the prompt and after every decode step (decode_steps + 1 ids).
// exact = the official full forward (Transformer); otherwise the default plan, CED prefill with Decoder SWA
// Bounded Replay (model/forward_plan.h), and decode steps with the decoder window floored at the replay start.
struct GreedyRun {
  std::vector<float> logits;
  std::vector<int64_t> positions;
  std::vector<int32_t> generated;
};
Result<GreedyRun> run_greedy(const ModelRunner& runner, const std::vector<int32_t>& prompt, int64_t decode_steps,
                             const std::vector<int32_t>& follow, bool exact);

}  // namespace dsflash
