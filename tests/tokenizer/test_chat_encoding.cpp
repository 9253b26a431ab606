// V4.1 prompt rendering against goldens from the public reference encoder (SGLang's encoding_dsv41.py with the
// release effort aliases; tools/tokenizer/gen_chat_goldens.py over tests/data/tokenizer/conversations.json).
#include <gtest/gtest.h>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/python_json.h"
#include "tokenizer_test_data.h"

namespace dsflash {
namespace {

OrderedJson load_ordered(const std::string& name) {
  return OrderedJson::parse(test::read_file(test::data_path(name)));
}

TEST(ChatEncoding, MatchesReferenceEncoder) {
  const OrderedJson conversations = load_ordered("conversations.json");
  const OrderedJson goldens = load_ordered("chat_goldens.json");
  std::map<std::string, OrderedJson> by_name;
  for (const auto& c : conversations["conversations"]) by_name[c["name"].get<std::string>()] = c;
  ASSERT_GT(goldens["renders"].size(), 150u);
  for (const auto& g : goldens["renders"]) {
    const std::string name = g["name"];
    const OrderedJson& conv = by_name.at(name);
    ChatRenderOptions options;
    options.thinking = g["thinking"].get<bool>();
    auto effort = parse_reasoning_effort(g["effort"]);
    ASSERT_TRUE(effort.ok()) << effort.status().message();
    options.reasoning_effort = *effort;
    auto rendered = render_chat_prompt(conv["messages"], conv.value("tools", OrderedJson()), options);
    const std::string label = name + " thinking=" + std::to_string(options.thinking) + " effort=" + g["effort"].dump();
    if (g.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << label << ": the reference refuses (" << g["error"] << ")";
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << label << ": " << rendered.status().message();
    EXPECT_EQ(rendered->text, g["prompt"].get<std::string>()) << label;
    ASSERT_EQ(rendered->images.size(), g["images"].size()) << label;
    for (size_t i = 0; i < rendered->images.size(); ++i) EXPECT_EQ(rendered->images[i], g["images"][i]) << label;
  }
}

TEST(ChatEncoding, SpecLayoutAndAliases) {
  const auto messages = OrderedJson::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"U"}])");
  ChatRenderOptions options;
  options.reasoning_effort = 42;
  auto thinking = render_chat_prompt(messages, nullptr, options);
  ASSERT_TRUE(thinking.ok());
  EXPECT_EQ(thinking->text,
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 42 (range 1-100, the higher the value, the more "
            "thorough the reasoning)\n\nS<｜User｜>U<｜Assistant｜><think>");
  options.thinking = false;
  auto chat = render_chat_prompt(messages, nullptr, options);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->text, "<｜begin▁of▁sentence｜><｜System｜>S<｜User｜>U<｜Assistant｜></think>");
  EXPECT_EQ(*parse_reasoning_effort("low"), 50);
  EXPECT_EQ(*parse_reasoning_effort("high"), 75);
  EXPECT_EQ(*parse_reasoning_effort("max"), 100);
  EXPECT_EQ(*parse_reasoning_effort(nullptr), 75);
  EXPECT_EQ(*parse_reasoning_effort(1), 1);
  EXPECT_FALSE(parse_reasoning_effort("xhigh").ok());  // pre-release alias, gone in the release
  EXPECT_FALSE(parse_reasoning_effort(0).ok());
  EXPECT_FALSE(parse_reasoning_effort(101).ok());
  EXPECT_FALSE(parse_reasoning_effort(50.5).ok());
  options.reasoning_effort = 0;
  EXPECT_FALSE(render_chat_prompt(messages, nullptr, options).ok());
}

TEST(ChatEncoding, RefusesMalformedInput) {
  ChatRenderOptions options;
  for (const char* bad : {R"({"role":"user"})", R"([1])", R"([{"content":"x"}])", R"([{"role":"user","content":5}])",
                          R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"1"}}]}])",
                          R"([{"role":"assistant","tool_calls":{"a":1}}])"}) {
    auto r = render_chat_prompt(OrderedJson::parse(bad), nullptr, options);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(PythonJson, MatchesJsonDumps) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.5), "0.5");
  EXPECT_EQ(python_float_repr(1e-7), "1e-07");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(123456789.125), "123456789.125");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(python_json_dumps(OrderedJson::parse(R"({"b":1,"a":[true,null,"x\ny\u0001é"]})")),
            "{\"b\": 1, \"a\": [true, null, \"x\\ny\\u0001é\"]}");
}

}  // namespace
}  // namespace dsflash
