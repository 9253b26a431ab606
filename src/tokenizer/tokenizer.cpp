#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace dsflash {

namespace {

Status check_normalizer(const nlohmann::json& normalizer) {
  if (normalizer.is_null()) return Status::Ok();
  if (normalizer.is_object() && normalizer.value("type", "") == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array() && normalizer["normalizers"].empty()) {
    return Status::Ok();
  }
  return Status::Error("normalizer " + normalizer.dump().substr(0, 200) +
                       " is not implemented (only null or an empty Sequence, the identity)");
}

Status check_decoder(const nlohmann::json& decoder) {
  if (decoder.is_object() && decoder.value("type", "") == "ByteLevel") return Status::Ok();
  return Status::Error("decoder " + decoder.dump().substr(0, 200) + " is not implemented (only ByteLevel)");
}

Status check_post_processor(const nlohmann::json& post) {
  // ByteLevel post-processing only adjusts offsets; it adds no tokens.
  if (post.is_null() || (post.is_object() && post.value("type", "") == "ByteLevel")) return Status::Ok();
  return Status::Error("post_processor " + post.value("type", std::string("?")) +
                       " is not implemented (only ByteLevel or null)");
}

Result<AddedToken> parse_added_token(const nlohmann::json& j, size_t index) {
  const std::string where = "added_tokens[" + std::to_string(index) + "]";
  if (!j.is_object() || !j.contains("id") || !j["id"].is_number_integer() || !j.contains("content") ||
      !j["content"].is_string()) {
    return Status::Error(where + ": needs an integer 'id' and a string 'content'");
  }
  AddedToken t;
  const auto id = j["id"].get<int64_t>();
  if (id < 0 || id > (1 << 30)) return Status::Error(where + ": id " + std::to_string(id) + " out of range");
  t.id = static_cast<int32_t>(id);
  t.content = j["content"].get<std::string>();
  if (t.content.empty()) return Status::Error(where + ": empty content");
  if (!utf8::is_valid(t.content)) return Status::Error(where + ": content is not valid UTF-8");
  t.special = j.value("special", false);
  // Hugging Face's default for a missing flag: normalized = !special.
  t.normalized = j.value("normalized", !t.special);
  t.lstrip = j.value("lstrip", false);
  t.rstrip = j.value("rstrip", false);
  t.single_word = j.value("single_word", false);
  return t;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("tokenizer: cannot open '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Status::Error("tokenizer: error reading '" + path + "'");
  return from_json_text(buffer.str(), path);
}

Result<Tokenizer> Tokenizer::from_model_dir(const std::string& dir) {
  return from_file(dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "tokenizer.json");
}

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, const std::string& origin) {
  auto fail = [&](const Status& s) { return s.with_context("tokenizer '" + origin + "'"); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error("tokenizer '" + origin + "': not valid JSON: " + e.what());
  }
  if (!j.is_object()) return fail(Status::Error("top level is not an object"));
  for (const char* key : {"model", "pre_tokenizer", "decoder"}) {
    if (!j.contains(key)) return fail(Status::Error(std::string("missing '") + key + "'"));
  }
  if (auto s = check_normalizer(j.value("normalizer", nlohmann::json())); !s.ok()) return fail(s);
  if (auto s = check_decoder(j["decoder"]); !s.ok()) return fail(s);
  if (auto s = check_post_processor(j.value("post_processor", nlohmann::json())); !s.ok()) return fail(s);

  Tokenizer t;
  t.origin_ = origin;
  auto bpe = BpeModel::from_json(j["model"]);
  if (!bpe.ok()) return fail(bpe.status());
  t.bpe_ = std::move(*bpe);
  auto pre = PreTokenizer::from_json(j["pre_tokenizer"]);
  if (!pre.ok()) return fail(pre.status());
  t.pre_tokenizer_ = std::move(*pre);

  t.id_limit_ = t.bpe_.id_limit();
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) return fail(Status::Error("added_tokens is not an array"));
    const auto& list = j["added_tokens"];
    const auto vocab_size = static_cast<int32_t>(t.bpe_.vocab_size());
    int32_t max_added_id = -1;  // -1 + 1 < vocab_size: the first new token gets vocab_size
    for (size_t i = 0; i < list.size(); ++i) {
      auto token = parse_added_token(list[i], i);
      if (!token.ok()) return fail(token.status());
      // Hugging Face ignores the file's id and numbers records itself: a content already in the vocab keeps its
      // vocab id, a repeated content its first id, a new one the next free id. A file that disagrees would be
      // renumbered there; refuse it rather than silently differ.
      int32_t expected_id;
      if (auto vocab_id = t.bpe_.token_to_id(token->content)) {
        expected_id = *vocab_id;
      } else if (auto it = t.added_by_content_.find(token->content); it != t.added_by_content_.end()) {
        expected_id = it->second;
      } else {
        expected_id = max_added_id >= vocab_size || vocab_size == 0 ? max_added_id + 1 : vocab_size;
      }
      if (token->id != expected_id) {
        return fail(Status::Error("added_tokens[" + std::to_string(i) + "] '" + token->content + "' has id " +
                                  std::to_string(token->id) + " but Hugging Face would assign it id " +
                                  std::to_string(expected_id)));
      }
      if (t.added_by_content_.count(token->content)) continue;  // a repeated record adds nothing
      max_added_id = std::max(max_added_id, token->id);
      t.added_by_id_.emplace(token->id, t.added_tokens_.size());
      t.added_by_content_.emplace(token->content, token->id);
      t.id_limit_ = std::max(t.id_limit_, token->id + 1);
      t.added_tokens_.push_back(std::move(*token));
    }
  }
  std::vector<size_t> raw, normalized;
  for (size_t i = 0; i < t.added_tokens_.size(); ++i) (t.added_tokens_[i].normalized ? normalized : raw).push_back(i);
  t.raw_matcher_.build(t.added_tokens_, raw);
  t.normalized_matcher_.build(t.added_tokens_, normalized);
  return t;
}

