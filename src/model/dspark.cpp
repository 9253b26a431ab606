// DSpark stages (spec/MODEL.md §4.10), following model.py's forward_spec with the reference's rounding points:
// bf16 tensors between ops, fp32 inside; the heads (main head, Markov head, confidence head) in fp32.
#include "model/dspark.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "formats/formats.h"
#include "model/attention.h"
#include "model/linear_ops.h"
#include "model/weight_binding.h"

namespace dsflash {
namespace {

// Streams of the draft blocks and the scratch of one stage (shapes as in model/forward.cpp).
struct BlockStreams {
  std::vector<float> h;        // [rows, hc, dim] bf16 values
  std::vector<float> pre_mix;  // [rows, hc] fp32: the pre the next attention (or the head) collapses with
  std::vector<float> mid, x, y, a_pre, a_post, a_comb, f_pre, f_post, f_comb;
  void resize(int64_t n, int hc, int64_t dim) {
    mid.resize(static_cast<size_t>(n * hc * dim));
    x.resize(static_cast<size_t>(n * dim));
    y.resize(static_cast<size_t>(n * dim));
    for (auto* v : {&a_pre, &a_post, &f_pre, &f_post}) v->resize(static_cast<size_t>(n * hc));
    for (auto* v : {&a_comb, &f_comb}) v->resize(static_cast<size_t>(n * hc * hc));
  }
};

void fp32_linear(const float* x, int64_t rows, const Bf16Weight& w, float* y, const ComputeContext& ctx) {
  ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
  ctx.backend->bf16_gemm(x, rows, w, y, ctx.pool);
}

int32_t argmax_first(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace

Result<std::unique_ptr<DSpark>> DSpark::bind(const Checkpoint& checkpoint, const ModelWeights& main) {
  const ModelConfig& config = checkpoint.config();
  if (config.dspark_stages() <= 0) {
    return Status::Error(checkpoint.dir() + ": the model has no DSpark stages (dspark_block_size " +
                         std::to_string(config.dspark_block_size) + ", n_mtp_layers " +
                         std::to_string(config.n_mtp_layers) + ")");
  }
  std::vector<int> targets = config.dspark_target_layer_ids;
  std::sort(targets.begin(), targets.end());
  if (targets.empty() || std::adjacent_find(targets.begin(), targets.end()) != targets.end()) {
    return Status::Error(checkpoint.dir() + ": dspark_target_layer_ids must be distinct layers (model.py captures "
                                            "each target layer once)");
  }
  std::unique_ptr<DSpark> d(new DSpark());
  d->main_ = &main;
  d->first_layer_ = config.n_layers;
  d->block_ = config.dspark_block_size;
  d->noise_token_ = config.dspark_noise_token_id;
  d->dim_ = config.dim;
  d->vocab_ = config.vocab_size;
  d->rank_ = config.dspark_markov_rank;
  d->hidden_width_ = static_cast<int64_t>(targets.size()) * config.dim;
  const int stages = config.dspark_stages();
  for (int s = 0; s < stages; ++s) {
    auto block = bind_block_weights(checkpoint, config.n_layers + s, nullptr);
    if (!block.ok()) return block.status().with_context("DSpark stage " + std::to_string(s));
    d->stages_.push_back(std::move(*block));
  }
  const std::string last = "mtp." + std::to_string(stages - 1);
  auto main_proj = bind_fp8_linear(checkpoint, "mtp.0.main_proj", d->dim_, d->hidden_width_);
  if (!main_proj.ok()) return main_proj.status();
  d->main_proj_ = *main_proj;
  auto main_norm = bind_bf16_vector(checkpoint, "mtp.0.main_norm.weight", d->dim_);
  if (!main_norm.ok()) return main_norm.status();
  d->main_norm_ = *main_norm;
  auto norm = bind_bf16_vector(checkpoint, last + ".norm.weight", d->dim_);
  if (!norm.ok()) return norm.status();
  d->norm_ = *norm;
  auto embed = bind_bf16_matrix(checkpoint, last + ".markov_head.embed.weight", d->vocab_, d->rank_);
  if (!embed.ok()) return embed.status();
  d->markov_embed_ = *embed;
  auto head = bind_bf16_matrix(checkpoint, last + ".markov_head.head.weight", d->vocab_, d->rank_);
  if (!head.ok()) return head.status();
  d->markov_head_ = *head;
  auto proj = bind_bf16_matrix(checkpoint, last + ".confidence_head.proj.weight", 1, d->dim_ + d->rank_);
  if (!proj.ok()) return proj.status();
  d->confidence_proj_ = *proj;
  return d;
}

Result<int64_t> DSpark::to_tile_major(const Checkpoint& checkpoint, TileMajorFormats formats, ThreadPool* pool) {
  return copy_to_tile_major(stages_, {&main_proj_}, formats, checkpoint, pool, tile_major_weights_);
}

void DSpark::project_main_hidden(const float* main_hidden, int64_t rows, const ComputeContext& ctx,
                                 float* main_x) const {
  fp8_linear_bf16(main_hidden, rows, main_proj_, main_x, ctx);
  ctx.backend->rmsnorm_bf16(main_x, rows, dim_, main_norm_, main_->hc_shape().norm_eps, main_x, ctx.pool);
}

void DSpark::markov_bias(const int32_t* tokens, int64_t rows, const ComputeContext& ctx, float* embed,
                         float* bias) const {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = markov_embed_.data + static_cast<int64_t>(tokens[r]) * rank_;
    for (int64_t i = 0; i < rank_; ++i) embed[r * rank_ + i] = bf16_to_f32(src[i]);
  }
  fp32_linear(embed, rows, markov_head_, bias, ctx);
}

void DSpark::confidence(const float* hidden, const float* markov_embed, int64_t rows, const ComputeContext& ctx,
                        float* out) const {
  const int64_t width = dim_ + rank_;
  std::vector<float> joined(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(&joined[static_cast<size_t>(r * width)], hidden + r * dim_, static_cast<size_t>(dim_) * sizeof(float));
    std::memcpy(&joined[static_cast<size_t>(r * width + dim_)], markov_embed + r * rank_,
                static_cast<size_t>(rank_) * sizeof(float));
  }
  fp32_linear(joined.data(), rows, confidence_proj_, out, ctx);
}

Status DSpark::check(const DSparkSegment* segments, int64_t num_segments) const {
  if (segments == nullptr || num_segments <= 0) return Status::Error("DSpark: no segments");
  const int needed_layers = first_layer_ + num_stages();
  for (int64_t i = 0; i < num_segments; ++i) {
    const DSparkSegment& seg = segments[i];
    const std::string where = "DSpark: segment " + std::to_string(i);
    if (seg.state == nullptr) return Status::Error(where + " has no sequence state");
    if (seg.state->num_layers() < needed_layers) {
      return Status::Error(where + ": the sequence state has " + std::to_string(seg.state->num_layers()) +
                           " layers, the DSpark stages need " + std::to_string(needed_layers));
    }
    if (seg.num_context < 0 || seg.first_position < 0) {
      return Status::Error(where + ": bad rows (first_position " + std::to_string(seg.first_position) +
                           ", num_context " + std::to_string(seg.num_context) + ")");
    }
    if (seg.num_context > 0 && seg.main_hidden == nullptr) return Status::Error(where + ": no main_hidden rows");
    if (!seg.draft && seg.num_context == 0) return Status::Error(where + ": nothing to do (no rows, no draft)");
    if (seg.draft) {
      if (seg.first_position + seg.num_context <= 0) {
        return Status::Error(where + ": a draft needs at least one context position before it");
      }
      if (seg.next_token < 0 || seg.next_token >= vocab_) {
        return Status::Error(where + ": next_token " + std::to_string(seg.next_token) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
      }
    }
    for (int64_t j = 0; j < i; ++j) {
      if (segments[j].state == seg.state) return Status::Error(where + ": its sequence appears twice in the call");
    }
  }
  return Status::Ok();
}

Status DSpark::forward(const DSparkSegment* segments, int64_t num_segments, const ComputeContext& ctx,
                       DSparkOutput* out, const DraftSampler& sampler) const {
  if (out == nullptr || ctx.backend == nullptr) return Status::Error("DSpark: bad arguments");
  Status status = check(segments, num_segments);
  if (!status.ok()) return status;
  const HcShape& shape = main_->hc_shape();
  const int hc = shape.hc;
  const int64_t dim = dim_, B = block_;

  // Context rows: main_x of every appended row, written into every stage's ring (model.py DSparkAttention's
  // main_kv; the prefill call and each decode step).
  std::vector<DSparkAttentionSegment> context;
  int64_t context_rows = 0;
  for (int64_t i = 0; i < num_segments; ++i) {
    if (segments[i].num_context == 0) continue;
    context.push_back({segments[i].state, segments[i].first_position, segments[i].num_context});
    context_rows += segments[i].num_context;
  }
  if (context_rows > 0) {
    std::vector<float> hidden(static_cast<size_t>(context_rows * hidden_width_));
    for (int64_t i = 0, row = 0; i < num_segments; ++i) {
      const int64_t n = segments[i].num_context;
      if (n == 0) continue;
      std::memcpy(&hidden[static_cast<size_t>(row * hidden_width_)], segments[i].main_hidden,
                  static_cast<size_t>(n * hidden_width_) * sizeof(float));
      row += n;
    }
    std::vector<float> main_x(static_cast<size_t>(context_rows * dim));
    project_main_hidden(hidden.data(), context_rows, ctx, main_x.data());
    for (const BlockWeights& stage : stages_) {
      status = stage.attention->dspark_write_context(main_x.data(), context.data(),
                                                     static_cast<int64_t>(context.size()), ctx);
      if (!status.ok()) return status;
    }
  }

  out->block = block_;
  out->drafts.clear();
  out->output_ids.clear();
  out->logits.clear();
  out->confidence.clear();
  std::vector<DSparkAttentionSegment> blocks;
  for (int64_t i = 0; i < num_segments; ++i) {
    if (!segments[i].draft) continue;
    const int64_t e = segments[i].first_position + segments[i].num_context;
    blocks.push_back({segments[i].state, e, B});
    out->drafts.push_back({i, e});
  }
  const int64_t drafts = static_cast<int64_t>(blocks.size());
  if (drafts == 0) return Status::Ok();
  const int64_t n = drafts * B;

  // Block ids [next_token, noise...] embedded with the main embedding into hc identical streams, pre one-hot.
  BlockStreams s;
  s.h.resize(static_cast<size_t>(n * hc * dim));
  s.pre_mix.assign(static_cast<size_t>(n * hc), 0.0f);
  out->output_ids.assign(static_cast<size_t>(drafts * (B + 1)), 0);
  for (int64_t d = 0; d < drafts; ++d) {
    const int32_t next = segments[out->drafts[static_cast<size_t>(d)].segment].next_token;
    out->output_ids[static_cast<size_t>(d * (B + 1))] = next;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t r = d * B + i;
      const int32_t id = i == 0 ? next : noise_token_;
      const uint16_t* row = main_->embed().data + static_cast<int64_t>(id) * dim;
      for (int j = 0; j < hc; ++j) {
        float* dst = &s.h[static_cast<size_t>((r * hc + j) * dim)];
        for (int64_t c = 0; c < dim; ++c) dst[c] = bf16_to_f32(row[c]);
      }
      s.pre_mix[static_cast<size_t>(r * hc)] = 1.0f;
    }
  }

  // The stages as Blocks (model.py Block.forward; Single-Pass mHC as in model/forward.cpp).
  s.resize(n, hc, dim);
  for (const BlockWeights& stage : stages_) {
    const std::string where = "DSpark stage " + std::to_string(stage.layer - first_layer_);
    ctx.backend->hc_mixes(s.h.data(), n, stage.hc_attn, shape, s.a_pre.data(), s.a_post.data(), s.a_comb.data(),
                          ctx.pool);
    ctx.backend->hc_pre(s.h.data(), n, hc, dim, s.pre_mix.data(), s.x.data(), ctx.pool);
    ctx.backend->rmsnorm_bf16(s.x.data(), n, dim, stage.attn_norm, shape.norm_eps, s.x.data(), ctx.pool);
    status = stage.attention->dspark_attend_block(s.x.data(), blocks.data(), drafts, ctx, s.y.data());
    if (!status.ok()) return status.with_context(where);
    ctx.backend->hc_post(s.y.data(), s.h.data(), n, hc, dim, s.a_post.data(), s.a_comb.data(), s.mid.data(),
                         ctx.pool);
    ctx.backend->hc_mixes(s.mid.data(), n, stage.hc_ffn, shape, s.f_pre.data(), s.f_post.data(), s.f_comb.data(),
                          ctx.pool);
    ctx.backend->hc_pre(s.mid.data(), n, hc, dim, s.a_pre.data(), s.x.data(), ctx.pool);
    ctx.backend->rmsnorm_bf16(s.x.data(), n, dim, stage.ffn_norm, shape.norm_eps, s.x.data(), ctx.pool);
    stage.moe->forward(s.x.data(), n, ctx, s.y.data());
    ctx.backend->hc_post(s.y.data(), s.mid.data(), n, hc, dim, s.f_post.data(), s.f_comb.data(), s.h.data(),
                         ctx.pool);
    std::copy(s.f_pre.begin(), s.f_pre.begin() + n * hc, s.pre_mix.begin());
  }

  // Head (model.py DSparkBlock.forward_head): x = hc_pre(streams, pre) bf16; logits = head(norm(x)) fp32.
  std::vector<float> x(static_cast<size_t>(n * dim)), normed(static_cast<size_t>(n * dim));
  ctx.backend->hc_pre(s.h.data(), n, hc, dim, s.pre_mix.data(), x.data(), ctx.pool);
  ctx.backend->rmsnorm_bf16(x.data(), n, dim, norm_, shape.norm_eps, normed.data(), ctx.pool);
  out->logits.assign(static_cast<size_t>(n * vocab_), 0.0f);
  fp32_linear(normed.data(), n, main_->head(), out->logits.data(), ctx);

  // Markov chain over the block: position i's bias comes from ids[i] (the previous pick), then ids[i+1] is picked.
  std::vector<float> markov_embeds(static_cast<size_t>(n * rank_));  // [drafts, B, rank]
  std::vector<int32_t> tokens(static_cast<size_t>(drafts));
  std::vector<float> embed(static_cast<size_t>(drafts * rank_)), bias(static_cast<size_t>(drafts * vocab_));
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t d = 0; d < drafts; ++d) tokens[static_cast<size_t>(d)] = out->output_ids[static_cast<size_t>(d * (B + 1) + i)];
    markov_bias(tokens.data(), drafts, ctx, embed.data(), bias.data());
    for (int64_t d = 0; d < drafts; ++d) {
      float* row = &out->logits[static_cast<size_t>((d * B + i) * vocab_)];
      const float* b = &bias[static_cast<size_t>(d * vocab_)];
      for (int64_t v = 0; v < vocab_; ++v) row[v] += b[v];
      std::memcpy(&markov_embeds[static_cast<size_t>((d * B + i) * rank_)], &embed[static_cast<size_t>(d * rank_)],
                  static_cast<size_t>(rank_) * sizeof(float));
      const int32_t pick = sampler ? sampler(row, vocab_, d, static_cast<int>(i)) : argmax_first(row, vocab_);
      if (pick < 0 || pick >= vocab_) {
        return Status::Error("DSpark: the draft sampler returned " + std::to_string(pick) +
                             ", outside the vocabulary [0, " + std::to_string(vocab_) + ")");
      }
      out->output_ids[static_cast<size_t>(d * (B + 1) + i + 1)] = pick;
    }
  }
  out->confidence.assign(static_cast<size_t>(n), 0.0f);
  confidence(x.data(), markov_embeds.data(), n, ctx, out->confidence.data());
  return Status::Ok();
}

}  // namespace dsflash
