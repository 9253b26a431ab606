// The engine core (DESIGN.md "The data path"; vLLM v1's "tokens to compute per request" scheduling): a request
// queue, a scheduler that admits requests while the KV cache budget allows, and steps that mix prefill chunks
// (the CED bounded-replay plan by default) with one decode row of every running sequence in ONE forward per
// step (engine/batch_builder.h: a mixed batch). Per-request stop conditions: max new tokens, stop ids (EOS);
// cancellation at any time. Sampling per request (engine/sampler.h; greedy = argmax, lowest id on ties, by
// default); optional logits rows and teacher forcing (the `dsflash logits` contract).
//
// Memory: every admitted request holds a KV sequence sized for prompt + max_new_tokens positions (global-KV
// pages from the kv::KvCacheManager, which the model's compressed KV writes into, plus the charge for its window
// rings, compressor tails and Engram history), so a running request never runs out of cache. A request that
// could never fit is rejected at submit(); one that does not fit now waits in the queue (FIFO) until others
// finish. Not thread-safe: one thread drives submit/cancel/step.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dsflash/sampling.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/compute_context.h"
#include "engine/batch_builder.h"
#include "model/model_weights.h"
#include "model/sequence.h"

namespace dsflash::engine {

using RequestId = int64_t;

struct Request {
  std::vector<int32_t> prompt;     // token ids, at least one
  int64_t max_new_tokens = 16;     // >= 1
  std::vector<int32_t> stop_ids;   // generation ends after emitting one of these (EOS); it is part of the output
  PrefillOptions prefill;          // plan: bounded replay (default) or exact
  SamplingParams sampling;         // greedy by default
  bool return_logits = false;      // token events carry their row; kExact: kPromptLogits events with the prompt rows
  std::vector<int32_t> follow;     // teacher forcing: decode step k is fed follow[k] (k < size) instead of token k
};

enum class RequestStatus { kQueued, kPrefilling, kDecoding, kFinished };
enum class FinishReason { kNone, kMaxTokens, kStopToken, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);  // "", "length", "stop", "cancelled", "error"

// What a caller can read about a request at any time (kept after it finishes).
struct RequestRecord {
  RequestId id = -1;
  RequestStatus status = RequestStatus::kQueued;
  FinishReason reason = FinishReason::kNone;
  int64_t prompt_tokens = 0;
  int64_t prompt_done = 0;        // prompt positions prefilled so far
  std::vector<int32_t> generated;
  std::string error;              // kError: what failed
  int64_t global_kv_bytes = 0;    // global-KV pages held (whole blocks) while running; at finish, what it held
};

struct Event {
  enum class Kind { kToken, kFinished, kPromptLogits };
  Kind kind = Kind::kToken;
  RequestId id = -1;
  int32_t token = -1;                        // kToken
  FinishReason reason = FinishReason::kNone; // kFinished
  float logprob = 0.0f;                      // kToken, sampling.top_logprobs > 0: log-softmax of the raw row
  std::vector<TokenLogprob> top_logprobs;    // kToken
  // return_logits: kToken = the row the token was drawn from [1, vocab]; kPromptLogits = prompt rows before the
  // last one [rows, vocab] (kExact). positions: the absolute position of each row.
  std::vector<float> logits;
  std::vector<int64_t> positions;
};

struct SchedulerOptions {
  int64_t kv_budget_bytes = int64_t{1} << 30;  // global KV pages + per-sequence fixed state of running requests
  int64_t kv_block_tokens = 64;                // positions per global-KV block
  int max_running = 16;                        // sequences prefilling or decoding at once (decode batch bound)
  int64_t prefill_tokens_per_step = 512;       // prompt tokens computed per step, over all prefilling requests
};

// What the last step did (for the benchmark and tests).
struct StepStats {
  int64_t prefill_tokens = 0;
  int64_t decode_batch = 0;
  int64_t admitted = 0;
};

class Scheduler {
 public:
  // weights and ctx must outlive the engine.
  static Result<std::unique_ptr<Scheduler>> create(const ModelWeights& weights, const ComputeContext& ctx,
                                                const SchedulerOptions& options);

  // Queues a request. Errors: empty prompt, ids outside the vocabulary, max_new_tokens < 1, a context beyond
  // max_position_embeddings, or a request larger than the whole KV budget.
  Result<RequestId> submit(Request request);
  // Cancels a queued or running request (its cache is released at once; a kFinished event follows in the next
  // step). Error for an unknown id; no-op for a finished one.
  Status cancel(RequestId id);
  // One scheduler iteration: admit, prefill chunks, one batched decode step. Events are appended.
  Status step(std::vector<Event>* events);
  // Steps until every request has finished.
  Status run_to_completion(std::vector<Event>* events);
  bool has_work() const { return !queue_.empty() || !running_.empty() || !pending_finish_.empty(); }

  const RequestRecord* record(RequestId id) const;
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_queued() const { return static_cast<int64_t>(queue_.size()); }
  kv::KvStats kv_stats() const { return kv_->stats(); }
  const kv::KvLayout& kv_layout() const { return kv_->layout(); }
  const StepStats& last_step() const { return last_step_; }
  const SchedulerOptions& options() const { return options_; }
  // KV bytes a request reaching `positions` positions reserves (what submit() checks against the budget).
  int64_t kv_bytes_for_sequence(int64_t positions) const { return kv_->bytes_for_sequence(positions); }

 private:
  struct Running {
    RequestId id = -1;
    Request request;
    SequenceState seq;
    kv::SequencePages* pages = nullptr;
    int64_t window_floor = 0;  // the plan's decoder window floor (replay start)
    int32_t next_input = -1;   // decoding: the token fed at the next step
    Sampler sampler;           // request.sampling, with the ids seen so far
  };

  Scheduler(const ModelWeights& weights, const ComputeContext& ctx, const SchedulerOptions& options,
         std::unique_ptr<kv::KvCacheManager> kv)
      : weights_(weights), ctx_(ctx), options_(options), kv_(std::move(kv)) {}

  Status admit();
  // Samples the next token from `row` [vocab] (the logits of the sequence's last position), records it; finishes
  // the request when a stop condition holds. Returns true if it finished.
  bool emit(Running& r, const float* row, std::vector<Event>* events);
  void finish(RequestId id, FinishReason reason, const std::string& error, std::vector<Event>* events);

  const ModelWeights& weights_;
  ComputeContext ctx_;
  SchedulerOptions options_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  RequestId next_id_ = 0;
  std::deque<RequestId> queue_;
  std::map<RequestId, Request> queued_requests_;
  std::vector<std::unique_ptr<Running>> running_;  // admission order
  std::vector<std::pair<RequestId, FinishReason>> pending_finish_;  // cancelled: event due at the next step
  std::map<RequestId, RequestRecord> records_;
  StepStats last_step_;
};

}  // namespace dsflash::engine
