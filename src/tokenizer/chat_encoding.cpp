#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <map>

#include "tokenizer/chat_markers.h"

namespace dsflash {

namespace {

using Json = OrderedJson;

using namespace chat_markers;

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> tokens = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},  {"read_url", "<｜read_url｜>"}};
  return tokens;
}

// Python truthiness of a JSON value (None, False, 0, "", [], {} are false).
bool truthy(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return v.get<bool>();
    case Json::value_t::number_integer: return v.get<int64_t>() != 0;
    case Json::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case Json::value_t::number_float: return v.get<double>() != 0.0;
    case Json::value_t::string: return !v.get_ref<const std::string&>().empty();  // json::empty() is false for strings
    case Json::value_t::array:
    case Json::value_t::object: return !v.empty();
    default: return false;
  }
}

// msg.get(key) -> null when absent.
const Json& get(const Json& msg, const char* key) {
  static const Json null_value;
  auto it = msg.find(key);
  return it == msg.end() ? null_value : *it;
}

std::string role_of(const Json& msg) {
  const Json& r = get(msg, "role");
  return r.is_string() ? r.get<std::string>() : std::string();
}

// Python `x or ""` for a text field; non-strings that are truthy are refused by the caller's validation.
std::string text_or_empty(const Json& v) { return v.is_string() ? v.get<std::string>() : std::string(); }

std::string tools_block(const Json& functions) {
  std::string schemas;
  for (size_t i = 0; i < functions.size(); ++i) {
    if (i) schemas += "\n";
    schemas += python_json_dumps(functions[i]);
  }
  const std::string calls = std::string(kDsml) + " calls";
  const std::string invoke = std::string(kDsml) + " invoke";
  const std::string parameter = std::string(kDsml) + " parameter";
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
         "writing a \"<" + calls + ">\" block like the following:\n\n<" + calls + ">\n<" + invoke +
         " name=\"$TOOL_NAME\">\n<" + parameter +
         " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + parameter + ">\n...\n</" + invoke +
         ">\n<" + invoke + " name=\"$TOOL_NAME2\">\n...\n</" + invoke + ">\n</" + calls +
         ">\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode "
         "is enabled (triggered by " + kThinkStart + "), you MUST output your complete reasoning inside " +
         kThinkStart + "..." + kThinkEnd + " BEFORE any tool calls or final response.\n\nOtherwise, output "
         "directly after " + kThinkEnd + " with tool calls or final response.\n\n### Available Tool Schemas\n\n" +
         schemas + "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
         "calls.\n";
}

Result<Json> tool_functions(const Json& tools, const std::string& where) {
  Json functions = Json::array();
  if (!tools.is_array()) return Status::Error(where + ": tools is not an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!tools[i].is_object() || !tools[i].contains("function")) {
      return Status::Error(where + ": tools[" + std::to_string(i) + "] has no 'function'");
    }
    functions.push_back(tools[i]["function"]);
  }
  return functions;
}

std::string response_format_block(const Json& response_format) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         python_json_dumps(response_format);
}

Result<std::string> dsml_arguments(const Json& call, const std::string& where) {
  const Json& raw = get(call, "arguments");
  Json arguments;
  if (raw.is_string()) {
    try {
      arguments = Json::parse(raw.get<std::string>());
    } catch (const Json::exception& e) {
      return Status::Error(where + ": function.arguments is not valid JSON: " + e.what());
    }
  } else {
    arguments = raw;
  }
  if (!arguments.is_object()) return Status::Error(where + ": function.arguments must be a JSON object");
  std::string out;
  bool first = true;
  for (auto it = arguments.begin(); it != arguments.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_string = it.value().is_string();
    out += std::string("<") + kDsml + " parameter name=\"" + it.key() + "\" string=\"" + (is_string ? "true" : "false") +
           "\">" + (is_string ? it.value().get<std::string>() : python_json_dumps(it.value())) + "</" + kDsml +
           " parameter>";
  }
  return out;
}

// ---- preprocessing (encoding.py: process_image_messages, merge_tool_messages, sort_tool_results_by_call_order)

Result<Json> image_record(const Json& block) {
  Json record = {{"type", "image"}};
  if (get(block, "type") == "image_url") {
    const Json& url = get(block, "image_url");
    if (url.is_string()) {
      record["url"] = url;
    } else if (url.is_object()) {
      record["url"] = url.contains("url") ? url["url"] : Json("");
    } else {
      record["url"] = "";
    }
  } else {
    for (const char* key : {"source", "url", "data"})
      if (block.contains(key)) record[key] = block[key];
  }
  bool has_source = false;
  for (const char* key : {"source", "url", "data"})
    if (record.contains(key) && truthy(record[key])) has_source = true;
  if (!has_source) return Status::Error("image block does not contain a valid source");
  return record;
}

