// Runs dsflash subcommands in-process (CLI11 parse of argv without the program name) with stdout and stderr
// captured, for the CLI tests.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace dsflash::testing {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// `add_commands` registers the subcommands under test on the app, writing their exit code to *exit_code.
inline CliRun run_cli_commands(const std::function<void(CLI::App&, int*)>& add_commands,
                               std::vector<std::string> args) {
  CLI::App app{"dsflash"};
  app.require_subcommand(1);
  CliRun r;
  r.exit_code = 0;
  add_commands(app, &r.exit_code);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    r.exit_code = app.exit(e);
  }
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

}  // namespace dsflash::testing
