// The public API of dsflash (a narrow boundary: no model, kernel, KV or format types). One Engine owns a loaded
// model directory (checkpoint, kernels, worker threads, tokenizer) and runs its own loop thread: requests
// submitted from any thread join the running batch at the next step (continuous batching); each request's
// events stream through its RequestHandle in order:
//   [kPromptLogits]  (return_logits with the exact plan: the prompt rows before the last)
//   per generated token: kToken, then kText (if the detokenised text grew), then kReasoning / kContent /
//                    kToolCall (if parse_output)
//   kFinished        always last, exactly once: finish reason, usage, error
// Stop ids (the end-of-sentence id when stop_at_eos) end generation and are never output (no kToken / kText);
// stop strings end it at the text level (the matched text and everything after are not output). Thread-safe:
// every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsflash/errors.h"
#include "dsflash/sampling.h"

namespace dsflash {

using RequestId = int64_t;

enum class Plan {
  kBoundedReplay,  // default: CED prefill with Decoder SWA Bounded Replay, decode with the window floored there
  kExact,          // the official full forward (all layers on all prompt tokens)
};
const char* plan_name(Plan plan);  // "bounded-replay", "exact"

struct LoadOptions {
  bool reference_kernels = false;          // scalar reference kernels, single-threaded (the oracle)
  int num_threads = 0;                     // fast kernels: worker threads, 0 = one per hardware thread
  // Fast kernel table by name ("avx512", "amx", "avx512-no-bf16", "avx512-no-vbmi", "avx512-no-vnni", "avx2";
  // kernels/backend.h); empty: this CPU's default. "amx" trades one-row decode speed for faster prefill and
  // batched-decode matmuls (README: figures).
  std::string backend;
  bool pin_threads = false;                // pin each worker to one CPU, spread over the NUMA nodes
  // Lock the weights in RAM (mlock of the mapped shards: read in at load, never paged out). Needs a locked-memory
  // limit (ulimit -l) of the checkpoint's size, or root.
  bool lock_weights = false;
  // Copy the FP8/MXFP4 weights into tile-major order at load when the kernels prefer it (results within the
  // kernels' reordering bound, a faster decode); the originals' file pages are given back (the files never change).
  bool tile_major_weights = true;
  // Load the model's DSpark draft stages (mtp.*), which GenerationRequest::speculative drafts with. false: their
  // weights are never bound, read or copied (V4.1-Flash's three stages hold 7.2 GB of MXFP4 experts, all of it
  // resident once copied into tile-major order), ModelInfo::dspark_block_size is 0 and speculative requests are
  // refused. The CLIs load them only with --speculative.
  bool dspark = true;
  int64_t kv_budget_bytes = int64_t{1} << 30;  // KV cache of all running requests (global pages + fixed state)
  int64_t kv_block_tokens = 64;            // positions per global-KV block
  int max_running = 16;                    // requests prefilling or decoding at once (decode batch bound)
  int64_t prefill_tokens_per_step = 512;   // prompt tokens computed per step, over all prefilling requests
  int max_requests = 1024;                 // requests in flight (queued + running); beyond: kOverloaded
  bool profile_steps = false;              // StepRecord::phase_ns filled (costs a clock read per phase change)
  bool require_tokenizer = false;          // fail the load when tokenizer.json is missing (else ids-only)
  // Prefix cache (global KV of whole 64-token prompt blocks, spec §7): RAM tier in the KV budget (cached blocks,
  // evicted LRU), plus an SSD tier when cache_dir is set. Bounded-replay requests only (Plan::kExact never uses it).
  bool prefix_cache = true;
  std::string cache_dir;                             // empty: no SSD tier
  int64_t cache_disk_bytes = int64_t{16} << 30;      // SSD tier byte budget (record files)
  // Called (from the engine's thread) with each message the cache says once: the SSD tier switched off (missing or
  // read-only directory, disk full), a damaged record removed. Null: written to stderr.
  std::function<void(const std::string&)> on_notice;
};

struct LoadProgress {
  std::string stage;      // "checkpoint", "weights", "kernels", "tokenizer", "ready"
  double fraction = 0.0;  // of the whole load, [0, 1]
};
using ProgressCallback = std::function<void(const LoadProgress&)>;

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;  // the prompt; when empty, prompt_text is encoded with the tokenizer
  std::string prompt_text;          // rendered prompt text (special tokens included as text)
  int64_t max_tokens = 16;          // >= 1: tokens to generate (a matched stop id counts)
  SamplingParams sampling;
  std::vector<std::string> stop_strings;  // non-empty strings; generation ends before the first match
  std::vector<int32_t> stop_ids;          // generation ends at one of these (not output)
  bool stop_at_eos = true;                // the model's end-of-sentence id is a stop id
  Plan plan = Plan::kBoundedReplay;
  bool return_logits = false;   // kToken carries the row its id was drawn from; kExact: kPromptLogits before
  std::vector<int32_t> follow_ids;  // teacher forcing: decode step k is fed follow_ids[k] instead of token k
  bool detokenize = true;       // kText events (needs the tokenizer; ignored without one)
  bool parse_output = false;    // kReasoning / kContent / kToolCall from the V4.1 output parser
  bool thinking = false;        // parse_output: the prompt ended with <think> (generation starts in reasoning)
  // Benchmarking only (`dsflash bench --depth`): the request runs as if `bench_synthetic_context` random token ids
  // preceded the prompt, but their KV is not computed: it is filled at admission with valid random state (global KV
  // entries, window rows, compressor tails, Engram history of those ids), so a decode step can be timed at a depth of
  // a million positions without prefilling it. The output is meaningless. Usage::prompt_tokens counts these
  // positions; the prefix cache is never used or fed. 0 = off.
  int64_t bench_synthetic_context = 0;
  // Speculative decoding with the model's DSpark draft stages (ModelInfo::dspark_block_size > 0): most drafted
  // tokens verified per decode step, 0 = off (capped by the block size). Greedy output is identical to a run
  // without it; sampled output follows the same distribution (standard speculative sampling). Adaptive: the draft
  // length follows the measured acceptance and the confidence head, and speculation switches itself off where
  // drafts rarely match. speculative_adaptive false: always verify `speculative` drafts (for measuring the cost).
  // Not with follow_ids.
  int speculative = 0;
  bool speculative_adaptive = true;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
};