Status process_image_blocks(Json& blocks, std::vector<Json>& images) {
  Json out = Json::array();
  for (auto& block : blocks) {
    if (!block.is_object()) {
      out.push_back(block);
      continue;
    }
    const Json& type = get(block, "type");
    if (type == "image" || type == "image_url") {
      auto record = image_record(block);
      if (!record.ok()) return record.status();
      out.push_back(Json{{"type", "text"}, {"text", kImage}});
      images.push_back(std::move(*record));
    } else if (type == "tool_result" && get(block, "content").is_array()) {
      Json copy = block;
      if (auto s = process_image_blocks(copy["content"], images); !s.ok()) return s;
      out.push_back(std::move(copy));
    } else if (type == "text") {
      const std::string text = text_or_empty(get(block, "text"));
      if (text.find(kImage) != std::string::npos) {
        return Status::Error(std::string("text block contains the image placeholder ") + kImage +
                             "; images must be separate content parts");
      }
      out.push_back(block);
    } else {
      out.push_back(block);
    }
  }
  blocks = std::move(out);
  return Status::Ok();
}

Status process_images(Json& messages, std::vector<Json>& images) {
  for (size_t i = 0; i < messages.size(); ++i) {
    Json& msg = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    for (const char* key : {"content", "reasoning_content"}) {
      const Json& v = get(msg, key);
      if (v.is_string() && v.get<std::string>().find(kImage) != std::string::npos) {
        return Status::Error(where + "." + key + " contains the image placeholder " + kImage +
                             "; images must be image content parts");
      }
    }
    if (get(msg, "content").is_array() && !msg.contains("content_blocks")) {
      msg["content_blocks"] = msg["content"];
      msg.erase("content");
    }
    if (truthy(get(msg, "content_blocks"))) {
      if (!msg["content_blocks"].is_array()) return Status::Error(where + ": content parts are not an array");
      if (auto s = process_image_blocks(msg["content_blocks"], images); !s.ok()) return s.with_context(where);
      if (!get(msg, "content").is_string()) {
        std::string joined;
        bool first = true;
        for (const auto& block : msg["content_blocks"]) {
          if (!block.is_object() || get(block, "type") != "text") continue;
          if (!first) joined += "\n\n";
          first = false;
          joined += text_or_empty(get(block, "text"));
        }
        msg["content"] = joined;
      }
    }
  }
  return Status::Ok();
}

Json merge_tool_messages(const Json& messages) {
  Json merged = Json::array();
  for (const auto& original : messages) {
    Json msg = original;
    const std::string role = role_of(msg);
    auto last_is_mergeable_user = [&](bool require_no_task) {
      if (merged.empty()) return false;
      const Json& last = merged.back();
      if (role_of(last) != "user" || !last.contains("content_blocks")) return false;
      return !require_no_task || get(last, "task").is_null();
    };
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", msg.contains("tool_call_id") ? msg["tool_call_id"] : Json("")},
                    {"content", msg.contains("content") ? msg["content"] : Json("")}};
      if (last_is_mergeable_user(false)) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({std::move(block)})}});
      }
    } else if (role == "user") {
      Json blocks = get(msg, "content_blocks");
      if (blocks.is_null()) {
        blocks = Json::array({Json{{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : Json("")}}});
      }
      if (last_is_mergeable_user(true)) {
        for (auto& b : blocks) merged.back()["content_blocks"].push_back(b);
      } else {
        msg["content_blocks"] = blocks;
        merged.push_back(std::move(msg));
      }
    } else {
      merged.push_back(std::move(msg));
    }
  }
  return merged;
}

void sort_tool_results(Json& messages) {
  std::map<std::string, int64_t> order;
  for (auto& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(get(msg, "tool_calls")) && msg["tool_calls"].is_array()) {
      order.clear();
      for (size_t i = 0; i < msg["tool_calls"].size(); ++i) {
        const Json& tc = msg["tool_calls"][i];
        std::string id;
        if (tc.is_object() && truthy(get(tc, "id")) && tc["id"].is_string()) {
          id = tc["id"].get<std::string>();
        } else if (tc.is_object() && get(tc, "function").is_object() && get(tc["function"], "id").is_string()) {
          id = tc["function"]["id"].get<std::string>();
        }
        if (!id.empty()) order[id] = static_cast<int64_t>(i);
      }
    } else if (role == "user" && truthy(get(msg, "content_blocks")) && msg["content_blocks"].is_array()) {
      std::vector<Json> tool_blocks;
      for (const auto& b : msg["content_blocks"])
        if (b.is_object() && get(b, "type") == "tool_result") tool_blocks.push_back(b);
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const Json& b) -> int64_t {
          const Json& id = get(b, "tool_use_id");
          if (!id.is_string()) return 0;
          auto it = order.find(id.get<std::string>());
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const Json& a, const Json& b) { return key(a) < key(b); });
        size_t k = 0;
        for (auto& b : msg["content_blocks"])
          if (b.is_object() && get(b, "type") == "tool_result") b = tool_blocks[k++];
      }
    }
  }
}

