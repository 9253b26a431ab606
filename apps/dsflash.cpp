// dsflash: one binary, subcommands (DESIGN.md "Layout").
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"dsflash: inference engine for DeepSeek-V4.1-Flash"};
  app.require_subcommand(1);
  int exit_code = 0;
  dsflash::cli::add_inspect_command(app, &exit_code);
  dsflash::cli::add_make_tiny_command(app, &exit_code);
  dsflash::cli::add_logits_command(app, &exit_code);
  dsflash::cli::add_bench_command(app, &exit_code);
  dsflash::cli::add_generate_command(app, &exit_code);
  dsflash::cli::add_tokenize_command(app, &exit_code);
  dsflash::cli::add_detokenize_command(app, &exit_code);
  dsflash::cli::add_render_command(app, &exit_code);
  dsflash::cli::add_parse_command(app, &exit_code);
  dsflash::cli::add_serve_command(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
