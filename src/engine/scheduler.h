// The engine core (DESIGN.md "The data path"; vLLM v1's "tokens to compute per request" scheduling): a request
// queue, a scheduler that admits requests while the KV cache budget allows, and steps that mix prefill chunks
// (the CED bounded-replay plan by default) with one decode row of every running sequence in ONE forward per
// step (engine/batch_builder.h: a mixed batch). Per-request stop conditions: max new tokens, stop ids (EOS);
// cancellation at any time. Sampling per request (engine/sampler.h; greedy = argmax, lowest id on ties, by
// default); optional logits rows and teacher forcing (the `dsflash logits` contract).
//
// Memory: sequences grow as they go. A request is admitted when its fixed state (window rings, tails, Engram
// history) and the blocks of its whole prompt fit in what is free; before each step every sequence in the batch
// reserves the blocks its rows need. When the budget cannot hold a running sequence's next rows, the most
// recently admitted other request is preempted: its KV is released and it waits at the head of the queue to be
// recomputed (its prompt plus the tokens generated so far, prefilled again; sampling state kept). A sequence that
// cannot grow even alone finishes with a "KV cache full" error; no sequence's state is ever touched by another's
// failure. A request that could never fit is rejected at submit(). Not thread-safe: one thread drives
// submit/cancel/step.
//
// Speculative decoding (Request::speculative, engine/speculative.h): a speculating request's decode rows are its
// next input plus the drafts its policy chooses (1 + k rows in the same mixed forward, KV reserved for all of
// them), verified row by row by its sampler; rejected rows are rolled back before anything else sees the
// sequence. Its prefill and decode segments hand out DSpark hidden rows, and after the forward one DSpark call
// feeds the accepted rows to the drafter and drafts the next block of every speculating request.
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
#include "prefix/prefix_cache.h"
#include "model/compute_context.h"
#include "engine/batch_builder.h"
#include "engine/speculative.h"
#include "model/dspark.h"
#include "model/model_weights.h"
#include "model/csa2.h"

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
  // Benchmarks only: the first `synthetic_positions` prompt positions are not computed; at admission their KV is
  // filled with valid random state (kv/synthetic_context.h; Engram history from those prompt ids) and the prefill
  // starts after them. Never uses or feeds the prefix cache. 0 = off.
  int64_t synthetic_positions = 0;
  // Speculative decoding with the DSpark stages: most drafted tokens verified per step (0 = off; capped by the
  // block size). Needs SchedulerOptions::dspark; not with `follow`. adaptive false: always verify that many.
  int speculative = 0;
  bool speculative_adaptive = true;
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
  int64_t preemptions = 0;        // times its KV was released to make room (then recomputed)
  int64_t cached_tokens = 0;      // prompt positions whose global KV came from the prefix cache
  SpeculativeStats speculation;   // decode steps, drafts verified and accepted (all zero without speculation)
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
  // Prefix cache (RAM + SSD tiers; not owned, may be null = off). Bounded-replay requests look their prompt up at
  // admission and restore a hit by Encoder SWA Bounded Replay; every request publishes its prompt's whole blocks
  // after prefill and its generated tokens' blocks when it finishes. The exact plan neither reads nor writes it.
  prefix::PrefixCache* prefix_cache = nullptr;
  // The model's DSpark stages (not owned, may be null: requests cannot speculate).
  const DSpark* dspark = nullptr;
};

// What the last step did (for the benchmark and tests).
struct StepStats {
  int64_t prefill_tokens = 0;
  int64_t decode_batch = 0;
  int64_t admitted = 0;
  int64_t preempted = 0;
  int64_t draft_tokens = 0;     // drafts verified in the step's forward
  int64_t accepted_tokens = 0;  // of which accepted
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
  bool has_work() const { return !waiting_.empty() || !running_.empty() || !pending_finish_.empty(); }

  const RequestRecord* record(RequestId id) const;
  // Drops a finished request's record (after its kFinished event was consumed); no-op otherwise.
  void forget(RequestId id);
  // The KV state of a running request (null when it is queued or finished); for tests and tools.
  const SequenceState* sequence(RequestId id) const;
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_queued() const { return static_cast<int64_t>(waiting_.size()); }
  kv::KvStats kv_stats() const { return kv_->stats(); }
  const kv::KvLayout& kv_layout() const { return kv_->layout(); }
  const StepStats& last_step() const { return last_step_; }
  const SchedulerOptions& options() const { return options_; }
  // KV bytes a request reaching `positions` positions reserves (what submit() checks against the budget).
  int64_t kv_bytes_for_sequence(int64_t positions) const { return kv_->bytes_for_sequence(positions); }

