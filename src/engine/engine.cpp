#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <filesystem>

#include "engine/sampler.h"
#include "io/model_stats.h"
#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

constexpr size_t kMaxStepRecords = 4096;

EngineError invalid(const std::string& message) { return EngineError{ErrorCode::kInvalidRequest, message}; }

FinishReason public_reason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStopToken: return FinishReason::kStop;
    case engine::FinishReason::kCancelled: return FinishReason::kCancelled;
    case engine::FinishReason::kError: return FinishReason::kError;
    case engine::FinishReason::kMaxTokens:
    case engine::FinishReason::kNone: break;
  }
  return FinishReason::kLength;
}

Status check_ids(const std::vector<int32_t>& ids, int64_t vocab, const std::string& what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Status::Error(what + " token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidRequest: return "invalid_request";
    case ErrorCode::kContextTooLong: return "context_too_long";
    case ErrorCode::kOverloaded: return "overloaded";
    case ErrorCode::kLoad: return "load";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

const char* plan_name(Plan plan) { return plan == Plan::kExact ? "exact" : "bounded-replay"; }

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->loop.joinable()) impl_->loop.join();
}

Expected<std::unique_ptr<Engine>> Engine::load(const std::string& model_dir, const LoadOptions& options,
                                               const ProgressCallback& progress) {
  auto report = [&](const char* stage, double fraction) {
    if (progress) progress(LoadProgress{stage, fraction});
  };
  auto load_error = [](const std::string& message) { return EngineError{ErrorCode::kLoad, message}; };
  std::error_code ec;
  if (!std::filesystem::exists(model_dir, ec)) return load_error("model directory " + model_dir + " does not exist");
  if (!std::filesystem::is_directory(model_dir, ec)) return load_error(model_dir + " is not a directory");
  if (options.max_requests < 1) return load_error("max_requests must be >= 1");

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  RunnerOptions runner_options;
  runner_options.reference = options.reference_kernels;
  runner_options.num_threads = options.num_threads;
  runner_options.backend = options.backend;
  runner_options.pin_threads = options.pin_threads;
  runner_options.lock_weights = options.lock_weights;
  runner_options.tile_major_weights = options.tile_major_weights;
  auto runner = ModelRunner::open(model_dir, runner_options, [&](const char* stage, double f) { report(stage, f); });
  if (!runner.ok()) return load_error(runner.status().message());
  impl->runner = std::move(*runner);

  const std::filesystem::path tokenizer_path = std::filesystem::path(model_dir) / "tokenizer.json";
  if (std::filesystem::exists(tokenizer_path, ec)) {
    auto tokenizer = Tokenizer::from_file(tokenizer_path.string());
    if (!tokenizer.ok()) return load_error(tokenizer.status().message());
    impl->tokenizer.emplace(std::move(*tokenizer));
  } else if (options.require_tokenizer) {
    return load_error("model directory " + model_dir + " has no tokenizer.json");
  }
  report("tokenizer", 0.95);

  if (options.prefix_cache) {
    auto layout = kv::KvLayout::from_config(impl->runner->config(), options.kv_block_tokens);
    if (!layout.ok()) return load_error(layout.status().message());
    auto fingerprint = prefix::fingerprint_checkpoint(impl->runner->checkpoint());
    if (!fingerprint.ok()) return load_error(fingerprint.status().message());
    prefix::PrefixCacheOptions cache_options;
    cache_options.cache_dir = options.cache_dir;
    cache_options.disk_budget_bytes = options.cache_disk_bytes;
    impl->prefix_cache = std::make_unique<prefix::PrefixCache>(*fingerprint, *layout, cache_options);
    impl->on_notice = options.on_notice;
    impl->say_cache_notices();
  }
  report("prefix cache", 0.97);

  if (options.dspark && impl->runner->config().dspark_stages() > 0) {
    auto dspark = DSpark::bind(impl->runner->checkpoint(), impl->runner->weights());
    if (!dspark.ok()) return load_error(dspark.status().message());
    impl->dspark = std::move(*dspark);
    if (impl->runner->tile_major_linears() > 0) {  // the stages' weights in the order the main layers got
      auto copied = impl->dspark->to_tile_major(impl->runner->checkpoint(),
                                                impl->runner->context().backend->prefers_tile_major,
                                                impl->runner->context().pool);
      if (!copied.ok()) return load_error(copied.status().with_context("DSpark stages in tile-major order").message());
      if (options.lock_weights) {
        if (Status s = impl->dspark->tile_major_weights().lock_in_memory(); !s.ok()) return load_error(s.message());
      }
    }
  }
  engine::SchedulerOptions scheduler_options;
  scheduler_options.prefix_cache = impl->prefix_cache.get();
  scheduler_options.dspark = impl->dspark.get();
  scheduler_options.kv_budget_bytes = options.kv_budget_bytes;
  scheduler_options.kv_block_tokens = options.kv_block_tokens;
  scheduler_options.max_running = options.max_running;
  scheduler_options.prefill_tokens_per_step = options.prefill_tokens_per_step;
  ComputeContext ctx = impl->runner->context();
  if (options.profile_steps) ctx.profile = &impl->profile;
  auto scheduler = engine::Scheduler::create(impl->runner->weights(), ctx, scheduler_options);
  if (!scheduler.ok()) return load_error(scheduler.status().message());
  impl->scheduler = std::move(*scheduler);
  impl->kv_layout.emplace(impl->scheduler->kv_layout());

  const ModelConfig& config = impl->runner->config();
  ModelInfo& info = impl->info;
  info.model_dir = model_dir;
  info.vocab_size = config.vocab_size;
  info.max_position_embeddings = config.max_position_embeddings;
  info.eos_token_id = config.eos_token_id;
  info.n_layers = config.n_layers;
  info.dim = config.dim;
  info.window_size = config.window_size;
  info.dspark_block_size = impl->dspark ? impl->dspark->block_size() : 0;
  const ParameterCounts params = count_parameters(config);
  info.parameters = params.total;
  info.activated_params_prefill = params.activated_prefill;
  info.activated_params_decode = params.activated_decode;
  info.activated_params_prefill_fp4 = params.activated_prefill_fp4;
  info.activated_params_decode_fp4 = params.activated_decode_fp4;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir, ec)) {
    if (entry.path().extension() == ".safetensors") info.checkpoint_bytes += static_cast<int64_t>(entry.file_size());
  }
  info.decode_weight_bytes = impl->runner->weights().decode_weight_bytes();
  info.decode_routed_bytes = impl->runner->weights().decode_routed_bytes();
  info.kernels = impl->runner->context().backend->name;
  info.tile_major_linears = impl->runner->tile_major_linears();
  info.tile_major_bytes = static_cast<int64_t>(impl->runner->weights().tile_major_weights().size()) +
                          (impl->dspark ? static_cast<int64_t>(impl->dspark->tile_major_weights().size()) : 0);
  // (Only tile-major MXFP4 weights take the tile unit.)
  info.fp4_amx_min_rows = info.tile_major_linears > 0 ? impl->runner->context().backend->fp4_amx_min_rows : 0;
  info.num_threads = impl->runner->context().pool != nullptr ? impl->runner->context().pool->num_threads() : 1;
  info.has_tokenizer = impl->tokenizer.has_value();
  info.kv_budget_bytes = options.kv_budget_bytes;
  impl->published_stats.kv_budget_bytes = options.kv_budget_bytes;
  info.kv_block_tokens = impl->kv_layout->block_tokens;
  info.global_kv_bytes_per_token = impl->kv_layout->global_bytes_per_token();
  info.fixed_kv_bytes_per_sequence = impl->kv_layout->fixed_bytes_per_sequence();
  // The longest request the KV budget holds (bytes grow with positions): binary search.
  int64_t lo = 0, hi = config.max_position_embeddings;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (impl->scheduler->kv_bytes_for_sequence(mid) <= options.kv_budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  info.max_request_positions = lo;

  Impl* raw = impl.get();
  impl->loop = std::thread([raw] { raw->run_loop(); });
  report("ready", 1.0);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelInfo& Engine::info() const { return impl_->info; }

Expected<std::vector<int32_t>> Engine::tokenize(std::string_view text) const {
  if (!impl_->tokenizer) return invalid("the model directory has no tokenizer.json");
  auto ids = impl_->tokenizer->encode(text);
  if (!ids.ok()) return invalid(ids.status().message());
  return std::move(*ids);
}

std::string Engine::detokenize(const std::vector<int32_t>& ids) const {
  return impl_->tokenizer ? impl_->tokenizer->decode(ids) : std::string();
}

int64_t Engine::global_kv_bytes_for_positions(int64_t positions) const {
  return impl_->kv_layout->global_bytes_for_positions(positions);
}

namespace {
PeakOps peak_ops(ComputeUnit unit, const ComputeContext& ctx) {
  return unit == ComputeUnit::kBf16Dot    ? PeakOps::kBf16Dot
         : unit == ComputeUnit::kAmxTiles ? PeakOps::kAmxBf16
                                          : ctx.backend->gemm_peak;
}
}  // namespace

ComputePeak Engine::measure_compute_peak(double seconds, ComputeUnit unit) const {
  const ComputeContext& ctx = impl_->runner->context();
  const DotPeak peak = measure_dot_peak(ctx.pool, seconds, peak_ops(unit, ctx));
  return ComputePeak{peak.gflops, peak.kernel};
}

std::string Engine::compute_peak_kernel(ComputeUnit unit) const {
  return dot_peak_kernel(peak_ops(unit, impl_->runner->context()));
}

ReadBandwidth Engine::measure_read_bandwidth(int64_t bytes) const {
  const ReadPeak read = dsflash::measure_read_bandwidth(impl_->runner->context().pool, bytes);
  return ReadBandwidth{read.gbps, read.bytes};
}

std::vector<StepRecord> Engine::take_step_records() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<StepRecord> out(impl_->steps.begin(), impl_->steps.end());
  impl_->steps.clear();
  return out;
}

