// expected_tensors() against the pinned real figures and the goldens; Checkpoint::open on the goldens and
// on crafted bad checkpoints (one per validation error).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace dsflash {
namespace {

using ::testing::HasSubstr;
using testing::golden_checkpoint;
using testing::load_config;
using testing::read_text;
using testing::ScratchDir;
using testing::spec_path;

TEST(ExpectedTensors, RealConfigGivesThePinnedCountAndBytes) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  std::vector<ExpectedTensor> all = expected_tensors(c);
  size_t bytes = 0, experts = 0;
  std::set<std::string> names;
  for (const auto& t : all) {
    bytes += t.num_bytes();
    names.insert(t.name);
    if (t.name.find(".ffn.experts.") != std::string::npos) ++experts;
  }
  EXPECT_EQ(all.size(), 96085u);
  EXPECT_EQ(names.size(), all.size()) << "duplicate names";
  EXPECT_EQ(bytes, 510286023000ull);
  EXPECT_EQ(experts, 94464u);
  // The flat form gives the same list.
  ModelConfig flat = load_config(spec_path("inference_config_v41_flash.json"));
  EXPECT_EQ(expected_tensors(flat).size(), 96085u);
}

// Every row of spec/checkpoint_tensors_nonexpert.tsv (name, dtype, shape), and nothing else besides experts.
TEST(ExpectedTensors, RealConfigMatchesTheNonExpertTsv) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  std::map<std::string, std::pair<std::string, std::string>> want;
  std::istringstream tsv(read_text(spec_path("checkpoint_tensors_nonexpert.tsv")));
  std::string line;
  while (std::getline(tsv, line)) {
    if (line.empty()) continue;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    want[line.substr(0, t1)] = {line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1)};
  }
  ASSERT_EQ(want.size(), 1621u);
  size_t non_expert = 0;
  for (const auto& t : expected_tensors(c)) {
    if (t.name.find(".ffn.experts.") != std::string::npos) continue;
    ++non_expert;
    auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << t.name << " is not in the TSV";
    EXPECT_EQ(dtype_name(t.dtype), it->second.first) << t.name;
    EXPECT_EQ(shape_to_string(t.shape), it->second.second) << t.name;
  }
  EXPECT_EQ(non_expert, want.size());
}

TEST(ExpectedTensors, PackedExpertConventions) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  StorageConventions i8;
  i8.packed_experts = DType::kI8;
  size_t bytes_f4 = 0, bytes_i8 = 0;
  for (const auto& t : expected_tensors(c)) bytes_f4 += t.num_bytes();
  const ExpectedTensor* w1 = nullptr;
  auto list = expected_tensors(c, i8);
  for (const auto& t : list) {
    bytes_i8 += t.num_bytes();
    if (t.name == "layers.0.ffn.experts.0.w1.weight") w1 = &t;
  }
  EXPECT_EQ(bytes_f4, bytes_i8);  // same bytes, different dtype string and shape
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->dtype, DType::kI8);
  EXPECT_EQ(w1->shape, (std::vector<int64_t>{2304, 2560}));
}

// The optional parts follow the config: vision (and gate.bias_vl) only with vision_n_layers > 0, FP8
// scales only with quantised linears, MXFP4 experts only with expert_dtype fp4.
TEST(ExpectedTensors, OptionalPartsFollowTheConfig) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  auto count = [](const std::vector<ExpectedTensor>& list, const std::string& needle) {
    size_t n = 0;
    for (const auto& t : list) n += t.name.find(needle) != std::string::npos ? 1 : 0;
    return n;
  };
  const auto full = expected_tensors(c);
  EXPECT_EQ(count(full, "gate.bias_vl"), 43u);  // 40 layers + 3 DSpark stages
  EXPECT_EQ(count(full, "vision."), 3u + 32u * 8u);
  ModelConfig text_only = c;
  text_only.vision_n_layers = 0;
  const auto no_vision = expected_tensors(text_only);
  EXPECT_EQ(count(no_vision, "gate.bias_vl"), 0u);
  EXPECT_EQ(count(no_vision, "vision."), 0u);
  EXPECT_EQ(count(no_vision, "aligner."), 0u);
  EXPECT_EQ(count(no_vision, "image_"), 0u);
  EXPECT_EQ(full.size() - no_vision.size(), 43u + 3u + 32u * 8u + 4u + 3u);

  ModelConfig bf16 = c;
  bf16.dtype = "bf16";
  bf16.expert_dtype = "";
  size_t scales = 0;
  for (const auto& t : expected_tensors(bf16)) {
    if (t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".scale") == 0) {
      ++scales;
      EXPECT_NE(t.name.find(".engram.embed."), std::string::npos) << t.name;  // the table stays FP8
    } else if (t.name == "layers.0.ffn.experts.0.w1.weight" || t.name == "layers.0.attn.wq_a.weight") {
      EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
    }
  }
  EXPECT_EQ(scales, 2u);

  ModelConfig no_dspark = c;
  no_dspark.dspark_block_size = 0;
  EXPECT_EQ(count(expected_tensors(no_dspark), "mtp."), 0u);
}

