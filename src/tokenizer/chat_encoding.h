// OpenAI-style messages -> the DeepSeek-V4.1 prompt text (spec: MODEL.md §8). Follows the official
// encoding/encoding.py (through its public SGLang port encoding_dsv41.py) with the release effort aliases
// low 50 / high 75 / max 100 (default "high" = 75):
//   <｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: {b} (range 1-100, ...)\n\n{system}[\n\n{tools}]
//   <｜User｜>{user}<｜Assistant｜><think>            (thinking mode; chat mode: no effort line, </think>)
// Assistant history: {reasoning}</think>{content}[\n\n<｜DSML｜ calls>...</｜DSML｜ calls>]<｜end▁of▁sentence｜>,
// reasoning dropped before the last user turn unless some message defines tools. Tool messages become
// <tool_result> blocks of a user turn, sorted in the order of the preceding assistant's calls. Image content
// parts become <｜deepseek_image｜>. Goldens: tests/data/tokenizer/chat_goldens.json
// (tools/tokenizer/gen_chat_goldens.py runs the reference on tests/data/tokenizer/conversations.json).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/python_json.h"

namespace dsflash {

inline constexpr int kDefaultReasoningEffort = 75;  // "high" in the release encoder

struct ChatRenderOptions {
  bool thinking = true;        // thinking mode (<think>) or chat mode (</think>)
  int reasoning_effort = kDefaultReasoningEffort;  // 1..100, rendered in thinking mode only
  bool drop_thinking = true;   // drop reasoning of turns before the last user message (unless tools exist)
  bool add_bos = true;
};

struct RenderedPrompt {
  std::string text;
  std::vector<OrderedJson> images;  // image records ({"type": "image", "url"|"source"|"data": ...}), prompt order
};

// Effort from an API value: an integer 1..100 or "low" (50), "high" (75), "max" (100).
Result<int> parse_reasoning_effort(const OrderedJson& value);

// messages: a JSON array of OpenAI chat messages (roles system, developer, user, assistant, tool,
// latest_reminder; content string or content parts; assistant reasoning_content and tool_calls; tool
// tool_call_id). tools: request-level OpenAI tool list (null or empty for none); they are attached to the first
// system message, or to an empty system message inserted first when there is none.
Result<RenderedPrompt> render_chat_prompt(const OrderedJson& messages, const OrderedJson& tools,
                                          const ChatRenderOptions& options);

}  // namespace dsflash
