// The binary's command line (cli::run_command_line, what main() runs): the subcommand set, --help, and usage errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "apps/cli_run.h"

namespace {

using ::testing::HasSubstr;

TEST(CommandLine, HelpListsEverySubcommand) {
  const dsflash::testing::CliRun r = dsflash::testing::run_dsflash({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Usage: dsflash"));
  for (const char* command : {"inspect", "make-tiny", "logits", "bench", "generate", "tokenize", "detokenize",
                              "render", "parse", "serve", "cache"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("\n  ") + command + " ")) << command;
  }
}

TEST(CommandLine, NoOrAnUnknownSubcommandIsAUsageError) {
  for (const auto& args : {std::vector<std::string>{}, std::vector<std::string>{"no-such-command"}}) {
    const dsflash::testing::CliRun r = dsflash::testing::run_dsflash(args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_FALSE(r.err.empty());
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
