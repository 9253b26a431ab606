// What one request's generated ids become on its public stream (include/dsflash/engine.h): token events (stop
// ids suppressed), detokenised text with stop strings held back and matched, output-parser events, and the final
// kFinished with usage. Runs on the engine's loop thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsflash/engine.h"
#include "engine/scheduler.h"
#include "engine/stop_strings.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace dsflash::engine {

class RequestOutput {
 public:
  // tokenizer: null = no text. stop_ids: the request's (the EOS id included when stop_at_eos).
  RequestOutput(dsflash::RequestId id, const Tokenizer* tokenizer, const GenerationRequest& request,
                int64_t prompt_tokens, std::vector<int32_t> stop_ids);

  void on_prompt_logits(Event& event, std::vector<dsflash::Event>* out);
  void on_token(Event& event, std::vector<dsflash::Event>* out);
  // The final events (held text, parser flush unless a stop string cut the text, kFinished). Once only.
  void finish(dsflash::FinishReason reason, std::optional<EngineError> error, int64_t global_kv_bytes,
              std::vector<dsflash::Event>* out);

  // Prompt tokens the prefix cache restored (reported in the usage of kFinished).
  void set_cached_tokens(int64_t tokens) { usage_.cached_tokens = tokens; }
  // What speculative decoding did (reported in the usage of kFinished).
  void set_speculation(const SpeculativeStats& stats) {
    usage_.decode_steps = stats.decode_steps;
    usage_.draft_tokens = stats.draft_tokens;
    usage_.accepted_tokens = stats.accepted_tokens;
  }
  bool stop_string_matched() const { return stops_.matched(); }
  bool finished() const { return finished_; }
  dsflash::RequestId id() const { return id_; }

 private:
  void emit_text(const std::string& text, std::vector<dsflash::Event>* out);
  void emit_parsed(std::vector<OutputEvent> parsed, std::vector<dsflash::Event>* out);
  dsflash::Event make(EventKind kind) const;

  dsflash::RequestId id_;
  std::optional<StreamingDetokenizer> detokenizer_;
  StopStringFilter stops_;
  std::optional<OutputParser> parser_;
  std::vector<int32_t> stop_ids_;
  Usage usage_;
  int32_t matched_stop_id_ = -1;
  bool finished_ = false;
};

}  // namespace dsflash::engine
