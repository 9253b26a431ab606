#include "model/transformer.h"

#include <algorithm>

#include "formats/formats.h"
#include "kernels/hc.h"
#include "kernels/rmsnorm.h"

namespace dsflash {

Status Transformer::forward(const int32_t* tokens, int64_t num_tokens, SequenceState& seq, const ComputeContext& ctx,
                            LogitsRows rows, std::vector<float>* logits, ForwardTrace* trace) const {
  const ModelConfig& config = weights_.config();
  const HcShape& shape = weights_.hc_shape();
  const int hc = shape.hc;
  const int64_t dim = shape.dim;
  const int64_t start_pos = seq.num_positions();
  if (num_tokens <= 0) return Status::Error("forward: no tokens to process");
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (tokens[t] < 0 || tokens[t] >= config.vocab_size) {
      return Status::Error("token id " + std::to_string(tokens[t]) + " at input index " + std::to_string(t) +
                           " is outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    }
  }
  if (start_pos + num_tokens > config.max_position_embeddings) {
    return Status::Error("context of " + std::to_string(start_pos + num_tokens) +
                         " positions exceeds max_position_embeddings " +
                         std::to_string(config.max_position_embeddings));
  }

  // Engram hash ids of this call: [tokens, engram layers, columns] (advances the n-gram history).
  std::vector<int64_t> hash_ids;
  if (const NgramHasher* hasher = weights_.engram_hasher()) {
    hash_ids.resize(static_cast<size_t>(num_tokens * hasher->num_layers() * hasher->columns()));
    Status s = hasher->hash(tokens, num_tokens, start_pos, &seq.engram(), hash_ids.data());
    if (!s.ok()) return s.with_context("Engram hashing");
  }

  // h: [tokens, hc, dim] streams, every copy the embedding row (bf16 values).
  const int64_t stream_elems = num_tokens * hc * dim;
  std::vector<float> h(static_cast<size_t>(stream_elems));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint16_t* row = weights_.embed().data + static_cast<int64_t>(tokens[t]) * dim;
    for (int j = 0; j < hc; ++j) {
      float* dst = h.data() + (t * hc + j) * dim;
      for (int64_t i = 0; i < dim; ++i) dst[i] = bf16_to_f32(row[i]);
    }
  }
  // The first attention collapses with the one-hot pre of stream 0.
  std::vector<float> pre_mix(static_cast<size_t>(num_tokens * hc), 0.0f);
  for (int64_t t = 0; t < num_tokens; ++t) pre_mix[static_cast<size_t>(t * hc)] = 1.0f;

  std::vector<float> mid(static_cast<size_t>(stream_elems));
  std::vector<float> x(static_cast<size_t>(num_tokens * dim));
  std::vector<float> y(static_cast<size_t>(num_tokens * dim));
  std::vector<float> a_pre(static_cast<size_t>(num_tokens * hc)), a_post(a_pre.size()),
      a_comb(static_cast<size_t>(num_tokens * hc * hc));
  std::vector<float> f_pre(a_pre.size()), f_post(a_pre.size()), f_comb(a_comb.size());

  Csa2Shared shared;
  shared.reset(start_pos, num_tokens);
  if (trace != nullptr) trace->layers.assign(static_cast<size_t>(config.n_layers), {});
  const float eps = shape.norm_eps;

  for (const BlockWeights& block : weights_.blocks()) {
    ForwardTrace::Layer* record = trace != nullptr ? &trace->layers[static_cast<size_t>(block.layer)] : nullptr;
    if (block.engram) {
      Status s = block.engram->forward(h.data(), num_tokens, hash_ids.data(), ctx);
      if (!s.ok()) return s.with_context("layer " + std::to_string(block.layer) + " Engram");
    }
    // attention site: coefficients from the block input; the input collapses with the previous site's pre.
    hc_mixes(h.data(), num_tokens, block.hc_attn, shape, a_pre.data(), a_post.data(), a_comb.data(), ctx.pool);
    hc_pre(h.data(), num_tokens, hc, dim, pre_mix.data(), x.data());
    rmsnorm_bf16(x.data(), num_tokens, dim, block.attn_norm, eps, x.data(), ctx.pool);
    if (record) record->attn_in = x;
    Status s = block.attention->forward(x.data(), num_tokens, start_pos, seq.attention(), shared, ctx, y.data(),
                                        record ? &record->attention : nullptr);
    if (!s.ok()) return s.with_context("layer " + std::to_string(block.layer) + " attention");
    if (record) record->attn_out = y;
    hc_post(y.data(), h.data(), num_tokens, hc, dim, a_post.data(), a_comb.data(), mid.data());

    // FFN site: coefficients from the post-attention streams; the input collapses with the attention site's pre.
    hc_mixes(mid.data(), num_tokens, block.hc_ffn, shape, f_pre.data(), f_post.data(), f_comb.data(), ctx.pool);
    hc_pre(mid.data(), num_tokens, hc, dim, a_pre.data(), x.data());
    rmsnorm_bf16(x.data(), num_tokens, dim, block.ffn_norm, eps, x.data(), ctx.pool);
    if (record) record->ffn_in = x;
    block.moe->forward(x.data(), num_tokens, ctx, y.data(), record ? &record->routing : nullptr);
    if (record) record->ffn_out = y;
    hc_post(y.data(), mid.data(), num_tokens, hc, dim, f_post.data(), f_comb.data(), h.data());
    pre_mix.swap(f_pre);  // the FFN site's pre feeds the next block's attention (Single-Pass mHC)
    if (record) {
      record->out = h;
      record->pre_mix = pre_mix;
    }
  }

  // Final collapse with the last FFN site's pre, final norm, head (bf16 weight used in fp32).
  hc_pre(h.data(), num_tokens, hc, dim, pre_mix.data(), x.data());
  if (trace) trace->final_hc = x;
  rmsnorm_bf16(x.data(), num_tokens, dim, weights_.final_norm(), eps, x.data(), ctx.pool);
  if (trace) trace->final_norm = x;
  seq.advance(num_tokens);

  if (logits != nullptr) {
    const int64_t first = rows == LogitsRows::kAll ? 0 : num_tokens - 1;
    const int64_t count = rows == LogitsRows::kNone ? 0 : num_tokens - first;
    logits->assign(static_cast<size_t>(count * config.vocab_size), 0.0f);
    if (count > 0) {
      ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
      ctx.linear->bf16_gemm(x.data() + first * dim, count, weights_.head(), logits->data(), ctx.pool);
    }
  }
  return Status::Ok();
}

}  // namespace dsflash
