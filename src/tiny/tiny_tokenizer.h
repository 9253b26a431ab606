// The tokenizer.json of a make-tiny checkpoint: a byte-level BPE tokenizer.json (shared/tokenizer's V3 file)
// restricted to the ids a small vocabulary keeps, the way the goldens' MANIFEST.md describes it.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace dsflash::tiny {

// Keeps the vocab entries and added tokens with id < vocab_size and the merges whose two parts and result
// are all kept (V3: ids 0-2 special, 3-258 bytes, 259+r = merge r, so the first vocab_size-259 merges);
// everything else (normalizer, pre-tokenizer, decoder) unchanged. Serialised like the goldens (1-space
// indent, UTF-8 unescaped, trailing newline). When vocab_size covers every id the text is returned as is.
Result<std::string> restrict_tokenizer_json(const std::string& json_text, int64_t vocab_size,
                                            const std::string& origin);

// shared/tokenizer/deepseek_v3_tokenizer.json under $DSFLASH_SHARED_DIR, else under the shared/ folder this
// build was configured with; "" when neither exists.
std::string default_tokenizer_path();

}  // namespace dsflash::tiny