Expected<engine::Request> Engine::Impl::validate(const GenerationRequest& request,
                                                 std::vector<int32_t>* stop_ids) const {
  engine::Request out;
  if (!request.prompt_ids.empty()) {
    out.prompt = request.prompt_ids;
  } else if (!request.prompt_text.empty()) {
    if (!tokenizer) return invalid("a text prompt needs the model's tokenizer.json");
    auto ids = tokenizer->encode(request.prompt_text);
    if (!ids.ok()) return invalid(ids.status().message());
    out.prompt = std::move(*ids);
  }
  if (out.prompt.empty()) return invalid("the prompt is empty");
  const int64_t vocab = info.vocab_size;
  if (request.bench_synthetic_context < 0) {
    return invalid("bench_synthetic_context must be >= 0, got " + std::to_string(request.bench_synthetic_context));
  }
  if (request.bench_synthetic_context > 0) {
    if (request.bench_synthetic_context + static_cast<int64_t>(out.prompt.size()) > info.max_position_embeddings) {
      return EngineError{ErrorCode::kContextTooLong,
                         "bench_synthetic_context (" + std::to_string(request.bench_synthetic_context) +
                             ") + prompt exceed max_position_embeddings " +
                             std::to_string(info.max_position_embeddings)};
    }
    // The ids of the synthetic positions (what the Engram history hashes): deterministic, never special ids 0-2.
    std::vector<int32_t> ids(static_cast<size_t>(request.bench_synthetic_context));
    uint64_t state = 0x5DEECE66Dull;
    for (int32_t& id : ids) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<int32_t>(3 + (state >> 33) % static_cast<uint64_t>(std::max<int64_t>(1, vocab - 3)));
    }
    ids.insert(ids.end(), out.prompt.begin(), out.prompt.end());
    out.prompt = std::move(ids);
    out.synthetic_positions = request.bench_synthetic_context;
  }
  using Ids = std::pair<const std::vector<int32_t>*, const char*>;
  for (const auto& [ids, what] : {Ids{&out.prompt, "prompt"}, Ids{&request.stop_ids, "stop"},
                                  Ids{&request.follow_ids, "follow"}}) {
    Status s = check_ids(*ids, vocab, what);
    if (!s.ok()) return invalid(s.message());
  }
  if (request.max_tokens < 1) return invalid("max_tokens must be >= 1, got " + std::to_string(request.max_tokens));
  Status s = validate_sampling(request.sampling);
  if (!s.ok()) return invalid(s.message());
  for (const std::string& stop : request.stop_strings) {
    if (stop.empty()) return invalid("stop strings must not be empty");
  }
  if (!tokenizer && (!request.stop_strings.empty() || request.parse_output)) {
    return invalid("stop strings and output parsing need the model's tokenizer.json");
  }
  const int64_t positions = static_cast<int64_t>(out.prompt.size()) + request.max_tokens;
  if (positions > info.max_position_embeddings) {
    return EngineError{ErrorCode::kContextTooLong,
                       "prompt (" + std::to_string(out.prompt.size()) + ") + max_tokens (" +
                           std::to_string(request.max_tokens) + ") exceed max_position_embeddings " +
                           std::to_string(info.max_position_embeddings)};
  }
  if (positions > info.max_request_positions) {
    return EngineError{ErrorCode::kContextTooLong,
                       "prompt (" + std::to_string(out.prompt.size()) + ") + max_tokens (" +
                           std::to_string(request.max_tokens) + ") need more KV cache than the whole budget (" +
                           std::to_string(info.max_request_positions) + " positions)"};
  }
  *stop_ids = request.stop_ids;
  if (request.stop_at_eos && info.eos_token_id >= 0 && info.eos_token_id < vocab) {
    stop_ids->push_back(info.eos_token_id);
  }
  out.max_new_tokens = request.max_tokens;
  out.stop_ids = *stop_ids;
  out.prefill.mode = request.plan == Plan::kExact ? engine::PrefillMode::kExact : engine::PrefillMode::kBoundedReplay;
  out.sampling = request.sampling;
  out.return_logits = request.return_logits;
  out.follow = request.follow_ids;
  if (request.speculative < 0) return invalid("speculative must be >= 0, got " + std::to_string(request.speculative));
  if (request.speculative > 0 && info.dspark_block_size == 0) {
    return invalid(runner->config().dspark_stages() > 0
                       ? "speculative decoding needs the model's DSpark stages (mtp.*), and this engine was loaded "
                         "without them (LoadOptions::dspark false)"
                       : "speculative decoding needs the model's DSpark stages (mtp.*), and this model has none");
  }
  if (request.speculative > 0 && !request.follow_ids.empty()) {
    return invalid("speculative decoding cannot be combined with follow ids (teacher forcing)");
  }
  out.speculative = request.speculative;
  out.speculative_adaptive = request.speculative_adaptive;
  return out;
}

