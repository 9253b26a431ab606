// Model configurations of the random test checkpoints `dsflash make-tiny` writes, and the two config.json forms
// of an official checkpoint directory (root config.json nested like the release, flat inference/config.json
// with model.py's ModelArgs names; goldens/tiny-a/checkpoint is the model for both).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace dsflash::tiny {

struct Preset {
  std::string name;
  std::string description;
  // Complete except the Engram fields that depend on the tokenizer (engram_num_embeddings,
  // engram_compressed_vocab_size): those are derived when the checkpoint is written.
  ModelConfig config;
  int64_t max_shard_bytes = 0;  // payload bytes per safetensors shard
};

// "tiny": goldens tiny-a's shape (12 layers, every layer role, Engram on an SWA layer and a KV source, 1 DSpark
//         stage; seconds to write).
// "wide": the real per-layer widths (dim 5120, 64 heads x 512, q_lora 1280, 8 x 1024 output groups, indexer
//         32 x 128, MoE inter 2304) on 8 layers covering the roles, split 4/4 into CED encoder/decoder like the
//         released 20/20, 8 experts top-6, small vocab and Engram tables.
// "real-kv": the real 40 layer roles and KV dims (head_dim 512, index_head_dim 128, window 128; KV sources
//         2, 8, 14, 20): 890 global KV bytes per token, narrow everywhere else.
std::vector<std::string> preset_names();
Result<Preset> preset(const std::string& name);

// The root config.json (nested text_config + quantization_config) and the flat inference/config.json.
std::string root_config_json(const ModelConfig& config);
std::string flat_config_json(const ModelConfig& config);

// Global KV bytes per token (spec/MODEL.md §6): per KV source, one compressed entry every `ratio` tokens of
// head_dim e2m1 + head_dim/16 e4m3 scales, plus index_head_dim e2m1 + index_head_dim/32 ue8m0 scales.
double global_kv_bytes_per_token(const ModelConfig& config);

}  // namespace dsflash::tiny
