#include "engine/scheduler.h"

#include <algorithm>

#include "engine/batch_builder.h"
#include "engine/sampler.h"
#include "kv/synthetic_context.h"

namespace dsflash::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kMaxTokens: return "length";
    case FinishReason::kStopToken: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const ModelWeights& weights, const ComputeContext& ctx,
                                               const SchedulerOptions& options) {
  if (ctx.backend == nullptr) return Status::Error("engine: the compute context has no kernel backend");
  if (options.max_running < 1) return Status::Error("engine: max_running must be >= 1");
  if (options.prefill_tokens_per_step < 1) return Status::Error("engine: prefill_tokens_per_step must be >= 1");
  auto layout = kv::KvLayout::from_config(weights.config(), options.kv_block_tokens);
  if (!layout.ok()) return layout.status().with_context("engine");
  auto manager = kv::KvCacheManager::create(*layout, options.kv_budget_bytes);
  if (!manager.ok()) return manager.status().with_context("engine");
  return std::unique_ptr<Scheduler>(new Scheduler(weights, ctx, options, std::move(*manager)));
}

Result<RequestId> Scheduler::submit(Request request) {
  const ModelConfig& config = weights_.config();
  if (request.prompt.empty()) return Status::Error("request: the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= config.vocab_size) {
      return Status::Error("request: prompt id " + std::to_string(request.prompt[i]) + " at index " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    }
  }
  if (request.max_new_tokens < 1) return Status::Error("request: max_new_tokens must be >= 1");
  const int64_t positions = static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens;
  if (positions > config.max_position_embeddings) {
    return Status::Error("request: prompt (" + std::to_string(request.prompt.size()) + ") + max_new_tokens (" +
                         std::to_string(request.max_new_tokens) + ") exceed max_position_embeddings " +
                         std::to_string(config.max_position_embeddings));
  }
  if (request.prefill.replay_tokens < 0) return Status::Error("request: replay_tokens must be >= 0");
  Status sampling = validate_sampling(request.sampling);
  if (!sampling.ok()) return sampling.with_context("request");
  for (size_t i = 0; i < request.follow.size(); ++i) {
    if (request.follow[i] < 0 || request.follow[i] >= config.vocab_size) {
      return Status::Error("request: follow id " + std::to_string(request.follow[i]) + " at index " +
                           std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                           ")");
    }
  }
  if (request.speculative < 0) return Status::Error("request: speculative must be >= 0");
  if (request.speculative > 0 && options_.dspark == nullptr) {
    return Status::Error("request: speculative decoding needs the model's DSpark stages, and this model has none");
  }
  if (request.speculative > 0 && !request.follow.empty()) {
    return Status::Error("request: speculative decoding cannot be combined with teacher forcing (follow ids)");
  }
  const int64_t need = kv_->bytes_for_sequence(positions);
  if (need > kv_->budget_bytes()) {
    return Status::Error("request: " + std::to_string(positions) + " positions need " + std::to_string(need) +
                         " B of KV cache, more than the whole budget of " + std::to_string(kv_->budget_bytes()) + " B");
  }
  const RequestId id = next_id_++;
  RequestRecord record;
  record.id = id;
  record.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  records_[id] = record;
  auto waiting = std::make_unique<Running>();
  waiting->id = id;
  waiting->request = std::move(request);
  waiting->sampler = Sampler(waiting->request.sampling);
  waiting->sampler.observe_prompt(waiting->request.prompt);
  waiting->prefill_tokens = waiting->request.prompt;
  if (waiting->request.speculative > 0) {
    DraftPolicyOptions policy;
    policy.max_draft = std::min(waiting->request.speculative, options_.dspark->block_size());
    policy.adaptive = waiting->request.speculative_adaptive;
    waiting->speculation = std::make_unique<Speculation>(policy);
  }
  waiting_.push_back(std::move(waiting));
  return id;
}