Expected<RequestHandle> Engine::submit(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  auto handles = submit_together(std::move(one));
  if (!handles.ok()) return handles.error();
  return std::move(handles->front());
}

Expected<std::vector<RequestHandle>> Engine::submit_together(std::vector<GenerationRequest> requests) {
  // Everything is validated before anything is queued; the outputs take their ids under the lock.
  std::vector<Impl::Submitted> batch(requests.size());
  std::vector<std::vector<int32_t>> stop_ids(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto validated = impl_->validate(requests[i], &stop_ids[i]);
    if (!validated.ok()) return validated.error();
    batch[i].request = std::move(*validated);
    batch[i].channel = std::make_shared<detail::EventChannel>();
  }
  const Tokenizer* tokenizer = impl_->tokenizer ? &*impl_->tokenizer : nullptr;
  std::vector<RequestHandle> handles;
  handles.reserve(batch.size());
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopping) return EngineError{ErrorCode::kOverloaded, "the engine is shutting down"};
    const int64_t count = static_cast<int64_t>(batch.size());
    if (impl_->in_flight + count > impl_->options.max_requests) {
      return EngineError{ErrorCode::kOverloaded,
                         std::to_string(impl_->in_flight) + " requests in flight and " + std::to_string(count) +
                             " more submitted, above the most this engine takes (" +
                             std::to_string(impl_->options.max_requests) + ")"};
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      Impl::Submitted& submitted = batch[i];
      submitted.id = impl_->next_id++;
      const int64_t prompt_tokens = static_cast<int64_t>(submitted.request.prompt.size());
      submitted.output = std::make_unique<engine::RequestOutput>(submitted.id, tokenizer, requests[i], prompt_tokens,
                                                                 std::move(stop_ids[i]));
      handles.emplace_back(submitted.id, submitted.channel);
      impl_->inbox.push_back(std::move(submitted));
    }
    impl_->in_flight += count;
  }
  impl_->wake.notify_all();
  return handles;
}

