// Subcommands of the `dsflash` binary. Each lives in its own cmd_*.cpp and adds itself to the CLI11 app;
// its callback stores the exit code in *exit_code. Errors go to stderr as one clear line, exit code 1/2.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dsflash::cli {

void add_inspect_command(CLI::App& app, int* exit_code);
void add_make_tiny_command(CLI::App& app, int* exit_code);
void add_logits_command(CLI::App& app, int* exit_code);
void add_bench_command(CLI::App& app, int* exit_code);
void add_generate_command(CLI::App& app, int* exit_code);
void add_tokenize_command(CLI::App& app, int* exit_code);
void add_detokenize_command(CLI::App& app, int* exit_code);
void add_render_command(CLI::App& app, int* exit_code);
void add_parse_command(CLI::App& app, int* exit_code);
void add_serve_command(CLI::App& app, int* exit_code);
void add_cache_command(CLI::App& app, int* exit_code);

// The whole command line: every subcommand above on one app named "dsflash", parsed from `args` (argv without the
// program name). Usage errors and --help print as CLI11 prints them. Returns the process exit code. main() and the
// CLI tests run this, so the tests see the binary's exact command set.
int run_command_line(std::vector<std::string> args);

}  // namespace dsflash::cli
