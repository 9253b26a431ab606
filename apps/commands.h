// Subcommands of the `dsflash` binary. Each lives in its own cmd_*.cpp and adds itself to the CLI11 app;
// its callback stores the exit code in *exit_code. Errors go to stderr as one clear line, exit code 1/2.
#pragma once

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

}  // namespace dsflash::cli
