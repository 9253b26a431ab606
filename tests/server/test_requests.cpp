// The request parsers of both APIs (400s naming the field; thinking, effort and tool_choice mapping) and the
// history round trip: a turn-2 request built from turn 1's response, as a client sends it back, renders a prompt
// whose token ids start with turn 1's prompt ids (so turn 2 hits the prefix cache for turn 1).
#include <gtest/gtest.h>

#include <filesystem>

#include "scripted_events.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/response_pump.h"
#include "tokenizer/tokenizer.h"

namespace dsflash::server {
namespace {

using Json = OrderedJson;
using dsflash::testing::kDsml;

ApiError openai_error(const std::string& body) {
  auto json = parse_json_object(body);
  if (failed(json)) return std::get<ApiError>(json);
  auto r = parse_openai_chat(std::get<Json>(json));
  return failed(r) ? std::get<ApiError>(r) : ApiError{0, "", ""};
}

ApiError anthropic_error(const std::string& body) {
  auto json = parse_json_object(body);
  if (failed(json)) return std::get<ApiError>(json);
  auto r = parse_anthropic_messages(std::get<Json>(json));
  return failed(r) ? std::get<ApiError>(r) : ApiError{0, "", ""};
}

TEST(OpenAiRequest, BadRequestsName400s) {
  EXPECT_EQ(openai_error("{not json").status, 400);
  EXPECT_EQ(openai_error("[1]").status, 400);
  EXPECT_NE(openai_error(R"({"messages": [{"role": "user", "content": "x"}]})").message.find("model"), std::string::npos);
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": []})").status, 400);
  EXPECT_NE(openai_error(R"({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})").message.find("wizard"),
            std::string::npos);
  EXPECT_NE(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": 5}]})").message.find("messages[0].content"),
            std::string::npos);
  EXPECT_NE(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})").message.find("temperature"),
            std::string::npos);
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})").status, 400);
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})").code,
            "unsupported_content");
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})").status, 400);
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2})").status, 400);
  EXPECT_EQ(openai_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})").status, 0);
}

TEST(OpenAiRequest, ThinkingEffortSamplingAndToolChoice) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "a", "parameters": {}}},
                                     {"type": "function", "function": {"name": "b", "parameters": {}}}])");
  Json body = {{"model", "m"}, {"messages", Json::parse(R"([{"role": "user", "content": "x"}])")}};
  auto plain = std::get<ChatRequest>(parse_openai_chat(body));
  EXPECT_TRUE(plain.render.thinking);
  EXPECT_EQ(plain.render.reasoning_effort, 75);
  body["thinking"] = {{"type", "disabled"}};
  EXPECT_FALSE(std::get<ChatRequest>(parse_openai_chat(body)).render.thinking);
  body.erase("thinking");
  body["chat_template_kwargs"] = {{"thinking", false}};
  EXPECT_FALSE(std::get<ChatRequest>(parse_openai_chat(body)).render.thinking);
  body.erase("chat_template_kwargs");
  body["reasoning_effort"] = "max";
  EXPECT_EQ(std::get<ChatRequest>(parse_openai_chat(body)).render.reasoning_effort, 100);
  body["reasoning_effort"] = "low";
  EXPECT_EQ(std::get<ChatRequest>(parse_openai_chat(body)).render.reasoning_effort, 50);
  body["temperature"] = 0;
  body["top_k"] = 5;
  body["seed"] = 9;
  body["stop"] = "END";
  body["max_completion_tokens"] = 7;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = std::get<ChatRequest>(parse_openai_chat(body));
  EXPECT_EQ(r.generation.sampling.temperature, 0.0f);
  EXPECT_EQ(r.generation.sampling.top_k, 5);
  EXPECT_EQ(r.generation.sampling.seed, 9u);
  EXPECT_EQ(r.generation.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(*r.generation.max_tokens, 7);
  EXPECT_TRUE(r.generation.logprobs && r.generation.stream && r.generation.include_usage);
  body["tools"] = tools;
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "b"}}}};
  auto named = std::get<ChatRequest>(parse_openai_chat(body));
  ASSERT_EQ(named.tools.size(), 1u);
  EXPECT_EQ(named.tools[0]["function"]["name"], "b");
  body["tool_choice"] = "none";
  EXPECT_TRUE(std::get<ChatRequest>(parse_openai_chat(body)).tools.is_null());
}

TEST(AnthropicRequest, BadRequestsAndMapping) {
  EXPECT_NE(anthropic_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})").message.find("max_tokens"),
            std::string::npos);
  EXPECT_EQ(anthropic_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})").status, 400);
  EXPECT_EQ(anthropic_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})").code,
            "unsupported_content");
  EXPECT_EQ(anthropic_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": []}]})").status, 400);
  auto ok = parse_anthropic_messages(Json::parse(R"({"model": "claude-x", "max_tokens": 5,
      "system": [{"type": "text", "text": "be brief"}],
      "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}, "stop_sequences": ["Z"],
      "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
      "messages": [{"role": "user", "content": "hi"}]})"));
  ASSERT_FALSE(failed(ok));
  const ChatRequest& r = std::get<ChatRequest>(ok);
  EXPECT_TRUE(r.render.thinking);
  EXPECT_EQ(r.render.reasoning_effort, 100);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "be brief");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(r.generation.stop, std::vector<std::string>{"Z"});
}

// ---- history round trips ----

class RoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = std::string(DSFLASH_SHARED_DIR) + "/tokenizer/deepseek_v3_tokenizer.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "no shared tokenizer";
    auto t = Tokenizer::from_file(path);
    ASSERT_TRUE(t.ok()) << t.status().message();
    tokenizer_.emplace(std::move(*t));
  }
  std::vector<int32_t> ids(const ChatRequest& r) {
    auto text = render_chat_request(r);
    EXPECT_FALSE(failed(text)) << std::get<ApiError>(text).message;
    auto encoded = tokenizer_->encode(failed(text) ? std::string("x") : std::get<std::string>(text));
    EXPECT_TRUE(encoded.ok());
    return *encoded;
  }
  // The response body the writer produces for scripted output pieces.
  static Json respond(ResponseWriter& writer, const std::vector<std::string>& pieces, bool thinking) {
    testing::ScriptedEventSource source(pieces, FinishReason::kStop);
    GenerationOutput output(OutputMode::kChat, thinking, -1, {});
    std::string bytes;
    PumpHooks hooks;
    hooks.write = [&](const std::string& b) { bytes += b; return true; };
    pump_response(source, output, writer, hooks);
    return Json::parse(bytes);
  }
  static bool starts_with(const std::vector<int32_t>& longer, const std::vector<int32_t>& prefix) {
    return longer.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), longer.begin());
  }
  std::optional<Tokenizer> tokenizer_;
};

std::vector<std::string> tool_call_output() {
  return {"Need weather.", "</think>",
          "\n\n<" + kDsml + " calls>\n<" + kDsml + " invoke name=\"get_weather\">\n<" + kDsml +
              " parameter name=\"city\" string=\"true\">Paris</" + kDsml + " parameter>\n</" + kDsml + " invoke>\n</" +
              kDsml + " calls>"};
}

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";

TEST_F(RoundTrip, OpenAiChatModeTurnTwoExtendsTurnOne) {
  Json body = {{"model", "m"}, {"thinking", {{"type", "disabled"}}},
               {"messages", Json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])")}};
  auto turn1 = std::get<ChatRequest>(parse_openai_chat(body));
  const std::vector<int32_t> ids1 = ids(turn1);
  OpenAiChatWriter writer(ResponseInfo{"chatcmpl-1", "m", 1, 0}, false, false, false);
  Json response = respond(writer, {"Hi", " there."}, false);
  body["messages"].push_back(response["choices"][0]["message"]);
  body["messages"].push_back(Json{{"role", "user"}, {"content", "More?"}});
  auto turn2 = std::get<ChatRequest>(parse_openai_chat(body));
  const std::vector<int32_t> ids2 = ids(turn2);
  ASSERT_TRUE(starts_with(ids2, ids1));
  // The assistant turn follows exactly as generated, closed by the end-of-sentence token.
  auto content = tokenizer_->encode("Hi there.<｜end▁of▁sentence｜>");
  ASSERT_TRUE(content.ok());
  EXPECT_TRUE(std::equal(content->begin(), content->end(), ids2.begin() + static_cast<long>(ids1.size())));
}

TEST_F(RoundTrip, OpenAiThinkingToolCallAndToolResult) {
  Json body = {{"model", "m"}, {"tools", Json::parse(kTools)},
               {"messages", Json::parse(R"([{"role": "user", "content": "Weather in Paris?"}])")}};
  auto turn1 = std::get<ChatRequest>(parse_openai_chat(body));
  const std::vector<int32_t> ids1 = ids(turn1);
  OpenAiChatWriter writer(ResponseInfo{"chatcmpl-2", "m", 1, 0}, false, false, false);
  Json response = respond(writer, tool_call_output(), true);
  Json message = response["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  body["messages"].push_back(message);
  body["messages"].push_back(Json{{"role", "tool"}, {"tool_call_id", message["tool_calls"][0]["id"]}, {"content", "sunny"}});
  auto turn2 = std::get<ChatRequest>(parse_openai_chat(body));
  const std::vector<int32_t> ids2 = ids(turn2);
  EXPECT_TRUE(starts_with(ids2, ids1));
  const std::string text2 = std::get<std::string>(render_chat_request(turn2));
  EXPECT_NE(text2.find("Need weather.</think>"), std::string::npos);  // reasoning kept: tools are defined
  EXPECT_NE(text2.find("<tool_result>sunny</tool_result>"), std::string::npos);
}

TEST_F(RoundTrip, AnthropicThinkingToolUseAndToolResult) {
  Json body = {{"model", "claude-x"}, {"max_tokens", 50}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 100}}},
               {"tools", Json::parse(R"([{"name": "get_weather", "description": "Weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])")},
               {"messages", Json::parse(R"([{"role": "user", "content": "Weather in Paris?"}])")}};
  auto turn1 = std::get<ChatRequest>(parse_anthropic_messages(body));
  const std::vector<int32_t> ids1 = ids(turn1);
  AnthropicMessageWriter writer(ResponseInfo{"msg_3", "claude-x", 1, 0}, false);
  Json response = respond(writer, tool_call_output(), true);
  ASSERT_EQ(response["content"].back()["type"], "tool_use");
  body["messages"].push_back(Json{{"role", "assistant"}, {"content", response["content"]}});
  body["messages"].push_back(Json{{"role", "user"},
                                  {"content", Json::array({Json{{"type", "tool_result"},
                                                                {"tool_use_id", response["content"].back()["id"]},
                                                                {"content", "sunny"}}})}});
  auto turn2 = std::get<ChatRequest>(parse_anthropic_messages(body));
  const std::vector<int32_t> ids2 = ids(turn2);
  EXPECT_TRUE(starts_with(ids2, ids1));
  // Both APIs render the same history the same way.
  Json openai = {{"model", "m"}, {"tools", Json::parse(kTools)},
                 {"messages", Json::parse(R"([{"role": "user", "content": "Weather in Paris?"}])")}};
  EXPECT_EQ(std::get<std::string>(render_chat_request(turn1)),
            std::get<std::string>(render_chat_request(std::get<ChatRequest>(parse_openai_chat(openai)))));
}

}  // namespace
}  // namespace dsflash::server
