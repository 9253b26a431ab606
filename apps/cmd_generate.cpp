// `dsflash generate`: prefill a prompt (text through the checkpoint's tokenizer, or token ids), then sample
// up to N tokens through the Engine (include/dsflash/engine.h), streaming text to stdout as it is produced (token
// ids with --ids). Stops at the end-of-sentence id (not printed), a --stop string (not printed) or N tokens.
// Prefill and decode use the default CED plan (decoder bounded replay, spec/MODEL.md §5); --exact runs the
// official full forward instead.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dsflash/engine.h"
#include "token_ids.h"

namespace dsflash::cli {

void add_generate_command(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir, prompt, tokens, tokens_file;
    int64_t max_tokens = 64;
    SamplingParams sampling;
    std::vector<std::string> stops;
    bool reference = false, ids = false, stats = false, exact = false, no_prefix_cache = false;
    int threads = 0;
    std::string backend;
    bool mlock = false;
    int speculative = 0;
    std::string cache_dir;
    int64_t cache_disk_bytes = int64_t{16} << 30;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate", "generate tokens from a prompt, streamed to stdout");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory")->required();
  cmd->add_option("-p,--prompt", options->prompt, "prompt text (encoded with the checkpoint's tokenizer.json)");
  cmd->add_option("--tokens", options->tokens, "prompt token ids, comma separated");
  cmd->add_option("--tokens-file", options->tokens_file, "file with prompt token ids");
  cmd->add_option("-n,--max-tokens", options->max_tokens, "tokens to generate")->check(whole_number_at_least(0));
  cmd->add_option("--temp", options->sampling.temperature, "temperature (0 = greedy)");
  cmd->add_option("--top-k", options->sampling.top_k, "keep the k most likely tokens (0 = all)");
  cmd->add_option("--top-p", options->sampling.top_p, "nucleus mass (1 = all)");
  cmd->add_option("--min-p", options->sampling.min_p, "drop tokens below min-p times the most likely (0 = none)");
  cmd->add_option("--repeat-penalty", options->sampling.repetition_penalty, "repetition penalty (1 = none)");
  cmd->add_option("--presence-penalty", options->sampling.presence_penalty, "presence penalty (0 = none)");
  cmd->add_option("--frequency-penalty", options->sampling.frequency_penalty, "frequency penalty (0 = none)");
  cmd->add_option("--seed", options->sampling.seed, "random seed of the sampler");
  cmd->add_option("--stop", options->stops, "stop string (repeatable): generation ends before it");
  cmd->add_flag("--ids", options->ids, "print token ids (one per line) instead of text");
  cmd->add_flag("--stats", options->stats, "print prefill/decode timings to stderr");
  cmd->add_flag("--reference", options->reference, "scalar reference kernels, single-threaded");
  add_backend_option(cmd, &options->backend);
  cmd->add_flag("--exact", options->exact, "official full forward (all layers on all prompt tokens)");
  cmd->add_option("--threads", options->threads, "worker threads (0 = all)");
  cmd->add_flag("--mlock", options->mlock, "lock the weights in RAM (mlock; needs ulimit -l or root)");
  add_prefix_cache_options(cmd, &options->cache_dir, &options->cache_disk_bytes, &options->no_prefix_cache);
  add_speculative_option(cmd, &options->speculative);
  cmd->callback([options, exit_code] {
    auto fail = [exit_code](const std::string& message) {
      std::cerr << "dsflash generate: " << message << "\n";
      *exit_code = 1;
    };
    const int sources = !options->prompt.empty() + !options->tokens.empty() + !options->tokens_file.empty();
    if (sources != 1) return fail("give exactly one of -p, --tokens, --tokens-file");
    LoadOptions load;
    load.prefix_cache = !options->no_prefix_cache;
    load.cache_dir = options->cache_dir;
    load.cache_disk_bytes = options->cache_disk_bytes;
    load.reference_kernels = options->reference;
    load.backend = options->backend;
    load.num_threads = options->threads;
    load.lock_weights = options->mlock;
    load.dspark = options->speculative > 0;  // the stages' weights only where they draft
    auto engine = Engine::load(options->model_dir, load);
    if (!engine.ok()) return fail(engine.error().message);
    GenerationRequest request;
    if (!options->prompt.empty()) {
      if (!(*engine)->info().has_tokenizer) {
        return fail("-p needs the checkpoint's tokenizer.json (" + options->model_dir + " has none)");
      }
      auto ids = (*engine)->tokenize(options->prompt);
      if (!ids.ok()) return fail(ids.error().message);
      request.prompt_ids = std::move(*ids);
    } else {
      auto ids = read_prompt_ids(options->tokens, options->tokens_file);
      if (!ids.ok()) return fail(ids.error().message);
      request.prompt_ids = std::move(*ids);
    }
    if (request.prompt_ids.empty()) return fail("the prompt is empty");
    const bool text = (*engine)->info().has_tokenizer && !options->ids;
    if (options->max_tokens == 0) {
      if (text) std::cout << "\n";
      *exit_code = 0;
      return;
    }
    request.max_tokens = options->max_tokens;
    request.sampling = options->sampling;
    request.stop_strings = options->stops;
    request.plan = options->exact ? Plan::kExact : Plan::kBoundedReplay;
    request.detokenize = text;
    request.speculative = options->speculative;

    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    auto handle = (*engine)->submit(std::move(request));
    if (!handle.ok()) return fail(handle.error().message);
    Clock::time_point t1 = t0;
    int64_t produced = 0;
    Usage usage;
    while (auto event = handle->next()) {
      if (event->kind == EventKind::kToken) {
        if (produced++ == 0) t1 = Clock::now();
        if (!text) std::cout << event->token << "\n" << std::flush;
      } else if (event->kind == EventKind::kText) {
        std::cout << event->text << std::flush;
      } else if (event->kind == EventKind::kFinished) {
        if (event->error) return fail(event->error->message);
        usage = event->usage;
      }
    }
    if (produced == 0) t1 = Clock::now();
    if (text) std::cout << "\n";
    const auto t2 = Clock::now();
    if (options->stats) {
      const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
      const double decode_s = std::chrono::duration<double>(t2 - t1).count();
      const int64_t generated = usage.generated_tokens;
      std::fprintf(stderr, "prefill %lld tokens in %.3f s (%.1f tok/s); decode %lld tokens in %.3f s (%.2f tok/s)\n",
                   static_cast<long long>(usage.prompt_tokens), prefill_s,
                   static_cast<double>(usage.prompt_tokens) / prefill_s, static_cast<long long>(generated), decode_s,
                   generated > 1 ? static_cast<double>(generated - 1) / decode_s : 0.0);
      if (usage.decode_steps > 0) {
        std::fprintf(stderr, "speculative: %lld decode steps, %lld drafts verified, %lld accepted, %.2f tokens/step\n",
                     static_cast<long long>(usage.decode_steps), static_cast<long long>(usage.draft_tokens),
                     static_cast<long long>(usage.accepted_tokens),
                     static_cast<double>(generated - 1) / static_cast<double>(usage.decode_steps));
      }
    }
    *exit_code = 0;
  });
}

}  // namespace dsflash::cli
