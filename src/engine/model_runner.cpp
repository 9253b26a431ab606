#include "engine/model_runner.h"

#include <thread>

#include "core/numa_topology.h"

namespace dsflash {

Result<std::unique_ptr<ModelRunner>> ModelRunner::open(const std::string& checkpoint_dir,
                                                       const RunnerOptions& options, const Progress& progress) {
  auto report = [&](const char* stage, double fraction) {
    if (progress) progress(stage, fraction);
  };
  const Backend* fast_backend = options.backend.empty() ? &best_backend() : find_backend(options.backend);
  if (fast_backend == nullptr || fast_backend == &reference_backend()) {
    std::string names;
    for (const Backend* b : available_backends())
      if (b != &reference_backend()) names += std::string(names.empty() ? "" : ", ") + b->name;
    return Status::Error("kernel backend '" + options.backend + "' is not one this CPU runs (" + names + ")");
  }
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
    std::vector<int> cpus, nodes;
    if (options.pin_threads) {
      // One CPU per worker, threads spread over the NUMA nodes in proportion to their CPUs (core/numa_topology.h).
      const int threads = options.num_threads > 0 ? options.num_threads
                                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      auto topology = NumaTopology::from_sysfs("/sys/devices/system/node", threads);
      if (!topology.ok()) return topology.status().with_context("pinning threads");
      const ThreadPlacement placement = place_threads(*topology, threads);
      cpus = placement.cpu_of_thread;  // entry 0 is whoever calls parallel_for (the engine's loop): left unpinned
      nodes = placement.node_of_thread;  // kernels and the load-time copy split weight rows by node
    }
    runner->pool_ = std::make_unique<ThreadPool>(options.num_threads, cpus, nodes);
    runner->ctx_ = ComputeContext::for_backend(*fast_backend, runner->pool_.get());
  }
  runner->ctx_.workspace = runner->workspace_.get();
  if (options.tile_major_weights && runner->ctx_.backend->prefers_tile_major.any()) {
    auto rewritten = runner->weights_->to_tile_major(runner->checkpoint_, runner->ctx_.backend->prefers_tile_major,
                                                      runner->pool_.get());
    if (!rewritten.ok()) return rewritten.status().with_context("rewriting the weights in tile-major order");
    runner->tile_major_linears_ = *rewritten;
  }
  // --mlock: after the copies, whose originals were given back and must not be read in again. Then the shards
  // are locked as their pages are touched (the first steps read the rest), the copies at once. One call per
  // mapping: locking tensor by tensor would split it into a memory area per tensor (the kernel's map count).
  if (options.lock_weights) {
    const bool released = runner->tile_major_linears_ > 0;
    if (Status s = runner->checkpoint_.lock_in_memory(released); !s.ok())
      return s.with_context("locking the weights in memory");
    if (Status s = runner->weights_->tile_major_weights().lock_in_memory(); !s.ok()) return s;
  }
  auto layout = kv::KvLayout::from_config(runner->config());
  if (!layout.ok()) return layout.status().with_context(checkpoint_dir);
  auto manager = kv::KvCacheManager::create(*layout, options.kv_budget_bytes);
  if (!manager.ok()) return manager.status().with_context(checkpoint_dir);
  runner->kv_ = std::move(*manager);
  report("kernels", 0.9);
  return runner;
}

Result<kv::SequenceLease> ModelRunner::new_sequence() const {
  auto seq = kv_->open_sequence();
  if (!seq.ok()) return seq.status();
  return kv::SequenceLease(kv_.get(), *seq);
}

Result<kv::SequenceLease> ModelRunner::fork(const SequenceState& seq) const {
  auto copy = kv_->fork(seq);
  if (!copy.ok()) return copy.status();
  return kv::SequenceLease(kv_.get(), *copy);
}

Status ModelRunner::forward(const std::vector<int32_t>& tokens, SequenceState& seq, LogitsRows rows,
                            std::vector<float>* logits, ForwardTrace* trace) const {
  ForwardBatch batch;
  RowOptions row;
  row.logits = rows;
  batch.add(seq, tokens.data(), static_cast<int64_t>(tokens.size()), row);
  Status s = seq.pages().reserve_positions(seq.num_positions() + static_cast<int64_t>(tokens.size()));
  if (!s.ok()) return s;
  ForwardOutput out;
  s = dsflash::forward(*weights_, batch, ctx_, &out, trace);
  if (!s.ok()) return s;
  if (logits != nullptr) *logits = std::move(out.logits);
  return Status::Ok();
}

}  // namespace dsflash
