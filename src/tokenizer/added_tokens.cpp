#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dsflash {

namespace {

// Rust's char::is_alphanumeric || '_' on the character before / after a match (single_word tokens).
// Alphabetic is approximated by letters, marks of letters (Mn/Mc) and letter numbers; numeric by N*.
bool is_word_code_point(uint32_t cp) {
  if (cp == '_') return true;
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return !utf8::is_white_space(cp) && utf8::is_alphanumeric(cp);
}

uint32_t last_code_point(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return utf8::next_code_point(s, pos);
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens, const std::vector<size_t>& members) {
  tokens_.clear();
  nodes_.assign(1, Node{});
  first_bytes_.reset();
  for (size_t member : members) {
    const std::string& content = tokens[member].content;
    if (content.empty()) continue;
    first_bytes_.set(static_cast<uint8_t>(content[0]));
    int32_t node = 0;
    for (char c : content) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& kids = nodes_[node].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1})),
                    std::make_pair(byte, next));
      }
      node = next;
    }
    if (nodes_[node].token < 0) {  // the first record with a given content wins
      nodes_[node].token = static_cast<int32_t>(tokens_.size());
      tokens_.push_back(tokens[member]);
    }
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& kids = nodes_[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
  return it != kids.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::split(std::string_view text, TextSpan seg, bool skip_special,
                              std::vector<TextSegment>& out) const {
  size_t start_offset = seg.begin;  // end of what has been emitted
  size_t pos = seg.begin;           // where the next search starts
  while (pos < seg.end && nodes_.size() > 1) {
    if (!first_bytes_.test(static_cast<uint8_t>(text[pos]))) {
      ++pos;
      continue;
    }
    // Longest token starting at pos (among those we may match).
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t k = pos; k < seg.end; ++k) {
      node = child(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      const int32_t t = nodes_[node].token;
      if (t >= 0) {
        best = t;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[best];
    size_t start = pos;
    size_t stop = best_end;
    pos = best_end;  // the automaton resumes after the raw match, even when rstrip extends it
    if (skip_special && token.special) continue;  // found, then ignored (not retried shorter), as HF does
    if (token.single_word) {
      const std::string_view before = text.substr(seg.begin, start - seg.begin);
      const std::string_view after = text.substr(stop, seg.end - stop);
      const bool start_space = before.empty() || !is_word_code_point(last_code_point(before));
      size_t p = 0;
      const bool stop_space = after.empty() || !is_word_code_point(utf8::next_code_point(after, p));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > seg.begin) {
        const std::string_view before = text.substr(seg.begin, new_start - seg.begin);
        const uint32_t cp = last_code_point(before);
        if (!utf8::is_white_space(cp)) break;
        size_t len = 1;
        while ((static_cast<uint8_t>(before[before.size() - len]) & 0xC0) == 0x80) ++len;
        new_start -= len;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < seg.end) {
        size_t p = stop;
        const uint32_t cp = utf8::next_code_point(text, p);
        if (!utf8::is_white_space(cp)) break;
        stop = p;
      }
    }
    if (start_offset < start) out.push_back({{start_offset, start}, -1});
    out.push_back({{start, stop}, token.id});
    start_offset = stop;
  }
  if (start_offset < seg.end) out.push_back({{start_offset, seg.end}, -1});
}

}  // namespace dsflash
