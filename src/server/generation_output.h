// One response's generated output, from engine events (kToken, kText, kFinished) to what the API writers
// render: reasoning / content deltas and tool calls from the V4.1 output parser (tokenizer/output_parser.h:
// markers split across text pieces are held back until decided; malformed DSML comes back as content), token
// logprobs, and the final summary (finish reason, usage, reasoning token count). kRaw (the completions API)
// passes text through unparsed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dsflash/engine.h"
#include "tokenizer/output_parser.h"

namespace dsflash::server {

enum class OutputMode { kChat, kRaw };

struct OutputDelta {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind = Kind::kContent;
  std::string text;  // kReasoning / kContent
  ToolCall call;     // kToolCall
};

// One generated token's logprob and its most likely alternatives (OpenAI logprobs.content[i]).
struct TokenLogprobs {
  std::string token;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

struct OutputSummary {
  FinishReason finish_reason = FinishReason::kLength;
  std::string stop_string;     // kStop by a stop string: which
  Usage usage;
  int64_t reasoning_tokens = 0;  // tokens generated before the reasoning ended (thinking mode)
  int tool_calls = 0;
  bool malformed_tool_calls = false;
  std::optional<EngineError> error;
};

class GenerationOutput {
 public:
  using TokenText = std::function<std::string(int32_t)>;
  // thinking: the prompt ended with <think>. top_logprobs: < 0 = no logprobs, else the alternatives per token.
  GenerationOutput(OutputMode mode, bool thinking, int top_logprobs, TokenText token_text);

  // Consumes one event, appending what it completes.
  void on_event(const Event& event, std::vector<OutputDelta>* deltas);
  // Logprobs of the tokens seen since the last call.
  std::vector<TokenLogprobs> take_logprobs();

  bool finished() const { return finished_; }
  const OutputSummary& summary() const { return summary_; }
  int64_t tokens() const { return tokens_; }

 private:
  void add(std::vector<OutputEvent> parsed, std::vector<OutputDelta>* deltas);

  OutputMode mode_;
  int top_logprobs_;
  TokenText token_text_;
  std::optional<OutputParser> parser_;
  bool in_reasoning_;
  int64_t tokens_ = 0;
  std::vector<TokenLogprobs> logprobs_;
  bool finished_ = false;
  OutputSummary summary_;
};

}  // namespace dsflash::server
