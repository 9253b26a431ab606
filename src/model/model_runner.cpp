#include "model/model_runner.h"

#include <cmath>


namespace dsflash {

Result<std::unique_ptr<ModelRunner>> ModelRunner::open(const std::string& checkpoint_dir,
                                                       const RunnerOptions& options) {
  auto checkpoint = Checkpoint::open(checkpoint_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  std::unique_ptr<ModelRunner> runner(new ModelRunner(std::move(*checkpoint)));
  auto weights = ModelWeights::bind(runner->checkpoint_);
  if (!weights.ok()) return weights.status().with_context("binding " + checkpoint_dir);
  runner->weights_ = std::move(*weights);
  if (options.reference) {
    runner->ctx_ = ComputeContext::for_backend(reference_backend());
  } else {
    runner->pool_ = std::make_unique<ThreadPool>(options.num_threads);
    runner->ctx_ = ComputeContext::for_backend(best_backend(), runner->pool_.get());
  }
  return runner;
}

int32_t argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(values[best]) || values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Status ModelRunner::forward(const std::vector<int32_t>& tokens, SequenceState& seq, LogitsRows rows,
                            std::vector<float>* logits, ForwardTrace* trace) const {
  ForwardBatch batch;
  RowOptions row;
  row.logits = rows;
  batch.add(seq, tokens.data(), static_cast<int64_t>(tokens.size()), row);
  Status s = seq.attention().reserve_positions(seq.num_positions() + static_cast<int64_t>(tokens.size()));
  if (!s.ok()) return s;
  ForwardOutput out;
  s = dsflash::forward(*weights_, batch, ctx_, &out, trace);
  if (!s.ok()) return s;
  if (logits != nullptr) *logits = std::move(out.logits);
  return Status::Ok();
}

}  // namespace dsflash