Status Scheduler::cancel(RequestId id) {
  auto rec = records_.find(id);
  if (rec == records_.end()) return Status::Error("cancel: no request " + std::to_string(id));
  if (rec->second.status == RequestStatus::kFinished) return Status::Ok();
  finish(id, FinishReason::kCancelled, "", nullptr);
  pending_finish_.emplace_back(id, FinishReason::kCancelled);
  return Status::Ok();
}

const RequestRecord* Scheduler::record(RequestId id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

void Scheduler::forget(RequestId id) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.status != RequestStatus::kFinished) return;
  for (const auto& [pending, reason] : pending_finish_) {
    if (pending == id) return;  // its kFinished event is still due
  }
  records_.erase(it);
}

const SequenceState* Scheduler::sequence(RequestId id) const {
  const Running* r = find_running(id);
  return r == nullptr ? nullptr : r->seq;
}

void Scheduler::finish(RequestId id, FinishReason reason, const std::string& error, std::vector<Event>* events) {
  RequestRecord& rec = records_[id];
  rec.status = RequestStatus::kFinished;
  rec.reason = reason;
  rec.error = error;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id != id) continue;
    rec.global_kv_bytes = (*it)->seq->pages().global_bytes();
    if (reason != FinishReason::kError) store_prefix(**it);
    Status s = kv_->release(*(*it)->seq);
    if (!s.ok() && rec.error.empty()) rec.error = s.message();
    running_.erase(it);
    break;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    waiting_.erase(it);
    break;
  }
  if (events != nullptr) events->push_back(Event{Event::Kind::kFinished, id, -1, reason, 0.0f, {}, {}, {}});
}

FinishReason Scheduler::ending(const Running& r, int32_t token, int64_t generated) const {
  const auto& stops = r.request.stop_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStopToken;
  return generated >= r.request.max_new_tokens ? FinishReason::kMaxTokens : FinishReason::kNone;
}

bool Scheduler::emit(Running& r, SampledToken sampled, const float* row, int64_t position, std::vector<Event>* events) {
  const int64_t vocab = weights_.config().vocab_size;
  const int32_t token = sampled.id;
  RequestRecord& rec = records_[r.id];
  rec.generated.push_back(token);
  if (events != nullptr) {
    Event event{Event::Kind::kToken, r.id, token, FinishReason::kNone, sampled.logprob, std::move(sampled.top), {}, {}};
    if (r.request.return_logits) {
      event.logits.assign(row, row + vocab);
      event.positions.push_back(position);
    }
    events->push_back(std::move(event));
  }
  r.next_input = input_of_step(r, static_cast<int64_t>(rec.generated.size()) - 1);
  const FinishReason reason = ending(r, token, static_cast<int64_t>(rec.generated.size()));
  if (reason == FinishReason::kNone) return false;
  finish(r.id, reason, "", events);
  return true;
}

Status Scheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Running& next = *waiting_.front();
    // FIFO: the head waits until its fixed state and whole prompt fit (generated tokens grow as they go).
    const int64_t prefill_positions = static_cast<int64_t>(next.prefill_tokens.size());
    if (!kv_->can_open(prefill_positions)) break;
    auto seq = kv_->open_sequence();
    if (!seq.ok()) return seq.status().with_context("admitting request " + std::to_string(next.id));
    next.seq = *seq;
    next.window_floor = replay_start(weights_.config(), next.request.prefill, prefill_positions);
    RequestRecord& rec = records_[next.id];
    rec.status = RequestStatus::kPrefilling;
    const int64_t cached = restore_cached_prefix(next);
    if (next.request.synthetic_positions > 0) {
      Status filled = fill_synthetic_prefix(next);
      if (!filled.ok()) return filled.with_context("admitting request " + std::to_string(next.id));
    }
    rec.prompt_done = next.seq->num_positions();
    if (rec.preemptions == 0) rec.cached_tokens = cached;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ++last_step_.admitted;
  }
  return Status::Ok();
}