void Tokenizer::append_plain_ids(std::string_view text, TextSpan span, bool use_cache, std::vector<int32_t>& ids,
                                 Status& status) const {
  // The regexes see only this segment (Hugging Face pre-tokenizes each piece between added tokens alone).
  const std::string_view segment = text.substr(span.begin, span.size());
  auto pieces = pre_tokenizer_.split(segment);
  if (!pieces.ok()) {
    status = pieces.status();
    return;
  }
  for (const auto& piece : *pieces) {
    const std::string_view bytes = segment.substr(piece.begin, piece.size());
    if (use_cache) {
      bpe_.tokenize_piece(bytes, ids);
    } else {
      bpe_.tokenize_piece_uncached(bytes, ids);
    }
  }
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view input, const EncodeOptions& options) const {
  const std::string text = utf8::sanitize(input);
  std::vector<TextSegment> first, segments;
  raw_matcher_.split(text, {0, text.size()}, options.split_special_tokens, first);
  for (const auto& seg : first) {
    if (seg.token_id >= 0) {
      segments.push_back(seg);
    } else {
      normalized_matcher_.split(text, seg.span, options.split_special_tokens, segments);
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  Status status;
  for (const auto& seg : segments) {
    if (seg.token_id >= 0) {
      ids.push_back(seg.token_id);
    } else {
      append_plain_ids(text, seg.span, options.use_cache, ids, status);
      if (!status.ok()) return status.with_context("tokenizer '" + origin_ + "': encode");
    }
  }
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return bpe_.alphabet().decode_token(added_tokens_[it->second].content);
  }
  const std::string* token = bpe_.id_to_token(id);
  return token ? bpe_.alphabet().decode_token(*token) : std::string();
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return utf8::sanitize(decode_bytes(ids, skip_special_tokens));
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_tokens_[it->second].content;
  if (const std::string* token = bpe_.id_to_token(id)) return *token;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return it->second;
  return bpe_.token_to_id(token);
}

const AddedToken* Tokenizer::added_token(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it == added_by_id_.end() ? nullptr : &added_tokens_[it->second];
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = added_token(id);
  return t && t->special;
}

}  // namespace dsflash
