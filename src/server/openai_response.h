// OpenAI response shapes (platform.openai.com/docs/api-reference/chat/object, /chat/streaming,
// /completions/object), with DeepSeek's additions (api-docs.deepseek.com): message.reasoning_content (streamed
// as delta.reasoning_content) and usage.prompt_cache_hit_tokens / prompt_cache_miss_tokens.
//   usage: {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens},
//           completion_tokens_details: {reasoning_tokens}, prompt_cache_hit_tokens, prompt_cache_miss_tokens}
//   finish_reason: "tool_calls" when the output called tools, else "length" (max_tokens) or "stop".
//   stream: chat.completion.chunk events; the first carries delta.role; tool calls arrive whole (one delta with
//           id, name and all arguments); include_usage adds "usage": null to each chunk and a last chunk with
//           "choices": [] and the usage; then "data: [DONE]". Errors mid-stream: data: {"error": {...}}.
#pragma once

#include "server/response_writer.h"
#include "tokenizer/python_json.h"

namespace dsflash::server {

OrderedJson openai_usage(const OutputSummary& summary);
const char* openai_finish_reason(const OutputSummary& summary);

class OpenAiChatWriter final : public ResponseWriter {
 public:
  OpenAiChatWriter(ResponseInfo info, bool stream, bool include_usage, bool logprobs);
  const char* content_type() const override;
  std::string start() override;
  std::string output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) override;
  std::string keepalive() override;
  std::string finish(const OutputSummary& summary) override;

 private:
  OrderedJson chunk(OrderedJson delta, OrderedJson logprobs, OrderedJson finish_reason) const;
  std::string call_id(int index) const;

  ResponseInfo info_;
  bool stream_, include_usage_, logprobs_;
  std::string reasoning_, content_;  // non-stream: accumulated
  OrderedJson tool_calls_ = OrderedJson::array();
  OrderedJson logprob_content_ = OrderedJson::array();
};

// POST /v1/completions: choices[0].text, legacy logprobs {tokens, token_logprobs, top_logprobs}.
class OpenAiCompletionWriter final : public ResponseWriter {
 public:
  OpenAiCompletionWriter(ResponseInfo info, bool stream, bool include_usage, bool logprobs);
  const char* content_type() const override;
  std::string start() override;
  std::string output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) override;
  std::string keepalive() override;
  std::string finish(const OutputSummary& summary) override;

 private:
  OrderedJson chunk(const std::string& text, OrderedJson logprobs, OrderedJson finish_reason) const;

  ResponseInfo info_;
  bool stream_, include_usage_, logprobs_;
  std::string text_;
  OrderedJson tokens_ = OrderedJson::array(), token_logprobs_ = OrderedJson::array(),
              top_logprobs_ = OrderedJson::array();
};

}  // namespace dsflash::server