void Engine::cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopping) return;
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_all();
}

Expected<Completion> Engine::generate(GenerationRequest request) {
  const auto submitted = std::chrono::steady_clock::now();
  auto handle = submit(std::move(request));
  if (!handle.ok()) return handle.error();
  Completion c;
  while (auto event = handle->next()) {
    if (event->kind == EventKind::kToken && c.tokens.empty()) {
      c.first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count();
    }
    switch (event->kind) {
      case EventKind::kPromptLogits:
        c.logits.insert(c.logits.end(), event->logits.begin(), event->logits.end());
        c.positions.insert(c.positions.end(), event->positions.begin(), event->positions.end());
        break;
      case EventKind::kToken:
        c.tokens.push_back(event->token);
        c.logprobs.push_back(event->logprob);
        c.top_logprobs.push_back(std::move(event->top_logprobs));
        c.logits.insert(c.logits.end(), event->logits.begin(), event->logits.end());
        c.positions.insert(c.positions.end(), event->positions.begin(), event->positions.end());
        break;
      case EventKind::kText: c.text += event->text; break;
      case EventKind::kReasoning: c.reasoning += event->text; break;
      case EventKind::kContent: c.content += event->text; break;
      case EventKind::kToolCall: c.tool_calls.push_back(std::move(event->tool_call)); break;
      case EventKind::kFinished:
        if (event->error) return *event->error;
        c.finish_reason = event->finish_reason;
        c.usage = event->usage;
        c.global_kv_bytes = event->global_kv_bytes;
        break;
    }
  }
  return c;
}