int32_t Scheduler::input_of_step(const Running& r, int64_t step) const {
  const auto& follow = r.request.follow;
  return step < static_cast<int64_t>(follow.size()) ? follow[static_cast<size_t>(step)]
                                                   : records_.at(r.id).generated[static_cast<size_t>(step)];
}

Status Scheduler::fill_synthetic_prefix(Running& r) {
  const int64_t depth = r.request.synthetic_positions;
  if (depth >= static_cast<int64_t>(r.prefill_tokens.size())) {
    return Status::Error("synthetic context of " + std::to_string(depth) + " positions leaves no prompt token of " +
                         std::to_string(r.prefill_tokens.size()) + " to compute");
  }
  Status s = kv_->reserve(r.seq->pages(), depth);
  if (s.ok()) s = kv::fill_synthetic_context(*r.seq, depth, /*seed=*/0x5EEDull);  // same context every time
  if (s.ok() && r.seq->engram() != nullptr && weights_.engram_hasher() != nullptr) {
    s = weights_.engram_hasher()->restore_history(r.prefill_tokens.data(), depth, r.seq->engram());
  }
  return s;
}

int64_t Scheduler::restore_cached_prefix(Running& r) {
  prefix::PrefixCache* cache = options_.prefix_cache;
  if (cache == nullptr || r.request.prefill.mode != PrefillMode::kBoundedReplay || r.request.synthetic_positions > 0) {
    return 0;
  }
  const ModelConfig& config = weights_.config();
  const int64_t window = config.window_size;
  const std::vector<kv::BlockHash> hashes = cache->lookup(r.prefill_tokens, *kv_);
  const int64_t block_tokens = kv_->layout().block_tokens;
  // Hits of at most one window are not used: replaying the window before the hit would cost what it saves.
  if (static_cast<int64_t>(hashes.size()) * block_tokens <= window) return 0;
  auto mapped = kv_->attach_cached_prefix(*r.seq, hashes, cache->seed());
  if (!mapped.ok() || *mapped == 0) return 0;
  const int64_t hit = *mapped * block_tokens;
  if (hit <= window) {
    // Fewer blocks than looked up (evicted meanwhile): start over on a sequence without frozen blocks.
    (void)kv_->release(*r.seq);
    auto fresh = kv_->open_sequence();
    r.seq = fresh.ok() ? *fresh : nullptr;
    return 0;
  }
  // Encoder SWA Bounded Replay (spec §7): the window before the hit is replayed to rebuild the window rings; its
  // global KV is the cached one (rows with stored entries are never compressed again).
  const int64_t replay_from = hit - window;
  Status s = r.seq->restart_at(replay_from);
  if (s.ok() && r.seq->engram() != nullptr && weights_.engram_hasher() != nullptr) {
    s = weights_.engram_hasher()->restore_history(r.prefill_tokens.data(), replay_from, r.seq->engram());
  }
  if (!s.ok()) return 0;
  return hit;
}

void Scheduler::store_prefix(Running& r) {
  prefix::PrefixCache* cache = options_.prefix_cache;
  if (cache == nullptr || r.seq == nullptr || r.request.prefill.mode != PrefillMode::kBoundedReplay ||
      r.request.synthetic_positions > 0) {
    return;
  }
  // Token ids of the positions written: the prefill tokens, then the generated ids fed back so far.
  const RequestRecord& rec = records_[r.id];
  std::vector<int32_t> tokens(r.prefill_tokens.begin(),
                              r.prefill_tokens.begin() + std::min<int64_t>(rec.prompt_done, static_cast<int64_t>(r.prefill_tokens.size())));
  const int64_t fed = r.seq->num_positions() - static_cast<int64_t>(tokens.size());
  const int64_t generated_base = static_cast<int64_t>(r.prefill_tokens.size()) - static_cast<int64_t>(r.request.prompt.size());
  for (int64_t i = 0; i < fed && generated_base + i < static_cast<int64_t>(rec.generated.size()); ++i) {
    tokens.push_back(input_of_step(r, generated_base + i));
  }
  (void)cache->store(*r.seq, tokens, *kv_);  // a refusal only means the blocks are not kept
}

