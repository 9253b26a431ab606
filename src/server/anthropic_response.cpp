#include "server/anthropic_response.h"

#include "server/api_error.h"
#include "server/json_fields.h"

namespace dsflash::server {
namespace {

const char* stop_reason(const OutputSummary& s) {
  if (s.tool_calls > 0) return "tool_use";
  if (s.finish_reason == FinishReason::kLength) return "max_tokens";
  if (!s.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

OrderedJson stop_sequence(const OutputSummary& s) {
  return s.tool_calls == 0 && !s.stop_string.empty() ? OrderedJson(s.stop_string) : OrderedJson(nullptr);
}

// Tool arguments (a JSON object as text) as an input object; {} if they do not parse (they always should).
OrderedJson input_of(const std::string& arguments) {
  OrderedJson input = OrderedJson::parse(arguments, nullptr, false);
  return input.is_object() ? input : OrderedJson::object();
}

}  // namespace

OrderedJson anthropic_usage(const OutputSummary& summary) {
  const Usage& u = summary.usage;
  return OrderedJson{{"input_tokens", u.prompt_tokens - u.cached_tokens},
                     {"output_tokens", u.generated_tokens},
                     {"cache_read_input_tokens", u.cached_tokens},
                     {"cache_creation_input_tokens", 0}};
}

AnthropicMessageWriter::AnthropicMessageWriter(ResponseInfo info, bool stream) : info_(std::move(info)), stream_(stream) {}

const char* AnthropicMessageWriter::content_type() const { return stream_ ? "text/event-stream" : "application/json"; }

std::string AnthropicMessageWriter::tool_id(int index) const { return "toolu_" + info_.id.substr(4) + "_" + std::to_string(index); }

std::string AnthropicMessageWriter::start() {
  if (!stream_) return "";
  OrderedJson message = {{"id", info_.id},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", info_.model},
                         {"content", OrderedJson::array()},
                         {"stop_reason", nullptr},
                         {"stop_sequence", nullptr},
                         {"usage",
                          {{"input_tokens", info_.prompt_tokens},
                           {"output_tokens", 0},
                           {"cache_read_input_tokens", 0},
                           {"cache_creation_input_tokens", 0}}}};
  return sse_event("message_start", dump_json(OrderedJson{{"type", "message_start"}, {"message", std::move(message)}}));
}

std::string AnthropicMessageWriter::open(Block type, OrderedJson block) {
  std::string out = close();
  open_ = type;
  ++index_;
  if (stream_) {
    out += sse_event("content_block_start",
                     dump_json(OrderedJson{{"type", "content_block_start"}, {"index", index_}, {"content_block", block}}));
  }
  if (!stream_) content_.push_back(std::move(block));
  return out;
}

std::string AnthropicMessageWriter::close() {
  if (open_ == Block::kNone) return "";
  std::string out;
  if (stream_ && open_ == Block::kThinking) {
    out += sse_event("content_block_delta",
                     dump_json(OrderedJson{{"type", "content_block_delta"},
                                           {"index", index_},
                                           {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}));
  }
  if (stream_) {
    out += sse_event("content_block_stop", dump_json(OrderedJson{{"type", "content_block_stop"}, {"index", index_}}));
  }
  open_ = Block::kNone;
  return out;
}

std::string AnthropicMessageWriter::output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs>) {
  std::string out;
  auto delta = [&](OrderedJson d) {
    if (stream_) {
      out += sse_event("content_block_delta",
                       dump_json(OrderedJson{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}}));
    }
  };
  for (const OutputDelta& d : deltas) {
    switch (d.kind) {
      case OutputDelta::Kind::kReasoning:
        if (open_ != Block::kThinking) {
          out += open(Block::kThinking, OrderedJson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        }
        if (!stream_) content_.back()["thinking"] = content_.back()["thinking"].get<std::string>() + d.text;
        delta(OrderedJson{{"type", "thinking_delta"}, {"thinking", d.text}});
        break;
      case OutputDelta::Kind::kContent:
        if (open_ != Block::kText) out += open(Block::kText, OrderedJson{{"type", "text"}, {"text", ""}});
        if (!stream_) content_.back()["text"] = content_.back()["text"].get<std::string>() + d.text;
        delta(OrderedJson{{"type", "text_delta"}, {"text", d.text}});
        break;
      case OutputDelta::Kind::kToolCall: {
        OrderedJson block = {{"type", "tool_use"}, {"id", tool_id(d.call.index)}, {"name", d.call.name},
                             {"input", stream_ ? OrderedJson::object() : input_of(d.call.arguments)}};
        out += open(Block::kToolUse, std::move(block));
        delta(OrderedJson{{"type", "input_json_delta"}, {"partial_json", d.call.arguments}});
        out += close();
        break;
      }
    }
  }
  return out;
}

std::string AnthropicMessageWriter::keepalive() {
  return stream_ ? sse_event("ping", "{\"type\": \"ping\"}") : " ";
}

std::string AnthropicMessageWriter::finish(const OutputSummary& summary) {
  if (summary.error) {
    const std::string body = error_body(from_engine_error(*summary.error, ApiFlavor::kAnthropic), ApiFlavor::kAnthropic);
    return stream_ ? close() + sse_event("error", body) : body;
  }
  if (stream_) {
    std::string out = close();
    out += sse_event("message_delta",
                     dump_json(OrderedJson{{"type", "message_delta"},
                                           {"delta", {{"stop_reason", stop_reason(summary)}, {"stop_sequence", stop_sequence(summary)}}},
                                           {"usage", anthropic_usage(summary)}}));
    out += sse_event("message_stop", "{\"type\": \"message_stop\"}");
    return out;
  }
  OrderedJson body = {{"id", info_.id},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", info_.model},
                      {"content", content_},
                      {"stop_reason", stop_reason(summary)},
                      {"stop_sequence", stop_sequence(summary)},
                      {"usage", anthropic_usage(summary)}};
  return dump_json(body);
}

}  // namespace dsflash::server
