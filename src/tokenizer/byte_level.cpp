#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace dsflash {

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_cp_.fill(-1);
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : next_extra++;
    utf8::append_code_point(byte_chars_[b], cp);
    byte_of_cp_[cp] = static_cast<int16_t>(b);
  }
}

std::optional<uint8_t> ByteLevelAlphabet::byte_of_code_point(uint32_t cp) const {
  if (cp >= byte_of_cp_.size() || byte_of_cp_[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(byte_of_cp_[cp]);
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_chars_[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::decode(std::string_view token) const {
  if (!utf8::is_valid(token)) return std::nullopt;
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const auto b = byte_of_code_point(utf8::next_code_point(token, pos));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

std::string ByteLevelAlphabet::decode_token(std::string_view token) const {
  auto bytes = decode(token);
  return bytes ? std::move(*bytes) : std::string(token);
}

}  // namespace dsflash
