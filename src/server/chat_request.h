// The API-neutral request both HTTP APIs parse into (OpenAI chat / completions, Anthropic messages), and the
// steps from it to an engine GenerationRequest:
//   ChatRequest --render_chat_request--> prompt text --tokenize--> ids --make_generation_request--> engine.
// Messages are kept in the OpenAI chat shape the V4.1 encoder takes (tokenizer/chat_encoding.h): roles system /
// user / assistant (content, reasoning_content, tool_calls with JSON arguments) / tool (tool_call_id); the
// Anthropic parser converts its content blocks into that shape, so both APIs render the same history the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsflash/engine.h"
#include "server/api_error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/python_json.h"

namespace dsflash::server {

// What one generation asks for, in both APIs.
struct GenerationSettings {
  std::optional<int64_t> max_tokens;  // none: up to the context limit
  SamplingParams sampling;
  std::vector<std::string> stop;      // stop strings
  bool stream = false;
  bool include_usage = false;         // OpenAI stream_options.include_usage
  bool logprobs = false;              // OpenAI logprobs (top_logprobs alternatives each)
  int top_logprobs = 0;
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ChatRequest {
  std::string model;             // as the client named it (echoed back)
  OrderedJson messages = OrderedJson::array();  // OpenAI chat shape
  OrderedJson tools;             // OpenAI tool list after tool_choice (null: none)
  ToolChoice tool_choice = ToolChoice::kAuto;
  ChatRenderOptions render;      // thinking mode + effort
  GenerationSettings generation;
};

struct CompletionRequest {
  std::string model;
  std::string prompt;             // raw prompt text, or
  std::vector<int32_t> prompt_ids;  // token ids
  GenerationSettings generation;
};

// Limits the server applies on top of the engine's.
struct ContextLimits {
  int64_t context_tokens = 0;  // prompt + max_tokens a request may reach (--ctx-size, capped by the engine)
};

// The V4.1 prompt text of a chat request (400 when the encoder refuses the messages).
ApiResult<std::string> render_chat_request(const ChatRequest& request);

// The engine request for `prompt_ids` (400: context too long, or max_tokens beyond the context).
// parse_output stays off: the server parses reasoning and DSML itself (server/generation_output.h).
ApiResult<GenerationRequest> make_generation_request(std::vector<int32_t> prompt_ids,
                                                     const GenerationSettings& settings, const ContextLimits& limits);

// Thinking effort from an API value: 1..100, "low" / "minimal" (50), "medium" / "high" (75), "max" / "xhigh"
// (100). nullopt: not an effort (the caller's 400).
std::optional<int> effort_from_api(const OrderedJson& value);

// tool_choice applied to a tool list (OpenAI shape): none drops the tools from the prompt; a named function keeps
// only that tool (400 if absent); auto and required keep them all (V4.1 has no forced-call mode: required is not
// enforced).
ApiResult<OrderedJson> apply_tool_choice(const OrderedJson& tools, ToolChoice choice, const std::string& name);

}  // namespace dsflash::server