void Scheduler::preempt(Running& r) {
  RequestRecord& rec = records_[r.id];
  (void)kv_->release(*r.seq);
  r.seq = nullptr;
  // Recompute later: the prompt and every generated id (the last one not yet fed) are prefilled again, so the
  // prefill's last row gives the next token as the decode step would have.
  r.prefill_tokens = r.request.prompt;
  for (size_t k = 0; k < rec.generated.size(); ++k) r.prefill_tokens.push_back(input_of_step(r, static_cast<int64_t>(k)));
  if (r.speculation) r.speculation->drop_drafts();  // drafted for the released state; the prefill drafts again
  rec.status = RequestStatus::kQueued;
  rec.prompt_done = 0;
  ++rec.preemptions;
  ++last_step_.preempted;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() != &r) continue;
    waiting_.push_front(std::move(*it));
    running_.erase(it);
    break;
  }
}

bool Scheduler::reserve_or_preempt(Running& r, int64_t rows, std::vector<Event>* events) {
  const int64_t positions = r.seq->num_positions() + rows;
  for (;;) {
    if (kv_->can_reserve(r.seq->pages(), positions)) {
      Status s = kv_->reserve(r.seq->pages(), positions);
      if (s.ok()) return true;
    }
    // The newest running request makes room; when that is r itself, r waits (it is recomputed later).
    if (running_.size() == 1) {
      finish(r.id, FinishReason::kError,
             "KV cache full: " + std::to_string(positions) + " positions need " +
                 std::to_string(kv_->bytes_to_reserve(r.seq->pages(), positions)) + " B more, " +
                 std::to_string(kv_->free_bytes()) + " B free of a " + std::to_string(kv_->budget_bytes()) +
                 " B budget, and no other request to preempt",
             events);
      return false;
    }
    Running& victim = *running_.back();
    const bool self = &victim == &r;
    preempt(victim);
    if (self) return false;
  }
}

