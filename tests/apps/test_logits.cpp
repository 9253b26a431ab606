// `dsflash logits` and `dsflash generate` through their CLI11 subcommands: the logits file and JSON line on a
// golden checkpoint (rows against the golden within the fast-path tolerance), and clear errors with a non-zero
// exit for bad input (ids outside the vocab, empty prompt, context beyond the maximum, a missing tensor).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/cli_run.h"
#include "io/safetensors.h"
#include "model/golden_tensors.h"

namespace {

using ::testing::HasSubstr;

using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;

std::string join(const std::vector<int64_t>& ids, size_t count) {
  std::string s;
  for (size_t i = 0; i < count && i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dsflash_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

class LogitsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dsflash::testing::goldens_present()) GTEST_SKIP() << "goldens not found";
  }
  const std::string model_ = dsflash::testing::golden_checkpoint_dir("tiny-a");
};

TEST_F(LogitsCli, ExactFollowRowsMatchGolden) {
  auto golden = dsflash::SafetensorsFile::open(dsflash::testing::golden_output_path("tiny-a", "rand.index_k_fix"));
  ASSERT_TRUE(golden.ok());
  const auto prompt = dsflash::testing::to_i64(golden->find("prompt_ids"));
  const auto generated = dsflash::testing::to_i64(golden->find("generated_ids"));
  const auto logits = dsflash::testing::to_f32(golden->find("logits"));
  const int64_t vocab = golden->find("logits")->dim(1);
  const int steps = 4;
  const std::string out = temp_path("logits.bin");
  for (bool reference : {false, true}) {
    std::vector<std::string> args = {"logits", "-m", model_, "--tokens", join(prompt, prompt.size()), "-n",
                                     std::to_string(steps), "--out", out, "--exact", "--follow",
                                     join(generated, steps)};
    if (reference) args.push_back("--reference");
    CliRun r = run_dsflash(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto line = nlohmann::json::parse(r.out);
    const size_t rows = prompt.size() + steps;
    ASSERT_EQ(line["rows"].get<size_t>(), rows);
    EXPECT_EQ(line["positions"][0], 0);
    EXPECT_EQ(line["positions"][rows - 1], static_cast<int64_t>(rows - 1));
    ASSERT_EQ(line["generated"].size(), static_cast<size_t>(steps + 1));
    for (int t = 0; t <= steps; ++t) EXPECT_EQ(line["generated"][t], generated[static_cast<size_t>(t)]);
    std::ifstream in(out, std::ios::binary);
    std::vector<float> mine(rows * static_cast<size_t>(vocab));
    in.read(reinterpret_cast<char*>(mine.data()), static_cast<std::streamsize>(mine.size() * 4));
    ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(mine.size() * 4));
    EXPECT_EQ(in.peek(), EOF);  // nothing after the last row
    float worst = 0.0f;
    for (size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, std::fabs(mine[i] - logits[i]));
    if (reference) {
      EXPECT_EQ(worst, 0.0f);  // the oracle reproduces the golden rows bit for bit
    } else {
      EXPECT_LT(worst, 0.5f);
    }
  }
  std::filesystem::remove(out);
}

