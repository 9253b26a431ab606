// Random weights for make-tiny checkpoints, of sane magnitude and in the official storage formats
// (spec/CHECKPOINT.md): FP8 linears as e4m3 + ue8m0 per 32x32 block, MXFP4 routed experts as packed e2m1 +
// ue8m0 per 32 along K, Engram tables as e4m3 + ue8m0 per row and 32 columns, BF16 and F32 as stored.
//
// Magnitudes follow the goldens (goldens/*/MANIFEST.md "Sensitivity"): linear weights N(0, 1/in), the residual
// branches' output projections scaled down (attention wo_b x0.12, MoE w2 x0.05, Engram value rows x0.12) so the
// activations stay O(1) through the layers; norms ~1; embeddings N(0, 1); head N(0, 1/dim).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"

namespace dsflash::tiny {

class WeightGenerator {
 public:
  // `schema`: every tensor of the checkpoint (expected_tensors), so a `.scale` can find its `.weight`.
  WeightGenerator(const ModelConfig& config, const std::vector<ExpectedTensor>& schema, uint64_t seed);

  // The stored bytes of one tensor (dtype and shape as the schema states). Each tensor's values depend only on
  // (seed, name), not on the order of the calls. Errors name the tensor.
  Result<std::vector<uint8_t>> generate(const ExpectedTensor& tensor);

 private:
  Result<std::vector<uint8_t>> quantised_weight(const ExpectedTensor& weight);

  const ModelConfig& config_;
  uint64_t seed_;
  std::map<std::string, const ExpectedTensor*> by_name_;
  std::map<std::string, std::vector<uint8_t>> pending_scales_;  // made with their weight, handed out once
};

}  // namespace dsflash::tiny
