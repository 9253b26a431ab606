// Prompt token ids from the command line (--tokens "1,2,3" or --tokens-file), shared by `logits` and `generate`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsflash/errors.h"

namespace dsflash::cli {

// Comma / whitespace separated ids from exactly one of the two sources; errors (kInvalidRequest) name the bad
// text.
Expected<std::vector<int32_t>> read_prompt_ids(const std::string& tokens, const std::string& tokens_file);
// The same for a plain list ("--follow").
Expected<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& origin);

}  // namespace dsflash::cli
