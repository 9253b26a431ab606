// The server's output path end to end on scripted token sequences (the tiny model's text is noise): engine
// events -> GenerationOutput (V4.1 output parser) -> the OpenAI / Anthropic writers -> SSE or JSON bytes, driven
// by ResponsePump. Reasoning and DSML markers split across pieces, malformed DSML, stop sequences, logprobs,
// usage fields, and a client that goes away.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/anthropic_response.h"
#include "server/openai_response.h"
#include "server/response_pump.h"
#include "scripted_events.h"

namespace dsflash::server {
namespace {

using dsflash::testing::ScriptedEventSource;
using Json = nlohmann::ordered_json;

using dsflash::testing::kDsml;
// One tool call in V4.1 DSML, cut into pieces that split every tag.
std::vector<std::string> dsml_call_pieces() {
  const std::string text = "\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n<" + kDsml +
                           " parameter name=\"city\" string=\"true\">Paris</" + kDsml + " parameter>\n<" + kDsml +
                           " parameter name=\"days\" string=\"false\">3</" + kDsml + " parameter>\n</" + kDsml +
                           " invoke>\n</" + kDsml + " calls>";
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size(); i += 5) pieces.push_back(text.substr(i, 5));
  // Keep pieces valid UTF-8 is not needed by the parser; re-join on byte boundaries of multi-byte characters.
  std::vector<std::string> fixed;
  std::string carry;
  for (const std::string& p : pieces) {
    carry += p;
    size_t cut = carry.size();
    while (cut > 0 && (static_cast<unsigned char>(carry[cut - 1]) & 0xC0) == 0x80) --cut;
    if (cut > 0 && static_cast<unsigned char>(carry[cut - 1]) >= 0xC0) --cut;
    if (cut == 0) continue;
    fixed.push_back(carry.substr(0, cut));
    carry = carry.substr(cut);
  }
  if (!carry.empty()) fixed.push_back(carry);
  return fixed;
}

struct SseEvent {
  std::string name;
  Json data;
  std::string raw;
};

std::vector<SseEvent> parse_sse(const std::string& bytes) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find("\n\n", pos);
    if (end == std::string::npos) end = bytes.size();
    const std::string block = bytes.substr(pos, end - pos);
    pos = end + 2;
    if (block.empty() || block[0] == ':') continue;
    SseEvent e;
    size_t line = 0;
    while (line < block.size()) {
      size_t nl = block.find('\n', line);
      if (nl == std::string::npos) nl = block.size();
      const std::string l = block.substr(line, nl - line);
      if (l.rfind("event: ", 0) == 0) e.name = l.substr(7);
      if (l.rfind("data: ", 0) == 0) {
        e.raw = l.substr(6);
        if (e.raw != "[DONE]") e.data = Json::parse(e.raw);
      }
      line = nl + 1;
    }
    out.push_back(std::move(e));
  }
  return out;
}

struct Played {
  std::string bytes;
  PumpResult result;
};

Played play(ScriptedEventSource& source, ResponseWriter& writer, OutputMode mode, bool thinking, int top_logprobs = -1,
            int fail_after_writes = -1) {
  Played p;
  int writes = 0;
  GenerationOutput output(mode, thinking, top_logprobs, [](int32_t id) { return "t" + std::to_string(id); });
  PumpHooks hooks;
  hooks.write = [&](const std::string& bytes) {
    if (fail_after_writes >= 0 && writes >= fail_after_writes) return false;
    ++writes;
    p.bytes += bytes;
    return true;
  };
  p.result = pump_response(source, output, writer, hooks);
  return p;
}

ResponseInfo info() { return ResponseInfo{"chatcmpl-7", "m", 1, 10}; }