Status Scheduler::step(std::vector<Event>* events) {
  last_step_ = StepStats();
  for (const auto& [id, reason] : pending_finish_) {
    if (events != nullptr) events->push_back(Event{Event::Kind::kFinished, id, -1, reason, 0.0f, {}, {}, {}});
  }
  pending_finish_.clear();
  Status s = admit();
  if (!s.ok()) return s;

  // One forward per step (a mixed batch): prefill chunks of the prefilling requests in admission order within the
  // per-step token budget, then the decode rows of every request that is decoding (one, or 1 + k for a
  // speculating one). Each reserves its rows' KV first (oldest first; preemption takes the newest, so a request
  // already planned is never preempted).
  std::vector<Planned> prefills, decodes;
  int64_t budget = options_.prefill_tokens_per_step;
  std::vector<RequestId> order;
  for (const auto& r : running_) order.push_back(r->id);
  const int64_t max_rows = kv::SequenceSnapshot::max_rows(kv_->layout());
  for (RequestId id : order) {
    Running* r = find_running(id);
    if (r == nullptr) continue;  // preempted or failed meanwhile
    const RequestRecord& rec = records_[id];
    const bool prefilling = rec.status == RequestStatus::kPrefilling;
    if (prefilling && budget == 0) continue;
    int64_t rows = 1;
    if (r->speculation) r->speculation->verifying = 0;
    if (prefilling) {
      rows = std::min(budget, static_cast<int64_t>(r->prefill_tokens.size()) - rec.prompt_done);
    } else if (r->speculation) {
      const int64_t left = r->request.max_new_tokens - static_cast<int64_t>(rec.generated.size());
      r->speculation->verifying = r->speculation->plan(left, max_rows);
      rows += r->speculation->verifying;
    }
    if (!reserve_or_preempt(*r, rows, events)) continue;
    (prefilling ? prefills : decodes).push_back(Planned{r, rows});
    if (prefilling) budget -= rows;
  }
  ForwardBatch batch;
  std::vector<Running*> rows_of;  // per segment, its request
  for (const Planned& p : prefills) {
    Running& r = *p.r;
    const int64_t prompt_length = static_cast<int64_t>(r.prefill_tokens.size());
    // Every prompt row only when the caller asked for logits rows of the exact plan (`dsflash logits --exact`).
    const bool all_rows = r.request.return_logits && r.request.prefill.mode == PrefillMode::kExact;
    s = add_prefill_chunk(batch, weights_.config(), *r.seq, r.prefill_tokens.data() + records_[r.id].prompt_done,
                          p.rows, prompt_length, r.request.prefill, all_rows ? LogitsRows::kAll : LogitsRows::kLast,
                          r.speculation != nullptr);
    if (!s.ok()) return s.with_context("request " + std::to_string(r.id));
    rows_of.push_back(&r);
  }
  std::vector<int32_t> decode_tokens;
  for (const Planned& p : decodes) {
    Running& r = *p.r;
    decode_tokens.assign(1, r.next_input);
    if (r.speculation && r.speculation->verifying > 0) {
      Speculation& spec = *r.speculation;
      decode_tokens.insert(decode_tokens.end(), spec.drafts.begin(), spec.drafts.begin() + spec.verifying);
      s = spec.snapshot.capture(*r.seq, p.rows);  // what the rows overwrite, to roll the rejected ones back
      if (!s.ok()) return s.with_context("request " + std::to_string(r.id));
    }
    add_decode_rows(batch, *r.seq, decode_tokens.data(), p.rows, r.window_floor, r.speculation != nullptr);
    rows_of.push_back(&r);
  }
  if (batch.empty()) return Status::Ok();
  ForwardOutput& out = step_out_;
  s = forward(weights_, batch, ctx_, &out);  // every segment's KV was reserved above
  if (!s.ok()) {
    for (Running* r : rows_of) {
      if (r->speculation && r->speculation->verifying > 0) r->speculation->snapshot.disarm(*r->seq);
      finish(r->id, FinishReason::kError, s.message(), events);
    }
    return s.with_context("step");
  }

  // Emit in batch order; emit() may erase finished requests from running_, so requests are held by id.
  const int64_t vocab = weights_.config().vocab_size;
  std::vector<RequestId> ids;
  for (Running* r : rows_of) ids.push_back(r->id);
  std::vector<int64_t> dspark_rows(ids.size(), -1);  // per segment: rows the drafter gets (-1: none)
  size_t next_row = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    Running* r = find_running(ids[i]);
    // This segment's logits rows: out.rows [first_row, end_row).
    const size_t first_row = next_row;
    while (next_row < out.rows.size() && out.rows[next_row].segment == static_cast<int64_t>(i)) ++next_row;
    const size_t end_row = next_row;
    const ForwardSegment& seg = batch.segments()[i];
    RequestRecord& rec = records_[ids[i]];
    if (end_row == first_row && (rec.status != RequestStatus::kPrefilling ||
                                 rec.prompt_done + seg.num_tokens == static_cast<int64_t>(r->prefill_tokens.size()))) {
      finish(ids[i], FinishReason::kError, "the forward gave no logits row", events);
      continue;
    }
    if (rec.status == RequestStatus::kPrefilling) {
      rec.prompt_done += seg.num_tokens;
      last_step_.prefill_tokens += seg.num_tokens;
      const bool prompt_done = rec.prompt_done == static_cast<int64_t>(r->prefill_tokens.size());
      if (r->speculation) dspark_rows[i] = seg.num_tokens;  // all of them (only the decoder rows have hidden states)
      // Every row but the prompt's last (that one goes with the first token) as a prompt-logits event.
      const size_t prompt_rows = end_row - first_row - (prompt_done && end_row > first_row ? 1 : 0);
      if (r->request.return_logits && prompt_rows > 0 && events != nullptr) {
        Event event{Event::Kind::kPromptLogits, r->id, -1, FinishReason::kNone, 0.0f, {}, {}, {}};
        event.logits.assign(out.logits.begin() + static_cast<int64_t>(first_row) * vocab,
                            out.logits.begin() + static_cast<int64_t>(first_row + prompt_rows) * vocab);
        for (size_t row = first_row; row < first_row + prompt_rows; ++row) event.positions.push_back(out.rows[row].position);
        events->push_back(std::move(event));
      }
      if (!prompt_done) continue;
      rec.status = RequestStatus::kDecoding;
      store_prefix(*r);  // the prompt's whole blocks, for the next request with this prefix
    } else {
      ++last_step_.decode_batch;
      if (r->speculation) {
        dspark_rows[i] = verify(*r, out, first_row, events);
        continue;
      }
    }
    const float* row = out.logits.data() + static_cast<int64_t>(end_row - 1) * vocab;
    emit(*r, r->sampler.sample(row, vocab), row, out.rows[end_row - 1].position, events);
  }
  draft_next(batch, out, ids, dspark_rows, events);
  return Status::Ok();
}

