// Runs the dsflash command line in-process (cli::run_command_line: argv without the program name, every
// subcommand of the binary) with stdout and stderr captured, for the CLI tests.
#pragma once

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"

namespace dsflash::testing {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

inline CliRun run_dsflash(std::vector<std::string> args) {
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  CliRun r;
  r.exit_code = cli::run_command_line(std::move(args));
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

}  // namespace dsflash::testing