struct GoldenFacts {
  const char* name;
  size_t num_tensors;
  size_t payload_bytes;
  size_t num_shards;
  DType packed_experts;
};

class GoldenCheckpoint : public ::testing::TestWithParam<GoldenFacts> {};

TEST_P(GoldenCheckpoint, OpensAndEqualsItsExpectedTensorList) {
  const GoldenFacts& g = GetParam();
  auto ckpt = Checkpoint::open(golden_checkpoint(g.name));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->num_shards(), g.num_shards);
  EXPECT_EQ(ckpt->conventions().packed_experts, g.packed_experts);
  EXPECT_EQ(ckpt->conventions().hc_scale, DType::kBF16);  // the goldens store hc_*_scale as BF16

  // The stored set, read back, against the expected list: names, dtypes, shapes, exactly.
  std::map<std::string, const TensorView*> stored;
  size_t bytes = 0;
  for (const TensorView* t : ckpt->all_tensors()) {
    stored[t->name] = t;
    bytes += t->num_bytes;
  }
  std::vector<ExpectedTensor> want = expected_tensors(ckpt->config(), ckpt->conventions());
  EXPECT_EQ(want.size(), stored.size());
  for (const auto& t : want) {
    auto it = stored.find(t.name);
    ASSERT_NE(it, stored.end()) << t.name;
    EXPECT_EQ(it->second->dtype, t.dtype) << t.name;
    EXPECT_EQ(it->second->shape, t.shape) << t.name;
    EXPECT_EQ(it->second->num_bytes, t.num_bytes()) << t.name;
  }
  // The golden's own manifest.json figures.
  auto manifest = nlohmann::json::parse(read_text(testing::shared_dir() + "/goldens/" + g.name + "/manifest.json"));
  EXPECT_EQ(stored.size(), manifest["checkpoint"]["n_tensors"].get<size_t>());
  EXPECT_EQ(bytes, manifest["checkpoint"]["payload_bytes"].get<size_t>());
  EXPECT_EQ(stored.size(), g.num_tensors);
  EXPECT_EQ(bytes, g.payload_bytes);

  // Lookups: zero copy into the mapping; errors name the tensor and the directory.
  auto embed = ckpt->get("embed.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed.value()->dtype, DType::kBF16);
  EXPECT_EQ(embed.value()->dim(0), ckpt->config().vocab_size);
  auto none = ckpt->get("layers.0.nothing");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("layers.0.nothing"));
  EXPECT_THAT(none.status().message(), HasSubstr(g.name));
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenCheckpoint,
                         ::testing::Values(GoldenFacts{"tiny-a", 1028, 6463260, 1, DType::kF4},
                                           GoldenFacts{"tiny-b", 1225, 12500337, 2, DType::kI8},
                                           GoldenFacts{"tiny-c", 956, 5482992, 1, DType::kF4}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

// A synthetic checkpoint for tiny-a's config: every expected tensor (zero bytes), split into shards.
class Synthetic {
 public:
  Synthetic() {
    dir_.write("config.json", read_text(golden_checkpoint("tiny-a") + "/config.json"));
    config_ = load_config(dir_.path());
    tensors_ = expected_tensors(config_);
  }
  std::vector<ExpectedTensor>& tensors() { return tensors_; }
  const ScratchDir& dir() const { return dir_; }

  // Writes the shards (round robin) and, when asked, an index; `index_edit` may change the weight_map.
  void write(int num_shards, bool with_index,
             const std::function<void(nlohmann::json&)>& index_edit = [](nlohmann::json&) {}) {
    std::vector<SafetensorsWriter> writers(static_cast<size_t>(num_shards));
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      const size_t s = i % static_cast<size_t>(num_shards);
      writers[s].add(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.num_bytes(), 0));
      weight_map[t.name] = shard_name(s, num_shards);
    }
    for (size_t s = 0; s < writers.size(); ++s) {
      Status st = writers[s].write(dir_.file(shard_name(s, num_shards)));
      ASSERT_TRUE(st.ok()) << st.message();
    }
    if (with_index) {
      nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
      index_edit(index);
      dir_.write("model.safetensors.index.json", index.dump());
    }
  }

  static std::string shard_name(size_t s, int n) {
    if (n == 1) return "model.safetensors";
    return "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(n) + ".safetensors";
  }

  void erase(const std::string& name) {
    std::erase_if(tensors_, [&](const ExpectedTensor& t) { return t.name == name; });
  }
  ExpectedTensor& at(const std::string& name) {
    for (auto& t : tensors_) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << "no " << name;
    return tensors_[0];
  }

 private:
  ScratchDir dir_;
  ModelConfig config_;
  std::vector<ExpectedTensor> tensors_;
};