Scheduler::Running* Scheduler::find_running(RequestId id) const {
  for (auto& candidate : running_) {
    if (candidate->id == id) return candidate.get();
  }
  return nullptr;
}

int64_t Scheduler::verify(Running& r, const ForwardOutput& out, size_t first_row, std::vector<Event>* events) {
  const int64_t vocab = weights_.config().vocab_size;
  Speculation& spec = *r.speculation;
  const int k = spec.verifying;
  const int64_t generated = static_cast<int64_t>(records_[r.id].generated.size());
  // Row i's logits give the token after input i; draft i is accepted when that token is it. Stop at the first
  // rejection or at a token that ends the request (nothing after it may be emitted).
  std::vector<SampledToken> tokens;
  int accepted = 0;
  for (int i = 0; i <= k; ++i) {
    const float* row = out.logits.data() + static_cast<int64_t>(first_row + i) * vocab;
    bool match = false;
    if (i < k) {
      const double* q = spec.draft_probs.empty() ? nullptr : spec.draft_probs.data() + static_cast<int64_t>(i) * vocab;
      tokens.push_back(r.sampler.verify(row, vocab, spec.drafts[static_cast<size_t>(i)], q, &match));
    } else {
      tokens.push_back(r.sampler.sample(row, vocab));  // every draft accepted: the bonus token
    }
    accepted += match ? 1 : 0;
    if (!match || ending(r, tokens.back().id, generated + i + 1) != FinishReason::kNone) break;
  }
  const int64_t kept = static_cast<int64_t>(tokens.size());  // the inputs of the rows whose tokens are emitted
  if (k > 0) {
    Status s = spec.snapshot.keep(*r.seq, kept);
    if (!s.ok()) {
      spec.snapshot.disarm(*r.seq);
      finish(r.id, FinishReason::kError, "speculative rollback: " + s.message(), events);
      return -1;
    }
  }
  ++spec.stats.decode_steps;
  spec.stats.draft_tokens += k;
  spec.stats.accepted_tokens += accepted;
  spec.policy.record(k, accepted);
  records_[r.id].speculation = spec.stats;
  last_step_.draft_tokens += k;
  last_step_.accepted_tokens += accepted;
  const RequestId id = r.id;
  for (int64_t i = 0; i < kept; ++i) {
    const size_t row = first_row + static_cast<size_t>(i);
    if (emit(r, std::move(tokens[static_cast<size_t>(i)]), out.logits.data() + static_cast<int64_t>(row) * vocab,
             out.rows[row].position, events)) {
      break;
    }
  }
  return find_running(id) == nullptr ? -1 : kept;
}

