// `dsflash make-tiny --preset NAME -o DIR [--seed S]`: writes a random official-format checkpoint directory
// (src/tiny/tiny_checkpoint.h), then opens it with Checkpoint::open to prove it loads and validates.
#include <CLI/CLI.hpp>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.h"
#include "io/checkpoint.h"
#include "tiny/tiny_checkpoint.h"
#include "tiny/tiny_config.h"

namespace dsflash::cli {

namespace {

struct MakeTinyOptions {
  tiny::TinyCheckpointOptions write;
  int64_t shard_mb = 0;
  bool skip_verify = false;
};

int run_make_tiny(MakeTinyOptions o) {
  if (o.shard_mb > 0) o.write.max_shard_bytes = o.shard_mb << 20;
  const auto start = std::chrono::steady_clock::now();
  auto summary = tiny::write_tiny_checkpoint(o.write);
  if (!summary.ok()) {
    std::cerr << "dsflash make-tiny: " << summary.status().message() << "\n";
    return 1;
  }
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ModelConfig& c = summary->config;
  std::cout << "wrote " << o.write.out_dir << ": preset " << o.write.preset << ", seed " << o.write.seed << "\n";
  std::cout << "  " << c.n_layers << " layers + " << c.dspark_stages() << " DSpark, dim " << c.dim << ", " << c.n_heads
            << " heads x " << c.head_dim << ", vocab " << c.vocab_size << ", " << c.n_routed_experts << " experts top-"
            << c.n_activated_experts << "\n";
  std::cout << "  " << summary->num_tensors << " tensors, " << std::fixed << std::setprecision(1)
            << static_cast<double>(summary->payload_bytes) / 1e6 << " MB in " << summary->num_shards
            << " shard(s), global KV " << std::setprecision(0) << summary->kv_bytes_per_token << " bytes/token, "
            << std::setprecision(2) << write_s << " s\n";
  if (!o.skip_verify) {
    auto ckpt = Checkpoint::open(o.write.out_dir);
    if (!ckpt.ok()) {
      std::cerr << "dsflash make-tiny: the written checkpoint does not load: " << ckpt.status().message() << "\n";
      return 1;
    }
    std::cout << "  verified: Checkpoint::open validates " << ckpt->all_tensors().size() << " tensors\n";
  }
  return 0;
}

}  // namespace

void add_make_tiny_command(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<MakeTinyOptions>();
  CLI::App* cmd = app.add_subcommand("make-tiny", "Write a random official-format checkpoint directory (test model)");
  cmd->add_option("--preset", options->write.preset, "tiny | wide | real-kv")
      ->check(CLI::IsMember(tiny::preset_names()))
      ->capture_default_str();
  cmd->add_option("-o,--output", options->write.out_dir, "output directory (created; must be empty unless --force)")
      ->required();
  cmd->add_option("--seed", options->write.seed, "weight seed")->capture_default_str();
  cmd->add_option("--tokenizer", options->write.tokenizer_path,
                  "byte-level BPE tokenizer.json to restrict (default: shared/tokenizer/deepseek_v3_tokenizer.json)");
  cmd->add_option("--shard-mb", options->shard_mb, "payload MB per safetensors shard (default: the preset's)");
  cmd->add_flag("--force", options->write.overwrite, "write into a non-empty directory");
  cmd->add_flag("--no-verify", options->skip_verify, "skip loading the result back with Checkpoint::open");
  cmd->callback([options, exit_code] { *exit_code = run_make_tiny(*options); });
}

}  // namespace dsflash::cli
