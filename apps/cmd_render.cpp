// dsflash render: OpenAI-style messages -> the V4.1 prompt text (spec: MODEL.md §8).
//   dsflash render --messages-file F [--thinking|--chat] [--effort N|low|high|max] [--tools-file F]
//                  [--no-bos] [--keep-reasoning] [(-m DIR | --tokenizer FILE) --ids]
// The messages file holds a JSON array of messages, or an object {"messages": [...], "tools": [...]}.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"

namespace dsflash::cli {

namespace {

Result<OrderedJson> read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return OrderedJson::parse(ss.str());
  } catch (const OrderedJson::exception& e) {
    return Status::Error("'" + path + "' is not valid JSON: " + e.what());
  }
}

}  // namespace

void add_render_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("render", "Render chat messages into the V4.1 prompt");
  struct Args {
    std::string messages_file, tools_file, effort, model_dir, tokenizer_file;
    bool thinking = false, chat = false, no_bos = false, keep_reasoning = false, ids = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--messages-file", a->messages_file, "JSON array of messages, or {\"messages\", \"tools\"}")
      ->required();
  auto* th = cmd->add_flag("--thinking", a->thinking, "thinking mode (default)");
  auto* ch = cmd->add_flag("--chat", a->chat, "chat mode (no reasoning)");
  th->excludes(ch);
  cmd->add_option("--effort", a->effort, "reasoning effort: 1-100 or low (50), high (75, default), max (100)");
  cmd->add_option("--tools-file", a->tools_file, "JSON array of OpenAI tools");
  cmd->add_flag("--no-bos", a->no_bos, "leave out <｜begin▁of▁sentence｜>");
  cmd->add_flag("--keep-reasoning", a->keep_reasoning, "keep the reasoning of earlier turns");
  auto* m = cmd->add_option("-m,--model", a->model_dir, "checkpoint directory (with --ids)");
  auto* t = cmd->add_option("--tokenizer", a->tokenizer_file, "tokenizer.json (with --ids)");
  m->excludes(t);
  cmd->add_flag("--ids", a->ids, "print the prompt's token ids (JSON) instead of its text");
  cmd->callback([=] {
    auto fail = [&](const std::string& message, int code = 1) {
      std::cerr << "dsflash render: " << message << "\n";
      *exit_code = code;
    };
    auto doc = read_json_file(a->messages_file);
    if (!doc.ok()) return fail(doc.status().message());
    OrderedJson messages = *doc;
    OrderedJson tools;
    if (doc->is_object()) {
      messages = doc->value("messages", OrderedJson());
      tools = doc->value("tools", OrderedJson());
    }
    if (!a->tools_file.empty()) {
      auto t_doc = read_json_file(a->tools_file);
      if (!t_doc.ok()) return fail(t_doc.status().message());
      tools = *t_doc;
    }
    ChatRenderOptions options;
    options.thinking = !a->chat;
    options.add_bos = !a->no_bos;
    options.drop_thinking = !a->keep_reasoning;
    if (!a->effort.empty()) {
      OrderedJson value = a->effort;
      if (a->effort.find_first_not_of("0123456789") == std::string::npos && a->effort.size() <= 4) {
        value = std::stoi(a->effort);
      }
      auto effort = parse_reasoning_effort(value);
      if (!effort.ok()) return fail(effort.status().message(), 2);
      options.reasoning_effort = *effort;
    }
    auto prompt = render_chat_prompt(messages, tools, options);
    if (!prompt.ok()) return fail(a->messages_file + ": " + prompt.status().message());
    if (!a->ids) {
      std::cout << prompt->text;
      return;
    }
    auto tok = !a->tokenizer_file.empty() ? Tokenizer::from_file(a->tokenizer_file)
               : !a->model_dir.empty()    ? Tokenizer::from_model_dir(a->model_dir)
                                          : Result<Tokenizer>(Status::Error("--ids needs -m DIR or --tokenizer FILE"));
    if (!tok.ok()) return fail(tok.status().message());
    auto ids = tok->encode(prompt->text);
    if (!ids.ok()) return fail(ids.status().message());
    std::cout << nlohmann::json(*ids).dump() << "\n";
  });
}

}  // namespace dsflash::cli
