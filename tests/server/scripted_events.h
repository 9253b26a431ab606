// Test-only token source for the server's output path: a scripted sequence of engine events (kToken + kText
// per generated piece, then kFinished) played through the same EventSource seam the engine feeds in production.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "server/event_source.h"
#include "tokenizer/chat_markers.h"

namespace dsflash::testing {

// The tag word of DSML tool calls in generated text, a std::string to build scripted outputs with.
inline const std::string kDsml = chat_markers::kDsml;

class ScriptedEventSource final : public server::EventSource {
 public:
  // One token per text piece (ids 100, 101, ...), then kFinished with `reason` and usage.
  ScriptedEventSource(const std::vector<std::string>& pieces, FinishReason reason, int64_t prompt_tokens = 10,
                      std::string stop_string = "") {
    int32_t id = 100;
    for (const std::string& piece : pieces) {
      Event token;
      token.kind = EventKind::kToken;
      token.token = id++;
      token.logprob = -0.5f;
      token.top_logprobs = {{token.token, -0.5f}, {7, -1.5f}};
      events_.push_back(token);
      Event text;
      text.kind = EventKind::kText;
      text.text = piece;
      events_.push_back(text);
    }
    Event finished;
    finished.kind = EventKind::kFinished;
    finished.finish_reason = reason;
    finished.stop_string = std::move(stop_string);
    finished.usage.prompt_tokens = prompt_tokens;
    finished.usage.generated_tokens = static_cast<int64_t>(pieces.size());
    events_.push_back(finished);
  }

  std::optional<Event> next_for(std::chrono::milliseconds) override {
    if (events_.empty()) return std::nullopt;
    if (cancelled_ && events_.front().kind != EventKind::kFinished) {  // the engine drops the rest at a step
      Event finished = events_.back();
      finished.finish_reason = FinishReason::kCancelled;
      events_.clear();
      return finished;
    }
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  bool done() const override { return events_.empty(); }
  void cancel() override { cancelled_ = true; ++cancels; }

  int cancels = 0;

 private:
  std::deque<Event> events_;
  bool cancelled_ = false;
};

}  // namespace dsflash::testing
