// Parser of the Anthropic Messages body (docs.anthropic.com/en/api/messages) into the neutral ChatRequest:
//   model, max_tokens (required), messages (user / assistant; content a string or blocks: text, tool_use,
//   tool_result, thinking, redacted_thinking; image and document refused: no vision yet), system (a string or
//   text blocks), tools ({name, description, input_schema}), tool_choice ({"type": auto | any | tool | none}),
//   thinking ({"type": enabled | disabled | adaptive}), output_config.effort (low | medium | high | max),
//   stop_sequences, temperature, top_p, top_k, stream.
// Blocks become the OpenAI chat shape the V4.1 encoder takes: thinking -> reasoning_content, tool_use ->
// tool_calls (input as JSON arguments), tool_result -> role "tool" messages, in block order. Thinking is off unless
// asked for (the Messages API's default).
#pragma once

#include "server/chat_request.h"

namespace dsflash::server {

// count_tokens: the same body without max_tokens.
ApiResult<ChatRequest> parse_anthropic_messages(const OrderedJson& body, bool count_tokens_only = false);

}  // namespace dsflash::server
