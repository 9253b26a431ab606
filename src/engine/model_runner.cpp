#include "engine/model_runner.h"

namespace dsflash {

Result<std::unique_ptr<ModelRunner>> ModelRunner::open(const std::string& checkpoint_dir,
                                                       const RunnerOptions& options, const Progress& progress) {
  auto report = [&](const char* stage, double fraction) {
    if (progress) progress(stage, fraction);
  };
  auto checkpoint = Checkpoint::open(checkpoint_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  report("checkpoint", 0.3);
  std::unique_ptr<ModelRunner> runner(new ModelRunner(std::move(*checkpoint)));
  auto weights = ModelWeights::bind(runner->checkpoint_);
  if (!weights.ok()) return weights.status().with_context("binding " + checkpoint_dir);
  runner->weights_ = std::move(*weights);
  report("weights", 0.8);
  if (options.reference) {
    runner->ctx_ = ComputeContext::for_backend(reference_backend());
  } else {
    runner->pool_ = std::make_unique<ThreadPool>(options.num_threads);
    runner->ctx_ = ComputeContext::for_backend(best_backend(), runner->pool_.get());
  }
  report("kernels", 0.9);
  return runner;
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
