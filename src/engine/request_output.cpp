#include "engine/request_output.h"

#include <algorithm>

namespace dsflash::engine {

RequestOutput::RequestOutput(dsflash::RequestId id, const Tokenizer* tokenizer, const GenerationRequest& request,
                             int64_t prompt_tokens, std::vector<int32_t> stop_ids)
    : id_(id), stops_(request.stop_strings), stop_ids_(std::move(stop_ids)) {
  if (tokenizer != nullptr && (request.detokenize || request.parse_output || !request.stop_strings.empty())) {
    detokenizer_.emplace(*tokenizer);
  }
  if (tokenizer != nullptr && request.parse_output) parser_.emplace(request.thinking);
  usage_.prompt_tokens = prompt_tokens;
}

dsflash::Event RequestOutput::make(EventKind kind) const {
  dsflash::Event e;
  e.kind = kind;
  e.request = id_;
  return e;
}

void RequestOutput::on_prompt_logits(Event& event, std::vector<dsflash::Event>* out) {
  if (finished_) return;
  dsflash::Event e = make(EventKind::kPromptLogits);
  e.logits = std::move(event.logits);
  e.positions = std::move(event.positions);
  out->push_back(std::move(e));
}

void RequestOutput::emit_text(const std::string& text, std::vector<dsflash::Event>* out) {
  if (text.empty()) return;
  dsflash::Event e = make(EventKind::kText);
  e.text = text;
  out->push_back(std::move(e));
  if (parser_) emit_parsed(parser_->push(text), out);
}

void RequestOutput::emit_parsed(std::vector<OutputEvent> parsed, std::vector<dsflash::Event>* out) {
  for (OutputEvent& one : parsed) {
    dsflash::Event e = make(one.kind == OutputEvent::Kind::kReasoning ? EventKind::kReasoning
                            : one.kind == OutputEvent::Kind::kContent ? EventKind::kContent
                                                                      : EventKind::kToolCall);
    e.text = std::move(one.text);
    e.tool_call = ToolCallEvent{one.call.index, std::move(one.call.name), std::move(one.call.arguments)};
    out->push_back(std::move(e));
  }
}

void RequestOutput::on_token(Event& event, std::vector<dsflash::Event>* out) {
  if (finished_ || stops_.matched()) return;
  ++usage_.generated_tokens;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), event.token) != stop_ids_.end()) {
    matched_stop_id_ = event.token;  // the scheduler finishes the request; the id is not output
    return;
  }
  dsflash::Event e = make(EventKind::kToken);
  e.token = event.token;
  e.logprob = event.logprob;
  e.top_logprobs = std::move(event.top_logprobs);
  e.logits = std::move(event.logits);
  e.positions = std::move(event.positions);
  out->push_back(std::move(e));
  if (detokenizer_) emit_text(stops_.push(detokenizer_->push(event.token)), out);
}

void RequestOutput::finish(dsflash::FinishReason reason, std::optional<EngineError> error, int64_t global_kv_bytes,
                           std::vector<dsflash::Event>* out) {
  if (finished_) return;
  finished_ = true;
  if (detokenizer_ && !stops_.matched()) {
    std::string tail = stops_.push(detokenizer_->finish());
    if (!stops_.matched()) tail += stops_.finish();
    emit_text(tail, out);
  }
  if (parser_) emit_parsed(parser_->finish(), out);
  dsflash::Event e = make(EventKind::kFinished);
  e.finish_reason = stops_.matched() || matched_stop_id_ >= 0 ? dsflash::FinishReason::kStop : reason;
  if (e.finish_reason == dsflash::FinishReason::kStop) {
    e.stop_id = matched_stop_id_;
    e.stop_string = stops_.matched_string();
  }
  e.usage = usage_;
  e.error = std::move(error);
  e.global_kv_bytes = global_kv_bytes;
  out->push_back(std::move(e));
}

}  // namespace dsflash::engine
