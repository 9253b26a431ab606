#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace dsflash {

std::string StreamingDetokenizer::push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  return push_bytes(tokenizer_->token_bytes(id));
}

std::string StreamingDetokenizer::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const std::string_view s = pending_;
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      out.push_back(s[pos++]);
      continue;
    }
    bool incomplete = false;
    const size_t n = utf8::valid_sequence_length(s.substr(pos), &incomplete);
    if (n > 0) {
      out.append(s.substr(pos, n));
      pos += n;
    } else if (incomplete) {
      break;  // a valid prefix cut by the end of what we have: wait for more bytes
    } else {
      out.append(utf8::kReplacement);
      pos += utf8::maximal_subpart_length(s.substr(pos));
    }
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out = pending_.empty() ? std::string() : utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsflash
