// The Engine of include/dsflash/engine.h: Engine::Impl owns the loaded model (ModelRunner), the tokenizer, one
// Scheduler and the loop thread that alone drives it. Callers' threads talk to the loop through an inbox
// (new requests, cancellations) under a mutex + condition variable; the loop takes the inbox between steps
// (continuous batching), runs one Scheduler::step, turns the scheduler's events into each request's public
// events (RequestOutput) and pushes them to the request's EventChannel.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dsflash/engine.h"
#include "engine/event_channel.h"
#include "engine/model_runner.h"
#include "engine/request_output.h"
#include "engine/scheduler.h"
#include "prefix/prefix_cache.h"
#include "kv/kv_layout.h"
#include "model/compute_context.h"
#include "tokenizer/tokenizer.h"

namespace dsflash {

struct Engine::Impl {
  // Set at load, immutable while the loop runs (read from any thread).
  LoadOptions options;
  ModelInfo info;
  std::unique_ptr<ModelRunner> runner;
  std::optional<Tokenizer> tokenizer;
  std::optional<kv::KvLayout> kv_layout;

  // Loop thread only.
  StepProfile profile;  // the scheduler's ComputeContext points here when options.profile_steps
  std::unique_ptr<prefix::PrefixCache> prefix_cache;  // null: off
  std::unique_ptr<DSpark> dspark;  // null: the model has no DSpark stages
  std::unique_ptr<engine::Scheduler> scheduler;
  struct Active {
    std::unique_ptr<engine::RequestOutput> output;
    std::shared_ptr<detail::EventChannel> channel;
  };
  std::map<engine::RequestId, Active> active;             // by scheduler id
  std::map<RequestId, engine::RequestId> scheduler_ids;   // public id -> scheduler id, while active

  // Shared: guarded by mutex.
  struct Submitted {
    RequestId id = -1;
    engine::Request request;
    std::unique_ptr<engine::RequestOutput> output;
    std::shared_ptr<detail::EventChannel> channel;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Submitted> inbox;
  std::vector<RequestId> cancels;
  bool stopping = false;
  int64_t in_flight = 0;  // submitted and not finished
  RequestId next_id = 0;
  std::deque<StepRecord> steps;
  EngineStats published_stats;  // the loop's last publish_stats()

  std::thread loop;

  // Caller side.
  Expected<engine::Request> validate(const GenerationRequest& request, std::vector<int32_t>* stop_ids) const;

  // Loop side.
  void run_loop();
  void take_request(Submitted submitted);
  void cancel_request(RequestId id);
  void run_step();
  void dispatch(std::vector<engine::Event>& events);
  void finish(engine::RequestId sid, FinishReason reason, std::optional<EngineError> error);
  void shut_down();
  void publish_stats();
  void say_cache_notices();  // the prefix cache's one-time messages, to on_notice or stderr
  std::function<void(const std::string&)> on_notice;
};

}  // namespace dsflash
