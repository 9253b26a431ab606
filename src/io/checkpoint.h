// An official checkpoint directory: config.json, model.safetensors or shards + model.safetensors.index.json.
// All shards are mapped; tensors are found by name without copying.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace dsflash {

// One expected tensor for a config (checkpoint schema, spec/CHECKPOINT.md).
struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // as the header states it (F4 experts: logical [out, in])

  size_t num_bytes() const;
};

// The dtype strings that differ between checkpoint writers for the same bytes or values.
struct StorageConventions {
  // Packed e2m1 routed experts: F4 with the logical shape [out, in] (what safetensors writes for
  // torch.float4_e2m1fn_x2; goldens tiny-a/c) or I8 / U8 with the byte shape [out, in/2] (the released
  // checkpoint's string per the OpenTallas pin; golden tiny-b).
  DType packed_experts = DType::kF4;
  // hc_{attn,ffn}_scale [3]: F32 in model.py and spec/CHECKPOINT.md; the goldens store BF16.
  DType hc_scale = DType::kF32;
};

// Every tensor a checkpoint for `config` must hold (backbone, DSpark stages when dspark_block_size > 0,
// vision + image delimiters + aligner + gate.bias_vl when vision_n_layers > 0), in a fixed order.
// Rules: spec/CHECKPOINT.md, generalised with model.py's constructors.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config, const StorageConventions& conventions);

class Checkpoint {
 public:
  // Opens and validates: index shards present, every expected tensor present with the expected dtype
  // and shape (packed experts accepted as F4 [out,in], I8/U8 [out,in/2]), no unexpected tensors.
  static Result<Checkpoint> open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const StorageConventions& conventions() const { return conventions_; }
  size_t num_shards() const { return shards_.size(); }
  const std::string& dir() const { return dir_; }
  const TensorView* find(const std::string& name) const;
  Result<const TensorView*> get(const std::string& name) const;  // error names the tensor and the dir
  std::vector<const TensorView*> all_tensors() const;
  // Locks every shard's mapping in RAM (MappedFile::lock_in_memory; on_fault: as pages are first touched, for
  // shards part of which was released); the error names the shard.
  Status lock_in_memory(bool on_fault = false) const;
  // Tensor bytes [p, p + n) copied elsewhere at load: their pages are given back (MappedFile::release). Reading
  // them again stays correct. Bytes in no shard are ignored.
  void release(const uint8_t* p, size_t n) const;

 private:
  std::string dir_;
  ModelConfig config_;
  StorageConventions conventions_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*> by_name_;
};

}  // namespace dsflash
