#include "server/openai_response.h"

#include "server/api_error.h"
#include "server/json_fields.h"

namespace dsflash::server {
namespace {

OrderedJson utf8_bytes(const std::string& s) {
  OrderedJson bytes = OrderedJson::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

OrderedJson chat_logprob(const TokenLogprobs& lp) {
  OrderedJson top = OrderedJson::array();
  for (const auto& [token, logprob] : lp.top) {
    top.push_back(OrderedJson{{"token", token}, {"logprob", logprob}, {"bytes", utf8_bytes(token)}});
  }
  return OrderedJson{{"token", lp.token}, {"logprob", lp.logprob}, {"bytes", utf8_bytes(lp.token)},
                     {"top_logprobs", std::move(top)}};
}

std::string error_event(const EngineError& error) {
  return sse_data(error_body(from_engine_error(error, ApiFlavor::kOpenAi), ApiFlavor::kOpenAi));
}

}  // namespace

OrderedJson openai_usage(const OutputSummary& summary) {
  const Usage& u = summary.usage;
  return OrderedJson{{"prompt_tokens", u.prompt_tokens},
                     {"completion_tokens", u.generated_tokens},
                     {"total_tokens", u.prompt_tokens + u.generated_tokens},
                     {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                     {"completion_tokens_details", {{"reasoning_tokens", summary.reasoning_tokens}}},
                     {"prompt_cache_hit_tokens", u.cached_tokens},
                     {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

const char* openai_finish_reason(const OutputSummary& summary) {
  if (summary.tool_calls > 0) return "tool_calls";
  return summary.finish_reason == FinishReason::kLength ? "length" : "stop";
}

// ---- chat ----

OpenAiChatWriter::OpenAiChatWriter(ResponseInfo info, bool stream, bool include_usage, bool logprobs)
    : info_(std::move(info)), stream_(stream), include_usage_(include_usage), logprobs_(logprobs) {}

const char* OpenAiChatWriter::content_type() const { return stream_ ? "text/event-stream" : "application/json"; }

std::string OpenAiChatWriter::call_id(int index) const { return "call_" + info_.id.substr(9) + "_" + std::to_string(index); }

OrderedJson OpenAiChatWriter::chunk(OrderedJson delta, OrderedJson logprobs, OrderedJson finish_reason) const {
  OrderedJson c = {{"id", info_.id},
                   {"object", "chat.completion.chunk"},
                   {"created", info_.created},
                   {"model", info_.model},
                   {"system_fingerprint", "dsflash"},
                   {"choices", OrderedJson::array({OrderedJson{{"index", 0},
                                                               {"delta", std::move(delta)},
                                                               {"logprobs", std::move(logprobs)},
                                                               {"finish_reason", std::move(finish_reason)}}})}};
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

std::string OpenAiChatWriter::start() {
  if (!stream_) return "";
  return sse_data(dump_json(chunk(OrderedJson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)));
}

std::string OpenAiChatWriter::output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) {
  OrderedJson lp = nullptr;
  if (logprobs_ && !logprobs.empty()) {
    OrderedJson content = OrderedJson::array();
    for (const TokenLogprobs& t : logprobs) content.push_back(chat_logprob(t));
    if (!stream_) {
      for (auto& c : content) logprob_content_.push_back(std::move(c));
    } else {
      lp = OrderedJson{{"content", std::move(content)}};
    }
  }
  std::string out;
  for (const OutputDelta& d : deltas) {
    OrderedJson delta;
    switch (d.kind) {
      case OutputDelta::Kind::kReasoning:
        if (!stream_) reasoning_ += d.text;
        delta = {{"reasoning_content", d.text}};
        break;
      case OutputDelta::Kind::kContent:
        if (!stream_) content_ += d.text;
        delta = {{"content", d.text}};
        break;
      case OutputDelta::Kind::kToolCall: {
        OrderedJson call = {{"index", d.call.index},
                            {"id", call_id(d.call.index)},
                            {"type", "function"},
                            {"function", {{"name", d.call.name}, {"arguments", d.call.arguments}}}};
        if (!stream_) {
          call.erase("index");
          tool_calls_.push_back(std::move(call));
        }
        delta = {{"tool_calls", OrderedJson::array({std::move(call)})}};
        break;
      }
    }
    if (stream_) {
      out += sse_data(dump_json(chunk(std::move(delta), std::move(lp), nullptr)));
      lp = nullptr;
    }
  }
  if (stream_ && !lp.is_null()) out += sse_data(dump_json(chunk(OrderedJson::object(), std::move(lp), nullptr)));
  return out;
}

std::string OpenAiChatWriter::keepalive() { return stream_ ? ": keepalive\n\n" : " "; }

std::string OpenAiChatWriter::finish(const OutputSummary& summary) {
  if (stream_) {
    if (summary.error) return error_event(*summary.error) + "data: [DONE]\n\n";
    std::string out = sse_data(dump_json(chunk(OrderedJson::object(), nullptr, openai_finish_reason(summary))));
    if (include_usage_) {
      OrderedJson last = chunk(OrderedJson::object(), nullptr, nullptr);
      last["choices"] = OrderedJson::array();
      last["usage"] = openai_usage(summary);
      out += sse_data(dump_json(last));
    }
    return out + "data: [DONE]\n\n";
  }
  if (summary.error) return error_body(from_engine_error(*summary.error, ApiFlavor::kOpenAi), ApiFlavor::kOpenAi);
  OrderedJson message = {{"role", "assistant"}, {"content", content_.empty() && !tool_calls_.empty() ? OrderedJson(nullptr) : OrderedJson(content_)}};
  if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
  if (!tool_calls_.empty()) message["tool_calls"] = tool_calls_;
  OrderedJson body = {{"id", info_.id},
                      {"object", "chat.completion"},
                      {"created", info_.created},
                      {"model", info_.model},
                      {"system_fingerprint", "dsflash"},
                      {"choices", OrderedJson::array({OrderedJson{
                                      {"index", 0},
                                      {"message", std::move(message)},
                                      {"logprobs", logprobs_ ? OrderedJson{{"content", logprob_content_}} : OrderedJson(nullptr)},
                                      {"finish_reason", openai_finish_reason(summary)}}})},
                      {"usage", openai_usage(summary)}};
  return dump_json(body);
}

// ---- completions ----

OpenAiCompletionWriter::OpenAiCompletionWriter(ResponseInfo info, bool stream, bool include_usage, bool logprobs)
    : info_(std::move(info)), stream_(stream), include_usage_(include_usage), logprobs_(logprobs) {}

const char* OpenAiCompletionWriter::content_type() const { return stream_ ? "text/event-stream" : "application/json"; }

OrderedJson OpenAiCompletionWriter::chunk(const std::string& text, OrderedJson logprobs, OrderedJson finish_reason) const {
  OrderedJson c = {{"id", info_.id},
                   {"object", "text_completion"},
                   {"created", info_.created},
                   {"model", info_.model},
                   {"choices", OrderedJson::array({OrderedJson{{"text", text},
                                                               {"index", 0},
                                                               {"logprobs", std::move(logprobs)},
                                                               {"finish_reason", std::move(finish_reason)}}})}};
  if (stream_ && include_usage_) c["usage"] = nullptr;
  return c;
}

std::string OpenAiCompletionWriter::start() { return ""; }

std::string OpenAiCompletionWriter::output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) {
  OrderedJson tokens = OrderedJson::array(), token_logprobs = OrderedJson::array(), top = OrderedJson::array();
  for (const TokenLogprobs& t : logprobs) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    OrderedJson alternatives = OrderedJson::object();
    for (const auto& [token, lp] : t.top) alternatives[token] = lp;
    top.push_back(std::move(alternatives));
  }
  std::string text;
  for (const OutputDelta& d : deltas) text += d.text;
  if (!stream_) {
    text_ += text;
    for (auto& t : tokens) tokens_.push_back(std::move(t));
    for (auto& t : token_logprobs) token_logprobs_.push_back(std::move(t));
    for (auto& t : top) top_logprobs_.push_back(std::move(t));
    return "";
  }
  if (text.empty() && tokens.empty()) return "";
  OrderedJson lp = logprobs_ ? OrderedJson{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}}
                             : OrderedJson(nullptr);
  return sse_data(dump_json(chunk(text, std::move(lp), nullptr)));
}

std::string OpenAiCompletionWriter::keepalive() { return stream_ ? ": keepalive\n\n" : " "; }

std::string OpenAiCompletionWriter::finish(const OutputSummary& summary) {
  OrderedJson usage = openai_usage(summary);
  usage.erase("completion_tokens_details");
  if (stream_) {
    if (summary.error) return error_event(*summary.error) + "data: [DONE]\n\n";
    std::string out = sse_data(dump_json(chunk("", nullptr, openai_finish_reason(summary))));
    if (include_usage_) {
      OrderedJson last = chunk("", nullptr, nullptr);
      last["choices"] = OrderedJson::array();
      last["usage"] = std::move(usage);
      out += sse_data(dump_json(last));
    }
    return out + "data: [DONE]\n\n";
  }
  if (summary.error) return error_body(from_engine_error(*summary.error, ApiFlavor::kOpenAi), ApiFlavor::kOpenAi);
  OrderedJson lp = logprobs_ ? OrderedJson{{"tokens", tokens_}, {"token_logprobs", token_logprobs_}, {"top_logprobs", top_logprobs_}}
                             : OrderedJson(nullptr);
  OrderedJson body = chunk(text_, std::move(lp), openai_finish_reason(summary));
  body["usage"] = std::move(usage);
  return dump_json(body);
}

}  // namespace dsflash::server
