// The GPT-2 byte-level alphabet used by tokenizer.json (ByteLevel pre-tokenizer and decoder): each of the 256
// byte values is shown as one printable code point (printable Latin-1 bytes as themselves, the other 68 bytes as
// U+0100..U+0143 in byte order). Vocab and merge strings are written in this alphabet.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsflash {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  // UTF-8 of the code point that stands for byte b.
  const std::string& char_of_byte(uint8_t b) const { return byte_chars_[b]; }
  // Byte value a code point stands for, nullopt when it is not in the alphabet.
  std::optional<uint8_t> byte_of_code_point(uint32_t cp) const;

  // Raw bytes -> alphabet string (what the ByteLevel pre-tokenizer does to a piece).
  std::string encode(std::string_view bytes) const;
  // Alphabet string -> raw bytes; nullopt when any code point is outside the alphabet or the string is not
  // valid UTF-8 (the ByteLevel decoder then passes the token's own UTF-8 through unchanged).
  std::optional<std::string> decode(std::string_view token) const;
  // The ByteLevel decoder's per-token rule: decode(), or the token's own bytes when decode() fails.
  std::string decode_token(std::string_view token) const;

 private:
  std::array<std::string, 256> byte_chars_;
  std::array<int16_t, 0x144> byte_of_cp_{};  // code point -> byte, -1 when not in the alphabet
};

}  // namespace dsflash
