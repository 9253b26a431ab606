// Engram hashing (spec/MODEL.md §4.8): numpy default_rng port, the prime layout, and the n-gram hasher
// against the official NgramHashState outputs in the goldens (prefill.engram_hash, decode.engram_hash).
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/engram_hash.h"
#include "model/golden_tensors.h"
#include "tokenizer/engram_token_map.h"

namespace dsflash {
namespace {

using testing::read_i64;

// An Engram history with storage of its own (in the engine it lives in the KV manager's per-sequence arena).
struct OwnedHistory {
  explicit OwnedHistory(const NgramHasher& hasher)
      : storage(static_cast<size_t>(hasher.layout().max_ngram), 0),
        history(hasher.layout().max_ngram - 1, storage.data()) {
    history.reset();
  }
  std::vector<int64_t> storage;  // [1 + max_ngram - 1]
  kv::EngramHistory history;
};

ModelConfig config_with(int64_t engram_vocab, int n_heads, int max_ngram, std::vector<int> layers,
                        std::vector<int64_t> rows, int64_t compressed = 0) {
  ModelConfig config;
  config.engram_layer_ids = std::move(layers);
  config.engram_num_embeddings = std::move(rows);
  config.engram_vocab_size = engram_vocab;
  config.engram_n_heads = n_heads;
  config.engram_max_ngram_size = max_ngram;
  config.engram_compressed_vocab_size = compressed;
  config.engram_pad_id = 2;
  return config;
}

TEST(EngramHash, NumpyDefaultRngMatchesReleasedMultipliers) {
  // spec/MODEL.md §4.8: default_rng(10007 * layer).integers(0, (int64max // 99092) // 2, 4) * 2 + 1.
  const int64_t bound = (std::numeric_limits<int64_t>::max() / 99092) / 2;
  const std::vector<std::vector<int64_t>> want = {
      {76632096046245, 4839876093313, 35959672319349, 73987337458391},
      {67716810739261, 51510806800915, 30921347202721, 82619226485591}};
  const int layers[] = {1, 14};
  for (int i = 0; i < 2; ++i) {
    auto got = numpy_default_rng_integers(10007ULL * static_cast<uint64_t>(layers[i]), bound, 4);
    for (auto& v : got) v = v * 2 + 1;
    EXPECT_EQ(got, want[static_cast<size_t>(i)]) << "layer " << layers[i];
  }
  // Different seeds, different streams; a bound of 1 draws nothing and gives zeros (numpy's rng == 0 case).
  EXPECT_NE(numpy_default_rng_integers(1, bound, 4), numpy_default_rng_integers(2, bound, 4));
  EXPECT_EQ(numpy_default_rng_integers(5, 1, 3), (std::vector<int64_t>{0, 0, 0}));
  // Small bounds take numpy's 32-bit path; values stay in range.
  for (int64_t v : numpy_default_rng_integers(7, 1000, 64)) {
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 1000);
  }
}

TEST(EngramHash, IsPrime) {
  EXPECT_FALSE(is_prime_u64(0));
  EXPECT_FALSE(is_prime_u64(1));
  EXPECT_TRUE(is_prime_u64(2));
  EXPECT_TRUE(is_prime_u64(16000057));
  EXPECT_FALSE(is_prime_u64(16000059));
  EXPECT_TRUE(is_prime_u64(2305843009213693951ULL));   // 2^61 - 1
  EXPECT_FALSE(is_prime_u64(3215031751ULL));           // strong pseudoprime to bases 2, 3, 5, 7
  int count = 0;
  for (uint64_t n = 0; n < 1000; ++n) count += is_prime_u64(n);
  EXPECT_EQ(count, 168);
}

// The released config (spec/config_v41_flash.json): primes from 16,000,057, Σ = 384,006,168 / 384,016,682.
TEST(EngramHash, RealConfigLayout) {
  auto config = ModelConfig::load(testing::shared_dir() + "/spec/config_v41_flash.json");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto layout = EngramHashLayout::create(*config, 99092);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  ASSERT_EQ(layout->layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(layout->columns(), 24);
  EXPECT_EQ(layout->primes[0][0][0], 16000057);
  EXPECT_EQ(layout->primes[0][2][7], 16000463);
  EXPECT_EQ(layout->primes[1][0][0], 16000477);
  EXPECT_EQ(layout->primes[1][2][7], 16000889);
  EXPECT_EQ(layout->num_rows, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(layout->offsets[0][0], 0);
  EXPECT_EQ(layout->offsets[0][1], 16000057);
  EXPECT_EQ(layout->multipliers[1][3], 82619226485591);
  // The compressed vocab size is checked against the config (engram.py asserts it).
  EXPECT_FALSE(EngramHashLayout::create(*config, 98627).ok());
}

TEST(EngramHash, LayoutErrors) {
  EXPECT_FALSE(EngramHashLayout::create(config_with(300, 2, 4, {}, {}), 100).ok());
  EXPECT_FALSE(EngramHashLayout::create(config_with(300, 2, 1, {1}, {0}), 100).ok());
  const auto wrong_rows = EngramHashLayout::create(config_with(300, 2, 4, {1, 4}, {1916, 2147}), 1744);
  ASSERT_FALSE(wrong_rows.ok());
  EXPECT_NE(wrong_rows.status().message().find("engram_num_embeddings[1]"), std::string::npos)
      << wrong_rows.status().message();
  EXPECT_TRUE(EngramHashLayout::create(config_with(300, 2, 4, {1, 4}, {1916, 2148}), 1744).ok());
}

// Look-back rules on a hand-made case: pads before the start, and a dead (image) token blocks every
// n-gram that would reach it or past it.
TEST(EngramHash, LookBackRules) {
  const ModelConfig config = config_with(300, 2, 4, {1, 4}, {1916, 2148}, 5);
  std::vector<int32_t> token_map = {4, 3, 2, 1, 0, 4};  // token id -> compressed id; pad = token_map[2] = 2
  auto hasher = NgramHasher::create(config, token_map, 5);
  ASSERT_TRUE(hasher.ok()) << hasher.status().message();
  const auto& layout = hasher->layout();
  const int64_t pad = hasher->pad_compressed_id();
  ASSERT_EQ(pad, 2);
  const auto expect_row = [&](const int64_t* row, std::vector<int64_t> window, const std::string& what) {
    for (int e = 0; e < layout.num_layers(); ++e) {
      int64_t rolling = window[0] * layout.multipliers[e][0];
      for (int k = 1; k < layout.max_ngram; ++k) {
        rolling ^= window[static_cast<size_t>(k)] * layout.multipliers[e][static_cast<size_t>(k)];
        for (int h = 0; h < layout.n_heads; ++h) {
          const int col = (k - 1) * layout.n_heads + h;
          EXPECT_EQ(row[e * layout.columns() + col],
                    rolling % layout.primes[e][static_cast<size_t>(k - 1)][static_cast<size_t>(h)] +
                        layout.offsets[e][static_cast<size_t>(col)])
              << what << " layer block " << e << " column " << col;
        }
      }
    }
  };
  const std::vector<int32_t> tokens = {0, 1, 3, 4, 5};
  const std::vector<uint8_t> dead = {0, 0, 1, 0, 0};  // position 2 is an image token
  OwnedHistory owned(*hasher);
  kv::EngramHistory& history = owned.history;
  std::vector<int64_t> out(tokens.size() * 2 * 6);
  ASSERT_TRUE(hasher->hash(tokens.data(), 5, 0, &history, out.data(), dead.data()).ok());
  const int64_t stride = 2 * 6;
  expect_row(out.data() + 0 * stride, {4, pad, pad, pad}, "pos 0");
  expect_row(out.data() + 1 * stride, {3, 4, pad, pad}, "pos 1");
  expect_row(out.data() + 2 * stride, {pad, pad, pad, pad}, "pos 2 (dead)");
  expect_row(out.data() + 3 * stride, {0, pad, pad, pad}, "pos 3");
  expect_row(out.data() + 4 * stride, {4, 0, pad, pad}, "pos 4");
  EXPECT_EQ(history.num_positions(), 5);
  EXPECT_EQ(std::vector<int64_t>(history.recent().begin(), history.recent().end()),
            (std::vector<int64_t>{kv::EngramHistory::kDead, 0, 4}));
  // The dead token still blocks one call later.
  const int32_t next = 1;
  ASSERT_TRUE(hasher->hash(&next, 1, 5, &history, out.data()).ok());
  expect_row(out.data(), {3, 4, 0, pad}, "pos 5");
}

TEST(EngramHash, Errors) {
  const ModelConfig config = config_with(300, 2, 4, {1, 4}, {1916, 2148}, 5);
  EXPECT_FALSE(NgramHasher::create(config, {0, 1, 5}, 5).ok());   // compressed id out of range
  EXPECT_FALSE(NgramHasher::create(config, {0, 1}, 5).ok());      // pad id 2 outside the map
  auto hasher = NgramHasher::create(config, {0, 1, 2, 3}, 5);
  ASSERT_TRUE(hasher.ok());
  OwnedHistory owned(*hasher);
  kv::EngramHistory& history = owned.history;
  std::vector<int64_t> out(2 * 12);
  const int32_t bad[] = {1, 4};
  const Status s = hasher->hash(bad, 2, 0, &history, out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("position 1"), std::string::npos) << s.message();
  EXPECT_EQ(history.num_positions(), 0);  // nothing changed
  const int32_t good[] = {1, 3};
  EXPECT_FALSE(hasher->hash(good, 2, 1, &history, out.data()).ok());  // start_pos != positions seen
  EXPECT_TRUE(hasher->hash(good, 2, 0, &history, out.data()).ok());
}

struct HashGoldenCase {
  std::string model;
  std::vector<std::string> scenarios;
};

class EngramHashGolden : public ::testing::TestWithParam<HashGoldenCase> {};

TEST_P(EngramHashGolden, PrefillDecodeAndChunkedMatchOfficial) {
  const HashGoldenCase& c = GetParam();
  const std::string dir = testing::goldens_dir() + "/" + c.model;
  auto config = ModelConfig::load(dir + "/checkpoint");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto map = EngramTokenMap::from_tokenizer_json(dir + "/checkpoint/tokenizer.json", config->vocab_size);
  ASSERT_TRUE(map.ok()) << map.status().message();
  auto hasher = NgramHasher::create(*config, map->ids(), map->compressed_vocab_size());
  ASSERT_TRUE(hasher.ok()) << hasher.status().message();

  // Primes and pad id as the golden generator derived them with engram.py.
  std::ifstream manifest_in(dir + "/manifest.json");
  const auto manifest = nlohmann::json::parse(manifest_in);
  EXPECT_EQ(hasher->layout().primes,
            manifest.at("derived").at("engram_primes").get<std::vector<std::vector<std::vector<int64_t>>>>());
  EXPECT_EQ(hasher->pad_compressed_id(), manifest.at("derived").at("engram_pad_compressed_id").get<int64_t>());

  const int64_t width = hasher->num_layers() * hasher->columns();
  for (const std::string& scenario : c.scenarios) {
    auto file = SafetensorsFile::open(dir + "/outputs/" + scenario + ".safetensors");
    ASSERT_TRUE(file.ok()) << file.status().message();
    const auto prompt64 = read_i64(*file, "prompt_ids");
    const auto generated64 = read_i64(*file, "generated_ids");
    const auto want_prefill = read_i64(*file, "prefill.engram_hash");
    const auto want_decode = read_i64(*file, "decode.engram_hash");
    const std::vector<int32_t> prompt(prompt64.begin(), prompt64.end());
    const int64_t steps = static_cast<int64_t>(want_decode.size()) / width;
    ASSERT_EQ(static_cast<int64_t>(want_prefill.size()), static_cast<int64_t>(prompt.size()) * width);
    ASSERT_GE(static_cast<int64_t>(generated64.size()), steps);

    // One prefill, then decode one token per step (generated_ids[t] at position S + t).
    OwnedHistory owned(*hasher);
  kv::EngramHistory& history = owned.history;
    std::vector<int64_t> got(want_prefill.size());
    ASSERT_TRUE(hasher->hash(prompt.data(), static_cast<int64_t>(prompt.size()), 0, &history, got.data()).ok());
    EXPECT_EQ(got, want_prefill) << c.model << "/" << scenario << " prefill";
    std::vector<int64_t> got_decode;
    for (int64_t t = 0; t < steps; ++t) {
      const int32_t token = static_cast<int32_t>(generated64[static_cast<size_t>(t)]);
      std::vector<int64_t> row(static_cast<size_t>(width));
      ASSERT_TRUE(hasher->hash(&token, 1, history.num_positions(), &history, row.data()).ok());
      got_decode.insert(got_decode.end(), row.begin(), row.end());
    }
    EXPECT_EQ(got_decode, want_decode) << c.model << "/" << scenario << " decode";

    // Chunked prefill (chunks of 1, 2, 3, 5, ...) over prompt + decoded tokens gives the same ids.
    std::vector<int32_t> all = prompt;
    for (int64_t t = 0; t < steps; ++t) all.push_back(static_cast<int32_t>(generated64[static_cast<size_t>(t)]));
    std::vector<int64_t> want_all = want_prefill;
    want_all.insert(want_all.end(), want_decode.begin(), want_decode.end());
    OwnedHistory owned_chunked(*hasher);
    kv::EngramHistory& chunked = owned_chunked.history;
    std::vector<int64_t> got_all(all.size() * static_cast<size_t>(width));
    int64_t pos = 0;
    for (int64_t chunk : {1, 2, 3, 5, 8, 13, 21, 34, 55}) {
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(all.size()) - pos);
      if (n <= 0) break;
      ASSERT_TRUE(hasher->hash(all.data() + pos, n, pos, &chunked, got_all.data() + pos * width).ok());
      pos += n;
    }
    if (pos < static_cast<int64_t>(all.size())) {
      const int64_t n = static_cast<int64_t>(all.size()) - pos;
      ASSERT_TRUE(hasher->hash(all.data() + pos, n, pos, &chunked, got_all.data() + pos * width).ok());
    }
    EXPECT_EQ(got_all, want_all) << c.model << "/" << scenario << " chunked";
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, EngramHashGolden,
                         ::testing::Values(HashGoldenCase{"tiny-a", {"rand", "short"}}, HashGoldenCase{"tiny-b", {"rand"}}),
                         [](const auto& info) { return info.param.model == "tiny-a" ? "TinyA" : "TinyB"; });

}  // namespace
}  // namespace dsflash