struct ToolCallEvent {
  int index = 0;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

enum class FinishReason { kLength, kStop, kCancelled, kError };
const char* finish_reason_name(FinishReason reason);  // "length", "stop", "cancelled", "error"

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens whose global KV came from the prefix cache
  int64_t generated_tokens = 0;  // ids the model produced, a matched stop id included
  // Speculative decoding (GenerationRequest::speculative; zero without it): decode steps after the first token,
  // drafted tokens verified, drafted tokens accepted. Mean tokens per decode step = (generated - 1) / steps.
  int64_t decode_steps = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
};

enum class EventKind { kPromptLogits, kToken, kText, kReasoning, kContent, kToolCall, kFinished };

struct Event {
  EventKind kind = EventKind::kToken;
  RequestId request = -1;
  // kToken
  int32_t token = -1;
  float logprob = 0.0f;                     // of `token` (log-softmax of the unmodified row); 0 unless top_logprobs
  std::vector<TokenLogprob> top_logprobs;   // most likely first, ties by lower id
  // kToken (one row) and kPromptLogits (rows), with return_logits: float32 [rows, vocab] and their positions
  std::vector<float> logits;
  std::vector<int64_t> positions;
  // kText, kReasoning, kContent: the text delta (valid UTF-8)
  std::string text;
  ToolCallEvent tool_call;  // kToolCall
  // kFinished
  FinishReason finish_reason = FinishReason::kLength;
  Usage usage;
  std::optional<EngineError> error;  // kError
  int32_t stop_id = -1;              // kStop by a stop id: which
  std::string stop_string;           // kStop by a stop string: which
  int64_t global_kv_bytes = 0;       // global-KV pages the request held (whole blocks)
};

namespace detail {
class EventChannel;
}

// The event stream of one request. Copies share the stream; each event is delivered once.
class RequestHandle {
 public:
  RequestId id() const { return id_; }
  // Blocks until the next event; nullopt once kFinished has been delivered.
  std::optional<Event> next();
  // The next event if one is ready (nullopt: none yet, or the stream is over; see done()).
  std::optional<Event> try_next();
  // Waits at most `timeout` for the next event (nullopt: none within it, or the stream is over; see done()).
  // For callers that must also watch something else, e.g. a server noticing a client that went away.
  std::optional<Event> next_for(std::chrono::milliseconds timeout);
  bool done() const;  // kFinished has been delivered