int64_t find_last_user_index(const Json& messages) {
  for (int64_t i = static_cast<int64_t>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[i]);
    if (role == "user" || role == "developer" || (role == "system" && i > 0)) return i;
  }
  return -1;
}

Json drop_thinking_messages(const Json& messages) {
  const int64_t last_user = find_last_user_index(messages);
  Json result = Json::array();
  for (int64_t i = 0; i < static_cast<int64_t>(messages.size()); ++i) {
    const std::string role = role_of(messages[i]);
    if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
        role == "direct_search_results" || i >= last_user) {
      result.push_back(messages[i]);
    } else if (role == "assistant") {
      Json copy = messages[i];
      copy.erase("reasoning_content");
      result.push_back(std::move(copy));
    }  // developer and other roles before the last user message are dropped
  }
  return result;
}

// ---- rendering (encoding.py render_message)

Result<std::string> render_user_blocks(const Json& blocks) {
  std::string out;
  bool first = true;
  for (const auto& block : blocks) {
    if (!first) out += "\n\n";
    first = false;
    const std::string type = block.is_object() ? text_or_empty(get(block, "type")) : std::string();
    if (type == "text") {
      out += text_or_empty(get(block, "text"));
    } else if (type == "tool_result") {
      const Json& content = get(block, "content");
      std::string text;
      if (content.is_array()) {
        bool first_part = true;
        for (const auto& part : content) {
          if (!first_part) text += "\n\n";
          first_part = false;
          const std::string part_type = part.is_object() ? text_or_empty(get(part, "type")) : std::string("None");
          text += part_type == "text" ? text_or_empty(get(part, "text")) : "[Unsupported " + part_type + "]";
        }
      } else {
        text = text_or_empty(content);
      }
      out += "<tool_result>" + text + "</tool_result>";
    } else {
      out += "[Unsupported " + (type.empty() ? std::string("None") : type) + "]";
    }
  }
  return out;
}

Result<std::string> render_message(int64_t index, const Json& messages, bool thinking, bool drop_thinking,
                                   int effort) {
  const Json& msg = messages[index];
  const std::string where = "message " + std::to_string(index);
  const int64_t last_user = find_last_user_index(messages);
  const std::string role = role_of(msg);
  const Json& content = get(msg, "content");
  if (!content.is_null() && !content.is_string()) return Status::Error(where + ": content must be a string or parts");

  std::string effort_prompt;
  if (index == 0 && thinking) {
    effort_prompt = "Reasoning Effort: " + std::to_string(effort) +
                    " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  }
  std::string prompt = index == 0 && (!effort_prompt.empty() || role == "system") ? kSystem : "";
  prompt += effort_prompt;

  Json functions;
  if (truthy(get(msg, "tools"))) {
    auto f = tool_functions(msg["tools"], where);
    if (!f.ok()) return f.status();
    functions = std::move(*f);
  }
  const bool has_response_format = truthy(get(msg, "response_format"));

  if (role == "system") {
    if (index > 0) prompt += kSystem;
    prompt += text_or_empty(content);
    if (!functions.is_null()) prompt += "\n\n" + tools_block(functions);
    if (has_response_format) prompt += "\n\n" + response_format_block(msg["response_format"]);
  } else if (role == "developer") {
    if (!truthy(content)) return Status::Error(where + ": a developer message needs content");
    prompt += kUser + content.get<std::string>();
    if (!functions.is_null()) prompt += "\n\n" + tools_block(functions);
    if (has_response_format) prompt += "\n\n" + response_format_block(msg["response_format"]);
  } else if (role == "user") {
    prompt += kUser;
    if (truthy(get(msg, "content_blocks"))) {
      auto blocks = render_user_blocks(msg["content_blocks"]);
      if (!blocks.ok()) return blocks.status().with_context(where);
      prompt += *blocks;
    } else {
      prompt += text_or_empty(content);
    }
  } else if (role == "latest_reminder") {
    prompt += std::string(kLatestReminder) + text_or_empty(content);
  } else if (role == "assistant") {
    std::string calls_text;
    const Json& tool_calls = get(msg, "tool_calls");
    if (truthy(tool_calls)) {
      if (!tool_calls.is_array()) return Status::Error(where + ": tool_calls is not an array");
      std::string invokes;
      for (size_t i = 0; i < tool_calls.size(); ++i) {
        const std::string call_where = where + ".tool_calls[" + std::to_string(i) + "]";
        const Json& tc = tool_calls[i];
        if (!tc.is_object() || !get(tc, "function").is_object()) return Status::Error(call_where + ": no function");
        const Json& fn = tc["function"];
        auto args = dsml_arguments(fn, call_where);
        if (!args.ok()) return args.status();
        const Json& name = get(fn, "name");
        if (i) invokes += "\n";
        invokes += std::string("<") + kDsml + " invoke name=\"" + (name.is_string() ? name.get<std::string>() : "None") +
                   "\">\n" + *args + "\n</" + kDsml + " invoke>";
      }
      calls_text = std::string("\n\n<") + kDsml + " calls>\n" + invokes + "\n</" + kDsml + " calls>";
    }
    const bool prev_has_task = index >= 1 && !get(messages[index - 1], "task").is_null();
    std::string thinking_part;
    if (thinking && !prev_has_task && (!drop_thinking || index > last_user)) {
      thinking_part = text_or_empty(get(msg, "reasoning_content")) + kThinkEnd;
    }
    prompt += thinking_part + text_or_empty(content) + calls_text;
    if (!truthy(get(msg, "wo_eos"))) prompt += kEos;
  } else if (role == "tool") {
    return Status::Error(where + ": tool message left after merging");  // unreachable: merged into user turns
  } else {
    return Status::Error(where + ": unknown role '" + role + "'");
  }

  // What follows: the assistant header after a turn that hands over to the assistant.
  if (index + 1 < static_cast<int64_t>(messages.size())) {
    const std::string next_role = role_of(messages[index + 1]);
    if (next_role != "assistant" && next_role != "latest_reminder") return prompt;
  }
  const Json& task = get(msg, "task");
  if (!task.is_null()) {
    const std::string name = task.is_string() ? task.get<std::string>() : std::string();
    auto it = task_tokens().find(name);
    if (it == task_tokens().end()) return Status::Error(where + ": invalid task '" + task.dump() + "'");
    if (name != "action") {
      prompt += it->second;
    } else {
      prompt += std::string(kAssistant) + (thinking ? kThinkStart : kThinkEnd) + it->second;
    }
  } else if (role == "user" || role == "developer" || (role == "system" && index > 0)) {
    prompt += kAssistant;
    if ((!drop_thinking && thinking) || (drop_thinking && thinking && index >= last_user)) {
      prompt += kThinkStart;
    } else {
      prompt += kThinkEnd;
    }
  }
  return prompt;
}

}  // namespace

