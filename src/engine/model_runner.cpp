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
  runner->transformer_ = std::make_unique<Transformer>(*runner->weights_);
  if (options.reference) {
    runner->ctx_.linear = &reference_linear_kernels();
    runner->ctx_.reference = true;
  } else {
    runner->pool_ = std::make_unique<ThreadPool>(options.num_threads);
    runner->ctx_.linear = &best_linear_kernels();
    runner->ctx_.pool = runner->pool_.get();
  }
  report("kernels", 0.9);
  return runner;
}

}  // namespace dsflash
