// Engram compressed token map (spec/MODEL.md §4.8) against maps made by the real Hugging Face `tokenizers`
// library running the official algorithm (tools/engram/gen_token_map.py -> tests/data/engram/*.txt).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/engram_token_map.h"

namespace dsflash {
namespace {

const std::string kShared = DSFLASH_SHARED_DIR;
const std::string kSource = DSFLASH_SOURCE_DIR;

struct ExpectedMap {
  int64_t num_ids = 0;
  int64_t compressed_vocab_size = 0;
  std::vector<int32_t> ids;
};

// Format (gen_token_map.py): '#' comments, "num_ids N", "compressed_vocab_size V", then one line
// "<token id delta> <compressed id>" per token whose key was seen before; all other tokens take fresh ids.
ExpectedMap read_expected(const std::string& path) {
  ExpectedMap map;
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::string line;
  std::vector<std::pair<int64_t, int32_t>> repeats;
  int64_t token = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    if (line.rfind("num_ids ", 0) == 0) {
      std::string name;
      fields >> name >> map.num_ids;
    } else if (line.rfind("compressed_vocab_size ", 0) == 0) {
      std::string name;
      fields >> name >> map.compressed_vocab_size;
    } else {
      int64_t delta = 0;
      int32_t id = 0;
      fields >> delta >> id;
      token += delta;
      repeats.emplace_back(token, id);
    }
  }
  map.ids.assign(static_cast<size_t>(map.num_ids), -1);
  for (const auto& [t, id] : repeats) map.ids[static_cast<size_t>(t)] = id;
  int32_t fresh = 0;
  for (auto& id : map.ids) {
    if (id < 0) id = fresh++;
  }
  EXPECT_EQ(fresh, map.compressed_vocab_size) << path;
  return map;
}

int64_t config_compressed_vocab(const std::string& config_dir) {
  std::ifstream in(config_dir + "/inference/config.json");
  EXPECT_TRUE(in) << config_dir;
  const auto json = nlohmann::json::parse(in);
  return json.at("engram_compressed_vocab_size").get<int64_t>();
}

void expect_maps_equal(const EngramTokenMap& got, const ExpectedMap& want, const std::string& what) {
  ASSERT_EQ(got.num_ids(), want.num_ids) << what;
  EXPECT_EQ(got.compressed_vocab_size(), want.compressed_vocab_size) << what;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < want.num_ids; ++i) {
    if (got.compressed_id(i) != want.ids[static_cast<size_t>(i)]) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << what << ": token " << i << " -> " << got.compressed_id(i) << ", expected "
                      << want.ids[static_cast<size_t>(i)];
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

TEST(EngramTokenMap, ByteLevelDecode) {
  EXPECT_EQ(EngramTokenMap::byte_level_decode("\xc4\xa0hello"), " hello");   // Ġ = byte 0x20
  EXPECT_EQ(EngramTokenMap::byte_level_decode("\xc4\x8a"), "\n");            // Ċ = byte 0x0a
  EXPECT_EQ(EngramTokenMap::byte_level_decode("\xc3\xa9"), "\xe9");          // é stands for byte 0xe9
  EXPECT_EQ(EngramTokenMap::byte_level_decode("\xc3\xa2\xc4\xa2\xc4\xb6"), "\xe2\x80\x94");  // "âĢĶ" = em dash
  // A char outside the table (｜, space): the whole token keeps its UTF-8 bytes.
  EXPECT_EQ(EngramTokenMap::byte_level_decode("<\xef\xbd\x9c" "end\xef\xbd\x9c>"), "<\xef\xbd\x9c" "end\xef\xbd\x9c>");
  EXPECT_EQ(EngramTokenMap::byte_level_decode("a b"), "a b");
}

TEST(EngramTokenMap, Normalize) {
  EXPECT_EQ(EngramTokenMap::normalize("Caf\xc3\xa9"), "cafe");                   // strip accents + lowercase
  EXPECT_EQ(EngramTokenMap::normalize("\xef\xbc\xa1\xef\xbc\xa2"), "ab");        // NFKC full-width
  EXPECT_EQ(EngramTokenMap::normalize("  The  "), "the");
  EXPECT_EQ(EngramTokenMap::normalize(" "), " ");                               // lone space survives
  EXPECT_EQ(EngramTokenMap::normalize("\t\n  "), " ");                          // collapses to one, survives
  EXPECT_EQ(EngramTokenMap::normalize("a \t b"), "a b");
  EXPECT_EQ(EngramTokenMap::normalize("\xe3\x80\x80x"), "x");                   // ideographic space -> " "
  EXPECT_EQ(EngramTokenMap::normalize("\xef\xac\x81"), "fi");                   // ﬁ ligature
  EXPECT_EQ(EngramTokenMap::normalize(""), "");
  // Devanagari vowel sign (Mc) is a mark too: StripAccents drops it.
  EXPECT_EQ(EngramTokenMap::normalize("\xe0\xa4\x95\xe0\xa4\xbe"), "\xe0\xa4\x95");
}

TEST(EngramTokenMap, Keys) {
  // Partial UTF-8 (byte 0xe2 alone, "â"): keyed by the raw token string.
  EXPECT_EQ(EngramTokenMap::key_of("\xc3\xa2"), "\xc3\xa2");
  // Normalising to nothing (a lone combining mark U+0301 = bytes cc 81 = "Ìģ"): the decoded text.
  EXPECT_EQ(EngramTokenMap::key_of("\xc3\x8c\xc4\xa3"), "\xcc\x81");
  EXPECT_EQ(EngramTokenMap::key_of("\xc4\xa0The"), "the");
  EXPECT_EQ(EngramTokenMap::key_of("x", /*defined=*/false), "");
}

TEST(EngramTokenMap, CollapsesCaseAndSpaceVariants) {
  const auto map = EngramTokenMap::from_token_strings({"the", "\xc4\xa0The", "THE", "\xc4\xa0", "\xc4\x8a", "x"},
                                                      {true, true, true, true, true, true});
  EXPECT_EQ(map.compressed_vocab_size(), 3);
  EXPECT_EQ(map.ids(), (std::vector<int32_t>{0, 0, 0, 1, 1, 2}));
}

TEST(EngramTokenMap, RejectsBadJson) {
  EXPECT_FALSE(EngramTokenMap::from_tokenizer_json_text("{", "t.json").ok());
  EXPECT_FALSE(EngramTokenMap::from_tokenizer_json_text("{\"model\": {}}", "t.json").ok());
  const auto bad = EngramTokenMap::from_tokenizer_json_text(
      "{\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": \"x\"}]}", "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("added_tokens[0]"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(EngramTokenMap::from_tokenizer_json("/nonexistent/tokenizer.json").ok());
}

TEST(EngramTokenMap, GoldenTinyTokenizers) {
  for (const std::string name : {"tiny-a", "tiny-b"}) {
    const std::string dir = kShared + "/goldens/" + name + "/checkpoint";
    const auto map = EngramTokenMap::from_tokenizer_json(dir + "/tokenizer.json");
    ASSERT_TRUE(map.ok()) << map.status().message();
    EXPECT_EQ(map->compressed_vocab_size(), config_compressed_vocab(dir)) << name;
    const std::string data = name == "tiny-a" ? "tiny_a_token_map.txt" : "tiny_b_token_map.txt";
    expect_maps_equal(*map, read_expected(kSource + "/tests/data/engram/" + data), name);
  }
}

// The whole V3 vocabulary against the map the real library gives (tokenizers 0.23.1).
TEST(EngramTokenMap, WholeV3VocabularyMatchesHuggingFace) {
  const auto map = EngramTokenMap::from_tokenizer_json(kShared + "/tokenizer/deepseek_v3_tokenizer.json");
  ASSERT_TRUE(map.ok()) << map.status().message();
  // V3's file defines 128,815 ids (818 added-token records up to 128814).
  EXPECT_EQ(map->num_ids(), 128815);
  EXPECT_EQ(map->compressed_vocab_size(), 98627);
  expect_maps_equal(*map, read_expected(kSource + "/tests/data/engram/v3_token_map.txt"), "V3");
}

// Mapped over the config's 129,280 ids, the V3 file leaves ids 128815.. undefined: they decode to "" and
// share one key, so the count is 98,628 (what tokenizers 0.23.1 gives with --num-ids 129280).
TEST(EngramTokenMap, UndefinedIdsShareTheEmptyKey) {
  const auto map = EngramTokenMap::from_tokenizer_json(kShared + "/tokenizer/deepseek_v3_tokenizer.json", 129280);
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(map->compressed_vocab_size(), 98628);
  EXPECT_EQ(map->compressed_id(128815), 98627);
  EXPECT_EQ(map->compressed_id(129279), 98627);
}

// V4.1's added tokens (the reconstructed file): 129,280 ids give the spec's 99,092 compressed ids, i.e.
// the 465 records added since V3 are all distinct keys (98,627 + 465).
TEST(EngramTokenMap, V41AddedTokensGiveSpecCount) {
  const auto map =
      EngramTokenMap::from_tokenizer_json(kShared + "/tokenizer/deepseek_v41_tokenizer.reconstructed.json");
  ASSERT_TRUE(map.ok()) << map.status().message();
  EXPECT_EQ(map->num_ids(), 129280);
  EXPECT_EQ(map->compressed_vocab_size(), 99092);
}

}  // namespace
}  // namespace dsflash
