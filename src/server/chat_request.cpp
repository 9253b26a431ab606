#include "server/chat_request.h"

#include <algorithm>

namespace dsflash::server {

ApiResult<std::string> render_chat_request(const ChatRequest& request) {
  auto rendered = render_chat_prompt(request.messages, request.tools, request.render);
  if (!rendered.ok()) return bad_request("messages: " + rendered.status().message());
  if (!rendered->images.empty()) return bad_request("image input is not supported (no vision yet)", "unsupported_content");
  return std::move(rendered->text);
}

ApiResult<GenerationRequest> make_generation_request(std::vector<int32_t> prompt_ids,
                                                     const GenerationSettings& settings, const ContextLimits& limits) {
  const int64_t prompt = static_cast<int64_t>(prompt_ids.size());
  if (prompt == 0) return bad_request("the prompt is empty");
  if (prompt >= limits.context_tokens) {
    return bad_request("the prompt has " + std::to_string(prompt) + " tokens; the context holds " +
                           std::to_string(limits.context_tokens) + " (prompt + at least one generated token)",
                       "context_length_exceeded");
  }
  const int64_t room = limits.context_tokens - prompt;
  if (settings.max_tokens && *settings.max_tokens > room) {
    return bad_request("max_tokens " + std::to_string(*settings.max_tokens) + " + the prompt's " +
                           std::to_string(prompt) + " tokens exceed the context of " +
                           std::to_string(limits.context_tokens) + " tokens",
                       "context_length_exceeded");
  }
  GenerationRequest out;
  out.prompt_ids = std::move(prompt_ids);
  out.max_tokens = settings.max_tokens.value_or(room);
  out.sampling = settings.sampling;
  if (settings.logprobs) out.sampling.top_logprobs = std::max(1, settings.top_logprobs);
  out.stop_strings = settings.stop;
  out.detokenize = true;
  out.parse_output = false;
  return out;
}

std::optional<int> effort_from_api(const OrderedJson& value) {
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (s == "low" || s == "minimal") return 50;
    if (s == "medium" || s == "high") return 75;
    if (s == "max" || s == "xhigh") return 100;
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 1 && v <= 100) return static_cast<int>(v);
  }
  return std::nullopt;
}

ApiResult<OrderedJson> apply_tool_choice(const OrderedJson& tools, ToolChoice choice, const std::string& name) {
  if (!tools.is_array() || tools.empty()) {
    if (choice == ToolChoice::kRequired || choice == ToolChoice::kNamed) {
      return bad_request("tool_choice asks for a tool call but no tools are given");
    }
    return OrderedJson();
  }
  if (choice == ToolChoice::kNone) return OrderedJson();
  if (choice != ToolChoice::kNamed) return tools;
  for (const auto& tool : tools) {
    if (tool["function"]["name"] == name) return OrderedJson::array({tool});
  }
  return bad_request("tool_choice names the function '" + name + "', which is not in tools");
}

}  // namespace dsflash::server
