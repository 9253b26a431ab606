// Tokenizer ids against Hugging Face tokenizers 0.23 (goldens made by tools/tokenizer/gen_tokenizer_goldens.py
// in a Debian-unstable chroot), the MODEL.md §8 probe, V4.1 added tokens, decoding, refusals.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/detokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace dsflash {
namespace {

using test::data_path;
using test::read_json_cached;

const nlohmann::json& goldens() { return read_json_cached(data_path("encode_goldens.json")); }

std::string case_text(const nlohmann::json& c) {
  return c.contains("hex") ? test::from_hex(c["hex"].get<std::string>()) : c["text"].get<std::string>();
}

TEST(Tokenizer, LoadsV3Shape) {
  const auto& t = test::v3_tokenizer();
  EXPECT_EQ(t.bpe().vocab_size(), 128000u);
  EXPECT_EQ(t.bpe().num_merges(), 127741u);
  EXPECT_EQ(t.added_tokens().size(), 818u);
  EXPECT_EQ(t.id_limit(), 128815);
}

TEST(Tokenizer, GoldenProbeOfModelSpec) {
  // MODEL.md §8: "Hello, world! 123\nsecond line" -> [19923,14,2058,3,223,6895,201,10930,2562].
  const std::vector<int32_t> expected = {19923, 14, 2058, 3, 223, 6895, 201, 10930, 2562};
  for (const Tokenizer* t : {&test::v3_tokenizer(), &test::v41_tokenizer()}) {
    auto ids = t->encode("Hello, world! 123\nsecond line");
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_EQ(*ids, expected);
  }
}

TEST(Tokenizer, IdsEqualHuggingFaceOnCorpus) {
  const auto& cases = goldens()["cases"];
  ASSERT_GT(cases.size(), 500u);
  int mismatches = 0;
  for (const auto& c : cases) {
    const std::string text = case_text(c);
    for (const auto& [key, tok] : {std::pair{"v3", &test::v3_tokenizer()}, std::pair{"v41", &test::v41_tokenizer()}}) {
      auto ids = tok->encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status().message();
      const auto expected = c[key].get<std::vector<int32_t>>();
      if (*ids != expected && ++mismatches <= 20) {
        ADD_FAILURE() << key << " case " << c["name"] << ": ids differ from Hugging Face\n got "
                      << nlohmann::json(*ids).dump() << "\n want " << nlohmann::json(expected).dump();
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// Every Unicode scalar value through the pre-tokenizer regexes, against Hugging Face (Oniguruma): catches
// differences in \p{L}, \p{N}, \s, ... between the two regex engines. The Unicode versions differ too:
// Debian's PCRE2 10.42 knows Unicode 14, the Oniguruma behind the goldens Unicode 16, so characters assigned
// after Unicode 14 (unassigned, \p{Cn}, for PCRE2) may split differently; they are counted, not failed.
TEST(Tokenizer, PreTokenizerAgreesOnEveryCodePoint) {
  const auto& golden = read_json_cached(data_path("codepoint_goldens.json"));
  const auto& pre = test::v3_tokenizer().pre_tokenizer();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* unassigned = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^\\p{Cn}$"), PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  ASSERT_NE(unassigned, nullptr);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(unassigned, nullptr);
  int mismatches = 0;
  int newer_unicode = 0;
  int64_t checked = 0;
  std::string text;
  for (const auto& run : golden["runs"]) {
    const auto first = run[0].get<uint32_t>();
    const auto last = run[1].get<uint32_t>();
    const std::string& want = run[2].get_ref<const std::string&>();
    for (uint32_t cp = first; cp <= last; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string c;
      utf8::append_code_point(c, cp);
      text = "x" + c + "1 " + c + c + "\n" + c + "!";
      auto pieces = pre.split(text);
      ASSERT_TRUE(pieces.ok());
      std::string sig;
      for (const auto& p : *pieces) {
        size_t n = 0;
        for (size_t i = p.begin; i < p.end; ++i) n += (static_cast<uint8_t>(text[i]) & 0xC0) != 0x80;
        if (!sig.empty()) sig += ",";
        sig += std::to_string(n);
      }
      ++checked;
      if (sig == want) continue;
      if (pcre2_match(unassigned, reinterpret_cast<PCRE2_SPTR>(c.data()), c.size(), 0, 0, match, nullptr) >= 0) {
        ++newer_unicode;
      } else if (++mismatches <= 20) {
        ADD_FAILURE() << "U+" << std::hex << cp << std::dec << ": pieces " << sig << ", Hugging Face " << want;
      }
    }
  }
  pcre2_match_data_free(match);
  pcre2_code_free(unassigned);
  EXPECT_EQ(checked, 0x110000 - 0x800);
  EXPECT_EQ(mismatches, 0);
  // Unicode 15.0-16.0 added about 10,500 characters (mostly CJK extensions); more would mean a real bug.
  EXPECT_LT(newer_unicode, 11000);
  std::printf("code points differing only because PCRE2 predates their assignment: %d\n", newer_unicode);
}

TEST(Tokenizer, DecodeEqualsHuggingFace) {
  const auto& t = test::v41_tokenizer();
  for (const auto& d : goldens()["decodes"]) {
    const auto ids = d["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(t.decode(ids, false), d["text"].get<std::string>()) << d["ids"].dump();
    EXPECT_EQ(t.decode(ids, true), d["text_skip_special"].get<std::string>()) << d["ids"].dump();
  }
}

TEST(Tokenizer, DecodeRoundTripsSanitizedText) {
  const auto& t = test::v41_tokenizer();
  for (const auto& c : goldens()["cases"]) {
    const std::string text = case_text(c);
    auto ids = t.encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(t.decode(*ids), utf8::sanitize(text)) << c["name"];
  }
}

TEST(Tokenizer, AddedTokenFlagsEqualHuggingFace) {
  // V3 plus records using lstrip / rstrip / single_word (the generator's "flag_tokens").
  auto j = nlohmann::json::parse(test::read_file(test::shared_path("tokenizer/deepseek_v3_tokenizer.json")));
  for (const auto& extra : goldens()["flag_tokens"]) j["added_tokens"].push_back(extra);
  auto t = Tokenizer::from_json_text(j.dump(), "v3+flags");
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (const auto& c : goldens()["flag_cases"]) {
    auto ids = t->encode(c["text"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["text"];
  }
}

// The V4.1 tokenizer = V3 + V4.1's added tokens (MODEL.md §8). Build that shape ourselves from the V3 file with
// the spec's ids and flags, and check it against the shared reconstruction and the ids Hugging Face gave.
TEST(Tokenizer, V41SpecialTokensBuiltFromV3) {
  auto j = nlohmann::json::parse(test::read_file(test::shared_path("tokenizer/deepseek_v3_tokenizer.json")));
  auto& added = j["added_tokens"];
  for (auto& a : added) {
    if (a["id"] == 128799) {
      a["content"] = "<｜System｜>";
      a["special"] = false;
      a["normalized"] = true;
    }
  }
  auto record = [](int id, const std::string& content, bool special, bool normalized) {
    return nlohmann::json{{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false},    {"normalized", normalized}, {"special", special}};
  };
  // Fill 128815..129279 like V4.1: named tokens where the spec names them, placeholders elsewhere.
  const std::map<int, std::pair<std::string, bool>> named = {
      {128821, {"<think>", true}}, {128822, {"</think>", true}}, {128825, {"｜DSML｜", true}},
      {128828, {"<｜latest_reminder｜>", true}}, {129264, {"<｜deepseek_image｜>", false}}};
  for (int id = 128815; id <= 129279; ++id) {
    auto it = named.find(id);
    if (it != named.end()) {
      added.push_back(record(id, it->second.first, false, it->second.second));
    } else {
      added.push_back(record(id, "<｜test▁placeholder▁" + std::to_string(id) + "｜>", true, false));
    }
  }
  auto built = Tokenizer::from_json_text(j.dump(), "v3+v4.1 specials");
  ASSERT_TRUE(built.ok()) << built.status().message();
  const auto& reference = test::v41_tokenizer();
  for (const auto& [content, id] : std::vector<std::pair<std::string, int32_t>>{
           {"<｜System｜>", 128799}, {"<think>", 128821}, {"</think>", 128822}, {"｜DSML｜", 128825},
           {"<｜latest_reminder｜>", 128828}, {"<｜deepseek_image｜>", 129264}, {"<｜User｜>", 128803},
           {"<｜Assistant｜>", 128804}, {"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}}) {
    EXPECT_EQ(built->token_to_id(content), id) << content;
    EXPECT_EQ(reference.token_to_id(content), id) << content;
  }
  const AddedToken* system = built->added_token(128799);
  ASSERT_NE(system, nullptr);
  EXPECT_FALSE(system->special);
  EXPECT_TRUE(system->normalized);
  const AddedToken* ref_system = reference.added_token(128799);
  ASSERT_NE(ref_system, nullptr);
  EXPECT_FALSE(ref_system->special);
  EXPECT_TRUE(ref_system->normalized);
  const AddedToken* image = reference.added_token(129264);
  ASSERT_NE(image, nullptr);
  EXPECT_FALSE(image->special);
  EXPECT_FALSE(image->normalized);
  // Non-special: kept by decode(skip_special_tokens=true).
  EXPECT_EQ(reference.decode(std::vector<int32_t>{0, 128799, 129264}, true), "<｜System｜><｜deepseek_image｜>");
  // On every chat / DSML / image golden, the built tokenizer agrees with Hugging Face's V4.1 ids.
  for (const auto& c : goldens()["cases"]) {
    const std::string name = c["name"];
    if (name != "system_token" && name != "image_token" && name != "dsml" && name != "chat_tokens" &&
        name != "adjacent_tokens" && name != "partial_tokens" && name.rfind("random_", 0) != 0) {
      continue;
    }
    auto ids = built->encode(case_text(c));
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["v41"].get<std::vector<int32_t>>()) << name;
  }
  // V3 does not know <｜System｜>: it is plain text there.
  auto v3_ids = test::v3_tokenizer().encode("<｜System｜>");
  ASSERT_TRUE(v3_ids.ok());
  EXPECT_GT(v3_ids->size(), 1u);
}

TEST(Tokenizer, SplitSpecialTokensTreatsSpecialAsText) {
  const auto& t = test::v41_tokenizer();
  EncodeOptions opts;
  opts.split_special_tokens = true;
  auto ids = t.encode("<｜begin▁of▁sentence｜><｜User｜>", opts);
  ASSERT_TRUE(ids.ok());
  EXPECT_NE((*ids)[0], 0);                // BOS is special: not matched
  EXPECT_EQ(ids->back(), 128803);         // <｜User｜> is not special: still matched
  EXPECT_EQ(t.decode(*ids), "<｜begin▁of▁sentence｜><｜User｜>");
}

TEST(Tokenizer, CacheGivesSameIds) {
  const auto& t = test::v3_tokenizer();
  const std::string text = "cache me if you can, cache me if you can 12345 你好";
  auto first = t.encode(text);
  const auto hits_before = t.bpe().cache().hits();
  auto second = t.encode(text);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_GT(t.bpe().cache().hits(), hits_before);
  // Cached and uncached BPE agree on every piece length, including uncacheable long ones.
  for (size_t n : {1, 2, 17, 255, 256, 257, 1000}) {
    std::string piece(n, 'z');
    std::vector<int32_t> a, b;
    t.bpe().tokenize_piece(piece, a);
    t.bpe().tokenize_piece_uncached(piece, b);
    EXPECT_EQ(a, b) << n;
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  // const methods run concurrently (the BPE cache is shared): every thread must see the golden ids.
  const auto& t = test::v41_tokenizer();
  const auto& cases = goldens()["cases"];
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = k; i < cases.size(); i += 2) {
        auto ids = t.encode(case_text(cases[i]));
        if (!ids.ok() || *ids != cases[i]["v41"].get<std::vector<int32_t>>()) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Tokenizer, LongInputsDoNotBlowUp) {
  const auto& t = test::v3_tokenizer();
  for (const std::string& text : {std::string(200000, ' '), std::string(200000, 'a'), std::string(100000, '\n'),
                                  std::string(60000, '7'), std::string(100000, '\xff')}) {
    auto ids = t.encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_EQ(t.decode(*ids), utf8::sanitize(text));
  }
}

TEST(StreamingDetokenizer, TokenByTokenEqualsWholeDecode) {
  const auto& t = test::v41_tokenizer();
  for (const auto& c : goldens()["cases"]) {
    const auto ids = c["v41"].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      StreamingDetokenizer detok(t, skip);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = detok.push(id);
        EXPECT_TRUE(utf8::is_valid(piece)) << c["name"];
        streamed += piece;
      }
      streamed += detok.finish();
      EXPECT_EQ(streamed, t.decode(ids, skip)) << c["name"];
    }
  }
}

TEST(StreamingDetokenizer, HoldsSplitCharactersAndReplacesBadBytes) {
  auto t = Tokenizer::from_file(test::shared_path("goldens/tiny-a/checkpoint/tokenizer.json"));  // small, fast
  ASSERT_TRUE(t.ok()) << t.status().message();
  StreamingDetokenizer detok(*t);
  EXPECT_EQ(detok.push_bytes("a\xE4"), "a");
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(detok.push_bytes("\xB8"), "");
  EXPECT_EQ(detok.push_bytes("\xAD!"), "\xE4\xB8\xAD!");
  EXPECT_EQ(detok.push_bytes("\xF0\x9F"), "");
  EXPECT_EQ(detok.push_bytes("x"), std::string(utf8::kReplacement) + "x");  // truncated 4-byte sequence
  EXPECT_EQ(detok.push_bytes("\xFF"), utf8::kReplacement);
  EXPECT_EQ(detok.push_bytes("\xE2\x82"), "");
  EXPECT_EQ(detok.finish(), utf8::kReplacement);
  EXPECT_EQ(detok.pending_bytes(), 0u);
}

TEST(Utf8, SanitizeMatchesMaximalSubpartRule) {
  EXPECT_EQ(utf8::sanitize("ok"), "ok");
  const std::string r(utf8::kReplacement);
  EXPECT_EQ(utf8::sanitize("\xC0\x80"), r + r);             // overlong: each byte alone
  EXPECT_EQ(utf8::sanitize("\xE0\x80\x80"), r + r + r);
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), r + r + r);     // surrogate
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98"), r);             // truncated: one replacement
  EXPECT_EQ(utf8::sanitize("\xE4\xB8 y"), r + " y");
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), r + r + r + r);
}

TEST(PreTokenizer, OnigurumaTranslation) {
  auto t = translate_oniguruma_pattern("\\s+(?!\\S)|[^\\r\\n\\s]?\\w+");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])|[^\\r\\n\\t-\\r\\x{85}\\p{Z}]?"
                "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]+");
  EXPECT_FALSE(translate_oniguruma_pattern("[\\S]").ok());
  EXPECT_FALSE(translate_oniguruma_pattern("\\h+").ok());
  EXPECT_FALSE(translate_oniguruma_pattern("[abc").ok());
}

TEST(PreTokenizer, SplitBehaviours) {
  // "a1b22" with \d+ under each behaviour (Hugging Face's documented examples use the same rules).
  auto run = [](SplitBehavior b, bool invert) {
    auto step = RegexSplitStep::create("\\d+", false, b, invert);
    EXPECT_TRUE(step.ok());
    std::vector<TextSpan> out;
    const std::string text = "a1b22c";
    EXPECT_TRUE(step->split(text, {0, text.size()}, out).ok());
    std::vector<std::string> pieces;
    for (auto s : out) pieces.push_back(text.substr(s.begin, s.size()));
    return pieces;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run(SplitBehavior::kIsolated, false), (V{"a", "1", "b", "22", "c"}));
  EXPECT_EQ(run(SplitBehavior::kRemoved, false), (V{"a", "b", "c"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithPrevious, false), (V{"a1", "b22", "c"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithNext, false), (V{"a", "1b", "22c"}));
  EXPECT_EQ(run(SplitBehavior::kContiguous, false), (V{"a", "1", "b", "22", "c"}));
  EXPECT_EQ(run(SplitBehavior::kRemoved, true), (V{"1", "22"}));
}

// A tokenizer.json of a shape we do not implement is refused with a message naming the part.
TEST(Tokenizer, RefusesUnimplementedShapes) {
  // The tiny golden checkpoints' tokenizer (V3 cut to 2,048 ids) has the same shape and loads fast.
  const auto base = nlohmann::json::parse(test::read_file(test::shared_path("goldens/tiny-a/checkpoint/tokenizer.json")));
  ASSERT_TRUE(Tokenizer::from_json_text(base.dump(), "tiny-a").ok());
  struct Mutation {
    std::string expect_in_message;
    std::function<void(nlohmann::json&)> apply;
  };
  const std::vector<Mutation> mutations = {
      {"model type 'WordPiece'", [](auto& j) { j["model"]["type"] = "WordPiece"; }},
      {"byte_fallback", [](auto& j) { j["model"]["byte_fallback"] = true; }},
      {"normalizer", [](auto& j) { j["normalizer"] = {{"type", "NFC"}}; }},
      {"Metaspace", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}}; }},
      {"add_prefix_space", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][3]["add_prefix_space"] = true; }},
      {"use_regex", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][3]["use_regex"] = true; }},
      {"no final ByteLevel", [](auto& j) { j["pre_tokenizer"]["pretokenizers"].erase(3); }},
      {"unknown behavior", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; }},
      {"decoder", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }},
      {"post_processor", [](auto& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }},
      {"merges[0]", [](auto& j) { j["model"]["merges"][0] = "nosuchtoken x"; }},
      {"would assign it id", [](auto& j) { j["added_tokens"][2]["id"] = 5; }},
      {"missing 'model'", [](auto& j) { j.erase("model"); }},
  };
  for (const auto& m : mutations) {
    auto j = base;
    m.apply(j);
    auto t = Tokenizer::from_json_text(j.dump(), "mutated.json");
    ASSERT_FALSE(t.ok()) << m.expect_in_message;
    EXPECT_NE(t.status().message().find(m.expect_in_message), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("mutated.json"), std::string::npos) << t.status().message();
  }
  EXPECT_FALSE(Tokenizer::from_json_text("{not json", "bad.json").ok());
  EXPECT_FALSE(Tokenizer::from_file("/nonexistent/tokenizer.json").ok());
}

}  // namespace
}  // namespace dsflash
