// The Engram module of one layer (spec/MODEL.md §4.8; official model.py Engram / ParallelEngramEmbedding).
#include "model/engram.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "io/model_config.h"

// model.py rounds gate*value to fp32 before adding it to h (two torch ops): the build's -ffp-contract=off keeps
// them two roundings (an FMA would change the last bit now and then).

namespace dsflash {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<const TensorView*> require(const Engram::TensorLookup& find, const std::string& origin,
                                  const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  const TensorView* view = find(name);
  if (view == nullptr) return Status::Error(origin + ": tensor " + name + " is missing");
  if (view->dtype != dtype) {
    return Status::Error(origin + ": tensor " + name + " has dtype " + dtype_name(view->dtype) + ", expected " +
                         dtype_name(dtype));
  }
  if (view->shape != shape) {
    return Status::Error(origin + ": tensor " + name + " has shape " + shape_string(view->shape) + ", expected " +
                         shape_string(shape));
  }
  if (view->data == nullptr && view->num_bytes > 0) return Status::Error(origin + ": tensor " + name + " has no data");
  return view;
}

// Runs fn(begin, end, thread_index) over [0, n) on the pool when there is one.
template <class Fn>
void for_range(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool == nullptr || n <= 1) {
    fn(int64_t{0}, n, 0);
    return;
  }
  pool->parallel_for(n, fn);
}

}  // namespace

Result<Engram> Engram::bind(const Checkpoint& checkpoint, int layer, const EngramHashLayout& layout) {
  return bind([&checkpoint](const std::string& name) { return checkpoint.find(name); }, checkpoint.dir(),
              checkpoint.config(), layer, layout);
}

Result<Engram> Engram::bind(const TensorLookup& find, const std::string& origin, const ModelConfig& config,
                            int layer, const EngramHashLayout& layout) {
  const std::string where = origin + " (Engram of layer " + std::to_string(layer) + ")";
  const int index = layout.layer_index(layer);
  if (index < 0) return Status::Error(where + ": layer is not in engram_layer_ids");
  const int64_t head_dim = config.engram_head_dim;
  if (head_dim <= 0 || head_dim % 32 != 0) {
    return Status::Error(where + ": config.engram_head_dim = " + std::to_string(head_dim) +
                         ", need a positive multiple of 32 (one ue8m0 scale per 32 columns)");
  }
  if (config.dim <= 0 || config.hc_mult <= 0) return Status::Error(where + ": config.dim / hc_mult not positive");

  Engram engram;
  engram.layer_ = layer;
  engram.layer_hash_index_ = index;
  engram.num_hash_layers_ = layout.num_layers();
  engram.columns_ = layout.columns();
  engram.head_dim_ = head_dim;
  engram.dim_ = config.dim;
  engram.hc_ = config.hc_mult;
  engram.eps_ = config.norm_eps;
  engram.rows_ = layout.num_rows[static_cast<size_t>(index)];

  const std::string prefix = "layers." + std::to_string(layer) + ".engram.";
  const int64_t in = engram.columns_ * head_dim;
  const int64_t out = (config.hc_mult + 1) * config.dim;
  auto table = require(find, where, prefix + "embed.weight", DType::kF8_E4M3, {engram.rows_, head_dim});
  if (!table.ok()) return table.status();
  auto table_scale = require(find, where, prefix + "embed.scale", DType::kF8_E8M0, {engram.rows_, head_dim / 32});
  if (!table_scale.ok()) return table_scale.status();
  auto wkv = require(find, where, prefix + "wkv.weight", DType::kF8_E4M3, {out, in});
  if (!wkv.ok()) return wkv.status();
  auto wkv_scale = require(find, where, prefix + "wkv.scale", DType::kF8_E8M0, {(out + 31) / 32, (in + 31) / 32});
  if (!wkv_scale.ok()) return wkv_scale.status();
  auto q_weight = require(find, where, prefix + "q_weight", DType::kBF16, {config.hc_mult, config.dim});
  if (!q_weight.ok()) return q_weight.status();
  auto k_weight = require(find, where, prefix + "k_weight", DType::kBF16, {config.hc_mult, config.dim});
  if (!k_weight.ok()) return k_weight.status();

  engram.table_codes_ = (*table)->data;
  engram.table_scales_ = (*table_scale)->data;
  engram.wkv_ = Fp8Weight{(*wkv)->data, (*wkv_scale)->data, out, in};
  // model.py: weight = q_weight.float() * k_weight.float(), only ever used as that product (fp32).
  const uint16_t* q = (*q_weight)->as<uint16_t>();
  const uint16_t* k = (*k_weight)->as<uint16_t>();
  engram.gate_weight_.resize(static_cast<size_t>(config.hc_mult * config.dim));
  for (size_t i = 0; i < engram.gate_weight_.size(); ++i) {
    engram.gate_weight_[i] = bf16_to_f32(q[i]) * bf16_to_f32(k[i]);
  }
  return engram;
}

