// libFuzzer target: the streaming output parser on arbitrary text.
// Invariants: never crashes; feeding the text in chunks gives what feeding it whole gives; every tool call's
// arguments are a valid JSON object; well-formed parses (not malformed) never put a DSML tag into content.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/output_parser.h"

namespace {

dsflash::ParsedOutput run(const std::string& text, bool thinking, size_t chunk) {
  dsflash::OutputParser parser(thinking);
  dsflash::ParsedOutput r;
  auto take = [&](const std::vector<dsflash::OutputEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == dsflash::OutputEvent::Kind::kReasoning) r.reasoning += e.text;
      if (e.kind == dsflash::OutputEvent::Kind::kContent) r.content += e.text;
      if (e.kind == dsflash::OutputEvent::Kind::kToolCall) r.tool_calls.push_back(e.call);
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) take(parser.push(text.substr(i, chunk)));
  take(parser.finish());
  r.malformed = parser.malformed();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool thinking = data[0] & 1;
  const size_t chunk = 1 + (data[0] >> 1) % 9;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto whole = dsflash::parse_output(text, thinking);
  const auto chunked = run(text, thinking, chunk);
  bool same = whole.reasoning == chunked.reasoning && whole.content == chunked.content &&
              whole.malformed == chunked.malformed && whole.tool_calls.size() == chunked.tool_calls.size();
  for (size_t i = 0; same && i < whole.tool_calls.size(); ++i) {
    same = whole.tool_calls[i].name == chunked.tool_calls[i].name &&
           whole.tool_calls[i].arguments == chunked.tool_calls[i].arguments;
  }
  if (!same) {
    std::fprintf(stderr, "chunked parse differs from whole parse (chunk %zu)\n", chunk);
    std::abort();
  }
  for (const auto& call : whole.tool_calls) {
    // nlohmann's lexer stops at a NUL byte, so a NUL would pass accept(): check for it separately.
    if (call.arguments.find('\0') != std::string::npos || !nlohmann::json::accept(call.arguments) ||
        !nlohmann::json::parse(call.arguments).is_object()) {
      std::fprintf(stderr, "tool call arguments are not a JSON object: %s\n", call.arguments.c_str());
      std::abort();
    }
  }
  if (!whole.malformed && whole.content.find("<｜DSML｜ calls>") != std::string::npos) {
    std::fprintf(stderr, "DSML calls tag in content without a malformed flag\n");
    std::abort();
  }
  return 0;
}