Result<int> parse_reasoning_effort(const OrderedJson& value) {
  if (value.is_null()) return kDefaultReasoningEffort;
  if (value.is_number_integer() || value.is_number_unsigned()) {
    const auto v = value.get<int64_t>();
    if (v >= 1 && v <= 100) return static_cast<int>(v);
  }
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (s == "low") return 50;
    if (s == "high") return 75;
    if (s == "max") return 100;
  }
  return Status::Error("invalid reasoning effort " + value.dump() +
                       ": expected an integer 1-100 or \"low\" (50), \"high\" (75), \"max\" (100)");
}

Result<RenderedPrompt> render_chat_prompt(const OrderedJson& messages_in, const OrderedJson& tools,
                                          const ChatRenderOptions& options) {
  if (!messages_in.is_array()) return Status::Error("messages: not a JSON array");
  if (options.reasoning_effort < 1 || options.reasoning_effort > 100) {
    return Status::Error("reasoning effort " + std::to_string(options.reasoning_effort) + " is outside 1-100");
  }
  Json messages = messages_in;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) return Status::Error("messages[" + std::to_string(i) + "]: not an object");
    if (!messages[i].contains("role") || !messages[i]["role"].is_string()) {
      return Status::Error("messages[" + std::to_string(i) + "]: missing string 'role'");
    }
  }
  if (truthy(tools)) {
    if (!tools.is_array()) return Status::Error("tools: not a JSON array");
    if (!messages.empty() && role_of(messages[0]) == "system") {
      if (!truthy(get(messages[0], "tools"))) messages[0]["tools"] = tools;
    } else {
      messages.insert(messages.begin(), Json{{"role", "system"}, {"content", ""}, {"tools", tools}});
    }
  }
  RenderedPrompt result;
  if (auto s = process_images(messages, result.images); !s.ok()) return s;
  messages = merge_tool_messages(messages);
  sort_tool_results(messages);

  bool drop = options.drop_thinking;
  for (const auto& m : messages)
    if (truthy(get(m, "tools"))) drop = false;
  if (options.thinking && drop) messages = drop_thinking_messages(messages);

  if (options.add_bos) result.text = kBos;
  for (int64_t i = 0; i < static_cast<int64_t>(messages.size()); ++i) {
    auto part = render_message(i, messages, options.thinking, drop, options.reasoning_effort);
    if (!part.ok()) return part.status();
    result.text += *part;
  }
  return result;
}

}  // namespace dsflash
