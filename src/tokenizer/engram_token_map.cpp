// Engram compressed token map (spec/MODEL.md §4.8, official engram.py build_compressed_token_map), with the
// Hugging Face ByteLevel decoder and normalizers reproduced on utf8proc.
#include "tokenizer/engram_token_map.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

namespace dsflash {

namespace {

// GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes take the
// code points 256, 257, ... in byte order. Returns the inverse (code point -> byte), -1 where none.
const std::array<int, 324>& unicode_to_byte() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[static_cast<size_t>(printable ? b : next++)] = b;
    }
    return t;
  }();
  return table;
}

// Next code point of valid UTF-8 starting at s[*pos] (advances *pos), -1 on an invalid sequence
// (overlong, surrogate, beyond U+10FFFF, truncated): the rules of Rust's str::from_utf8.
int32_t next_code_point(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const size_t i = *pos;
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  int len = 0;
  int32_t cp = 0;
  uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    len = 2, cp = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    len = 3, cp = b0 & 0x0f;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    len = 4, cp = b0 & 0x07;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return -1;
  }
  if (i + static_cast<size_t>(len) > s.size()) return -1;
  for (int k = 1; k < len; ++k) {
    const uint8_t b = byte(i + static_cast<size_t>(k));
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return -1;
    cp = (cp << 6) | (b & 0x3f);
  }
  *pos = i + static_cast<size_t>(len);
  return cp;
}

bool decode_utf8(std::string_view s, std::vector<int32_t>* out) {
  out->clear();
  size_t pos = 0;
  while (pos < s.size()) {
    const int32_t cp = next_code_point(s, &pos);
    if (cp < 0) return false;
    out->push_back(cp);
  }
  return true;
}

void append_utf8(int32_t cp, std::string* out) {
  uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string encode_utf8(const std::vector<int32_t>& cps) {
  std::string s;
  for (int32_t cp : cps) append_utf8(cp, &s);
  return s;
}

// utf8proc_map on a valid UTF-8 string (NUL bytes allowed: length-based, no NULLTERM).
std::string utf8proc_transform(const std::string& s, int options) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    std::free(dst);
    return s;  // cannot happen for valid UTF-8; leave the text as it is
  }
  std::string result(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return result;
}

// Rust char::is_whitespace (Unicode White_Space), which HF's Strip uses.
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_mark(int32_t c) {
  const utf8proc_category_t cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

constexpr int32_t kSentinel = 0xe000;  // private use: lets a lone " " survive Strip (engram.py)
constexpr std::string_view kReplacementChar = "\xef\xbf\xbd";

}  // namespace

