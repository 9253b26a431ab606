#include "tokenizer/output_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_markers.h"
#include "tokenizer/python_json.h"
#include "tokenizer/utf8.h"

namespace dsflash {

namespace {

using chat_markers::kEos;
using chat_markers::kThinkEnd;
constexpr std::string_view kDsmlOpen = "<｜DSML｜";  // any DSML tag opening; well-formed output uses " calls"
constexpr std::string_view kCallsOpen = "<｜DSML｜ calls>\n";
constexpr std::string_view kCallsClose = "</｜DSML｜ calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜ invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke>";
constexpr std::string_view kInvokeCloseStem = "</｜DSML｜ invoke";
constexpr std::string_view kParamOpen = "<｜DSML｜ parameter";
constexpr std::string_view kParamCloseStem = "/｜DSML｜ parameter";

// Start of the longest suffix of s that is a proper prefix of one of `markers` (s.size() when none).
size_t partial_marker_start(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = s.size();
  for (std::string_view m : markers) {
    const size_t max_len = std::min(s.size(), m.size() - 1);
    for (size_t len = max_len; len > 0; --len) {
      if (s.substr(s.size() - len) == m.substr(0, len)) {
        best = std::min(best, s.size() - len);
        break;
      }
    }
  }
  return best;
}

bool is_prefix_of(std::string_view s, std::string_view full) { return s.size() <= full.size() && full.substr(0, s.size()) == s; }

// Earliest of several markers in s: (position, marker index), npos when none.
std::pair<size_t, int> find_first(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = std::string_view::npos;
  int which = -1;
  int i = 0;
  for (std::string_view m : markers) {
    const size_t p = s.find(m);
    if (p != std::string_view::npos && p < best) {
      best = p;
      which = i;
    }
    ++i;
  }
  return {best, which};
}

bool is_python_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

OutputParser::OutputParser(bool thinking) : state_(thinking ? State::kReasoning : State::kContent) {}

void OutputParser::emit(std::vector<OutputEvent>& out, OutputEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != OutputEvent::Kind::kToolCall) {
    out.back().text.append(text);
    return;
  }
  OutputEvent e;
  e.kind = kind;
  e.text = std::string(text);
  out.push_back(std::move(e));
}

std::vector<OutputEvent> OutputParser::push(std::string_view text) {
  std::vector<OutputEvent> out;
  buffer_.append(text);
  step(out, false);
  return out;
}

std::vector<OutputEvent> OutputParser::finish() {
  std::vector<OutputEvent> out;
  step(out, true);
  if (state_ == State::kReasoning && !saw_think_end_) problems_.push_back("generation ended inside the reasoning (no </think>)");
  return out;
}

void OutputParser::note_after_calls(std::string_view content) {
  if (after_calls_ && state_ == State::kContent && !content.empty()) {
    problems_.push_back("text after the DSML tool calls block");
    after_calls_ = false;  // reported once
  }
}

void OutputParser::fail_calls(std::vector<OutputEvent>& out, const std::string& problem) {
  problems_.push_back(problem);
  emit(out, OutputEvent::Kind::kContent, calls_raw_);
  calls_raw_.clear();
  in_calls_block_ = false;
  separator_pending_ = false;
  state_ = State::kContent;
}

// The official grammar of one invoke (encoding.py parse_tool_calls), from "<｜DSML｜ invoke" to its closing tag.
bool OutputParser::parse_invoke(std::string_view invoke, ToolCall& call, std::string& problem,
                                std::string& warning) const {
  std::string_view rest = invoke.substr(kInvokeOpen.size());
  rest.remove_suffix(kInvokeClose.size() - kInvokeCloseStem.size());  // drop the final ">"
  // rest: ' name="f">\n' [params] '</｜DSML｜ invoke'
  auto [head_end, head_kind] = find_first(rest, {kParamOpen, kInvokeCloseStem});
  std::string_view head = rest.substr(0, head_end);
  size_t k = 0;
  while (k < head.size() && is_python_space(static_cast<unsigned char>(head[k]))) ++k;
  head.remove_prefix(k);
  constexpr std::string_view kNameOpen = "name=\"";
  constexpr std::string_view kNameClose = "\">\n";
  if (head.size() < kNameOpen.size() + kNameClose.size() || head.substr(0, kNameOpen.size()) != kNameOpen ||
      head.substr(head.size() - kNameClose.size()) != kNameClose) {
    problem = "DSML invoke without name=\"...\">\\n";
    return false;
  }
  call.name = std::string(head.substr(kNameOpen.size(), head.size() - kNameOpen.size() - kNameClose.size()));
  rest.remove_prefix(head_end);

  std::vector<std::string> seen;
  std::string args = "{";
  bool first = true;
  while (rest.substr(0, kParamOpen.size()) == kParamOpen) {
    rest.remove_prefix(kParamOpen.size());
    const size_t close = rest.find(kParamCloseStem);
    if (close == std::string_view::npos) {
      problem = "DSML parameter without closing tag";
      return false;
    }
    std::string_view param = rest.substr(0, close);  // ' name="k" string="true">value<'
    rest.remove_prefix(close + kParamCloseStem.size());
    constexpr std::string_view kParamName = " name=\"";
    if (param.substr(0, kParamName.size()) != kParamName || param.empty() || param.back() != '<') {
      problem = "DSML parameter not of the form name=\"...\" string=\"...\">...";
      return false;
    }
    param.remove_prefix(kParamName.size());
    param.remove_suffix(1);
    constexpr std::string_view kStringTrue = "\" string=\"true\">";
    constexpr std::string_view kStringFalse = "\" string=\"false\">";
    const size_t t = param.find(kStringTrue);
    const size_t f = param.find(kStringFalse);
    const bool is_string = t != std::string_view::npos && (f == std::string_view::npos || t < f);
    const size_t sep = is_string ? t : f;
    if (sep == std::string_view::npos) {
      problem = "DSML parameter without string=\"true|false\"";
      return false;
    }
    const std::string name(param.substr(0, sep));
    const std::string_view value = param.substr(sep + (is_string ? kStringTrue : kStringFalse).size());
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      problem = "duplicate DSML parameter '" + name + "'";
      return false;
    }
    seen.push_back(name);
    if (!first) args += ", ";
    first = false;
    // Ill-formed UTF-8 (only possible when the caller feeds raw bytes) becomes U+FFFD so arguments stay JSON.
    args += python_json_string(utf8::sanitize(name)) + ": ";
    if (is_string) {
      args += python_json_string(utf8::sanitize(value));
    } else if (value.find('\0') == std::string_view::npos && nlohmann::json::accept(value)) {
      // (nlohmann's lexer takes a NUL byte for the end of input, so a NUL is checked for separately)
      args += std::string(value);
    } else {
      // Not JSON although string="false": keep it as a string so the arguments stay valid JSON.
      warning = "DSML parameter '" + name + "' has string=\"false\" but its value is not JSON";
      args += python_json_string(utf8::sanitize(value));
    }
    auto [sep_end, sep_kind] = find_first(rest, {kParamOpen, kInvokeCloseStem});
    if (sep_kind < 0 || rest.substr(0, sep_end) != ">\n") {
      problem = "DSML parameter closing tag not followed by '>\\n'";
      return false;
    }
    rest.remove_prefix(sep_end);
  }
  if (rest != kInvokeCloseStem) {
    problem = "unexpected text inside DSML invoke";
    return false;
  }
  call.arguments = args + "}";
  return true;
}