std::string open_error(const Synthetic& s) {
  auto ckpt = Checkpoint::open(s.dir().path());
  EXPECT_FALSE(ckpt.ok());
  return ckpt.ok() ? std::string() : ckpt.status().message();
}

// Pages of `view` in the page cache, and how many there are.
std::pair<size_t, size_t> resident_pages(const TensorView& view) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(view.data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(view.data) + view.num_bytes;
  std::vector<unsigned char> flags((end - begin + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, flags.data()) != 0) return {0, flags.size()};
  size_t resident = 0;
  for (unsigned char f : flags) resident += f & 1;
  return {resident, flags.size()};
}

// --mlock: on a private copy of a checkpoint whose pages were dropped from the page cache, locking reads every
// tensor's pages in (and keeps them); the bytes are those of the file.
TEST(CheckpointOpen, LockInMemoryBringsEveryTensorPageIn) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer intercepts mlock as a no-op (the normal build runs this test)";
#endif
  ScratchDir dir;
  for (const auto& entry : std::filesystem::directory_iterator(golden_checkpoint("tiny-a"))) {
    if (entry.is_regular_file()) std::filesystem::copy_file(entry.path(), dir.file(entry.path().filename().string()));
  }
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  // Drop the copy's pages from the page cache (clean them first; the mapping has touched none of the tensors').
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const TensorView* largest = nullptr;
  for (const TensorView* t : ckpt->all_tensors())
    if (largest == nullptr || t->num_bytes > largest->num_bytes) largest = t;
  ASSERT_NE(largest, nullptr);
  const auto [cold, pages] = resident_pages(*largest);
  ASSERT_LT(cold, pages) << "the copy's pages were not dropped: nothing to show";
  const Status locked = ckpt->lock_in_memory();
  ASSERT_TRUE(locked.ok()) << locked.message();
  for (const TensorView* t : ckpt->all_tensors()) {
    const auto [resident, total] = resident_pages(*t);
    EXPECT_EQ(resident, total) << t->name;
  }
  auto reference = Checkpoint::open(golden_checkpoint("tiny-a"));
  ASSERT_TRUE(reference.ok());
  const TensorView* same = reference->find(largest->name);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(std::memcmp(same->data, largest->data, largest->num_bytes), 0);
}

