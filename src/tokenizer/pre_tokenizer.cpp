#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace dsflash {

namespace {

// Oniguruma's Unicode \s: U+0009..U+000D, U+0085 and General_Category Z (Zs, Zl, Zp).
constexpr std::string_view kSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";
// Oniguruma's Unicode \w: Letter, Mark, Decimal_Number, Connector_Punctuation.
constexpr std::string_view kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Result<std::string> translate_oniguruma_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  int class_depth = 0;  // inside [...] (Oniguruma allows nested classes)
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      switch (e) {
        case 's':
          out += class_depth ? std::string(kSpaceClassBody) : "[" + std::string(kSpaceClassBody) + "]";
          continue;
        case 'w':
          out += class_depth ? std::string(kWordClassBody) : "[" + std::string(kWordClassBody) + "]";
          continue;
        case 'S':
        case 'W':
          if (class_depth) {
            return Status::Error("pre-tokenizer regex: negated shorthand \\" + std::string(1, e) +
                                 " inside a character class is not supported (pattern offset " +
                                 std::to_string(i - 1) + ")");
          }
          out += "[^" + std::string(e == 'S' ? kSpaceClassBody : kWordClassBody) + "]";
          continue;
        case 'h':
        case 'H':
          return Status::Error("pre-tokenizer regex: \\h / \\H (Oniguruma hex-digit class) is not supported");
        default:
          out += c;
          out += e;
          continue;
      }
    }
    if (c == '[') {
      // "[" right after "[" or "[^" is a literal only in POSIX bracket syntax; Oniguruma nests classes.
      if (class_depth && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        return Status::Error("pre-tokenizer regex: POSIX bracket classes are not supported");
      }
      ++class_depth;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      // A ']' first in a class is a literal in both dialects.
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && class_depth) --class_depth;
    out += c;
  }
  if (class_depth) return Status::Error("pre-tokenizer regex: unterminated character class");
  return out;
}

struct RegexSplitStep::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitStep::RegexSplitStep(RegexSplitStep&&) noexcept = default;
RegexSplitStep& RegexSplitStep::operator=(RegexSplitStep&&) noexcept = default;
RegexSplitStep::~RegexSplitStep() = default;

Result<RegexSplitStep> RegexSplitStep::create(std::string_view pattern, bool is_literal, SplitBehavior behavior,
                                              bool invert) {
  std::string translated;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (is_literal) {
    translated = std::string(pattern);
    options |= PCRE2_LITERAL;
  } else {
    auto t = translate_oniguruma_pattern(pattern);
    if (!t.ok()) return t.status();
    translated = std::move(*t);
  }
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (!code) {
    return Status::Error("pre-tokenizer regex '" + std::string(pattern) + "': " + pcre2_error_text(error_code) +
                         " at offset " + std::to_string(error_offset));
  }
  RegexSplitStep step;
  step.compiled_ = std::make_unique<Compiled>();
  step.compiled_->code = code;
  step.compiled_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  step.behavior_ = behavior;
  step.invert_ = invert;
  return step;
}

Status RegexSplitStep::split(std::string_view text, TextSpan piece, std::vector<TextSpan>& out) const {
  // 1. The piece as alternating (span, is_match) runs covering it, like Hugging Face's Pattern::find_matches.
  struct Run {
    TextSpan span;
    bool is_match;
  };
  std::vector<Run> runs;
  const std::string_view subject = text.substr(piece.begin, piece.size());
  if (subject.empty()) return Status::Ok();
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (!match) return Status::Error("pre-tokenizer: out of memory for PCRE2 match data");
  size_t prev = 0;
  size_t search_from = 0;
  bool have_last_end = false;
  size_t last_match_end = 0;
  Status status;
  while (search_from <= subject.size()) {
    // Subject is valid UTF-8 (the tokenizer sanitises its input), so PCRE2 need not re-check it.
    int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), search_from,
                         PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), search_from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = Status::Error("pre-tokenizer regex match failed at byte " + std::to_string(piece.begin + search_from) +
                             ": " + pcre2_error_text(rc));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && have_last_end && last_match_end == end) {
      // An empty match right after the previous match: step one character (Oniguruma's find_iter).
      if (search_from >= subject.size()) break;
      size_t p = search_from;
      utf8::next_code_point(subject, p);
      search_from = p;
      continue;
    }
    if (prev != start) runs.push_back({{piece.begin + prev, piece.begin + start}, false});
    runs.push_back({{piece.begin + start, piece.begin + end}, true});
    prev = end;
    have_last_end = true;
    last_match_end = end;
    if (end == start) {
      if (end >= subject.size()) break;
      size_t p = end;
      utf8::next_code_point(subject, p);
      search_from = p;
    } else {
      search_from = end;
    }
  }
  pcre2_match_data_free(match);
  if (!status.ok()) return status;
  if (prev != subject.size()) runs.push_back({{piece.begin + prev, piece.end}, false});
  if (invert_) {
    for (auto& r : runs) r.is_match = !r.is_match;
  }

  // 2. Apply the behaviour (Hugging Face NormalizedString::split), then drop empty pieces.
  std::vector<TextSpan> pieces;
  pieces.reserve(runs.size());
  switch (behavior_) {
    case SplitBehavior::kIsolated:
      for (const auto& r : runs) pieces.push_back(r.span);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& r : runs)
        if (!r.is_match) pieces.push_back(r.span);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& r : runs) {
        if (r.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = r.span.end;
        } else {
          pieces.push_back(r.span);
        }
        previous_match = r.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t k = runs.size(); k-- > 0;) {
        const auto& r = runs[k];
        if (r.is_match && !previous_match && !pieces.empty()) {
          pieces.back().begin = r.span.begin;
        } else {
          pieces.push_back(r.span);
        }
        previous_match = r.is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& r : runs) {
        if (r.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = r.span.end;
        } else {
          pieces.push_back(r.span);
        }
        previous_match = r.is_match;
      }
      break;
    }
  }
  for (const auto& p : pieces)
    if (p.size() > 0) out.push_back(p);
  return Status::Ok();
}