Status Engram::forward(float* streams, int64_t num_tokens, const int64_t* hash_ids, const ComputeContext& ctx,
                       const uint8_t* dead) const {
  if (num_tokens <= 0) return Status::Ok();
  if (ctx.backend == nullptr) return Status::Error("Engram layer " + std::to_string(layer_) + ": no kernel backend");
  if (streams == nullptr || hash_ids == nullptr) {
    return Status::Error("Engram layer " + std::to_string(layer_) + ": no streams or hash ids given");
  }
  if (ctx.workspace == nullptr) {
    Workspace private_workspace;
    ComputeContext with_workspace = ctx;
    with_workspace.workspace = &private_workspace;
    return forward(streams, num_tokens, hash_ids, with_workspace, dead);
  }
  // Rows are independent: blocks of tokens bound the scratch (wkv output alone is (hc+1)*dim fp32 per token,
  // 100 KB at the released shapes) without changing any value.
  constexpr int64_t kTokensPerBlock = 64;
  for (int64_t first = 0; first < num_tokens; first += kTokensPerBlock) {
    const int64_t n = std::min(kTokensPerBlock, num_tokens - first);
    forward_block(streams + first * hc_ * dim_, n, hash_ids + first * num_hash_layers_ * columns_, ctx,
                  dead != nullptr ? dead + first : nullptr);
  }
  return Status::Ok();
}

void Engram::forward_block(float* streams, int64_t num_tokens, const int64_t* hash_ids, const ComputeContext& ctx,
                           const uint8_t* dead) const {
  const int64_t in = columns_ * head_dim_;
  const int64_t out = (hc_ + 1) * dim_;
  const int64_t scales_per_row = head_dim_ / 32;

  // 1. Table rows: e4m3 * ue8m0 in fp32, then bf16 (ParallelEngramEmbedding); ids outside the table read 0.
  //    rows [num_tokens, C*head_dim], then act_quant for the FP8 GEMM: codes [num_tokens, in], scales [.., in/32].
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const std::span<uint8_t> codes = frame.take<uint8_t>(static_cast<size_t>(num_tokens * in));
  const std::span<uint8_t> scales = frame.take<uint8_t>(static_cast<size_t>(num_tokens * (in / 32)));
  for_range(ctx.pool, num_tokens, [&](int64_t begin, int64_t end, int thread) {
    ThreadScratch scratch(ctx.pool, thread);
    const std::span<float> row = scratch.take<float>(static_cast<size_t>(in));  // [C * head_dim] bf16 values
    const float* e4m3_values = e4m3_value_table();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t* ids = hash_ids + (t * num_hash_layers_ + layer_hash_index_) * columns_;
      for (int c = 0; c < columns_; ++c) {
        float* dst = row.data() + c * head_dim_;
        const int64_t id = ids[c];
        if (id < 0 || id >= rows_) {
          std::fill(dst, dst + head_dim_, 0.0f);
          continue;
        }
        const uint8_t* src = table_codes_ + id * head_dim_;
        const uint8_t* src_scales = table_scales_ + id * scales_per_row;
        for (int64_t j0 = 0; j0 < head_dim_; j0 += 32) {
          const float block_scale = e8m0_to_f32(src_scales[j0 / 32]);
          for (int64_t j = j0; j < std::min<int64_t>(head_dim_, j0 + 32); ++j)
            dst[j] = round_to_bf16(e4m3_values[src[j]] * block_scale);
        }
      }
      ctx.backend->act_quant(row.data(), 1, in, codes.data() + t * in, scales.data() + t * (in / 32), nullptr);
    }
  });

  // 2. wkv: [num_tokens, in] x [out, in]^T -> [num_tokens, (hc+1)*dim], rounded to bf16 (the GEMM's output dtype).
  const std::span<float> kv = frame.take<float>(static_cast<size_t>(num_tokens * out));
  {
    ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
    ctx.backend->fp8_gemm(Fp8Activations{codes.data(), scales.data(), num_tokens, in}, wkv_, kv.data(), ctx.pool);
  }

  // 3. Gate per (token, stream) and residual update, all in fp32; the streams come back as bf16 values.
  const float eps = static_cast<float>(eps_);
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim_), -0.5));
  const float clamp_value = 1e-6f;
  for_range(ctx.pool, num_tokens, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float* kv_row = kv.data() + t * out;
      for (int64_t i = 0; i < out; ++i) kv_row[i] = round_to_bf16(kv_row[i]);
      const float* value = kv_row + hc_ * dim_;  // [dim]
      const bool is_dead = dead != nullptr && dead[t];
      for (int k = 0; k < hc_; ++k) {
        float* h = streams + (t * hc_ + k) * dim_;
        const float* key = kv_row + k * dim_;
        const float* w = gate_weight_.data() + k * dim_;
        float gate = 0.0f;  // image tokens: the gate is shut
        if (!is_dead) {
          // Sums accumulate in double (the reference's fp32 tree order is not reproduced); each
          // elementwise product is rounded to fp32 as torch does it.
          double sum_h2 = 0, sum_k2 = 0, sum_dot = 0;
          for (int64_t d = 0; d < dim_; ++d) {
            const float hd = h[d];
            const float hw = hd * w[d];
            const float hwk = hw * key[d];
            const float h2 = hd * hd;
            const float k2 = key[d] * key[d];
            sum_h2 += h2;
            sum_k2 += k2;
            sum_dot += hwk;
          }
          const float mean_h2 = static_cast<float>(sum_h2) / static_cast<float>(dim_);
          const float mean_k2 = static_cast<float>(sum_k2) / static_cast<float>(dim_);
          const float rstd = (1.0f / std::sqrt(mean_h2 + eps)) * (1.0f / std::sqrt(mean_k2 + eps));
          const float dot = static_cast<float>(sum_dot) * rstd * inv_sqrt_dim;
          const float root = std::copysign(std::sqrt(std::max(std::fabs(dot), clamp_value)), dot);
          gate = 1.0f / (1.0f + std::exp(-root));
        }
        for (int64_t d = 0; d < dim_; ++d) {
          const float update = gate * value[d];
          h[d] = round_to_bf16(h[d] + update);
        }
      }
    }
  });
}

}  // namespace dsflash
