#include "server/openai_request.h"

#include "server/json_fields.h"

namespace dsflash::server {
namespace {

constexpr int64_t kMaxStopStrings = 16;

// Sampling and stopping fields shared by chat and completions.
void read_generation(FieldReader& r, GenerationSettings& g) {
  SamplingParams& s = g.sampling;
  s.temperature = static_cast<float>(r.number("temperature", 0.0, 2.0).value_or(1.0));
  s.top_p = static_cast<float>(r.number("top_p", 0.0, 1.0).value_or(1.0));
  if (s.top_p <= 0.0f && !r.error()) r.fail("top_p must be > 0");
  s.top_k = static_cast<int>(r.integer("top_k", 0, 1 << 30).value_or(0));
  s.min_p = static_cast<float>(r.number("min_p", 0.0, 1.0).value_or(0.0));
  s.seed = static_cast<uint64_t>(r.integer("seed", INT64_MIN, INT64_MAX).value_or(0));
  s.presence_penalty = static_cast<float>(r.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = static_cast<float>(r.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  s.repetition_penalty = static_cast<float>(r.number("repetition_penalty", 0.01, 10.0).value_or(1.0));
  if (auto m = r.integer("max_completion_tokens", 1, INT64_MAX)) g.max_tokens = m;
  if (auto m = r.integer("max_tokens", 1, INT64_MAX); m && !g.max_tokens) g.max_tokens = m;
  if (auto n = r.integer("n", 1, 1); !n && r.has("n") && !r.error()) r.fail("n must be 1");
  g.stream = r.boolean("stream").value_or(false);
  if (const OrderedJson* options = r.object("stream_options")) {
    FieldReader o(*options, "stream_options");
    g.include_usage = o.boolean("include_usage").value_or(false);
    if (o.error()) r.fail(o.error()->message);
  }
  if (const OrderedJson* stop = r.value("stop")) {
    if (stop->is_string()) {
      g.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && static_cast<int64_t>(stop->size()) <= kMaxStopStrings) {
      for (const auto& item : *stop) {
        if (!item.is_string()) {
          r.fail("stop must be a string or an array of strings");
          break;
        }
        g.stop.push_back(item.get<std::string>());
      }
    } else {
      r.fail("stop must be a string or an array of at most " + std::to_string(kMaxStopStrings) + " strings");
    }
    for (const std::string& s : g.stop) {
      if (s.empty()) r.fail("stop strings must not be empty");
    }
  }
}

// One content part list: text parts only (images and audio are refused).
ApiResult<OrderedJson> read_parts(const OrderedJson& parts, const std::string& where) {
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const OrderedJson& part = parts[i];
    if (!part.is_object()) return bad_request(at + " must be an object");
    FieldReader r(part, at);
    const std::string type = r.string("type", true).value_or("");
    if (r.error()) return *r.error();
    if (type == "image_url" || type == "input_image" || type == "image") {
      return bad_request(at + ": image input is not supported (no vision yet)", "unsupported_content");
    }
    if (type != "text") return bad_request(at + ": unsupported content part type '" + type + "'");
    const std::string text = r.string("text", true).value_or("");
    if (r.error()) return *r.error();
    out.push_back(OrderedJson{{"type", "text"}, {"text", text}});
  }
  return out;
}

ApiResult<OrderedJson> read_tool_calls(const OrderedJson& calls, const std::string& where) {
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!calls[i].is_object()) return bad_request(at + " must be an object");
    FieldReader r(calls[i], at);
    const std::string id = r.string("id").value_or("");
    const OrderedJson* function = r.object("function", true);
    if (r.error()) return *r.error();
    FieldReader f(*function, at + ".function");
    const std::string name = f.string("name", true).value_or("");
    const OrderedJson* arguments = f.value("arguments");
    if (f.error()) return *f.error();
    OrderedJson args = arguments == nullptr ? OrderedJson("{}") : *arguments;
    if (!args.is_string() && !args.is_object()) return bad_request(at + ".function.arguments must be a JSON string");
    out.push_back(OrderedJson{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
  }
  return out;
}

ApiResult<OrderedJson> read_message(const OrderedJson& message, const std::string& at) {
  if (!message.is_object()) return bad_request(at + " must be an object");
  FieldReader r(message, at);
  const std::string role = r.string("role", true).value_or("");
  if (r.error()) return *r.error();
  if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
    return bad_request(at + ".role '" + role + "' is not one of system, developer, user, assistant, tool");
  }
  OrderedJson out = {{"role", role}};
  const OrderedJson* content = r.value("content");
  if (content != nullptr) {
    if (content->is_string()) {
      out["content"] = *content;
    } else if (content->is_array()) {
      auto parts = read_parts(*content, at + ".content");
      if (failed(parts)) return std::get<ApiError>(parts);
      out["content"] = std::move(std::get<OrderedJson>(parts));
    } else {
      return bad_request(at + ".content must be a string or an array of content parts");
    }
  }
  if (role == "assistant") {
    if (auto reasoning = r.string("reasoning_content")) out["reasoning_content"] = *reasoning;
    if (const OrderedJson* calls = r.array("tool_calls"); calls != nullptr && !calls->empty()) {
      auto read = read_tool_calls(*calls, at + ".tool_calls");
      if (failed(read)) return std::get<ApiError>(read);
      out["tool_calls"] = std::move(std::get<OrderedJson>(read));
    }
    if (content == nullptr && !out.contains("tool_calls") && !out.contains("reasoning_content")) {
      return bad_request(at + ": an assistant message needs content or tool_calls");
    }
  } else if (content == nullptr) {
    return bad_request(at + ".content is required for a " + role + " message");
  }
  if (role == "tool") out["tool_call_id"] = r.string("tool_call_id").value_or("");
  if (r.error()) return *r.error();
  return out;
}

ApiResult<OrderedJson> read_tools(const OrderedJson& tools) {
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) return bad_request(at + " must be an object");
    FieldReader r(tools[i], at);
    const std::string type = r.string("type").value_or("function");
    const OrderedJson* function = r.object("function", true);
    if (r.error()) return *r.error();
    if (type != "function") return bad_request(at + ".type must be \"function\"");
    FieldReader f(*function, at + ".function");
    (void)f.string("name", true);
    (void)f.string("description");
    (void)f.object("parameters");
    if (f.error()) return *f.error();
    out.push_back(OrderedJson{{"type", "function"}, {"function", *function}});
  }
  return out;
}

