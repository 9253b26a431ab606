// The pre-tokenizer of tokenizer.json: a Sequence of Split steps (regex or literal pattern, with a behaviour)
// followed by ByteLevel(add_prefix_space=false, use_regex=false). Each Split step cuts every piece the previous
// step produced, independently (a regex never sees past its piece's ends). Spec: MODEL.md §8.
//
// Hugging Face runs the patterns with Oniguruma; we run them with PCRE2 (UTF + UCP, JIT). The two differ in
// what the shorthand classes mean, so patterns are translated first: \s -> [\t-\r\x{85}\p{Z}] (Oniguruma's
// Unicode \s; PCRE2's would add U+180E), \w -> [\p{L}\p{M}\p{Nd}\p{Pc}]; \h / \H (hex digit in Oniguruma)
// and negated shorthands inside a class are refused.
// Unicode data: Debian bookworm's PCRE2 10.42 knows Unicode 14.0 (as Oniguruma 6.9.8, which the tokenizers
// wheels vendor through onig_sys 69.8, to our knowledge). Characters assigned later (Unicode 15.0-16.0, ~10k,
// mostly CJK extensions) can split differently from a Hugging Face built on a newer Oniguruma (Debian unstable's
// python3-tokenizers: 10,294 code points differ); every code point assigned by Unicode 14 splits identically
// (tests/tokenizer PreTokenizerAgreesOnEveryCodePoint).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace dsflash {

// A byte range [begin, end) of the (UTF-8) text being tokenized.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Oniguruma (Ruby syntax) pattern -> equivalent PCRE2 pattern, or an error naming the construct.
Result<std::string> translate_oniguruma_pattern(std::string_view pattern);

class RegexSplitStep {
 public:
  // regex: an Oniguruma pattern; literal: a plain string (tokenizer.json {"String": ...}).
  static Result<RegexSplitStep> create(std::string_view pattern, bool is_literal, SplitBehavior behavior,
                                       bool invert);
  RegexSplitStep(RegexSplitStep&&) noexcept;
  RegexSplitStep& operator=(RegexSplitStep&&) noexcept;
  ~RegexSplitStep();

  // Appends to `out` the pieces `piece` of `text` splits into (empty pieces dropped).
  Status split(std::string_view text, TextSpan piece, std::vector<TextSpan>& out) const;

 private:
  struct Compiled;
  RegexSplitStep() = default;
  std::unique_ptr<Compiled> compiled_;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  bool invert_ = false;
};

class PreTokenizer {
 public:
  // Parses tokenizer.json's "pre_tokenizer"; refuses any shape other than Split* + final ByteLevel without
  // prefix space and without its own regex.
  static Result<PreTokenizer> from_json(const nlohmann::json& pre_tokenizer);

  // Splits valid UTF-8 `text` into pieces, each to be byte-level encoded and run through BPE separately.
  Result<std::vector<TextSpan>> split(std::string_view text) const;

 private:
  std::vector<RegexSplitStep> steps_;
};

}  // namespace dsflash