void OutputParser::step(std::vector<OutputEvent>& out, bool final) {
  for (;;) {
    if (state_ == State::kDone) {
      if (!buffer_.empty()) {
        problems_.push_back("text after <｜end▁of▁sentence｜>");
        emit(out, OutputEvent::Kind::kContent, buffer_);
        buffer_.clear();
      }
      return;
    }
    if (state_ == State::kReasoning || state_ == State::kContent) {
      const bool reasoning = state_ == State::kReasoning;
      const auto kind = reasoning ? OutputEvent::Kind::kReasoning : OutputEvent::Kind::kContent;
      auto [pos, which] = reasoning ? find_first(buffer_, {kThinkEnd, kEos, kDsmlOpen})
                                    : find_first(buffer_, {kEos, kDsmlOpen, kDsmlOpen});
      const bool is_think_end = reasoning && which == 0;
      const bool is_eos = reasoning ? which == 1 : which == 0;
      if (pos == std::string::npos) {
        // Hold back what could still become a tag, and up to two newlines that would precede a DSML block.
        size_t keep = final ? buffer_.size()
                            : partial_marker_start(buffer_, reasoning ? std::initializer_list<std::string_view>{kThinkEnd, kEos, kDsmlOpen}
                                                                      : std::initializer_list<std::string_view>{kEos, kDsmlOpen});
        if (!final) {
          for (int n = 0; n < 2 && keep > 0 && buffer_[keep - 1] == '\n'; ++n) --keep;
        }
        note_after_calls(std::string_view(buffer_).substr(0, keep));
        emit(out, kind, std::string_view(buffer_).substr(0, keep));
        buffer_.erase(0, keep);
        return;
      }
      if (is_think_end) {
        emit(out, kind, std::string_view(buffer_).substr(0, pos));
        buffer_.erase(0, pos + std::string_view(kThinkEnd).size());
        saw_think_end_ = true;
        state_ = State::kContent;
        continue;
      }
      if (is_eos) {
        note_after_calls(std::string_view(buffer_).substr(0, pos));
        emit(out, kind, std::string_view(buffer_).substr(0, pos));
        if (reasoning) problems_.push_back("<｜end▁of▁sentence｜> inside the reasoning (no </think>)");
        buffer_.erase(0, pos + std::string_view(kEos).size());
        saw_eos_ = true;
        state_ = State::kDone;
        continue;
      }
      // A DSML tag: the text before it (less the "\n\n" that introduces a calls block) is reasoning / content.
      size_t text_end = pos;
      if (text_end >= 2 && buffer_.compare(text_end - 2, 2, "\n\n") == 0) text_end -= 2;
      emit(out, kind, std::string_view(buffer_).substr(0, text_end));
      if (reasoning) problems_.push_back("DSML tool calls inside the reasoning (no </think> before them)");
      calls_raw_ = buffer_.substr(text_end, pos - text_end);
      buffer_.erase(0, pos);
      state_ = State::kCalls;
      continue;
    }

    // State::kCalls: buffer_ starts inside a DSML block; calls_raw_ holds its raw text not yet delivered.
    if (!in_calls_block_) {
      if (buffer_.size() < kCallsOpen.size() && is_prefix_of(buffer_, kCallsOpen) && !final) return;
      if (buffer_.compare(0, kCallsOpen.size(), kCallsOpen) != 0) {
        // Not a calls block: give back the tag opening as text and go on as content.
        const size_t n = std::min(buffer_.size(), kDsmlOpen.size());
        calls_raw_ += buffer_.substr(0, n);
        buffer_.erase(0, n);
        fail_calls(out, "DSML tag outside a <｜DSML｜ calls> block");
        state_ = State::kContent;
        continue;
      }
      calls_raw_ += kCallsOpen;
      buffer_.erase(0, kCallsOpen.size());
      in_calls_block_ = true;
    }
    if (separator_pending_) {  // the "\n" after "</｜DSML｜ invoke>", which may not have arrived yet
      if (buffer_.empty() && !final) return;
      if (!buffer_.empty() && buffer_[0] == '\n') buffer_.erase(0, 1);
      separator_pending_ = false;
    }
    if (buffer_.compare(0, kCallsClose.size(), kCallsClose) == 0) {
      buffer_.erase(0, kCallsClose.size());
      calls_raw_.clear();
      in_calls_block_ = false;
      after_calls_ = true;
      state_ = State::kContent;
      continue;
    }
    if (buffer_.compare(0, kInvokeOpen.size(), kInvokeOpen) == 0) {
      const size_t eos = buffer_.find(kEos);
      const size_t close = buffer_.find(kInvokeClose);
      if (close == std::string::npos || (eos != std::string::npos && eos < close)) {
        if (!final && eos == std::string::npos) return;  // wait for the closing tag
        const size_t cut = eos == std::string::npos ? buffer_.size() : eos;
        calls_raw_ += buffer_.substr(0, cut);
        buffer_.erase(0, cut);
        fail_calls(out, "unterminated DSML invoke");
        continue;
      }
      const size_t end = close + kInvokeClose.size();
      ToolCall call;
      std::string problem, warning;
      if (!parse_invoke(std::string_view(buffer_).substr(0, end), call, problem, warning)) {
        calls_raw_ += buffer_.substr(0, end);
        buffer_.erase(0, end);
        fail_calls(out, problem);
        continue;
      }
      if (!warning.empty()) problems_.push_back(warning);
      call.index = next_call_index_++;
      OutputEvent e;
      e.kind = OutputEvent::Kind::kToolCall;
      e.call = std::move(call);
      out.push_back(std::move(e));
      buffer_.erase(0, end);
      calls_raw_.clear();  // delivered; a later failure gives back only what follows
      separator_pending_ = true;
      continue;
    }
    // Neither tag yet: wait while it can still become one.
    const bool maybe_tag = is_prefix_of(buffer_, kInvokeOpen) || is_prefix_of(buffer_, kCallsClose) ||
                           is_prefix_of(buffer_, kEos);
    if (!final && maybe_tag) return;
    if (buffer_.empty() || buffer_.compare(0, std::string_view(kEos).size(), kEos) == 0) {
      fail_calls(out, "unterminated DSML calls block");
      continue;
    }
    // Give back only the bytes that decided it is no tag (to the next character boundary), and scan the rest as
    // content again: the result must not depend on how the text was cut into pieces.
    size_t matched = 0;
    while (matched < buffer_.size() &&
           (is_prefix_of(std::string_view(buffer_).substr(0, matched + 1), kInvokeOpen) ||
            is_prefix_of(std::string_view(buffer_).substr(0, matched + 1), kCallsClose) ||
            is_prefix_of(std::string_view(buffer_).substr(0, matched + 1), kEos))) {
      ++matched;
    }
    size_t cut = std::max<size_t>(matched, 1);
    while (cut < buffer_.size() && (static_cast<uint8_t>(buffer_[cut]) & 0xC0) == 0x80) ++cut;
    calls_raw_ += buffer_.substr(0, cut);
    buffer_.erase(0, cut);
    fail_calls(out, "unexpected text inside a DSML calls block");
  }
}

ParsedOutput parse_output(std::string_view text, bool thinking) {
  OutputParser parser(thinking);
  ParsedOutput result;
  auto take = [&](const std::vector<OutputEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kReasoning) result.reasoning += e.text;
      if (e.kind == OutputEvent::Kind::kContent) result.content += e.text;
      if (e.kind == OutputEvent::Kind::kToolCall) result.tool_calls.push_back(e.call);
    }
  };
  take(parser.push(text));
  take(parser.finish());
  result.malformed = parser.malformed();
  result.problems = parser.problems();
  return result;
}

}  // namespace dsflash