void Scheduler::draft_next(const ForwardBatch& batch, const ForwardOutput& out, const std::vector<RequestId>& ids,
                           const std::vector<int64_t>& segment_rows, std::vector<Event>* events) {
  if (options_.dspark == nullptr) return;
  // Each speculating segment's hidden rows in out.dspark_hidden (segment order) and its part of the call.
  const int64_t width = options_.dspark->hidden_width();
  std::vector<DSparkSegment> segments;
  std::vector<Running*> owners;
  size_t hidden_row = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t first = hidden_row;
    while (hidden_row < out.dspark_rows.size() && out.dspark_rows[hidden_row].segment == static_cast<int64_t>(i)) ++hidden_row;
    if (segment_rows[i] < 0) continue;
    Running* r = find_running(ids[i]);
    if (r == nullptr) continue;
    const RequestRecord& rec = records_[r->id];
    DSparkSegment seg;
    seg.state = r->seq;
    seg.main_hidden = out.dspark_hidden.data() + static_cast<int64_t>(first) * width;
    // Decode rows past the kept ones were rolled back; prefill rows without hidden states are the global-only ones.
    seg.num_context = std::min<int64_t>(segment_rows[i], static_cast<int64_t>(hidden_row - first));
    seg.first_position = first < hidden_row ? out.dspark_rows[first].position : batch.segments()[i].seq->num_positions();
    const bool decoding = rec.status == RequestStatus::kDecoding;
    const int64_t left = r->request.max_new_tokens - static_cast<int64_t>(rec.generated.size());
    seg.draft = decoding && r->speculation->policy.active() && left > 1;
    seg.next_token = r->next_input;
    r->speculation->drop_drafts();
    if (decoding && !r->speculation->policy.needs_context(weights_.config().window_size)) seg.num_context = 0;
    if (seg.num_context == 0 && !seg.draft) continue;
    segments.push_back(seg);
    owners.push_back(r);
  }
  if (segments.empty()) return;
  const int64_t vocab = weights_.config().vocab_size;
  const int block = options_.dspark->block_size();
  // Sampled requests draw their drafts from the draft distribution q (kept for the verification); greedy ones
  // take the drafter's argmax.
  bool any_sampled = false;
  for (Running* r : owners) any_sampled = any_sampled || !r->sampler.greedy();
  std::vector<Running*> drafter_of;  // per draft of the call, its request
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].draft) drafter_of.push_back(owners[i]);
  }
  DraftSampler sampler;
  if (any_sampled) {
    sampler = [&](const float* logits, int64_t n, int64_t draft, int position) {
      Running& r = *drafter_of[static_cast<size_t>(draft)];
      std::vector<double>& q = r.speculation->draft_probs;
      if (r.sampler.greedy()) return argmax(logits, n);
      q.resize(static_cast<size_t>(block * vocab));
      return r.sampler.draw_draft(logits, n, q.data() + static_cast<int64_t>(position) * vocab);
    };
  }
  Status s = options_.dspark->forward(segments.data(), static_cast<int64_t>(segments.size()), ctx_, &drafts_, sampler);
  if (!s.ok()) {
    for (Running* r : owners) finish(r->id, FinishReason::kError, "DSpark: " + s.message(), events);
    return;
  }
  for (size_t d = 0; d < drafts_.drafts.size(); ++d) {
    Running& r = *owners[static_cast<size_t>(drafts_.drafts[d].segment)];
    r.speculation->take_drafts(drafts_.output_ids.data() + d * static_cast<size_t>(block + 1) + 1,
                               drafts_.confidence.data() + d * static_cast<size_t>(block), block);
  }
}

Status Scheduler::run_to_completion(std::vector<Event>* events) {
  while (has_work()) {
    Status s = step(events);
    if (!s.ok()) return s;
    if (running_.empty() && !waiting_.empty()) {
      const int64_t positions = static_cast<int64_t>(waiting_.front()->prefill_tokens.size());
      if (!kv_->can_open(positions)) {
        // Nothing runs, so nothing will free memory: the head of the queue can never be admitted.
        return Status::Error("engine: request " + std::to_string(waiting_.front()->id) +
                             " cannot be admitted: it needs " + std::to_string(kv_->bytes_for_sequence(positions)) +
                             " B of KV cache, " + std::to_string(kv_->free_bytes()) + " B free");
      }
    }
  }
  return Status::Ok();
}

}  // namespace dsflash::engine
