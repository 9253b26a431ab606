#include "server/anthropic_request.h"

#include "server/json_fields.h"

namespace dsflash::server {
namespace {

constexpr int64_t kMaxStopSequences = 16;

// Text of a string or of a list of text blocks (system, tool_result content), joined by blank lines.
ApiResult<std::string> text_of(const OrderedJson& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) return bad_request(where + " must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    FieldReader r(value[i], at);
    if (!value[i].is_object()) return bad_request(at + " must be an object");
    const std::string type = r.string("type", true).value_or("");
    if (r.error()) return *r.error();
    if (type == "image" || type == "document") {
      return bad_request(at + ": " + type + " input is not supported (no vision yet)", "unsupported_content");
    }
    if (type != "text") return bad_request(at + ": expected a text block, got '" + type + "'");
    const std::string text = r.string("text", true).value_or("");
    if (r.error()) return *r.error();
    if (!out.empty()) out += "\n\n";
    out += text;
  }
  return out;
}

// One Anthropic message -> one or more OpenAI-shaped messages appended to `out`.
std::optional<ApiError> read_message(const OrderedJson& message, const std::string& at, OrderedJson& out) {
  if (!message.is_object()) return bad_request(at + " must be an object");
  FieldReader r(message, at);
  const std::string role = r.string("role", true).value_or("");
  const OrderedJson* content = r.value("content");
  if (r.error()) return *r.error();
  if (role != "user" && role != "assistant") return bad_request(at + ".role '" + role + "' must be user or assistant");
  if (content == nullptr) return bad_request(at + ".content is required");
  if (content->is_string()) {
    out.push_back(OrderedJson{{"role", role}, {"content", *content}});
    return std::nullopt;
  }
  if (!content->is_array()) return bad_request(at + ".content must be a string or an array of content blocks");
  if (content->empty()) return bad_request(at + ".content must not be empty");
  std::string text, thinking;
  bool has_text = false, has_thinking = false;
  OrderedJson calls = OrderedJson::array();
  OrderedJson results = OrderedJson::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string bat = at + ".content[" + std::to_string(i) + "]";
    const OrderedJson& block = (*content)[i];
    if (!block.is_object()) return bad_request(bat + " must be an object");
    FieldReader b(block, bat);
    const std::string type = b.string("type", true).value_or("");
    if (b.error()) return *b.error();
    if (type == "text") {
      const std::string t = b.string("text", true).value_or("");
      if (b.error()) return *b.error();
      if (has_text) text += "\n\n";
      text += t;
      has_text = true;
    } else if (type == "image" || type == "document") {
      return bad_request(bat + ": " + type + " input is not supported (no vision yet)", "unsupported_content");
    } else if (type == "thinking" && role == "assistant") {
      thinking += b.string("thinking", true).value_or("");
      (void)b.string("signature");
      has_thinking = true;
    } else if (type == "redacted_thinking" && role == "assistant") {
      continue;  // opaque to us
    } else if (type == "tool_use" && role == "assistant") {
      const std::string id = b.string("id", true).value_or("");
      const std::string name = b.string("name", true).value_or("");
      const OrderedJson* input = b.object("input");
      if (b.error()) return *b.error();
      calls.push_back(OrderedJson{{"id", id},
                                  {"type", "function"},
                                  {"function", {{"name", name}, {"arguments", input ? *input : OrderedJson::object()}}}});
    } else if (type == "tool_result" && role == "user") {
      const std::string id = b.string("tool_use_id", true).value_or("");
      (void)b.boolean("is_error");
      if (b.error()) return *b.error();
      std::string result;
      if (const OrderedJson* c = b.value("content")) {
        auto t = text_of(*c, bat + ".content");
        if (failed(t)) return std::get<ApiError>(t);
        result = std::move(std::get<std::string>(t));
      }
      results.push_back(OrderedJson{{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else {
      return bad_request(bat + ": content block type '" + type + "' is not accepted in a " + role + " message");
    }
    if (b.error()) return *b.error();
  }
  if (role == "assistant") {
    OrderedJson m = {{"role", "assistant"}, {"content", text}};
    if (has_thinking) m["reasoning_content"] = thinking;
    if (!calls.empty()) m["tool_calls"] = std::move(calls);
    out.push_back(std::move(m));
    return std::nullopt;
  }
  for (auto& result : results) out.push_back(std::move(result));
  if (has_text || results.empty()) out.push_back(OrderedJson{{"role", "user"}, {"content", text}});
  return std::nullopt;
}

ApiResult<OrderedJson> read_tools(const OrderedJson& tools) {
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) return bad_request(at + " must be an object");
    FieldReader r(tools[i], at);
    const std::string name = r.string("name", true).value_or("");
    const std::optional<std::string> description = r.string("description");
    const OrderedJson* schema = r.object("input_schema", true);
    if (r.error()) return *r.error();
    OrderedJson function = {{"name", name}};
    if (description) function["description"] = *description;
    function["parameters"] = *schema;
    out.push_back(OrderedJson{{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

}  // namespace

ApiResult<ChatRequest> parse_anthropic_messages(const OrderedJson& body, bool count_tokens_only) {
  ChatRequest out;
  out.render.thinking = false;
  FieldReader r(body, "");
  out.model = r.string("model", true).value_or("");
  const auto max_tokens = r.integer("max_tokens", 1, INT64_MAX, !count_tokens_only);
  const OrderedJson* messages = r.array("messages", true);
  if (r.error()) return *r.error();
  if (messages->empty()) return bad_request("messages must not be empty");
  out.generation.max_tokens = max_tokens;
  if (const OrderedJson* system = r.value("system")) {
    auto text = text_of(*system, "system");
    if (failed(text)) return std::get<ApiError>(text);
    out.messages.push_back(OrderedJson{{"role", "system"}, {"content", std::get<std::string>(text)}});
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    if (auto e = read_message((*messages)[i], "messages[" + std::to_string(i) + "]", out.messages)) return *e;
  }
  OrderedJson tools;
  if (const OrderedJson* t = r.array("tools"); t != nullptr && !t->empty()) {
    auto read = read_tools(*t);
    if (failed(read)) return std::get<ApiError>(read);
    tools = std::move(std::get<OrderedJson>(read));
  }
  std::string named;
  if (const OrderedJson* choice = r.object("tool_choice")) {
    FieldReader c(*choice, "tool_choice");
    const std::string type = c.string("type", true).value_or("");
    (void)c.boolean("disable_parallel_tool_use");
    if (c.error()) return *c.error();
    if (type == "auto") {
      out.tool_choice = ToolChoice::kAuto;
    } else if (type == "any") {
      out.tool_choice = ToolChoice::kRequired;
    } else if (type == "none") {
      out.tool_choice = ToolChoice::kNone;
    } else if (type == "tool") {
      out.tool_choice = ToolChoice::kNamed;
      named = c.string("name", true).value_or("");
      if (c.error()) return *c.error();
    } else {
      return bad_request("tool_choice.type must be auto, any, tool or none");
    }
  }
  if (const OrderedJson* thinking = r.object("thinking")) {
    FieldReader t(*thinking, "thinking");
    const std::string type = t.string("type", true).value_or("");
    (void)t.integer("budget_tokens", 0, INT64_MAX);
    if (t.error()) return *t.error();
    if (type == "enabled" || type == "adaptive") {
      out.render.thinking = true;
    } else if (type != "disabled") {
      return bad_request("thinking.type must be enabled, disabled or adaptive");
    }
  }
  if (const OrderedJson* config = r.object("output_config")) {
    FieldReader c(*config, "output_config");
    if (const OrderedJson* effort = c.value("effort")) {
      auto e = effort_from_api(*effort);
      if (!e) return bad_request("output_config.effort must be low, medium, high or max");
      out.render.reasoning_effort = *e;
    }
  }
  GenerationSettings& g = out.generation;
  g.sampling.temperature = static_cast<float>(r.number("temperature", 0.0, 1.0).value_or(1.0));
  g.sampling.top_p = static_cast<float>(r.number("top_p", 0.0, 1.0).value_or(1.0));
  if (g.sampling.top_p <= 0.0f && !r.error()) r.fail("top_p must be > 0");
  g.sampling.top_k = static_cast<int>(r.integer("top_k", 0, 1 << 30).value_or(0));
  g.stream = r.boolean("stream").value_or(false);
  (void)r.object("metadata");
  if (const OrderedJson* stops = r.array("stop_sequences")) {
    if (static_cast<int64_t>(stops->size()) > kMaxStopSequences) {
      r.fail("stop_sequences holds at most " + std::to_string(kMaxStopSequences) + " strings");
    }
    for (const auto& s : *stops) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        r.fail("stop_sequences must be non-empty strings");
        break;
      }
      g.stop.push_back(s.get<std::string>());
    }
  }
  if (r.error()) return *r.error();
  auto chosen = apply_tool_choice(tools, out.tool_choice, named);
  if (failed(chosen)) return std::get<ApiError>(chosen);
  out.tools = std::move(std::get<OrderedJson>(chosen));
  return out;
}

}  // namespace dsflash::server
