// libFuzzer target: the HTTP request parsers of both APIs (src/server/openai_request.h, anthropic_request.h) and
// the V4.1 rendering of what they accept. First byte: which parser (chat, completions, messages, count_tokens);
// the rest is the request body. Any input must give a request or a 400, never a crash or an exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/anthropic_request.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsflash::server;
  if (size < 1) return 0;
  const int which = data[0] % 4;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto json = parse_json_object(body);
  if (failed(json)) return 0;
  const dsflash::OrderedJson& value = std::get<dsflash::OrderedJson>(json);
  if (which == 1) {
    (void)parse_openai_completion(value);
    return 0;
  }
  auto chat = which == 0 ? parse_openai_chat(value) : parse_anthropic_messages(value, which == 3);
  if (failed(chat)) return 0;
  auto text = render_chat_request(std::get<ChatRequest>(chat));
  if (!failed(text)) (void)dump_json(dsflash::OrderedJson(std::get<std::string>(text)));
  return 0;
}