// Thinking mode and effort: thinking {"type"}, chat_template_kwargs {thinking, reasoning_effort},
// reasoning_effort ("none" turns thinking off).
void read_thinking(FieldReader& r, ChatRenderOptions& render) {
  if (const OrderedJson* thinking = r.object("thinking")) {
    FieldReader t(*thinking, "thinking");
    const std::string type = t.string("type", true).value_or("");
    if (t.error()) return r.fail(t.error()->message);
    if (type == "enabled") {
      render.thinking = true;
    } else if (type == "disabled") {
      render.thinking = false;
    } else {
      return r.fail("thinking.type must be \"enabled\" or \"disabled\"");
    }
  }
  if (const OrderedJson* kwargs = r.object("chat_template_kwargs")) {
    FieldReader k(*kwargs, "chat_template_kwargs");
    if (auto on = k.boolean("thinking")) render.thinking = *on;
    if (auto on = k.boolean("enable_thinking")) render.thinking = *on;
    if (const OrderedJson* effort = k.value("reasoning_effort")) {
      auto e = effort_from_api(*effort);
      if (!e) return r.fail("chat_template_kwargs.reasoning_effort must be low, medium, high, max or 1..100");
      render.reasoning_effort = *e;
    }
    if (k.error()) return r.fail(k.error()->message);
  }
  if (const OrderedJson* effort = r.value("reasoning_effort")) {
    if (*effort == "none") {
      render.thinking = false;
      return;
    }
    auto e = effort_from_api(*effort);
    if (!e) return r.fail("reasoning_effort must be none, minimal, low, medium, high, xhigh, max or 1..100");
    render.reasoning_effort = *e;
  }
}

}  // namespace

