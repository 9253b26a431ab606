// The text <-> ids tokenizer of a DeepSeek checkpoint, loaded from its tokenizer.json (spec: MODEL.md §8).
// Implements exactly the shape DeepSeek uses (and refuses, with a message naming the field, anything else):
// identity normalizer, added tokens, Split* + ByteLevel pre-tokenizer, byte-level BPE, ByteLevel decoder.
// encode() gives the ids Hugging Face tokenizers gives for the same text (no special tokens are added: the
// prompt encoder writes <｜begin▁of▁sentence｜> into the text). Thread-safe: const methods may run concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace dsflash {

struct EncodeOptions {
  // Treat special added tokens in the text as plain text (Hugging Face's split_special_tokens). Non-special
  // added tokens (<｜User｜>, <think>, ...) are still matched, as in Hugging Face.
  bool split_special_tokens = false;
  // Look pieces up in / add them to the BPE cache (off: always run the merges; for benchmarks and tests).
  bool use_cache = true;
};

class Tokenizer {
 public:
  static Result<Tokenizer> from_file(const std::string& path);
  // dir/tokenizer.json of a checkpoint directory.
  static Result<Tokenizer> from_model_dir(const std::string& dir);
  static Result<Tokenizer> from_json_text(std::string_view json_text, const std::string& origin);

  // Text (any bytes; ill-formed UTF-8 is replaced by U+FFFD first) -> ids.
  Result<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // Ids -> text as Hugging Face's decode: unknown ids skipped, optionally special tokens skipped, bytes joined
  // and ill-formed UTF-8 replaced by U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The raw bytes before that replacement (may end inside a character; the streaming detokenizer uses this).
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // Bytes of one token ("" for an unknown id).
  std::string token_bytes(int32_t id) const;

  // Token string as stored in tokenizer.json (added-token content, else the byte-level vocab string).
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const AddedToken* added_token(int32_t id) const;  // nullptr when id is not an added token
  bool is_special(int32_t id) const;
  // One past the largest id defined (Hugging Face len(tokenizer) when ids are dense).
  int32_t id_limit() const { return id_limit_; }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }
  const BpeModel& bpe() const { return bpe_; }
  const PreTokenizer& pre_tokenizer() const { return pre_tokenizer_; }
  const std::string& origin() const { return origin_; }

 private:
  Tokenizer() = default;
  void append_plain_ids(std::string_view text, TextSpan span, bool use_cache, std::vector<int32_t>& ids,
                        Status& status) const;

  std::string origin_;
  BpeModel bpe_;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_by_id_;  // id -> index in added_tokens_
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher raw_matcher_;         // normalized=false tokens, matched on the raw text
  AddedTokenMatcher normalized_matcher_;  // normalized=true tokens, matched on the normalised pieces
  int32_t id_limit_ = 0;
};

}  // namespace dsflash
