// dsflash: one binary, subcommands (DESIGN.md "Layout").
#include <string>
#include <vector>

#include "commands.h"

int main(int argc, char** argv) {
  return dsflash::cli::run_command_line(std::vector<std::string>(argv + 1, argv + argc));
}