TEST_F(LogitsCli, WithoutExactWritesLastPromptRowAndDecodeRows) {
  const std::string out = temp_path("logits_last.bin");
  CliRun r = run_dsflash({"logits", "-m", model_, "--tokens", "0,5,9,200", "-n", "3", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto line = nlohmann::json::parse(r.out);
  EXPECT_EQ(line["positions"], nlohmann::json::parse("[3,4,5,6]"));
  EXPECT_EQ(std::filesystem::file_size(out), 4u * 2048u * 4u);
  std::filesystem::remove(out);
}

// Without --exact the default plan runs (CED prefill with Decoder SWA Bounded Replay). A prompt that fits in the
// window has nothing to replay, so it must give exactly the rows of the full forward.
TEST_F(LogitsCli, DefaultPlanEqualsExactWhenThePromptFitsTheWindow) {
  const std::string exact_out = temp_path("plan_exact.bin"), plan_out = temp_path("plan_default.bin");
  CliRun exact = run_dsflash({"logits", "-m", model_, "--tokens", "0,5,9,200", "-n", "5", "--out", exact_out, "--exact",
                          "--reference"});
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  CliRun plan = run_dsflash({"logits", "-m", model_, "--tokens", "0,5,9,200", "-n", "5", "--out", plan_out, "--reference"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(exact.out)["generated"], nlohmann::json::parse(plan.out)["generated"]);
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const auto a = read(exact_out), b = read(plan_out);
  const size_t row = 2048 * 4;
  ASSERT_EQ(a.size(), 9 * row);
  ASSERT_EQ(b.size(), 6 * row);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 3 * row));  // rows of positions 3..8
  // A prompt longer than the window (tiny-a: 8) replays only its tail through the decoder: it still runs.
  std::string ids;
  for (int i = 0; i < 30; ++i) ids += (i ? "," : "") + std::to_string((i * 37) % 2048);
  CliRun longer = run_dsflash({"logits", "-m", model_, "--tokens", ids, "-n", "2", "--out", plan_out});
  ASSERT_EQ(longer.exit_code, 0) << longer.err;
  EXPECT_EQ(nlohmann::json::parse(longer.out)["positions"], nlohmann::json::parse("[29,30,31]"));
  std::filesystem::remove(exact_out);
  std::filesystem::remove(plan_out);
}

// --speculative: the logits file and the ids are those of a run without it (greedy is lossless and the
// verification rows are computed like decode rows), and the JSON line says what the drafts did.
TEST_F(LogitsCli, SpeculativeRunWritesTheSameRowsAndReportsTheDrafts) {
  std::string ids;
  for (int i = 0; i < 30; ++i) ids += (i ? "," : "") + std::to_string((i * 53 + 7) % 2048);
  const std::string plain_out = temp_path("spec_plain.bin"), spec_out = temp_path("spec_on.bin");
  CliRun plain = run_dsflash({"logits", "-m", model_, "--tokens", ids, "-n", "20", "--out", plain_out});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  CliRun spec = run_dsflash({"logits", "-m", model_, "--tokens", ids, "-n", "20", "--out", spec_out, "--speculative", "4"});
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(spec.out);
  EXPECT_EQ(a["generated"], b["generated"]);
  EXPECT_EQ(a["positions"], b["positions"]);
  EXPECT_EQ(a["draft_tokens"], 0);
  EXPECT_EQ(a["mean_accept_len"], 1.0);
  EXPECT_GT(b["draft_tokens"].get<int64_t>(), 0);
  EXPECT_LE(b["accepted_tokens"].get<int64_t>(), b["draft_tokens"].get<int64_t>());
  EXPECT_GE(b["mean_accept_len"].get<double>(), 1.0);
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(plain_out), read(spec_out));
  CliRun refused = run_dsflash({"logits", "-m", model_, "--tokens", ids, "-n", "3", "--out", spec_out, "--speculative",
                            "2", "--follow", "1,2,3"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("follow"));
  std::filesystem::remove(plain_out);
  std::filesystem::remove(spec_out);
}

TEST_F(LogitsCli, TokensFile) {
  const std::string ids = temp_path("ids.txt");
  std::ofstream(ids) << "0 5\n9,200\n";
  const std::string out = temp_path("logits_file.bin");
  CliRun r = run_dsflash({"logits", "-m", model_, "--tokens-file", ids, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_tokens"], 4);
  std::filesystem::remove(ids);
  std::filesystem::remove(out);
}

TEST_F(LogitsCli, BadInputFailsWithMessage) {
  const std::string out = temp_path("bad.bin");
  CliRun r = run_dsflash({"logits", "-m", model_, "--tokens", "1,2048", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("token id 2048"));
  r = run_dsflash({"logits", "-m", model_, "--tokens", "", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("empty"));
  r = run_dsflash({"logits", "-m", model_, "--tokens", "1,x", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("\"x\" is not a token id"));
  r = run_dsflash({"logits", "-m", model_, "--tokens", "1,2", "-n", "3", "--follow", "4", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--follow"));
  r = run_dsflash({"logits", "-m", model_, "--tokens", "1,2", "-n", "100000000", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("max_position_embeddings"));
  r = run_dsflash({"logits", "-m", temp_path("no_such_dir"), "--tokens", "1", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.err.empty());
  std::filesystem::remove(out);
}

// A copy of tiny-a whose safetensors lacks one tensor the config needs: a clear error naming it.
TEST_F(LogitsCli, CheckpointMissingTensor) {
  const std::filesystem::path dir = temp_path("missing_tensor");
  std::filesystem::create_directories(dir);
  for (const char* name : {"config.json", "tokenizer.json"}) {
    std::filesystem::copy_file(std::filesystem::path(model_) / name, dir / name,
                               std::filesystem::copy_options::overwrite_existing);
  }
  if (std::filesystem::exists(std::filesystem::path(model_) / "inference")) {
    std::filesystem::create_directories(dir / "inference");
    std::filesystem::copy_file(std::filesystem::path(model_) / "inference/config.json", dir / "inference/config.json",
                               std::filesystem::copy_options::overwrite_existing);
  }
  auto source = dsflash::SafetensorsFile::open(model_ + "/model.safetensors");
  ASSERT_TRUE(source.ok());
  dsflash::SafetensorsWriter writer;
  for (const auto& t : source->tensors()) {
    if (t.name == "layers.3.ffn.gate.bias") continue;
    writer.add(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
  }
  ASSERT_TRUE(writer.write((dir / "model.safetensors").string()).ok());
  const std::string out = temp_path("missing.bin");
  CliRun r = run_dsflash({"logits", "-m", dir.string(), "--tokens", "1,2", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("layers.3.ffn.gate.bias"));
  std::filesystem::remove_all(dir);
}

TEST_F(LogitsCli, GenerateStreamsIdsAndIsReproducible) {
  CliRun a = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", "6", "--ids", "--temp", "0.9",
                      "--top-k", "50", "--top-p", "0.95", "--seed", "11"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  CliRun b = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", "6", "--ids", "--temp", "0.9",
                      "--top-k", "50", "--top-p", "0.95", "--seed", "11"});
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(std::count(a.out.begin(), a.out.end(), '\n'), 6);
  // Greedy generate --exact gives the golden ids; the default (bounded-replay) plan gives the greedy ids of
  // `logits` in its default plan (the prompt is longer than the window, so the plans differ).
  auto golden = dsflash::SafetensorsFile::open(dsflash::testing::golden_output_path("tiny-a", "rand.index_k_fix"));
  ASSERT_TRUE(golden.ok());
  const auto prompt = dsflash::testing::to_i64(golden->find("prompt_ids"));
  const auto generated = dsflash::testing::to_i64(golden->find("generated_ids"));
  CliRun g = run_dsflash({"generate", "-m", model_, "--tokens", join(prompt, prompt.size()), "-n", "5", "--ids",
                      "--reference", "--exact"});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  std::string expect;
  for (int i = 0; i < 5; ++i) expect += std::to_string(generated[static_cast<size_t>(i)]) + "\n";
  EXPECT_EQ(g.out, expect);
  CliRun plan_generate = run_dsflash({"generate", "-m", model_, "--tokens", join(prompt, prompt.size()), "-n", "5", "--ids"});
  ASSERT_EQ(plan_generate.exit_code, 0) << plan_generate.err;
  const std::string plan_out = temp_path("plan_generate.bin");
  CliRun plan_logits = run_dsflash({"logits", "-m", model_, "--tokens", join(prompt, prompt.size()), "-n", "4", "--out", plan_out});
  ASSERT_EQ(plan_logits.exit_code, 0) << plan_logits.err;
  std::string plan_expect;
  const auto plan_line = nlohmann::json::parse(plan_logits.out);
  for (const auto& id : plan_line["generated"]) plan_expect += std::to_string(id.get<int>()) + "\n";
  EXPECT_EQ(plan_generate.out, plan_expect);
  std::filesystem::remove(plan_out);
  CliRun text = run_dsflash({"generate", "-m", model_, "-p", "Hello world", "-n", "3"});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  CliRun bad = run_dsflash({"generate", "-m", model_, "--tokens", "5", "--temp", "-1"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("temperature"));
}

}  // namespace
