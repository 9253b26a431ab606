// Streaming parser of generated V4.1 text (spec: MODEL.md §8): reasoning (before </think>), content, and tool
// calls written in V4.1 DSML:
//   \n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="k" string="true|false">v</｜DSML｜ parameter>\n
//   ...</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>
// Text arrives in arbitrary pieces (token by token; a tag may be split anywhere). Text that could still become a
// tag is held back until it is decided, so well-formed DSML never reaches content. Each invoke becomes one
// OpenAI tool call when its closing tag arrives: string="true" values are JSON strings, the others are pasted
// as JSON (the official decode_dsml_to_arguments), giving arguments like {"city": "Paris", "days": 3}.
// Malformed or truncated DSML is given back verbatim as content and sets malformed(); nothing is ever dropped
// and no input makes it fail.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsflash {

struct ToolCall {
  int index = 0;          // order in the response
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct OutputEvent {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind = Kind::kContent;
  std::string text;  // reasoning / content delta
  ToolCall call;     // kToolCall
};

class OutputParser {
 public:
  // thinking: the prompt ended with <think>, so generation starts inside the reasoning.
  explicit OutputParser(bool thinking);

  // Feeds the next piece of generated text; returns what it completes.
  std::vector<OutputEvent> push(std::string_view text);
  // End of generation: flushes held text (unfinished tags, an unclosed DSML block become content + malformed).
  std::vector<OutputEvent> finish();

  bool malformed() const { return !problems_.empty(); }
  const std::vector<std::string>& problems() const { return problems_; }
  bool saw_end_of_sentence() const { return saw_eos_; }
  bool saw_think_end() const { return saw_think_end_; }

 private:
  enum class State { kReasoning, kContent, kCalls, kDone };
  void step(std::vector<OutputEvent>& out, bool final);
  void emit(std::vector<OutputEvent>& out, OutputEvent::Kind kind, std::string_view text);
  // One <｜DSML｜ invoke ...>...</｜DSML｜ invoke>; false + problem when malformed; warning for a soft issue.
  bool parse_invoke(std::string_view invoke, ToolCall& call, std::string& problem, std::string& warning) const;
  // Gives the undelivered raw DSML back as content, records the problem, returns to the content state.
  void fail_calls(std::vector<OutputEvent>& out, const std::string& problem);
  void note_after_calls(std::string_view content);

  State state_;
  std::string buffer_;       // undecided text of the current state
  std::string calls_raw_;    // raw text of the open DSML block not yet turned into calls
  bool in_calls_block_ = false;  // the "<｜DSML｜ calls>\n" header has been consumed
  bool separator_pending_ = false;  // an invoke just closed; its "\n" separator may follow
  bool after_calls_ = false;     // a calls block was closed: more content is unexpected
  int next_call_index_ = 0;
  bool saw_eos_ = false;
  bool saw_think_end_ = false;
  std::vector<std::string> problems_;
};

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool malformed = false;
  std::vector<std::string> problems;
};

// Whole-text convenience wrapper over OutputParser.
ParsedOutput parse_output(std::string_view text, bool thinking);

}  // namespace dsflash
