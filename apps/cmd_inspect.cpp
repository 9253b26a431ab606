// `dsflash inspect`: layer roles, parameter counts, tensor counts/bytes by dtype and KV-cache bytes of a
// checkpoint directory (-m, validated) or of a config file alone (--config). Figures: io/model_stats.h.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "commands.h"
#include "io/checkpoint.h"
#include "io/model_stats.h"

namespace dsflash::cli {

namespace {

struct InspectOptions {
  std::string model_dir;
  std::string config_file;
  bool json = false;
  bool list_expected = false;
};

int run_inspect(const InspectOptions& o) {
  if (o.model_dir.empty() == o.config_file.empty()) {
    std::cerr << "dsflash inspect: give exactly one of -m DIR or --config FILE\n";
    return 2;
  }
  ModelConfig config;
  ModelStats stats;
  if (!o.model_dir.empty()) {
    auto ckpt = Checkpoint::open(o.model_dir);
    if (!ckpt.ok()) {
      std::cerr << "dsflash inspect: " << ckpt.status().message() << "\n";
      return 1;
    }
    config = ckpt->config();
    stats = compute_model_stats(ckpt.value());
  } else {
    auto loaded = ModelConfig::load(o.config_file);
    if (!loaded.ok()) {
      std::cerr << "dsflash inspect: " << loaded.status().message() << "\n";
      return 1;
    }
    config = std::move(loaded.value());
    stats = compute_model_stats(config);
  }
  if (o.json) {
    std::cout << model_stats_json(config, stats, o.list_expected) << "\n";
  } else {
    std::cout << model_stats_text(config, stats, o.list_expected);
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Layer roles, parameter counts, tensor and KV-cache bytes of a model");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory (config.json + safetensors), validated");
  cmd->add_option("--config", options->config_file, "a config.json or inference/config.json alone (no weights)");
  cmd->add_flag("--json", options->json, "print one JSON object instead of text");
  cmd->add_flag("--expected-tensors", options->list_expected,
                "also list every tensor the config implies (name, dtype, shape; spec/CHECKPOINT.md); the count "
                "and bytes are always reported");
  cmd->callback([options, exit_code] { *exit_code = run_inspect(*options); });
}

}  // namespace dsflash::cli
