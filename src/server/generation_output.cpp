#include "server/generation_output.h"

#include <algorithm>

namespace dsflash::server {

GenerationOutput::GenerationOutput(OutputMode mode, bool thinking, int top_logprobs, TokenText token_text)
    : mode_(mode), top_logprobs_(top_logprobs), token_text_(std::move(token_text)),
      in_reasoning_(mode == OutputMode::kChat && thinking) {
  if (mode == OutputMode::kChat) parser_.emplace(thinking);
}

void GenerationOutput::add(std::vector<OutputEvent> parsed, std::vector<OutputDelta>* deltas) {
  for (OutputEvent& e : parsed) {
    OutputDelta d;
    switch (e.kind) {
      case OutputEvent::Kind::kReasoning: d.kind = OutputDelta::Kind::kReasoning; break;
      case OutputEvent::Kind::kContent: d.kind = OutputDelta::Kind::kContent; break;
      case OutputEvent::Kind::kToolCall: d.kind = OutputDelta::Kind::kToolCall; break;
    }
    if (d.kind != OutputDelta::Kind::kReasoning) in_reasoning_ = false;
    if (d.kind == OutputDelta::Kind::kToolCall) {
      ++summary_.tool_calls;
      d.call = std::move(e.call);
    } else {
      if (e.text.empty()) continue;
      d.text = std::move(e.text);
    }
    deltas->push_back(std::move(d));
  }
}

void GenerationOutput::on_event(const Event& event, std::vector<OutputDelta>* deltas) {
  if (finished_) return;
  switch (event.kind) {
    case EventKind::kToken: {
      ++tokens_;
      // The parser holds back undecided text, so a token that ends the reasoning may be counted as reasoning.
      if (in_reasoning_) ++summary_.reasoning_tokens;
      if (top_logprobs_ >= 0) {
        TokenLogprobs lp;
        lp.token = token_text_ ? token_text_(event.token) : std::string();
        lp.logprob = event.logprob;
        const size_t n = std::min(event.top_logprobs.size(), static_cast<size_t>(top_logprobs_));
        for (size_t i = 0; i < n; ++i) {
          const TokenLogprob& t = event.top_logprobs[i];
          lp.top.emplace_back(token_text_ ? token_text_(t.id) : std::string(), t.logprob);
        }
        logprobs_.push_back(std::move(lp));
      }
      break;
    }
    case EventKind::kText:
      if (parser_) {
        add(parser_->push(event.text), deltas);
      } else if (!event.text.empty()) {
        deltas->push_back(OutputDelta{OutputDelta::Kind::kContent, event.text, {}});
      }
      break;
    case EventKind::kFinished:
      if (parser_) {
        add(parser_->finish(), deltas);
        summary_.malformed_tool_calls = parser_->malformed();
      }
      finished_ = true;
      summary_.finish_reason = event.finish_reason;
      summary_.stop_string = event.stop_string;
      summary_.usage = event.usage;
      summary_.error = event.error;
      break;
    case EventKind::kPromptLogits:
    case EventKind::kReasoning:
    case EventKind::kContent:
    case EventKind::kToolCall:
      break;  // not requested (parse_output off, no return_logits)
  }
}

std::vector<TokenLogprobs> GenerationOutput::take_logprobs() {
  std::vector<TokenLogprobs> out;
  out.swap(logprobs_);
  return out;
}

}  // namespace dsflash::server
