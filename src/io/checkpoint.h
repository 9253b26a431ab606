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
};

// Every tensor a checkpoint for `config` must hold (backbone, DSpark stages, vision when enabled).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

class Checkpoint {
 public:
  // Opens and validates: index shards present, every expected tensor present with the expected dtype
  // and shape (packed experts accepted as F4 [out,in], I8/U8 [out,in/2]), no unexpected tensors.
  static Result<Checkpoint> open(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const TensorView* find(const std::string& name) const;
  Result<const TensorView*> get(const std::string& name) const;  // error names the tensor and the dir
  std::vector<const TensorView*> all_tensors() const;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*> by_name_;
};

}  // namespace dsflash
