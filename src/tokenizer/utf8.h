// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the output parser.
// Invalid input is never an error here: ill-formed sequences become U+FFFD, one per "maximal subpart"
// (Unicode §3.9 best practice; what Python's bytes.decode('utf-8', 'replace') and Rust's
// String::from_utf8_lossy do), so our ids match Hugging Face tokenizers fed the same replaced text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsflash::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at s[0], 0 if s does not start with one.
// `incomplete` (optional) is set when s is a valid but truncated prefix of a sequence (needs more bytes).
size_t valid_sequence_length(std::string_view s, bool* incomplete = nullptr);

// Length of the maximal subpart at s[0] (>= 1) for an ill-formed position: the bytes one U+FFFD replaces.
size_t maximal_subpart_length(std::string_view s);

bool is_valid(std::string_view s);

// s with every ill-formed subsequence replaced by U+FFFD (returns s unchanged when valid).
std::string sanitize(std::string_view s);

// Appends the UTF-8 encoding of code point cp (cp must be a Unicode scalar value).
void append_code_point(std::string& out, uint32_t cp);

// Decodes the code point at s[pos] of VALID UTF-8; advances pos.
uint32_t next_code_point(std::string_view s, size_t& pos);

// Rust's char::is_alphanumeric (Alphabetic or Numeric), approximated from General_Category with utf8proc:
// letters, marks, all numbers (Alphabetic's Other_Alphabetic marks are mostly Mn/Mc).
bool is_alphanumeric(uint32_t cp);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_white_space(uint32_t cp);

}  // namespace dsflash::utf8
