// Streaming output parser: against the reference parser (parse_message_from_completion_text goldens), fed whole,
// byte by byte, in odd chunks and token by token; malformed / truncated DSML becomes flagged content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/python_json.h"
#include "tokenizer_test_data.h"

namespace dsflash {
namespace {

const std::string D = "｜DSML｜";

ParsedOutput parse_in_chunks(const std::string& text, bool thinking, size_t chunk) {
  OutputParser parser(thinking);
  ParsedOutput result;
  auto take = [&](const std::vector<OutputEvent>& events) {
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kReasoning) result.reasoning += e.text;
      if (e.kind == OutputEvent::Kind::kContent) result.content += e.text;
      if (e.kind == OutputEvent::Kind::kToolCall) result.tool_calls.push_back(e.call);
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) take(parser.push(text.substr(i, chunk)));
  take(parser.finish());
  result.malformed = parser.malformed();
  result.problems = parser.problems();
  return result;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& label) {
  EXPECT_EQ(a.reasoning, b.reasoning) << label;
  EXPECT_EQ(a.content, b.content) << label;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << label;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << label;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << label;
  }
  EXPECT_EQ(a.malformed, b.malformed) << label;
}

TEST(OutputParser, MatchesReferenceParser) {
  const auto goldens = OrderedJson::parse(test::read_file(test::data_path("chat_goldens.json")));
  int checked = 0;
  for (const auto& g : goldens["parses"]) {
    const std::string name = g["name"];
    const std::string text = g["text"];
    const bool thinking = g["thinking"];
    const ParsedOutput whole = parse_output(text, thinking);
    if (g.contains("parsed")) {
      const auto& p = g["parsed"];
      EXPECT_FALSE(whole.malformed) << name << ": " << (whole.problems.empty() ? "" : whole.problems[0]);
      EXPECT_EQ(whole.reasoning, p["reasoning_content"].get<std::string>()) << name;
      EXPECT_EQ(whole.content, p["content"].get<std::string>()) << name;
      ASSERT_EQ(whole.tool_calls.size(), p["tool_calls"].size()) << name;
      for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
        EXPECT_EQ(whole.tool_calls[i].name, p["tool_calls"][i]["function"]["name"].get<std::string>()) << name;
        EXPECT_EQ(whole.tool_calls[i].arguments, p["tool_calls"][i]["function"]["arguments"].get<std::string>()) << name;
        EXPECT_TRUE(nlohmann::json::accept(whole.tool_calls[i].arguments)) << name;
      }
      EXPECT_EQ(whole.content.find(D), std::string::npos) << name << ": DSML leaked into content";
      ++checked;
    }
    // Any split of the text gives the same result as the whole text.
    for (size_t chunk : {1, 2, 3, 5, 7, 13}) expect_same(parse_in_chunks(text, thinking, chunk), whole, name + " chunk");
  }
  EXPECT_GE(checked, 5);
}

TEST(OutputParser, TokenByTokenThroughTheDetokenizer) {
  const auto& tok = test::v41_tokenizer();
  const auto goldens = OrderedJson::parse(test::read_file(test::data_path("chat_goldens.json")));
  for (const auto& g : goldens["parses"]) {
    const std::string text = g["text"];
    auto ids = tok.encode(text);
    ASSERT_TRUE(ids.ok());
    StreamingDetokenizer detok(tok);
    OutputParser parser(g["thinking"].get<bool>());
    ParsedOutput streamed;
    auto take = [&](const std::vector<OutputEvent>& events) {
      for (const auto& e : events) {
        if (e.kind == OutputEvent::Kind::kReasoning) streamed.reasoning += e.text;
        if (e.kind == OutputEvent::Kind::kContent) streamed.content += e.text;
        if (e.kind == OutputEvent::Kind::kToolCall) streamed.tool_calls.push_back(e.call);
      }
    };
    for (int32_t id : *ids) take(parser.push(detok.push(id)));
    take(parser.push(detok.finish()));
    take(parser.finish());
    streamed.malformed = parser.malformed();
    expect_same(streamed, parse_output(text, g["thinking"].get<bool>()), g["name"].get<std::string>());
  }
}

TEST(OutputParser, StreamsDeltasWithoutWaitingForTheEnd) {
  OutputParser parser(true);
  auto events = parser.push("Thinking about ");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, OutputEvent::Kind::kReasoning);
  EXPECT_EQ(events[0].text, "Thinking about ");
  events = parser.push("it</thi");  // a tag split across tokens is held back
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "it");
  events = parser.push("nk>Answer");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, OutputEvent::Kind::kContent);
  EXPECT_EQ(events[0].text, "Answer");
  events = parser.push("\n\n");  // might introduce a calls block: held
  EXPECT_TRUE(events.empty());
  events = parser.push("<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n");
  EXPECT_TRUE(events.empty());
  events = parser.push("<｜DSML｜ parameter name=\"x\" string=\"false\">[1]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, OutputEvent::Kind::kToolCall);
  EXPECT_EQ(events[0].call.name, "f");
  EXPECT_EQ(events[0].call.arguments, "{\"x\": [1]}");
  events = parser.push("</｜DSML｜ calls><｜end▁of▁sentence｜>");
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(parser.finish().empty());
  EXPECT_FALSE(parser.malformed());
  EXPECT_TRUE(parser.saw_end_of_sentence());
}

