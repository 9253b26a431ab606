// dsflash tokenize / detokenize: text <-> token ids with a checkpoint's tokenizer.json (spec: MODEL.md §8).
//   dsflash tokenize (-m DIR | --tokenizer FILE) (--text T | --text-file F) [--split-special]  -> [ids]
//   dsflash detokenize (-m DIR | --tokenizer FILE) (--ids "1,2" | --ids-file F) [--skip-special] -> text
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "tokenizer/tokenizer.h"

namespace dsflash::cli {

namespace {

Result<std::string> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TokenizerSource {
  std::string model_dir;
  std::string tokenizer_file;
};

void add_tokenizer_options(CLI::App* cmd, TokenizerSource& src) {
  auto* m = cmd->add_option("-m,--model", src.model_dir, "checkpoint directory holding tokenizer.json");
  auto* t = cmd->add_option("--tokenizer", src.tokenizer_file, "a tokenizer.json file");
  m->excludes(t);
}

Result<Tokenizer> load_tokenizer(const TokenizerSource& src) {
  if (!src.tokenizer_file.empty()) return Tokenizer::from_file(src.tokenizer_file);
  if (!src.model_dir.empty()) return Tokenizer::from_model_dir(src.model_dir);
  return Status::Error("give -m DIR or --tokenizer FILE");
}

// "[1, 2, 3]" (JSON) or "1,2,3" / "1 2 3".
Result<std::vector<int32_t>> parse_ids(const std::string& text, const std::string& origin) {
  std::vector<int32_t> ids;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    try {
      for (const auto& v : nlohmann::json::parse(text)) {
        if (!v.is_number_integer()) return Status::Error(origin + ": ids must be integers");
        ids.push_back(v.get<int32_t>());
      }
    } catch (const nlohmann::json::exception& e) {
      return Status::Error(origin + ": not a JSON array of ids: " + e.what());
    }
    return ids;
  }
  std::string token;
  std::stringstream ss(text);
  while (ss >> token) {
    std::stringstream parts(token);
    std::string part;
    while (std::getline(parts, part, ',')) {
      if (part.empty()) continue;
      try {
        size_t used = 0;
        const long v = std::stol(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
        ids.push_back(static_cast<int32_t>(v));
      } catch (const std::exception&) {
        return Status::Error(origin + ": '" + part + "' is not a token id");
      }
    }
  }
  return ids;
}

}  // namespace

void add_tokenize_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("tokenize", "Text -> token ids (JSON array), as Hugging Face tokenizers gives");
  auto src = std::make_shared<TokenizerSource>();
  auto text = std::make_shared<std::string>();
  auto text_file = std::make_shared<std::string>();
  auto split_special = std::make_shared<bool>(false);
  add_tokenizer_options(cmd, *src);
  auto* t = cmd->add_option("--text", *text, "the text");
  auto* f = cmd->add_option("--text-file", *text_file, "file holding the text (bytes as they are)");
  t->excludes(f);
  cmd->add_flag("--split-special", *split_special, "treat special tokens in the text as plain text");
  cmd->callback([=] {
    auto tok = load_tokenizer(*src);
    if (!tok.ok()) {
      std::cerr << "dsflash tokenize: " << tok.status().message() << "\n";
      *exit_code = 1;
      return;
    }
    std::string input = *text;
    if (!text_file->empty()) {
      auto content = read_whole_file(*text_file);
      if (!content.ok()) {
        std::cerr << "dsflash tokenize: " << content.status().message() << "\n";
        *exit_code = 1;
        return;
      }
      input = std::move(*content);
    } else if (t->count() == 0) {
      std::cerr << "dsflash tokenize: give --text or --text-file\n";
      *exit_code = 2;
      return;
    }
    EncodeOptions options;
    options.split_special_tokens = *split_special;
    auto ids = tok->encode(input, options);
    if (!ids.ok()) {
      std::cerr << "dsflash tokenize: " << ids.status().message() << "\n";
      *exit_code = 1;
      return;
    }
    std::cout << nlohmann::json(*ids).dump() << "\n";
  });
}

void add_detokenize_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("detokenize", "Token ids -> text");
  auto src = std::make_shared<TokenizerSource>();
  auto ids_text = std::make_shared<std::string>();
  auto ids_file = std::make_shared<std::string>();
  auto skip_special = std::make_shared<bool>(false);
  add_tokenizer_options(cmd, *src);
  auto* i = cmd->add_option("--ids", *ids_text, "ids: JSON array or comma/space separated");
  auto* f = cmd->add_option("--ids-file", *ids_file, "file holding the ids");
  i->excludes(f);
  cmd->add_flag("--skip-special", *skip_special, "leave out special tokens");
  cmd->callback([=] {
    auto tok = load_tokenizer(*src);
    if (!tok.ok()) {
      std::cerr << "dsflash detokenize: " << tok.status().message() << "\n";
      *exit_code = 1;
      return;
    }
    std::string text = *ids_text;
    std::string origin = "--ids";
    if (!ids_file->empty()) {
      auto content = read_whole_file(*ids_file);
      if (!content.ok()) {
        std::cerr << "dsflash detokenize: " << content.status().message() << "\n";
        *exit_code = 1;
        return;
      }
      text = std::move(*content);
      origin = *ids_file;
    } else if (i->count() == 0) {
      std::cerr << "dsflash detokenize: give --ids or --ids-file\n";
      *exit_code = 2;
      return;
    }
    auto ids = parse_ids(text, origin);
    if (!ids.ok()) {
      std::cerr << "dsflash detokenize: " << ids.status().message() << "\n";
      *exit_code = 1;
      return;
    }
    for (int32_t id : *ids) {
      if (id < 0 || id >= tok->id_limit() || !tok->id_to_token(id)) {
        std::cerr << "dsflash detokenize: id " << id << " is not in the tokenizer (ids 0.." << tok->id_limit() - 1
                  << ")\n";
        *exit_code = 1;
        return;
      }
    }
    std::cout << tok->decode(*ids, *skip_special);
  });
}

}  // namespace dsflash::cli
