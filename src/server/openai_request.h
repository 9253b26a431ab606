// Parsers of the OpenAI request bodies (platform.openai.com/docs/api-reference/chat/create, /completions/create)
// into the neutral requests of server/chat_request.h. Every wrong field is a 400 naming it.
//   chat: model, messages (system / developer / user / assistant / tool; content a string or text parts;
//         assistant reasoning_content + tool_calls; tool tool_call_id), tools, tool_choice (auto, none,
//         required, {"type": "function", "function": {"name"}}), stream, stream_options.include_usage,
//         temperature, top_p, top_k, min_p, seed, stop, max_tokens / max_completion_tokens, presence_penalty,
//         frequency_penalty, repetition_penalty, logprobs + top_logprobs, n (1 only), and DeepSeek's thinking
//         controls: thinking {"type": "enabled" | "disabled"}, reasoning_effort, chat_template_kwargs.thinking.
//         Thinking is on unless turned off (the release encoder's default), effort "high" (75).
//   completions: model, prompt (a string, or token ids), the sampling fields above, stream.
#pragma once

#include "server/chat_request.h"

namespace dsflash::server {

ApiResult<ChatRequest> parse_openai_chat(const OrderedJson& body);
ApiResult<CompletionRequest> parse_openai_completion(const OrderedJson& body);

}  // namespace dsflash::server
