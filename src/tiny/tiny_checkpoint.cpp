// make-tiny: checkpoint directory writer (see tiny_checkpoint.h).
#include "tiny/tiny_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/engram_hash.h"
#include "tiny/tiny_config.h"
#include "tiny/tiny_tokenizer.h"
#include "tiny/tiny_weights.h"
#include "tokenizer/engram_token_map.h"

namespace dsflash::tiny {

namespace {

namespace fs = std::filesystem;

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Error(path + ": read failed");
  return text.str();
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path.string() + ": cannot open for writing");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return Status::Error(path.string() + ": write failed");
  return Status::Ok();
}

// engram.py's prime walk: every (layer, order) restarts at engram_vocab_size - 1 and takes, per head, the next
// prime not handed out before (to any layer). Returns Σ primes per layer.
std::vector<int64_t> engram_table_rows(const ModelConfig& c) {
  std::set<int64_t> seen;
  std::vector<int64_t> rows;
  for (size_t e = 0; e < c.engram_layer_ids.size(); ++e) {
    int64_t total = 0;
    for (int order = 2; order <= c.engram_max_ngram_size; ++order) {
      int64_t current = c.engram_vocab_size - 1;
      for (int head = 0; head < c.engram_n_heads; ++head) {
        do {
          ++current;
        } while (current < 2 || !is_prime_u64(static_cast<uint64_t>(current)) || seen.count(current));
        seen.insert(current);
        total += current;
      }
    }
    rows.push_back(total);
  }
  return rows;
}

// Consecutive schema entries that belong in one shard: a quantised `.weight` with its `.scale`.
std::vector<std::pair<size_t, size_t>> tensor_units(const std::vector<ExpectedTensor>& schema) {
  std::vector<std::pair<size_t, size_t>> units;  // [begin, end)
  for (size_t i = 0; i < schema.size();) {
    size_t end = i + 1;
    const std::string& name = schema[i].name;
    if (end < schema.size() && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
        schema[end].name == name.substr(0, name.size() - 7) + ".scale") {
      ++end;
    }
    units.emplace_back(i, end);
    i = end;
  }
  return units;
}

std::string shard_name(int index, int count) {
  if (count == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", index + 1, count);
  return buf;
}

}  // namespace

Status derive_engram_fields(const std::string& tokenizer_json_text, ModelConfig* config) {
  if (config->engram_layer_ids.empty()) {
    config->engram_num_embeddings.clear();
    return Status::Ok();
  }
  auto map = EngramTokenMap::from_tokenizer_json_text(tokenizer_json_text, "tokenizer.json", config->vocab_size);
  if (!map.ok()) return map.status().with_context("Engram token map");
  config->engram_compressed_vocab_size = map->compressed_vocab_size();
  config->engram_num_embeddings = engram_table_rows(*config);
  // The hashing code walks the primes itself and refuses a config whose rows disagree with its walk.
  auto layout = EngramHashLayout::create(*config, config->engram_compressed_vocab_size);
  if (!layout.ok()) return layout.status().with_context("make-tiny Engram fields");
  return Status::Ok();
}

Result<TinyCheckpointSummary> write_tiny_checkpoint(const TinyCheckpointOptions& options) {
  auto chosen = preset(options.preset);
  if (!chosen.ok()) return chosen.status();
  ModelConfig config = chosen->config;
  const int64_t max_shard_bytes = options.max_shard_bytes > 0 ? options.max_shard_bytes : chosen->max_shard_bytes;
  if (options.out_dir.empty()) return Status::Error("make-tiny: no output directory given");

  const std::string tokenizer_path = options.tokenizer_path.empty() ? default_tokenizer_path() : options.tokenizer_path;
  if (tokenizer_path.empty()) {
    return Status::Error("make-tiny: no tokenizer.json found (looked for tokenizer/deepseek_v3_tokenizer.json under "
                         "$DSFLASH_SHARED_DIR and the configured shared/ folder); pass --tokenizer PATH");
  }
  auto full_tokenizer = read_text(tokenizer_path);
  if (!full_tokenizer.ok()) return full_tokenizer.status().with_context("make-tiny tokenizer");
  auto tokenizer = restrict_tokenizer_json(*full_tokenizer, config.vocab_size, tokenizer_path);
  if (!tokenizer.ok()) return tokenizer.status();

  Status s = derive_engram_fields(*tokenizer, &config);
  if (!s.ok()) return s;
  s = config.validate();
  if (!s.ok()) return s.with_context("make-tiny preset " + options.preset);
  config.derive_roles();

  const fs::path dir(options.out_dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return Status::Error(options.out_dir + ": exists and is not a directory");
  }
  if (fs::is_directory(dir, ec) && !options.overwrite && !fs::is_empty(dir, ec)) {
    return Status::Error(options.out_dir + ": directory is not empty (use --force to overwrite)");
  }
  fs::create_directories(dir / "inference", ec);
  if (ec) return Status::Error(options.out_dir + ": cannot create: " + ec.message());

  // Shard plan: units in schema order, a new shard when the next unit would pass the limit.
  const std::vector<ExpectedTensor> schema = expected_tensors(config);
  std::vector<std::vector<std::pair<size_t, size_t>>> shards(1);
  int64_t shard_bytes = 0, payload = 0;
  for (const auto& unit : tensor_units(schema)) {
    int64_t unit_bytes = 0;
    for (size_t i = unit.first; i < unit.second; ++i) unit_bytes += static_cast<int64_t>(schema[i].num_bytes());
    if (!shards.back().empty() && shard_bytes + unit_bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(unit);
    shard_bytes += unit_bytes;
    payload += unit_bytes;
  }

  // Remove shards of an earlier run with other names (overwrite): the index must be the only truth.
  if (options.overwrite) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("model", 0) == 0 && entry.path().extension() == ".safetensors") fs::remove(entry.path(), ec);
    }
  }

  WeightGenerator generator(config, schema, options.seed);
  nlohmann::json weight_map = nlohmann::json::object();
  const int num_shards = static_cast<int>(shards.size());
  for (int k = 0; k < num_shards; ++k) {
    const std::string file = shard_name(k, num_shards);
    SafetensorsWriter writer;
    writer.add_metadata("format", "pt");
    for (const auto& unit : shards[static_cast<size_t>(k)]) {
      for (size_t i = unit.first; i < unit.second; ++i) {
        auto bytes = generator.generate(schema[i]);
        if (!bytes.ok()) return bytes.status().with_context("make-tiny");
        writer.add(schema[i].name, schema[i].dtype, schema[i].shape, std::move(bytes.value()));
        weight_map[schema[i].name] = file;
      }
    }
    s = writer.write((dir / file).string());
    if (!s.ok()) return s;
  }

  nlohmann::json index;
  index["metadata"]["total_size"] = payload;
  index["weight_map"] = weight_map;
  s = write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  if (!s.ok()) return s;
  s = write_text(dir / "config.json", root_config_json(config));
  if (!s.ok()) return s;
  s = write_text(dir / "inference" / "config.json", flat_config_json(config));
  if (!s.ok()) return s;
  s = write_text(dir / "tokenizer.json", *tokenizer);
  if (!s.ok()) return s;

  TinyCheckpointSummary summary;
  summary.config = config;
  summary.num_tensors = static_cast<int64_t>(schema.size());
  summary.payload_bytes = payload;
  summary.num_shards = num_shards;
  summary.kv_bytes_per_token = global_kv_bytes_per_token(config);
  return summary;
}

}  // namespace dsflash::tiny