TEST(OutputParser, NewlinesNotBeforeDsmlAreContent) {
  auto r = parse_output("a\n\nb\n\n", false);
  EXPECT_EQ(r.content, "a\n\nb\n\n");
  EXPECT_FALSE(r.malformed);
}

// Malformed or truncated DSML: flagged, and all its text comes back as content (nothing lost, no crash).
TEST(OutputParser, MalformedDsmlBecomesFlaggedContent) {
  const std::vector<std::string> bad = {
      "\n\n<" + D + " calls>\n<" + D + " invoke name=\"f\">\n<" + D + " parameter name=\"a\">1</" + D + " parameter>\n</" + D + " invoke>\n</" + D + " calls>",
      "\n\n<" + D + " calls>\n<" + D + " invoke name=\"f\">\n<" + D + " parameter name=\"a\" string=\"true\">x",  // truncated
      "\n\n<" + D + " calls>\n<" + D + " invoke nam=\"f\">\n</" + D + " invoke>\n</" + D + " calls>",
      "<" + D + " invoke name=\"f\">\n</" + D + " invoke>",  // no calls block
      "\n\n<" + D + " calls>\ngarbage</" + D + " calls>",
      "\n\n<" + D + " calls>\n<" + D + " invoke name=\"f\">\n<" + D + " parameter name=\"a\" string=\"true\">1</" + D +
          " parameter>\n<" + D + " parameter name=\"a\" string=\"true\">2</" + D + " parameter>\n</" + D + " invoke>\n</" + D + " calls>",
      "\n\n<" + D + " calls",
      "<" + D,
  };
  for (const auto& text : bad) {
    auto r = parse_output(text, false);
    EXPECT_TRUE(r.malformed) << text;
    EXPECT_TRUE(r.tool_calls.empty()) << text;
    // Every byte of the input is in the content, in order (the DSML was given back verbatim).
    EXPECT_EQ(r.content, text) << text;
    for (size_t chunk : {1, 4}) expect_same(parse_in_chunks(text, false, chunk), r, text);
  }
  // A good call, then a broken one: the first is kept, the second comes back as text.
  const std::string mixed = "\n\n<" + D + " calls>\n<" + D + " invoke name=\"ok\">\n</" + D + " invoke>\n<" + D +
                            " invoke name=\"bad\">\noops</" + D + " invoke>\n</" + D + " calls>";
  auto r = parse_output(mixed, false);
  EXPECT_TRUE(r.malformed);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "ok");
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
  EXPECT_NE(r.content.find("oops"), std::string::npos);
  // string="false" that is not JSON: still a call, value kept as a string, flagged.
  auto soft = parse_output("\n\n<" + D + " calls>\n<" + D + " invoke name=\"f\">\n<" + D +
                               " parameter name=\"n\" string=\"false\">not json</" + D + " parameter>\n</" + D +
                               " invoke>\n</" + D + " calls>",
                           false);
  ASSERT_EQ(soft.tool_calls.size(), 1u);
  EXPECT_EQ(soft.tool_calls[0].arguments, "{\"n\": \"not json\"}");
  EXPECT_TRUE(soft.malformed);
}

// Inputs the fuzzer (fuzz/fuzz_output_parser.cpp) once broke: first byte = mode and chunk size, then the text.
TEST(OutputParser, FuzzRegressions) {
  for (const char* name : {"fuzz_regressions/output_parser_1.bin", "fuzz_regressions/output_parser_2.bin",
                           "fuzz_regressions/output_parser_3.bin"}) {
    const std::string data = test::read_file(test::data_path(name));
    ASSERT_FALSE(data.empty()) << name;
    const bool thinking = data[0] & 1;
    const std::string text = data.substr(1);
    const auto whole = parse_output(text, thinking);
    for (size_t chunk = 1; chunk <= 9; ++chunk) expect_same(parse_in_chunks(text, thinking, chunk), whole, name);
    for (const auto& call : whole.tool_calls) {
      EXPECT_TRUE(call.arguments.find('\0') == std::string::npos && nlohmann::json::accept(call.arguments))
          << call.arguments;
    }
  }
}

TEST(OutputParser, ReasoningEdgeCases) {
  auto truncated = parse_output("still thinking", true);
  EXPECT_EQ(truncated.reasoning, "still thinking");
  EXPECT_TRUE(truncated.malformed);
  auto eos_in_reasoning = parse_output("r<｜end▁of▁sentence｜>", true);
  EXPECT_EQ(eos_in_reasoning.reasoning, "r");
  EXPECT_TRUE(eos_in_reasoning.malformed);
  auto after_eos = parse_output("a<｜end▁of▁sentence｜>b", false);
  EXPECT_EQ(after_eos.content, "ab");
  EXPECT_TRUE(after_eos.malformed);
  // Tool calls without </think>: the calls are still recovered, and flagged.
  auto calls_in_reasoning = parse_output("plan\n\n<" + D + " calls>\n<" + D + " invoke name=\"g\">\n</" + D +
                                             " invoke>\n</" + D + " calls>",
                                         true);
  EXPECT_EQ(calls_in_reasoning.reasoning, "plan");
  ASSERT_EQ(calls_in_reasoning.tool_calls.size(), 1u);
  EXPECT_TRUE(calls_in_reasoning.malformed);
  auto chat_no_eos = parse_output("partial answer", false);
  EXPECT_EQ(chat_no_eos.content, "partial answer");
  EXPECT_FALSE(chat_no_eos.malformed);  // stopping at max_tokens is not a format error
}

}  // namespace
}  // namespace dsflash
