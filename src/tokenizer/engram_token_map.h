// Engram's compressed token map (spec/MODEL.md §4.8; official engram.py build_compressed_token_map):
// every token id is decoded (tokenizer.json, byte-level decoder) and normalised with the official
// normaliser sequence; ids whose keys are equal share one compressed id, numbered in first-seen order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsflash {

class EngramTokenMap {
 public:
  // Reads a Hugging Face tokenizer.json (model.vocab + added_tokens). num_ids: how many ids to map
  // ([0, num_ids)); <= 0 means len(tokenizer) = number of distinct ids the file defines. Ids the file
  // does not define decode to "" (as the Rust decoder skips them) and share that key.
  static Result<EngramTokenMap> from_tokenizer_json(const std::string& path, int64_t num_ids = 0);
  static Result<EngramTokenMap> from_tokenizer_json_text(const std::string& json_text, const std::string& origin,
                                                         int64_t num_ids = 0);
  // From each id's token string as stored in the file (vocab / added-token content); `defined[i]` false for gaps.
  static EngramTokenMap from_token_strings(const std::vector<std::string>& token_strings,
                                           const std::vector<bool>& defined);

  int64_t num_ids() const { return static_cast<int64_t>(ids_.size()); }
  int64_t compressed_vocab_size() const { return compressed_vocab_size_; }
  int32_t compressed_id(int64_t token_id) const { return ids_[static_cast<size_t>(token_id)]; }
  const std::vector<int32_t>& ids() const { return ids_; }  // [num_ids] compressed ids

  // The steps, exposed for tests:
  // byte-level decode of one token string (ByteLevel decoder: every char through the GPT-2 unicode->byte
  // table, or the raw UTF-8 if any char is outside it; invalid UTF-8 -> U+FFFD per maximal subpart).
  static std::string byte_level_decode(std::string_view token);
  // NFKC, NFD, strip accents (drop General_Category M*), lowercase, [ \t\r\n]+ -> " ", a lone " " survives,
  // strip (Unicode White_Space) — the official normalizers.Sequence. Input must be valid UTF-8.
  static std::string normalize(std::string_view text);
  // The key of one token: raw token string if the decoded text contains U+FFFD, else the normalised text,
  // or the decoded text when normalisation leaves nothing.
  static std::string key_of(std::string_view token_string, bool defined = true);

 private:
  std::vector<int32_t> ids_;
  int64_t compressed_vocab_size_ = 0;
};

}  // namespace dsflash
