#include <CLI/CLI.hpp>

#include <algorithm>

#include "commands.h"

namespace dsflash::cli {

int run_command_line(std::vector<std::string> args) {
  CLI::App app{"dsflash: inference engine for DeepSeek-V4.1-Flash", "dsflash"};
  app.require_subcommand(1);
  int exit_code = 0;
  add_inspect_command(app, &exit_code);
  add_make_tiny_command(app, &exit_code);
  add_logits_command(app, &exit_code);
  add_bench_command(app, &exit_code);
  add_generate_command(app, &exit_code);
  add_tokenize_command(app, &exit_code);
  add_detokenize_command(app, &exit_code);
  add_render_command(app, &exit_code);
  add_parse_command(app, &exit_code);
  add_serve_command(app, &exit_code);
  add_cache_command(app, &exit_code);
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}

}  // namespace dsflash::cli