// ---- the loop thread ----

void Engine::Impl::run_loop() {
  for (;;) {
    std::deque<Submitted> arrived;
    std::vector<RequestId> cancelled;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [this] { return stopping || !inbox.empty() || !cancels.empty() || scheduler->has_work(); });
      arrived.swap(inbox);
      cancelled.swap(cancels);
      stop = stopping;
    }
    for (Submitted& s : arrived) take_request(std::move(s));
    for (RequestId id : cancelled) cancel_request(id);
    if (stop) {
      shut_down();
      return;
    }
    if (scheduler->has_work()) run_step();
    publish_stats();
  }
}

// ---- load snapshot (Engine::stats) ----

void Engine::Impl::say_cache_notices() {
  if (prefix_cache == nullptr) return;
  for (const std::string& notice : prefix_cache->take_notices()) {
    if (on_notice) {
      on_notice(notice);
    } else {
      std::cerr << notice << std::endl;
    }
  }
}

void Engine::Impl::publish_stats() {
  const kv::KvStats kv = scheduler->kv_stats();
  say_cache_notices();
  std::vector<PrefixCacheTierStats> tiers;
  if (prefix_cache != nullptr) {
    const prefix::PrefixCacheStats c = prefix_cache->stats();
    tiers.push_back(PrefixCacheTierStats{"ram", c.ram_hit_blocks, 0, kv.cached_bytes});
    if (c.disk_enabled) {
      tiers.push_back(PrefixCacheTierStats{"disk", c.disk.hits, c.disk.misses, c.disk.bytes});
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  published_stats.prefix_cache = prefix_cache != nullptr;
  published_stats.prefix_tiers = std::move(tiers);
  published_stats.requests_running = scheduler->num_running();
  published_stats.kv_used_bytes = kv.used_bytes;
  published_stats.kv_budget_bytes = kv.budget_bytes;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EngineStats s = impl_->published_stats;
  s.requests_running = std::min(s.requests_running, impl_->in_flight);
  s.requests_waiting = std::max<int64_t>(0, impl_->in_flight - s.requests_running);
  return s;
}

void Engine::Impl::take_request(Submitted submitted) {
  auto sid = scheduler->submit(std::move(submitted.request));
  if (!sid.ok()) {  // validate() checked what the scheduler checks; anything left is internal
    std::vector<Event> events;
    submitted.output->finish(FinishReason::kError, EngineError{ErrorCode::kInternal, sid.status().message()}, 0,
                             &events);
    for (Event& e : events) submitted.channel->push(std::move(e));
    std::lock_guard<std::mutex> lock(mutex);
    --in_flight;
    return;
  }
  scheduler_ids[submitted.id] = *sid;
  active[*sid] = Active{std::move(submitted.output), std::move(submitted.channel)};
}

void Engine::Impl::cancel_request(RequestId id) {
  auto it = scheduler_ids.find(id);
  if (it == scheduler_ids.end()) return;  // unknown or finished
  auto a = active.find(it->second);
  if (a == active.end() || a->second.output->finished()) return;
  (void)scheduler->cancel(it->second);  // kFinished kCancelled comes with the next step
}

void Engine::Impl::run_step() {
  std::vector<engine::Event> events;
  if (options.profile_steps) profile.reset();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = scheduler->step(&events);
  StepRecord record;
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const engine::StepStats& stats = scheduler->last_step();
  record.prefill_tokens = stats.prefill_tokens;
  record.decode_batch = stats.decode_batch;
  record.admitted = stats.admitted;
  record.draft_tokens = stats.draft_tokens;
  record.accepted_tokens = stats.accepted_tokens;
  if (options.profile_steps) {
    profile.flush();
    for (int p = 0; p < kNumProfilePhases; ++p) record.phase_ns[p] = profile.ns[p];
    record.routed_expert_bytes = profile.routed_expert_bytes;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    steps.push_back(record);
    while (steps.size() > kMaxStepRecords) steps.pop_front();
  }
  dispatch(events);
  if (!s.ok()) {
    // The step failed beyond the requests it already finished: fail every request still running.
    std::vector<engine::RequestId> left;
    for (const auto& [sid, a] : active) {
      if (!a.output->finished()) left.push_back(sid);
    }
    for (engine::RequestId sid : left) {
      (void)scheduler->cancel(sid);
      finish(sid, FinishReason::kError, EngineError{ErrorCode::kInternal, s.message()});
    }
  }
}

void Engine::Impl::dispatch(std::vector<engine::Event>& events) {
  for (engine::Event& event : events) {
    auto it = active.find(event.id);
    if (it == active.end()) continue;
    Active& a = it->second;
    std::vector<Event> out;
    switch (event.kind) {
      case engine::Event::Kind::kPromptLogits: a.output->on_prompt_logits(event, &out); break;
      case engine::Event::Kind::kToken:
        a.output->on_token(event, &out);
        if (a.output->stop_string_matched() && !a.output->finished()) {
          for (Event& e : out) a.channel->push(std::move(e));
          out.clear();
          (void)scheduler->cancel(event.id);  // no-op when this step already finished it
          finish(event.id, FinishReason::kStop, std::nullopt);
        }
        break;
      case engine::Event::Kind::kFinished: {
        if (!a.output->finished()) {
          const engine::RequestRecord* rec = scheduler->record(event.id);
          std::optional<EngineError> error;
          if (event.reason == engine::FinishReason::kError) {
            error = EngineError{ErrorCode::kInternal, rec != nullptr ? rec->error : "the forward failed"};
          }
          for (Event& e : out) a.channel->push(std::move(e));
          out.clear();
          finish(event.id, public_reason(event.reason), std::move(error));
        }
        // The scheduler is done with it: forget it.
        scheduler_ids.erase(a.output->id());
        active.erase(it);
        scheduler->forget(event.id);  // its record too (a long-running server would otherwise keep every one)
        continue;
      }
    }
    for (Event& e : out) a.channel->push(std::move(e));
  }
}

void Engine::Impl::finish(engine::RequestId sid, FinishReason reason, std::optional<EngineError> error) {
  auto it = active.find(sid);
  if (it == active.end() || it->second.output->finished()) return;
  const engine::RequestRecord* rec = scheduler->record(sid);
  std::vector<Event> out;
  if (rec != nullptr) {
    it->second.output->set_cached_tokens(rec->cached_tokens);
    it->second.output->set_speculation(rec->speculation);
  }
  it->second.output->finish(reason, std::move(error), rec != nullptr ? rec->global_kv_bytes : 0, &out);
  for (Event& e : out) it->second.channel->push(std::move(e));
  std::lock_guard<std::mutex> lock(mutex);
  --in_flight;
}

void Engine::Impl::shut_down() {
  std::vector<engine::RequestId> left;
  for (const auto& [sid, a] : active) left.push_back(sid);
  for (engine::RequestId sid : left) {
    (void)scheduler->cancel(sid);
    finish(sid, FinishReason::kCancelled, std::nullopt);
  }
  active.clear();
  scheduler_ids.clear();
  if (prefix_cache != nullptr) prefix_cache->flush();  // the SSD writer's queue reaches the disk
  say_cache_notices();
}

}  // namespace dsflash