// Tensor bytes copied elsewhere at load give their pages back; reading them again still gives the file's bytes
// (and a range in no shard is ignored).
TEST(CheckpointOpen, ReleasedBytesStillReadBackFromTheFile) {
  auto ckpt = Checkpoint::open(golden_checkpoint("tiny-a"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const TensorView* largest = nullptr;
  for (const TensorView* t : ckpt->all_tensors())
    if (largest == nullptr || t->num_bytes > largest->num_bytes) largest = t;
  ASSERT_NE(largest, nullptr);
  ASSERT_GT(largest->num_bytes, size_t{3} * 4096) << "too small to hold a whole page";
  const std::vector<uint8_t> original(largest->data, largest->data + largest->num_bytes);
  ckpt->release(largest->data, largest->num_bytes);
  EXPECT_EQ(std::memcmp(largest->data, original.data(), original.size()), 0);
  const uint8_t outside[16] = {};
  ckpt->release(outside, sizeof(outside));
}

// --mlock after a load-time copy: released pages leave the page cache, locking on fault does not read them in
// again, and reading them (which nothing does after the copy) still gives the file's bytes.
TEST(CheckpointOpen, LockOnFaultLeavesReleasedPagesOut) {
  ScratchDir dir;
  for (const auto& entry : std::filesystem::directory_iterator(golden_checkpoint("tiny-a"))) {
    if (entry.is_regular_file()) std::filesystem::copy_file(entry.path(), dir.file(entry.path().filename().string()));
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {  // clean pages can be dropped
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fsync(fd);
    ::close(fd);
  }
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const TensorView* largest = nullptr;
  for (const TensorView* t : ckpt->all_tensors())
    if (largest == nullptr || t->num_bytes > largest->num_bytes) largest = t;
  ASSERT_NE(largest, nullptr);
  const std::vector<uint8_t> original(largest->data, largest->data + largest->num_bytes);  // reads it in
  ckpt->release(largest->data, largest->num_bytes);
  // Pages left resident: the partial first and last, and the page cache's large folios that straddle the ends.
  const auto [left, pages] = resident_pages(*largest);
  EXPECT_LT(left, pages / 2) << "of " << pages << " pages";
  ASSERT_TRUE(ckpt->lock_in_memory(/*on_fault=*/true).ok());
  EXPECT_EQ(resident_pages(*largest).first, left) << "locking on fault read released pages in";
  EXPECT_EQ(std::memcmp(largest->data, original.data(), original.size()), 0);
}

TEST(CheckpointOpen, SyntheticCheckpointsOpenSingleAndSharded) {
  {
    Synthetic s;
    s.write(1, false);
    auto ckpt = Checkpoint::open(s.dir().path());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    EXPECT_EQ(ckpt->all_tensors().size(), 1028u);
    EXPECT_EQ(ckpt->conventions().hc_scale, DType::kF32);
  }
  {
    Synthetic s;
    s.write(3, true);
    auto ckpt = Checkpoint::open(s.dir().path());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    EXPECT_EQ(ckpt->num_shards(), 3u);
    EXPECT_EQ(ckpt->all_tensors().size(), 1028u);
  }
}

TEST(CheckpointOpen, MissingTensor) {
  Synthetic s;
  s.erase("layers.3.attn.wq_a.scale");
  s.write(1, false);
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("missing tensor 'layers.3.attn.wq_a.scale'"));
  EXPECT_THAT(err, HasSubstr("F8_E8M0 [2, 4]"));
  EXPECT_THAT(err, HasSubstr(s.dir().path()));
}

TEST(CheckpointOpen, UnexpectedTensor) {
  Synthetic s;
  s.tensors().push_back({"layers.3.attn.compressor.wkv.weight", DType::kBF16, {128, 128}});  // L3 is Reuse
  s.write(1, false);
  EXPECT_THAT(open_error(s), HasSubstr("unexpected tensor 'layers.3.attn.compressor.wkv.weight'"));
}

TEST(CheckpointOpen, WrongDtypeAndShapeNameTheTensorAndFile) {
  Synthetic s;
  s.at("layers.0.attn.attn_sink").dtype = DType::kBF16;
  s.at("layers.5.ffn.gate.weight").shape = {8, 127};
  s.write(2, true);
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("2 problems"));
  EXPECT_THAT(err, HasSubstr("tensor 'layers.0.attn.attn_sink' in"));
  EXPECT_THAT(err, HasSubstr("is BF16 [4], expected F32 [4]"));
  EXPECT_THAT(err, HasSubstr("is BF16 [8, 127], expected BF16 [8, 128]"));
  EXPECT_THAT(err, HasSubstr(".safetensors"));
}

TEST(CheckpointOpen, ManyProblemsAreSummarised) {
  Synthetic s;
  std::erase_if(s.tensors(), [](const ExpectedTensor& t) { return t.name.rfind("layers.2.", 0) == 0; });
  s.write(1, false);
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("more"));
  EXPECT_THAT(err, HasSubstr("missing tensor 'layers.2."));
}