ApiResult<ChatRequest> parse_openai_chat(const OrderedJson& body) {
  ChatRequest out;
  FieldReader r(body, "");
  out.model = r.string("model", true).value_or("");
  const OrderedJson* messages = r.array("messages", true);
  if (r.error()) return *r.error();
  if (messages->empty()) return bad_request("messages must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) {
    auto m = read_message((*messages)[i], "messages[" + std::to_string(i) + "]");
    if (failed(m)) return std::get<ApiError>(m);
    out.messages.push_back(std::move(std::get<OrderedJson>(m)));
  }
  OrderedJson tools;
  if (const OrderedJson* t = r.array("tools"); t != nullptr && !t->empty()) {
    auto read = read_tools(*t);
    if (failed(read)) return std::get<ApiError>(read);
    tools = std::move(std::get<OrderedJson>(read));
  }
  std::string named;
  if (const OrderedJson* choice = r.value("tool_choice")) {
    if (*choice == "auto") {
      out.tool_choice = ToolChoice::kAuto;
    } else if (*choice == "none") {
      out.tool_choice = ToolChoice::kNone;
    } else if (*choice == "required") {
      out.tool_choice = ToolChoice::kRequired;
    } else if (choice->is_object() && choice->contains("function") && (*choice)["function"].is_object() &&
               (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
      out.tool_choice = ToolChoice::kNamed;
      named = (*choice)["function"]["name"].get<std::string>();
    } else {
      r.fail("tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
    }
  }
  read_thinking(r, out.render);
  read_generation(r, out.generation);
  if (r.has("logprobs")) out.generation.logprobs = r.boolean("logprobs").value_or(false);
  out.generation.top_logprobs = static_cast<int>(r.integer("top_logprobs", 0, kMaxTopLogprobs).value_or(0));
  if (out.generation.top_logprobs > 0 && !out.generation.logprobs && !r.error()) {
    r.fail("top_logprobs needs logprobs: true");
  }
  if (r.error()) return *r.error();
  auto chosen = apply_tool_choice(tools, out.tool_choice, named);
  if (failed(chosen)) return std::get<ApiError>(chosen);
  out.tools = std::move(std::get<OrderedJson>(chosen));
  return out;
}

ApiResult<CompletionRequest> parse_openai_completion(const OrderedJson& body) {
  CompletionRequest out;
  FieldReader r(body, "");
  out.model = r.string("model", true).value_or("");
  const OrderedJson* prompt = r.value("prompt");
  if (!r.error() && prompt == nullptr) r.fail("prompt is required (a string or an array of token ids)");
  if (r.error()) return *r.error();
  if (prompt->is_string()) {
    out.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    out.prompt = (*prompt)[0].get<std::string>();
  } else if (prompt->is_array()) {
    for (const auto& id : *prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return bad_request("prompt must be a string or an array of token ids (one prompt only)");
      }
      out.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    return bad_request("prompt must be a string or an array of token ids");
  }
  if (out.prompt.empty() && out.prompt_ids.empty()) return bad_request("prompt must not be empty");
  read_generation(r, out.generation);
  if (!out.generation.max_tokens) out.generation.max_tokens = 16;  // the completions API's default
  if (auto lp = r.integer("logprobs", 0, kMaxTopLogprobs)) {
    out.generation.logprobs = *lp > 0;
    out.generation.top_logprobs = static_cast<int>(*lp);
  }
  if (r.error()) return *r.error();
  return out;
}

}  // namespace dsflash::server
