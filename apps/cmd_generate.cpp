// `dsflash generate`: prefill a prompt (text through the checkpoint's tokenizer, or token ids), then sample
// up to N tokens, streaming text to stdout as it is produced (token ids with --ids). Stops at the EOS id.
// Prefill and decode use the default CED plan (decoder bounded replay, spec/MODEL.md §5); --exact runs the
// official full forward instead.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "engine/batch_builder.h"
#include "model/model_runner.h"
#include "model/sampler.h"
#include "token_ids.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dsflash::cli {

void add_generate_command(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir, prompt, tokens, tokens_file;
    int64_t max_tokens = 64;
    SamplingParams sampling;
    bool reference = false, ids = false, stats = false, exact = false;
    int threads = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate", "generate tokens from a prompt, streamed to stdout");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory")->required();
  cmd->add_option("-p,--prompt", options->prompt, "prompt text (encoded with the checkpoint's tokenizer.json)");
  cmd->add_option("--tokens", options->tokens, "prompt token ids, comma separated");
  cmd->add_option("--tokens-file", options->tokens_file, "file with prompt token ids");
  cmd->add_option("-n,--max-tokens", options->max_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temp", options->sampling.temperature, "temperature (0 = greedy)");
  cmd->add_option("--top-k", options->sampling.top_k, "keep the k most likely tokens (0 = all)");
  cmd->add_option("--top-p", options->sampling.top_p, "nucleus mass (1 = all)");
  cmd->add_option("--seed", options->sampling.seed, "random seed of the sampler");
  cmd->add_flag("--ids", options->ids, "print token ids (one per line) instead of text");
  cmd->add_flag("--stats", options->stats, "print prefill/decode timings to stderr");
  cmd->add_flag("--reference", options->reference, "scalar reference kernels, single-threaded");
  cmd->add_flag("--exact", options->exact, "official full forward (all layers on all prompt tokens)");
  cmd->add_option("--threads", options->threads, "worker threads (0 = all)");
  cmd->callback([options, exit_code] {
    auto fail = [exit_code](const Status& s) {
      std::cerr << "dsflash generate: " << s.message() << "\n";
      *exit_code = 1;
    };
    const int sources = !options->prompt.empty() + !options->tokens.empty() + !options->tokens_file.empty();
    if (sources != 1) return fail(Status::Error("give exactly one of -p, --tokens, --tokens-file"));
    auto sampler = Sampler::create(options->sampling);
    if (!sampler.ok()) return fail(sampler.status());
    std::optional<Tokenizer> tokenizer;
    auto loaded = Tokenizer::from_model_dir(options->model_dir);
    if (loaded.ok()) tokenizer.emplace(std::move(*loaded));
    std::vector<int32_t> prompt;
    if (!options->prompt.empty()) {
      if (!tokenizer) return fail(loaded.status().with_context("-p needs the checkpoint's tokenizer.json"));
      auto ids = tokenizer->encode(options->prompt);
      if (!ids.ok()) return fail(ids.status());
      prompt = std::move(*ids);
    } else {
      auto ids = read_prompt_ids(options->tokens, options->tokens_file);
      if (!ids.ok()) return fail(ids.status());
      prompt = std::move(*ids);
    }
    if (prompt.empty()) return fail(Status::Error("the prompt is empty"));
    RunnerOptions runner_options;
    runner_options.reference = options->reference;
    runner_options.num_threads = options->threads;
    auto runner = ModelRunner::open(options->model_dir, runner_options);
    if (!runner.ok()) return fail(runner.status());
    const ModelRunner& model = **runner;
    const int64_t vocab = model.config().vocab_size;
    if (static_cast<int64_t>(prompt.size()) + options->max_tokens > model.config().max_position_embeddings) {
      return fail(Status::Error("prompt + max tokens exceed max_position_embeddings " +
                                std::to_string(model.config().max_position_embeddings)));
    }
    auto seq = model.new_sequence();
    if (!seq.ok()) return fail(seq.status());
    const bool text = tokenizer.has_value() && !options->ids;
    std::optional<StreamingDetokenizer> detok;
    if (text) detok.emplace(*tokenizer);

    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    engine::PrefillOptions plan_options;  // bounded replay, tail = the window
    if (options->exact) plan_options.mode = engine::PrefillMode::kExact;
    const int64_t prompt_length = static_cast<int64_t>(prompt.size());
    const int64_t floor = engine::replay_start(model.config(), plan_options, prompt_length);
    ForwardBatch batch;
    ForwardOutput out;
    Status s = engine::add_prefill_chunk(batch, model.config(), *seq, prompt.data(), prompt_length, prompt_length,
                                         plan_options, LogitsRows::kLast);
    if (s.ok()) s = engine::run_batch(model.weights(), batch, model.context(), &out);
    if (!s.ok()) return fail(s);
    std::vector<float>& logits = out.logits;
    const auto t1 = Clock::now();
    int64_t produced = 0;
    while (produced < options->max_tokens) {
      const int32_t id = sampler->sample(logits.data(), vocab);
      ++produced;
      if (text) {
        std::cout << detok->push(id) << std::flush;
      } else {
        std::cout << id << "\n" << std::flush;
      }
      if (id == model.config().eos_token_id || produced == options->max_tokens) break;
      batch.clear();
      engine::add_decode_row(batch, *seq, id, floor);
      s = engine::run_batch(model.weights(), batch, model.context(), &out);
      if (!s.ok()) return fail(s);
    }
    if (text) std::cout << detok->finish() << "\n";
    const auto t2 = Clock::now();
    if (options->stats) {
      const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
      const double decode_s = std::chrono::duration<double>(t2 - t1).count();
      std::fprintf(stderr, "prefill %zu tokens in %.3f s (%.1f tok/s); decode %lld tokens in %.3f s (%.2f tok/s)\n",
                   prompt.size(), prefill_s, static_cast<double>(prompt.size()) / prefill_s,
                   static_cast<long long>(produced), decode_s,
                   produced > 1 ? static_cast<double>(produced - 1) / decode_s : 0.0);
    }
    *exit_code = 0;
  });
}

}  // namespace dsflash::cli