TEST(OpenAiStream, ReasoningThenContentWithTheThinkEndSplitAcrossPieces) {
  ScriptedEventSource source({"Let me", " think</th", "ink>Hel", "lo!"}, FinishReason::kStop);
  OpenAiChatWriter writer(info(), /*stream=*/true, /*include_usage=*/true, /*logprobs=*/false);
  Played p = play(source, writer, OutputMode::kChat, /*thinking=*/true);
  auto events = parse_sse(p.bytes);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.front().data["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  for (const auto& e : events) {
    if (e.raw == "[DONE]" || e.data["choices"].empty()) continue;
    const Json& delta = e.data["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    EXPECT_TRUE(e.data.contains("usage"));  // include_usage: null on every chunk
  }
  EXPECT_EQ(reasoning, "Let me think");
  EXPECT_EQ(content, "Hello!");
  EXPECT_EQ(events.back().raw, "[DONE]");
  const Json& usage_chunk = events[events.size() - 2].data;
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 4);
  EXPECT_EQ(usage_chunk["usage"]["total_tokens"], 14);
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(usage_chunk["usage"]["prompt_cache_miss_tokens"], 10);
  EXPECT_GE(usage_chunk["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 2);
  EXPECT_EQ(events[events.size() - 3].data["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiStream, DsmlToolCallSplitEverywhereBecomesOneToolCallDelta) {
  std::vector<std::string> pieces = {"I'll check.</think>Checking"};
  for (const auto& piece : dsml_call_pieces()) pieces.push_back(piece);
  ScriptedEventSource source(pieces, FinishReason::kStop);
  OpenAiChatWriter writer(info(), true, false, false);
  Played p = play(source, writer, OutputMode::kChat, true);
  std::string content;
  int calls = 0;
  std::string finish;
  for (const auto& e : parse_sse(p.bytes)) {
    if (e.raw == "[DONE]") continue;
    const Json& choice = e.data["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    if (choice["delta"].contains("tool_calls")) {
      ++calls;
      const Json& call = choice["delta"]["tool_calls"][0];
      EXPECT_EQ(call["index"], 0);
      EXPECT_EQ(call["type"], "function");
      EXPECT_FALSE(call["id"].get<std::string>().empty());
      EXPECT_EQ(call["function"]["name"], "get_weather");
      EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()), Json::parse(R"({"city": "Paris", "days": 3})"));
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(content, "Checking");
  EXPECT_EQ(content.find(kDsml), std::string::npos);
  EXPECT_EQ(finish, "tool_calls");
}

TEST(OpenAiStream, MalformedDsmlComesBackAsContent) {
  const std::string broken =
      "\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"f\">\n<" + kDsml + " parameter name=\"x\">oops";
  ScriptedEventSource source({"ok", broken.substr(0, 7), broken.substr(7)}, FinishReason::kLength);
  OpenAiChatWriter writer(info(), false, false, false);
  Played p = play(source, writer, OutputMode::kChat, /*thinking=*/false);
  Json body = Json::parse(p.bytes);
  const Json& message = body["choices"][0]["message"];
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(message["content"], "ok" + broken);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(p.result.summary.malformed_tool_calls);
}

TEST(OpenAiJson, ReasoningToolCallsLogprobsAndUsage) {
  std::vector<std::string> pieces = {"hmm", "</think>"};
  for (const auto& piece : dsml_call_pieces()) pieces.push_back(piece);
  ScriptedEventSource source(pieces, FinishReason::kStop, 12);
  OpenAiChatWriter writer(info(), false, false, /*logprobs=*/true);
  Played p = play(source, writer, OutputMode::kChat, true, /*top_logprobs=*/1);
  Json body = Json::parse(p.bytes);
  const Json& message = body["choices"][0]["message"];
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(message["reasoning_content"], "hmm");
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  const Json& lp = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), pieces.size());
  EXPECT_EQ(lp[0]["token"], "t100");
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(body["usage"]["completion_tokens"], static_cast<int>(pieces.size()));
  EXPECT_EQ(body["usage"]["prompt_cache_hit_tokens"], 0);
}

TEST(AnthropicStream, EventSequenceWithThinkingTextAndToolUse) {
  std::vector<std::string> pieces = {"plan", " it</thi", "nk>Sure"};
  for (const auto& piece : dsml_call_pieces()) pieces.push_back(piece);
  ScriptedEventSource source(pieces, FinishReason::kStop, 20);
  AnthropicMessageWriter writer(ResponseInfo{"msg_9", "claude-x", 1, 20}, true);
  Played p = play(source, writer, OutputMode::kChat, true);
  std::vector<std::string> names;
  std::string thinking, text, json;
  for (const auto& e : parse_sse(p.bytes)) {
    if (e.name == "ping") continue;
    names.push_back(e.name);
    if (e.name == "content_block_delta") {
      const Json& d = e.data["delta"];
      if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
      if (d["type"] == "text_delta") text += d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") json += d["partial_json"].get<std::string>();
    }
    if (e.name == "content_block_start" && e.data["content_block"]["type"] == "tool_use") {
      EXPECT_EQ(e.data["content_block"]["name"], "get_weather");
      EXPECT_EQ(e.data["index"], 2);
    }
    if (e.name == "message_delta") {
      EXPECT_EQ(e.data["delta"]["stop_reason"], "tool_use");
      EXPECT_EQ(e.data["usage"]["output_tokens"], static_cast<int>(pieces.size()));
      EXPECT_EQ(e.data["usage"]["input_tokens"], 20);
      EXPECT_EQ(e.data["usage"]["cache_read_input_tokens"], 0);
    }
    if (e.name == "message_start") {
      EXPECT_EQ(e.data["message"]["usage"]["input_tokens"], 20);
    }
  }
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  int starts = 0, stops = 0;
  for (const auto& n : names) {
    starts += n == "content_block_start";
    stops += n == "content_block_stop";
  }
  EXPECT_EQ(starts, 3);
  EXPECT_EQ(stops, 3);
  EXPECT_EQ(thinking, "plan it");
  EXPECT_EQ(text, "Sure");
  EXPECT_EQ(Json::parse(json), Json::parse(R"({"city": "Paris", "days": 3})"));
}

TEST(AnthropicJson, StopSequenceAndMaxTokens) {
  ScriptedEventSource stopped({"a", "b"}, FinishReason::kStop, 5, "END");
  AnthropicMessageWriter w1(ResponseInfo{"msg_1", "m", 1, 5}, false);
  Json b1 = Json::parse(play(stopped, w1, OutputMode::kChat, false).bytes);
  EXPECT_EQ(b1["type"], "message");
  EXPECT_EQ(b1["stop_reason"], "stop_sequence");
  EXPECT_EQ(b1["stop_sequence"], "END");
  EXPECT_EQ(b1["content"][0]["type"], "text");
  EXPECT_EQ(b1["content"][0]["text"], "ab");

  ScriptedEventSource length({"x"}, FinishReason::kLength, 5);
  AnthropicMessageWriter w2(ResponseInfo{"msg_2", "m", 1, 5}, false);
  Json b2 = Json::parse(play(length, w2, OutputMode::kChat, false).bytes);
  EXPECT_EQ(b2["stop_reason"], "max_tokens");
  EXPECT_TRUE(b2["stop_sequence"].is_null());
  EXPECT_EQ(b2["usage"]["output_tokens"], 1);
}

TEST(Completions, RawTextIsNotParsed) {
  ScriptedEventSource source({"a</think>", "b"}, FinishReason::kLength);
  OpenAiCompletionWriter writer(ResponseInfo{"cmpl-1", "m", 1, 10}, false, false, false);
  Json body = Json::parse(play(source, writer, OutputMode::kRaw, false).bytes);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "a</think>b");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST(ResponsePump, ClientGoneCancelsAtOnceAndDrains) {
  ScriptedEventSource source({"a", "b", "c", "d", "e"}, FinishReason::kLength);
  OpenAiChatWriter writer(info(), true, false, false);
  Played p = play(source, writer, OutputMode::kChat, false, -1, /*fail_after_writes=*/2);
  EXPECT_TRUE(p.result.client_gone);
  EXPECT_EQ(source.cancels, 1);
  EXPECT_TRUE(p.result.finished);
  EXPECT_EQ(p.result.summary.finish_reason, FinishReason::kCancelled);
}

TEST(ResponsePump, EngineErrorBecomesAnErrorEvent) {
  ScriptedEventSource source({"a"}, FinishReason::kError);
  OpenAiChatWriter writer(info(), true, false, false);
  GenerationOutput output(OutputMode::kChat, false, -1, {});
  std::string bytes;
  PumpHooks hooks;
  hooks.write = [&](const std::string& b) { bytes += b; return true; };
  // Mark the scripted kFinished as an error.
  struct ErrorSource : EventSource {
    ScriptedEventSource& inner;
    explicit ErrorSource(ScriptedEventSource& s) : inner(s) {}
    std::optional<Event> next_for(std::chrono::milliseconds t) override {
      auto e = inner.next_for(t);
      if (e && e->kind == EventKind::kFinished) e->error = EngineError{ErrorCode::kInternal, "forward failed"};
      return e;
    }
    bool done() const override { return inner.done(); }
    void cancel() override { inner.cancel(); }
  } errors(source);
  pump_response(errors, output, writer, hooks);
  EXPECT_NE(bytes.find("forward failed"), std::string::npos);
  EXPECT_NE(bytes.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace dsflash::server