std::string EngramTokenMap::byte_level_decode(std::string_view token) {
  std::vector<int32_t> cps;
  if (!decode_utf8(token, &cps)) return std::string(token);
  const auto& table = unicode_to_byte();
  std::string bytes;
  bytes.reserve(cps.size());
  for (int32_t cp : cps) {
    const int b = (cp >= 0 && cp < static_cast<int32_t>(table.size())) ? table[static_cast<size_t>(cp)] : -1;
    if (b < 0) return std::string(token);  // any char outside the table: the token's own UTF-8 bytes
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

std::string EngramTokenMap::normalize(std::string_view text) {
  // NFKC then NFD (the composition in between is undone again, but both steps are the official ones).
  const std::string nfkc =
      utf8proc_transform(std::string(text), UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  const std::string nfd = utf8proc_transform(nfkc, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  std::vector<int32_t> cps;
  if (!decode_utf8(nfd, &cps)) return nfd;

  // StripAccents (drop every General_Category M*), Lowercase, [ \t\r\n]+ -> " ".
  std::vector<int32_t> out;
  out.reserve(cps.size());
  bool in_space_run = false;
  for (int32_t c : cps) {
    if (is_mark(c)) continue;
    c = utf8proc_tolower(c);
    const bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (space) {
      if (!in_space_run) out.push_back(' ');
      in_space_run = true;
      continue;
    }
    in_space_run = false;
    out.push_back(c);
  }
  // Replace(^ $ -> sentinel), Strip (White_Space both ends), Replace(sentinel -> " ").
  if (out.size() == 1 && out[0] == ' ') out[0] = kSentinel;
  size_t begin = 0, end = out.size();
  while (begin < end && is_white_space(out[begin])) ++begin;
  while (end > begin && is_white_space(out[end - 1])) --end;
  std::vector<int32_t> stripped(out.begin() + static_cast<std::ptrdiff_t>(begin),
                                out.begin() + static_cast<std::ptrdiff_t>(end));
  for (auto& c : stripped) {
    if (c == kSentinel) c = ' ';
  }
  return encode_utf8(stripped);
}

std::string EngramTokenMap::key_of(std::string_view token_string, bool defined) {
  if (!defined) return std::string();  // the decoder skips unknown ids: "" normalises to "", key ""
  const std::string text = byte_level_decode(token_string);
  std::vector<int32_t> cps;
  // from_utf8_lossy puts U+FFFD where the bytes are not UTF-8; either way the text holds a U+FFFD.
  if (!decode_utf8(text, &cps) || text.find(kReplacementChar) != std::string::npos) {
    return std::string(token_string);
  }
  std::string normalized = normalize(text);
  return normalized.empty() ? text : normalized;
}

EngramTokenMap EngramTokenMap::from_token_strings(const std::vector<std::string>& token_strings,
                                                  const std::vector<bool>& defined) {
  EngramTokenMap map;
  std::unordered_map<std::string, int32_t> key_to_id;
  map.ids_.resize(token_strings.size());
  for (size_t i = 0; i < token_strings.size(); ++i) {
    const bool is_defined = i < defined.size() ? defined[i] : true;
    const std::string key = key_of(token_strings[i], is_defined);
    const auto [it, inserted] = key_to_id.try_emplace(key, static_cast<int32_t>(key_to_id.size()));
    map.ids_[i] = it->second;
  }
  map.compressed_vocab_size_ = static_cast<int64_t>(key_to_id.size());
  return map;
}

Result<EngramTokenMap> EngramTokenMap::from_tokenizer_json_text(const std::string& json_text,
                                                                const std::string& origin, int64_t num_ids) {
  const std::string where = "Engram token map from " + origin + ": ";
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    return Status::Error(where + "invalid JSON: " + e.what());
  }
  // id -> token string; added tokens take precedence over the model vocab (as the Rust decoder looks them up).
  std::unordered_map<int64_t, std::string> by_id;
  try {
    const auto model = root.find("model");
    if (model == root.end() || !model->is_object()) return Status::Error(where + "no \"model\" object");
    const auto vocab = model->find("vocab");
    if (vocab == model->end() || !vocab->is_object()) return Status::Error(where + "no \"model.vocab\" object");
    for (const auto& [token, id] : vocab->items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return Status::Error(where + "model.vocab[\"" + token + "\"] is not a non-negative integer id");
      }
      by_id[id.get<int64_t>()] = token;
    }
    if (const auto added = root.find("added_tokens"); added != root.end() && !added->is_null()) {
      if (!added->is_array()) return Status::Error(where + "\"added_tokens\" is not an array");
      for (size_t i = 0; i < added->size(); ++i) {
        const auto& entry = (*added)[i];
        if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
            entry["id"].get<int64_t>() < 0 || !entry.contains("content") || !entry["content"].is_string()) {
          return Status::Error(where + "added_tokens[" + std::to_string(i) + "] lacks an integer id or content");
        }
        by_id[entry["id"].get<int64_t>()] = entry["content"].get<std::string>();
      }
    }
  } catch (const std::exception& e) {
    return Status::Error(where + e.what());
  }
  if (num_ids <= 0) num_ids = static_cast<int64_t>(by_id.size());  // len(tokenizer): distinct ids
  constexpr int64_t kMaxIds = int64_t{1} << 26;
  if (num_ids > kMaxIds) return Status::Error(where + "num_ids " + std::to_string(num_ids) + " is implausible");
  std::vector<std::string> strings(static_cast<size_t>(num_ids));
  std::vector<bool> defined(static_cast<size_t>(num_ids), false);
  for (auto& [id, token] : by_id) {
    if (id < num_ids) {
      strings[static_cast<size_t>(id)] = std::move(token);
      defined[static_cast<size_t>(id)] = true;
    }
  }
  return from_token_strings(strings, defined);
}

Result<EngramTokenMap> EngramTokenMap::from_tokenizer_json(const std::string& path, int64_t num_ids) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("Engram token map: cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Error("Engram token map: error reading " + path);
  return from_tokenizer_json_text(text.str(), path, num_ids);
}

}  // namespace dsflash
