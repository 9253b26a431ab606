// CLI11 validators with messages a user can read (CLI11's NonNegativeNumber prints its range with a 300-digit
// upper bound).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace dsflash::cli {

// A whole number >= minimum.
inline CLI::Validator whole_number_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& value) -> std::string {
        char* end = nullptr;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || end == value.c_str() || *end != '\0' || v < minimum) {
          return "must be a whole number >= " + std::to_string(minimum) + ", got " + value;
        }
        return "";
      },
      "N>=" + std::to_string(minimum), "WholeNumberAtLeast");
}

}  // namespace dsflash::cli