 private:
  // A request while queued (seq null) or running.
  struct Running {
    RequestId id = -1;
    Request request;
    Sampler sampler;                       // request.sampling, with the ids seen so far
    std::vector<int32_t> prefill_tokens;   // what the prefill computes: the prompt (+ generated ids after a preemption)
    SequenceState* seq = nullptr;          // owned by kv_ while running
    int64_t window_floor = 0;              // the plan's decoder window floor (replay start of prefill_tokens)
    int32_t next_input = -1;               // decoding: the token fed at the next step
    std::unique_ptr<Speculation> speculation;  // null: not speculating
  };
  // One segment of a step's forward: its request and the rows it planned.
  struct Planned {
    Running* r = nullptr;
    int64_t rows = 0;
  };

  Scheduler(const ModelWeights& weights, const ComputeContext& ctx, const SchedulerOptions& options,
         std::unique_ptr<kv::KvCacheManager> kv)
      : weights_(weights), ctx_(ctx), options_(options), kv_(std::move(kv)) {
    ctx_.workspace = &workspace_;  // the scheduler's own step scratch (one thread runs its steps)
  }

  Status admit();
  // Maps the cached prefix of r's prompt (when the cache holds more than one window of it) and sets r up to replay
  // the window before the hit; returns the prompt positions restored (0: no hit).
  int64_t restore_cached_prefix(Running& r);
  // Request::synthetic_positions: reserves and fills r's first positions with synthetic KV (benchmarks).
  Status fill_synthetic_prefix(Running& r);
  // Publishes r's whole written blocks to the prefix cache (no-op without one or for the exact plan).
  void store_prefix(Running& r);
  // The token fed at decode step `step` (the input after generated token `step`): follow[step] or that token.
  int32_t input_of_step(const Running& r, int64_t step) const;
  // Reserves the KV of `rows` more positions for `r`, preempting the newest running request while the budget
  // refuses. False when r itself was the newest and got preempted, or when even alone it does not fit (r is then
  // finished with the error).
  bool reserve_or_preempt(Running& r, int64_t rows, std::vector<Event>* events);
  void preempt(Running& r);
  // Records `sampled` (drawn from `row` [vocab], the logits at `position`); finishes the request when a stop
  // condition holds. Returns true if it finished.
  bool emit(Running& r, SampledToken sampled, const float* row, int64_t position, std::vector<Event>* events);
  // Whether `token` ends the request (kStopToken: a stop id; kMaxTokens: the last of max_new_tokens once
  // `generated` ids are out; else kNone).
  FinishReason ending(const Running& r, int32_t token, int64_t generated) const;
  // A speculating decode segment after the forward: verifies its rows [first_row, first_row + 1 + k) of out,
  // rolls back the rejected ones and emits the tokens. Returns the rows kept (the DSpark context of the step).
  int64_t verify(Running& r, const ForwardOutput& out, size_t first_row, std::vector<Event>* events);
  // Feeds the step's kept rows of every speculating segment to the DSpark stages and drafts their next blocks.
  // segment_rows[i]: the kept rows of batch segment i (-1: not a speculating segment, or finished).
  void draft_next(const ForwardBatch& batch, const ForwardOutput& out, const std::vector<RequestId>& ids,
                  const std::vector<int64_t>& segment_rows, std::vector<Event>* events);
  Running* find_running(RequestId id) const;
  void finish(RequestId id, FinishReason reason, const std::string& error, std::vector<Event>* events);

  const ModelWeights& weights_;
  ComputeContext ctx_;
  Workspace workspace_;      // every forward's scratch; grows to the largest step shape, then reused
  ForwardOutput step_out_;   // reused across steps (keeps the logits capacity)
  DSparkOutput drafts_;      // the last DSpark call's drafts
  SchedulerOptions options_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  RequestId next_id_ = 0;
  std::deque<std::unique_ptr<Running>> waiting_;   // FIFO; preempted requests go back to the front
  std::vector<std::unique_ptr<Running>> running_;  // admission order
  std::vector<std::pair<RequestId, FinishReason>> pending_finish_;  // cancelled: event due at the next step
  std::map<RequestId, RequestRecord> records_;
  StepStats last_step_;
};

}  // namespace dsflash::engine