  RequestHandle(RequestId id, std::shared_ptr<detail::EventChannel> channel)
      : id_(id), channel_(std::move(channel)) {}

 private:
  RequestId id_ = -1;
  std::shared_ptr<detail::EventChannel> channel_;
};

// Everything one request produced (Engine::generate).
struct Completion {
  std::vector<int32_t> tokens;     // output ids (stop ids excluded)
  std::vector<float> logprobs;     // per token
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string text, reasoning, content;
  std::vector<ToolCallEvent> tool_calls;
  std::vector<float> logits;       // return_logits: [rows, vocab], prompt rows then one per token
  std::vector<int64_t> positions;  // of those rows
  FinishReason finish_reason = FinishReason::kLength;
  Usage usage;
  int64_t global_kv_bytes = 0;
  double first_token_s = 0.0;      // from submit() to the first token (prefill, including any prefix-cache replay)
};

struct ModelInfo {
  std::string model_dir;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int32_t eos_token_id = -1;
  int n_layers = 0;
  int64_t dim = 0;
  int64_t window_size = 0;
  int64_t parameters = 0;            // from the config (all experts)
  int64_t checkpoint_bytes = 0;      // *.safetensors files
  int64_t decode_weight_bytes = 0;   // weight bytes one decode step reads
  int64_t decode_routed_bytes = 0;   // of which routed experts' (top-k per layer; StepRecord::routed_expert_bytes)
  std::string kernels;               // linear kernel table in use ("reference", "avx2", ...)
  int64_t tile_major_linears = 0;    // FP8/MXFP4 linears rewritten in tile-major order at load
  int64_t tile_major_bytes = 0;      // their copies (resident: the originals' file pages were given back)
  int num_threads = 1;
  bool has_tokenizer = false;
  // KV cache
  int64_t kv_budget_bytes = 0;
  int64_t kv_block_tokens = 0;
  double global_kv_bytes_per_token = 0.0;   // the layout's formula
  int64_t fixed_kv_bytes_per_sequence = 0;  // window rings + compressor tails + Engram history
  int64_t max_request_positions = 0;        // prompt + max_tokens a single request may reach
  // DSpark draft block (0: requests cannot speculate: the model has no DSpark stages, or LoadOptions::dspark was
  // false).
  int dspark_block_size = 0;
  // Weight elements one token's matmuls use (io/model_stats.h): CED prefill per prompt token (encoder + the
  // decoder start's global-KV path), and a decode token (every layer + the head).
  int64_t activated_params_prefill = 0;
  int64_t activated_params_decode = 0;
  // Of which in MXFP4 weights (the routed experts), and from how many rows the kernel table multiplies those on the
  // AMX tile unit (ComputeUnit::kAmxTiles) rather than with its GEMM instruction (0: never).
  int64_t activated_params_prefill_fp4 = 0;
  int64_t activated_params_decode_fp4 = 0;
  int64_t fp4_amx_min_rows = 0;
};

// Which dense-compute limit Engine::measure_compute_peak times.
enum class ComputeUnit {
  kTableGemm,  // the instruction the loaded table's many-row matmuls multiply with
  kBf16Dot,    // vdpbf16ps (an fp32 FMA fallback without it), whatever the table multiplies with
  kAmxTiles,   // the AMX tile unit (TDPBF16PS), where ModelInfo::fp4_amx_min_rows says the table uses it
};

// The machine's dense dot-product peak, measured on the engine's worker threads (benchmarks print speed figures
// next to it).
struct ComputePeak {
  double gflops = 0.0;
  std::string kernel;  // which instruction was timed ("avx512bf16 vdpbf16ps", or an fp32 FMA fallback)
};

// The machine's memory read bandwidth, measured on the engine's worker threads over a buffer far larger than the
// caches (the limit of a memory-bound step, printed next to it).
struct ReadBandwidth {
  double gbps = 0.0;
  int64_t bytes = 0;  // bytes read per timed pass
};

