// Added tokens of tokenizer.json ("added_tokens": id, content, special, normalized, lstrip, rstrip,
// single_word). They are cut out of the text before pre-tokenization, as Hugging Face's AddedVocabulary does:
// first the tokens with normalized=false on the raw text, then those with normalized=true on the remaining
// pieces (after the normalizer, the identity for DeepSeek). Matching is leftmost-longest and non-overlapping.
// Spec: MODEL.md §8 (1,283 records in V4.1; <｜System｜> 128799 is special=false, normalized=true).
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pre_tokenizer.h"

namespace dsflash {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A text segment after added-token extraction: either an added token's id or plain text for the BPE path.
struct TextSegment {
  TextSpan span;
  int32_t token_id = -1;  // -1: plain text
};

// Compute: leftmost-longest matching of one set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Matches `tokens[i]` for every i in `members` (keeps its own copy of them).
  void build(const std::vector<AddedToken>& tokens, const std::vector<size_t>& members);

  // Splits plain-text segment `seg` of valid UTF-8 `text` into plain and token segments (appended to out).
  // skip_special: special tokens are not matched (Hugging Face's split_special_tokens / encode_special_tokens).
  void split(std::string_view text, TextSpan seg, bool skip_special, std::vector<TextSegment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node index, sorted by byte
    int32_t token = -1;                                 // index into tokens_ when a token ends here
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::bitset<256> first_bytes_;
};

}  // namespace dsflash
