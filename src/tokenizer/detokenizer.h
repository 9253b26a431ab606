// Streaming detokenizer: ids in, text out as it becomes complete. Never emits half a UTF-8 character: bytes of
// a character split across tokens are held until it completes; ill-formed bytes become U+FFFD exactly as the
// whole-sequence decode() would (maximal subparts), so the concatenation of every push() and finish() equals
// Tokenizer::decode of all ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace dsflash {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Text completed by this token (valid UTF-8, possibly empty).
  std::string push(int32_t id);
  // The same for raw bytes (used by push; exposed for tests).
  std::string push_bytes(std::string_view bytes);
  // End of stream: held bytes of an unfinished character become one U+FFFD.
  std::string finish();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace dsflash