// One step of the loop thread (for benchmarks): what it computed and how long it took.
struct StepRecord {
  int64_t prefill_tokens = 0;  // prompt tokens computed
  int64_t decode_batch = 0;    // sequences in the batched decode step
  int64_t admitted = 0;        // requests admitted
  int64_t draft_tokens = 0;    // speculative drafts verified in the step (extra decode rows)
  int64_t accepted_tokens = 0; // of which accepted
  double seconds = 0.0;        // wall time of the step
  // profile_steps: wall ns by phase: [other, linear, indexer, attention] (see LoadOptions::profile_steps)
  int64_t phase_ns[4] = {};
  // profile_steps: weight bytes of the distinct routed experts the step ran (each read once per step), so the
  // step's weight bytes are decode_weight_bytes - decode_routed_bytes + this (ModelInfo).
  int64_t routed_expert_bytes = 0;
};
inline constexpr const char* kStepPhaseNames[4] = {"other", "linear", "indexer", "attention"};

// A snapshot of the engine's load (for a server's metrics and health), published by the loop thread after each
// step.
struct PrefixCacheTierStats {
  std::string tier;        // "ram", "disk", ...
  int64_t hits = 0;        // lookups that restored blocks from this tier
  int64_t misses = 0;
  int64_t bytes = 0;       // bytes held by the tier
};
struct EngineStats {
  int64_t requests_running = 0;  // admitted: prefilling or decoding
  int64_t requests_waiting = 0;  // submitted and not yet admitted
  int64_t kv_used_bytes = 0;     // KV cache in use (global blocks + fixed state of live sequences)
  int64_t kv_budget_bytes = 0;
  bool prefix_cache = false;     // a prefix cache serves Usage::cached_tokens
  std::vector<PrefixCacheTierStats> prefix_tiers;
};

class Engine {
 public:
  // Loads `model_dir` (config.json, *.safetensors, tokenizer.json). Errors: kLoad naming what is missing.
  static Expected<std::unique_ptr<Engine>> load(const std::string& model_dir, const LoadOptions& options = {},
                                                const ProgressCallback& progress = {});
  // Cancels what is in flight (each stream gets kFinished kCancelled) and joins the loop thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors: kInvalidRequest, kContextTooLong, kOverloaded.
  Expected<RequestHandle> submit(GenerationRequest request);
  // Validates every request, then queues all of them at once or none (the first error): the loop takes them at the
  // same step boundary, so they are admitted together (as far as the KV budget allows) and decode as one batch from
  // their first step, what a batch benchmark measures. Handles in request order.
  Expected<std::vector<RequestHandle>> submit_together(std::vector<GenerationRequest> requests);
  // Cancels a request (kFinished kCancelled at the next step boundary); no-op if unknown or finished.
  void cancel(RequestId id);
  // submit + drain: everything the request produced; a request that ends in kError gives its error.
  Expected<Completion> generate(GenerationRequest request);

  const ModelInfo& info() const;
  // Running / waiting requests and KV use as of the last step.
  EngineStats stats() const;
  // Tokenizer (kInvalidRequest without one).
  Expected<std::vector<int32_t>> tokenize(std::string_view text) const;
  std::string detokenize(const std::vector<int32_t>& ids) const;
  // Global-KV bytes reserving `positions` positions takes (whole blocks).
  int64_t global_kv_bytes_for_positions(int64_t positions) const;
  // The steps run since the last call (at most the last 4096), oldest first.
  std::vector<StepRecord> take_step_records();
  // Times a dense-GEMM peak now (about `seconds`, on the worker threads the steps use: call it between requests,
  // or it competes with them). kTableGemm: the instruction the loaded table's many-row matmuls multiply with (the
  // bf16 dot, fp32 FMAs where "avx512" chose them, the AMX tile unit for "amx").
  ComputePeak measure_compute_peak(double seconds = 0.25, ComputeUnit unit = ComputeUnit::kTableGemm) const;
  // The instruction measure_compute_peak(…, unit) times (its ComputePeak::kernel), without timing it.
  std::string compute_peak_kernel(ComputeUnit unit) const;
  ReadBandwidth measure_read_bandwidth(int64_t bytes = int64_t{512} << 20) const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsflash
