// `dsflash make-tiny`: writes a complete official-format checkpoint directory with random weights
// (config.json nested like the release, inference/config.json flat, sharded safetensors +
// model.safetensors.index.json, tokenizer.json), for tests, benchmarks and the demo job (scripts/run.sh).
// The tensor list is io's expected_tensors(config) (spec/CHECKPOINT.md), so the directory loads through
// Checkpoint::open and passes its validation.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/model_config.h"

namespace dsflash::tiny {

struct TinyCheckpointOptions {
  std::string preset = "tiny";  // tiny_config.h: tiny, wide, real-kv
  std::string out_dir;
  uint64_t seed = 1;
  std::string tokenizer_path;   // a byte-level BPE tokenizer.json; "" = default_tokenizer_path()
  int64_t max_shard_bytes = 0;  // payload bytes per shard; 0 = the preset's
  bool overwrite = false;       // allow a non-empty out_dir (files of the same names are replaced)
};

struct TinyCheckpointSummary {
  ModelConfig config;             // as written (Engram fields derived)
  int64_t num_tensors = 0;
  int64_t payload_bytes = 0;      // tensor bytes over all shards
  int num_shards = 0;
  double kv_bytes_per_token = 0;  // global KV (spec/MODEL.md §6)
};

// Fills the Engram fields that depend on the tokenizer, as goldens/*/MANIFEST.md derives them with engram.py:
// engram_compressed_vocab_size = the compressed token map over ids [0, vocab_size), engram_num_embeddings =
// Σ of each layer's primes (the prime walk from engram_vocab_size - 1), cross-checked with EngramHashLayout.
Status derive_engram_fields(const std::string& tokenizer_json_text, ModelConfig* config);

Result<TinyCheckpointSummary> write_tiny_checkpoint(const TinyCheckpointOptions& options);

}  // namespace dsflash::tiny
