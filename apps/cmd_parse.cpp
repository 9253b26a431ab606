// dsflash parse: generated V4.1 text -> reasoning, content and OpenAI tool calls as JSON (spec: MODEL.md §8).
//   dsflash parse --text-file F [--chat]
// Thinking mode (the default) means the text starts inside the reasoning (the prompt ended with <think>).
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/python_json.h"

namespace dsflash::cli {

void add_parse_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("parse", "Parse generated text into reasoning, content and tool calls (JSON)");
  auto text_file = std::make_shared<std::string>();
  auto chat = std::make_shared<bool>(false);
  cmd->add_option("--text-file", *text_file, "file holding the generated text")->required();
  cmd->add_flag("--chat", *chat, "chat mode: the text has no reasoning part");
  cmd->callback([=] {
    std::ifstream in(*text_file, std::ios::binary);
    if (!in) {
      std::cerr << "dsflash parse: cannot open '" << *text_file << "'\n";
      *exit_code = 1;
      return;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    OutputParser parser(!*chat);
    std::vector<OutputEvent> events = parser.push(ss.str());
    for (auto& e : parser.finish()) events.push_back(std::move(e));
    OrderedJson result = {{"reasoning_content", ""}, {"content", ""}, {"tool_calls", OrderedJson::array()}};
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kReasoning) result["reasoning_content"] = result["reasoning_content"].get<std::string>() + e.text;
      if (e.kind == OutputEvent::Kind::kContent) result["content"] = result["content"].get<std::string>() + e.text;
      if (e.kind == OutputEvent::Kind::kToolCall) {
        result["tool_calls"].push_back({{"id", "call_" + std::to_string(e.call.index)},
                                        {"type", "function"},
                                        {"function", {{"name", e.call.name}, {"arguments", e.call.arguments}}}});
      }
    }
    result["finished"] = parser.saw_end_of_sentence();
    result["malformed"] = parser.malformed();
    result["problems"] = parser.problems();
    // Generated text may hold ill-formed UTF-8: replace it rather than fail the dump.
    std::cout << result.dump(2, ' ', false, OrderedJson::error_handler_t::replace) << "\n";
  });
}

}  // namespace dsflash::cli