namespace {

Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Status::Error("pre_tokenizer Split: unknown behavior '" + name + "'");
}

Status check_byte_level(const nlohmann::json& step) {
  if (step.value("add_prefix_space", false)) {
    return Status::Error("pre_tokenizer ByteLevel with add_prefix_space=true is not implemented");
  }
  if (step.value("use_regex", true)) {
    return Status::Error("pre_tokenizer ByteLevel with use_regex=true (GPT-2 regex) is not implemented");
  }
  return Status::Ok();
}

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& pre_tokenizer) {
  PreTokenizer result;
  if (pre_tokenizer.is_null()) {
    return Status::Error("pre_tokenizer is null; only byte-level BPE tokenizers (ByteLevel pre-tokenizer) are "
                         "implemented");
  }
  std::vector<nlohmann::json> steps;
  const std::string type = pre_tokenizer.value("type", "");
  if (type == "Sequence") {
    if (!pre_tokenizer.contains("pretokenizers") || !pre_tokenizer["pretokenizers"].is_array()) {
      return Status::Error("pre_tokenizer Sequence without a 'pretokenizers' array");
    }
    for (const auto& s : pre_tokenizer["pretokenizers"]) steps.push_back(s);
  } else {
    steps.push_back(pre_tokenizer);
  }
  bool seen_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& step = steps[i];
    const std::string where = "pre_tokenizer step " + std::to_string(i);
    if (!step.is_object()) return Status::Error(where + ": not an object");
    const std::string step_type = step.value("type", "");
    if (step_type == "ByteLevel") {
      if (i + 1 != steps.size()) return Status::Error(where + ": ByteLevel must be the last step");
      if (auto s = check_byte_level(step); !s.ok()) return s.with_context(where);
      seen_byte_level = true;
    } else if (step_type == "Split") {
      if (!step.contains("pattern") || !step["pattern"].is_object()) {
        return Status::Error(where + ": Split without a pattern object");
      }
      const auto& pattern = step["pattern"];
      bool is_literal = false;
      std::string text;
      if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
        text = pattern["Regex"].get<std::string>();
      } else if (pattern.contains("String") && pattern["String"].is_string()) {
        text = pattern["String"].get<std::string>();
        is_literal = true;
      } else {
        return Status::Error(where + ": Split pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
      }
      auto behavior = parse_behavior(step.value("behavior", ""));
      if (!behavior.ok()) return behavior.status().with_context(where);
      auto compiled = RegexSplitStep::create(text, is_literal, *behavior, step.value("invert", false));
      if (!compiled.ok()) return compiled.status().with_context(where);
      result.steps_.push_back(std::move(*compiled));
    } else {
      return Status::Error(where + ": pre-tokenizer type '" + step_type +
                           "' is not implemented (supported: Split, ByteLevel)");
    }
  }
  if (!seen_byte_level) {
    return Status::Error("pre_tokenizer: no final ByteLevel step; only byte-level BPE tokenizers are implemented");
  }
  return result;
}

Result<std::vector<TextSpan>> PreTokenizer::split(std::string_view text) const {
  std::vector<TextSpan> pieces;
  if (!text.empty()) pieces.push_back({0, text.size()});
  std::vector<TextSpan> next;
  for (const auto& step : steps_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const auto& piece : pieces) {
      if (auto s = step.split(text, piece, next); !s.ok()) return s;
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace dsflash
