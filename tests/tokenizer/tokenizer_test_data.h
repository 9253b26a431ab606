// Shared fixtures of the tokenizer tests: the V3 and (reconstructed) V4.1 tokenizers of shared/tokenizer/,
// loaded once per test binary, and the goldens under tests/data/tokenizer/.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace dsflash::test {

inline std::string shared_path(const std::string& rel) { return std::string(DSFLASH_SHARED_DIR) + "/" + rel; }
inline std::string data_path(const std::string& rel) {
  return std::string(DSFLASH_SOURCE_DIR) + "/tests/data/tokenizer/" + rel;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline const nlohmann::json& read_json_cached(const std::string& path) {
  static std::map<std::string, nlohmann::json>* cache = new std::map<std::string, nlohmann::json>();
  auto it = cache->find(path);
  if (it == cache->end()) it = cache->emplace(path, nlohmann::json::parse(read_file(path))).first;
  return it->second;
}

inline const Tokenizer& v3_tokenizer() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::from_file(shared_path("tokenizer/deepseek_v3_tokenizer.json"));
    if (!r.ok()) {
      ADD_FAILURE() << r.status().message();
      std::abort();
    }
    return new Tokenizer(std::move(*r));
  }();
  return *t;
}

inline const Tokenizer& v41_tokenizer() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::from_file(shared_path("tokenizer/deepseek_v41_tokenizer.reconstructed.json"));
    if (!r.ok()) {
      ADD_FAILURE() << r.status().message();
      std::abort();
    }
    return new Tokenizer(std::move(*r));
  }();
  return *t;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace dsflash::test