TEST(CheckpointOpen, ShardListedInIndexButAbsent) {
  Synthetic s;
  s.write(2, true, [](nlohmann::json& index) { index["weight_map"]["norm.weight"] = "model-00009-of-00009.safetensors"; });
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("model-00009-of-00009.safetensors"));
  EXPECT_THAT(err, HasSubstr("absent"));
  EXPECT_THAT(err, HasSubstr("norm.weight"));
}

TEST(CheckpointOpen, IndexPointsToAShardThatLacksTheTensor) {
  Synthetic s;
  s.write(2, true, [](nlohmann::json& index) {
    // Move embed.weight's entry to the other shard.
    const std::string now = index["weight_map"]["embed.weight"];
    index["weight_map"]["embed.weight"] = now == Synthetic::shard_name(0, 2) ? Synthetic::shard_name(1, 2)
                                                                              : Synthetic::shard_name(0, 2);
  });
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("'embed.weight'"));
  EXPECT_THAT(err, HasSubstr("does not hold it"));
}

TEST(CheckpointOpen, ShardHoldsATensorTheIndexDoesNotList) {
  Synthetic s;
  s.write(2, true, [](nlohmann::json& index) { index["weight_map"].erase("head.weight"); });
  const std::string err = open_error(s);
  EXPECT_THAT(err, HasSubstr("'head.weight'"));
  EXPECT_THAT(err, HasSubstr("does not list"));
}

TEST(CheckpointOpen, IndexProblems) {
  {
    Synthetic s;
    s.write(2, false);
    s.dir().write("model.safetensors.index.json", "{\"weight_map\": {");
    EXPECT_THAT(open_error(s), HasSubstr("malformed JSON"));
  }
  {
    Synthetic s;
    s.write(2, true, [](nlohmann::json& index) { index.erase("weight_map"); });
    EXPECT_THAT(open_error(s), HasSubstr("weight_map"));
  }
  {
    Synthetic s;
    s.write(2, true, [](nlohmann::json& index) { index["weight_map"]["norm.weight"] = "../elsewhere.safetensors"; });
    EXPECT_THAT(open_error(s), HasSubstr("outside the checkpoint directory"));
  }
}

TEST(CheckpointOpen, NoWeightsOrBadConfigOrCorruptShard) {
  {
    Synthetic s;
    EXPECT_THAT(open_error(s), HasSubstr("neither model.safetensors.index.json nor model.safetensors"));
  }
  {
    Synthetic s;
    s.write(1, false);
    s.dir().write("config.json", "{\"text_config\": {\"hidden_size\": 128}}");
    EXPECT_THAT(open_error(s), HasSubstr("config.json"));
  }
  {
    Synthetic s;
    s.write(1, false);
    // Truncate the shard to its first 100 bytes: the header length now runs past the end.
    std::string bytes = read_text(s.dir().file("model.safetensors")).substr(0, 100);
    s.dir().write("model.safetensors", bytes);
    const std::string err = open_error(s);
    EXPECT_THAT(err, HasSubstr("model.safetensors"));
    EXPECT_THAT(err, HasSubstr("header length"));
  }
  {
    Synthetic s;
    s.write(1, false);
    // Cut the payload short: the last tensor's offsets now run past the payload.
    std::string bytes = read_text(s.dir().file("model.safetensors"));
    s.dir().write("model.safetensors", bytes.substr(0, bytes.size() - 1));
    const std::string err = open_error(s);
    EXPECT_THAT(err, HasSubstr("out of range"));
  }
  auto not_dir = Checkpoint::open("/nonexistent-dsflash-checkpoint");
  ASSERT_FALSE(not_dir.ok());
  EXPECT_THAT(not_dir.status().message(), HasSubstr("/nonexistent-dsflash-checkpoint"));
}

}  // namespace
}  // namespace dsflash
