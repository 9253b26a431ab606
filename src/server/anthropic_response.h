// Anthropic Messages response shapes (docs.anthropic.com/en/api/messages, /en/docs/build-with-claude/streaming):
//   body: {id, type: "message", role: "assistant", model, content: [thinking | text | tool_use blocks],
//          stop_reason: end_turn | max_tokens | stop_sequence | tool_use, stop_sequence, usage}
//   usage: {input_tokens (prompt tokens not read from the cache), output_tokens, cache_read_input_tokens,
//           cache_creation_input_tokens}
//   stream: message_start, then per block content_block_start / content_block_delta (thinking_delta,
//           text_delta, input_json_delta) / content_block_stop, then message_delta (stop_reason, usage) and
//           message_stop; ping events keep the connection alive; an error mid-stream is an "error" event.
// Blocks open in output order: reasoning -> a thinking block, content -> a text block, each tool call -> one
// tool_use block whose input arrives as one input_json_delta.
#pragma once

#include "server/response_writer.h"
#include "tokenizer/python_json.h"

namespace dsflash::server {

OrderedJson anthropic_usage(const OutputSummary& summary);

class AnthropicMessageWriter final : public ResponseWriter {
 public:
  AnthropicMessageWriter(ResponseInfo info, bool stream);
  const char* content_type() const override;
  std::string start() override;
  std::string output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) override;
  std::string keepalive() override;
  std::string finish(const OutputSummary& summary) override;

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open(Block type, OrderedJson block);
  std::string close();
  std::string tool_id(int index) const;

  ResponseInfo info_;
  bool stream_;
  Block open_ = Block::kNone;
  int index_ = -1;                     // index of the open (or last) block
  OrderedJson content_ = OrderedJson::array();  // non-stream: the blocks
};

}  // namespace dsflash::server
