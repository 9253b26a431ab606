// Attention of one layer (spec/MODEL.md §4.3-§4.6), following model.py's Attention, Compressor and Indexer
// step by step; the rounding points are those of the reference (bf16 tensors between ops, fp32 inside).
#include "model/attention.h"
#include "model/linear_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/index_score.h"
#include "kernels/rmsnorm.h"
#include "kernels/sparse_attention.h"
#include "kernels/torch_exp.h"
#include "model/csa2.h"

namespace dsflash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr int64_t kQueryTile = 32;   // queries per tile (bounds the per-call buffers on long prefills)
constexpr int64_t kKeyBlock = 256;   // indexer keys per kernel call, at least (the call prepares q once per call)

// BF16 (or fp32-promoted) linear: fp32 sums; rounded to bf16 when the reference's output tensor is bf16.
void bf16_linear(const float* x, int64_t rows, const Bf16Weight& w, float* y, const ComputeContext& ctx,
                 bool round_output) {
  ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
  ctx.backend->bf16_gemm(x, rows, w, y, ctx.pool);
  if (round_output) round_to_bf16_inplace(y, rows * w.out);
}

constexpr int64_t kGatherGrain = 16;  // rows per range of a parallel row gather (dequantisation)

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Looks tensors up and checks dtype and shape; the first error is kept.
class Binder {
 public:
  Binder(const AttentionLayer::TensorLookup& find, const std::string& origin) : find_(find), origin_(origin) {}

  const TensorView* get(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    if (!status_.ok()) return nullptr;
    const TensorView* t = find_(name);
    if (t == nullptr) {
      status_ = Status::Error(origin_ + ": missing tensor " + name);
      return nullptr;
    }
    if (t->dtype != dtype || t->shape != shape) {
      status_ = Status::Error(origin_ + ": tensor " + name + " is " + dtype_name(t->dtype) + " " +
                              shape_text(t->shape) + ", expected " + dtype_name(dtype) + " " + shape_text(shape));
      return nullptr;
    }
    return t;
  }
  Fp8Weight fp8(const std::string& prefix, int64_t out, int64_t in) {
    const TensorView* w = get(prefix + ".weight", DType::kF8_E4M3, {out, in});
    const TensorView* s = get(prefix + ".scale", DType::kF8_E8M0, {(out + 31) / 32, (in + 31) / 32});
    if (w == nullptr || s == nullptr) return {};
    return Fp8Weight{w->data, s->data, out, in};
  }
  Bf16Weight bf16(const std::string& name, int64_t out, int64_t in) {
    const TensorView* w = get(name, DType::kBF16, {out, in});
    return w == nullptr ? Bf16Weight{} : Bf16Weight{w->as<uint16_t>(), out, in};
  }
  const uint16_t* bf16_vector(const std::string& name, int64_t n) {
    const TensorView* w = get(name, DType::kBF16, {n});
    return w == nullptr ? nullptr : w->as<uint16_t>();
  }
  const Status& status() const { return status_; }

 private:
  const AttentionLayer::TensorLookup& find_;
  const std::string& origin_;
  Status status_;
};

bool contains(const std::vector<int>& list, int value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// The latest entry of `sources` at or before `layer` (model.py's shared_attn: the most recent writer), or -1.
int latest_source(const std::vector<int>& sources, int layer) {
  int latest = -1;
  for (int s : sources) {
    if (s <= layer) latest = std::max(latest, s);
  }
  return latest;
}

// Indexer scores of a tile of tile_n queries (q [tile_n, heads, dim], weights [tile_n, heads]) against `count` stored
// key rows of `source`: key c is the source's entry columns[c] (columns nullptr: entry c); scores[t * stride + c].
// Blocks of keys split over the pool: kKeyBlock keys, or more (up to 16x, in steps of 16) on long rows so the
// kernel's per-call preparation of q is spread over more keys while every thread still gets >= 4 blocks. Keys are
// scored independently, so the blocking never changes a score.
void score_key_rows(const CompressedKv& source, const int32_t* columns, int64_t count, const float* q,
                    const float* weights, int64_t tile_n, int heads, int64_t dim, float* scores, int64_t stride,
                    const ComputeContext& ctx) {
  const int64_t threads = ctx.pool != nullptr ? ctx.pool->num_threads() : 1;
  const int64_t key_block = std::clamp<int64_t>((count / (4 * threads) + 15) / 16 * 16, kKeyBlock, 16 * kKeyBlock);
  auto score_blocks = [&](int64_t kb_begin, int64_t kb_end, int thread) {
    ThreadScratch scratch(ctx.pool, thread);
    const std::span<const uint8_t*> key_rows = scratch.take<const uint8_t*>(static_cast<size_t>(key_block));
    for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
      const int64_t c0 = kb * key_block, c1 = std::min(count, c0 + key_block);
      for (int64_t c = c0; c < c1; ++c) {
        key_rows[static_cast<size_t>(c - c0)] = source.index_key_row(columns != nullptr ? columns[c] : c);
      }
      IndexScoreRowsArgs args;
      args.q = q;
      args.weights = weights;
      args.key_rows = key_rows.data();
      args.scores = scores + c0;
      args.num_queries = tile_n;
      args.num_keys = c1 - c0;
      args.score_stride = stride;
      args.heads = heads;
      args.dim = dim;
      args.scratch = &scratch.arena();
      ctx.backend->index_scores_rows(args);
    }
  };
  const int64_t key_blocks = (count + key_block - 1) / key_block;
  if (ctx.pool != nullptr && key_blocks > 1) {
    ctx.pool->parallel_for(key_blocks, score_blocks);
  } else {
    score_blocks(0, key_blocks, 0);
  }
}

// The entries j < width in the candidate pool of some query of a tile (masks [tile_n, width] bytes, nonzero =
// pooled), ascending, into columns [width]; returns their count. 64 entries at a time, OR-ed over the tile, so the
// mostly empty pools of a long context cost one pass over their bytes.
int64_t pooled_columns(const uint8_t* masks, int64_t tile_n, int64_t width, int32_t* columns) {
  constexpr int64_t kSpan = 64;
  int64_t count = 0;
  for (int64_t j0 = 0; j0 < width; j0 += kSpan) {
    const int64_t n = std::min(kSpan, width - j0);
    uint8_t any[kSpan] = {};
    for (int64_t t = 0; t < tile_n; ++t) {
      const uint8_t* mask = masks + t * width + j0;
      for (int64_t j = 0; j < n; ++j) any[j] |= mask[j];
    }
    uint64_t words[kSpan / 8];
    std::memcpy(words, any, sizeof(words));
    uint64_t seen = 0;
    for (uint64_t w : words) seen |= w;
    if (seen == 0) continue;
    for (int64_t j = 0; j < n; ++j) {
      if (any[j] != 0) columns[count++] = static_cast<int32_t>(j0 + j);
    }
  }
  return count;
}

// out [blocks]: the maximum of each block of `block` scores of row [width] (the last block ragged), from -inf with
// std::max (a NaN score never wins). Ranges of blocks split over the pool when it is given (each block's maximum is
// its own, so any split gives the same values).
void block_maxima(const float* row, int64_t width, int64_t block, int64_t blocks, float* out, ThreadPool* pool) {
  auto run = [&](int64_t b_begin, int64_t b_end, int) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t j0 = b * block, j1 = std::min(width, j0 + block);
      float m = kNegInf;
      for (int64_t j = j0; j < j1; ++j) m = std::max(m, row[j]);
      out[b] = m;
    }
  };
  constexpr int64_t kGrain = 4096;  // blocks per range: the pool's hand-off is worth it only on long rows
  if (pool != nullptr && blocks >= 2 * kGrain) {
    pool->parallel_for(blocks, run, kGrain);
  } else {
    run(0, blocks, 0);
  }
}

}  // namespace

AttentionLayer::~AttentionLayer() = default;

Result<std::unique_ptr<AttentionLayer>> AttentionLayer::bind(const Checkpoint& checkpoint, int layer) {
  return bind([&checkpoint](const std::string& name) { return checkpoint.find(name); }, checkpoint.dir(),
              checkpoint.config(), layer);
}

Result<std::unique_ptr<AttentionLayer>> AttentionLayer::bind(const TensorLookup& find, const std::string& origin,
                                                             const ModelConfig& config, int layer) {
  const std::string where = origin + ": attention layer " + std::to_string(layer);
  if (layer < 0 || layer >= config.total_layers() || static_cast<size_t>(layer) >= config.compress_ratios.size()) {
    return Status::Error(where + ": no such layer (model has " + std::to_string(config.total_layers()) + ")");
  }
  std::unique_ptr<AttentionLayer> a(new AttentionLayer());
  a->layer_ = layer;
  a->dim_ = config.dim;
  a->heads_ = config.n_heads;
  a->head_dim_ = config.head_dim;
  a->rope_dim_ = config.rope_head_dim;
  a->q_lora_ = config.q_lora_rank;
  a->groups_ = config.o_groups;
  a->o_lora_ = config.o_lora_rank;
  a->window_ = config.window_size;
  a->ratio_ = config.compress_ratios[static_cast<size_t>(layer)];
  a->index_heads_ = config.index_n_heads;
  a->index_head_dim_ = config.index_head_dim;
  a->index_topk_ = config.index_topk;
  a->candidate_blocks_ = config.candidate_topk_blocks;
  a->candidate_block_size_ = config.candidate_block_size;
  a->eps_ = static_cast<float>(config.norm_eps);

  if (a->heads_ <= 0 || a->groups_ <= 0 || a->heads_ % a->groups_ != 0) {
    return Status::Error(where + ": n_heads " + std::to_string(a->heads_) + " must be a positive multiple of o_groups " +
                         std::to_string(a->groups_));
  }
  if (a->head_dim_ % 32 != 0 || a->rope_dim_ <= 0 || a->rope_dim_ % 2 != 0 || a->rope_dim_ > a->head_dim_ ||
      a->dim_ % 32 != 0 || a->q_lora_ % 32 != 0 || a->window_ <= 0) {
    return Status::Error(where + ": unsupported shape (head_dim, dim, q_lora_rank must be multiples of 32, rope_head_dim "
                                 "even and <= head_dim, window_size > 0)");
  }

  const bool backbone = layer < config.n_layers;
  a->kv_source_ = backbone && contains(config.kv_source_layers, layer);
  a->index_source_ = backbone && contains(config.index_source_layers, layer);
  a->candidate_source_ = backbone && layer == config.candidate_source_layer;
  a->candidate_restricted_ = a->index_source_ && config.candidate_source_layer >= 0 &&
                             config.candidate_source_layer < layer;
  if (a->ratio_ > 0) {
    if (!backbone) return Status::Error(where + ": DSpark stages must have compress ratio 0");
    a->kv_source_layer_ = latest_source(config.kv_source_layers, layer);
    a->index_source_layer_ = latest_source(config.index_source_layers, layer);
    if (a->kv_source_layer_ < 0 || a->index_source_layer_ < 0) {
      return Status::Error(where + ": compress ratio " + std::to_string(a->ratio_) +
                           " but no KV source / index source at or before it");
    }
    if (config.compress_ratios[static_cast<size_t>(a->kv_source_layer_)] != a->ratio_ ||
        config.compress_ratios[static_cast<size_t>(a->index_source_layer_)] != a->ratio_) {
      return Status::Error(where + ": its KV source L" + std::to_string(a->kv_source_layer_) + " / index source L" +
                           std::to_string(a->index_source_layer_) + " has another compress ratio");
    }
    if (a->index_head_dim_ % 32 != 0 || a->index_head_dim_ < a->rope_dim_ || a->index_heads_ <= 0 ||
        a->index_topk_ <= 0) {
      return Status::Error(where + ": unsupported indexer shape (index_head_dim multiple of 32 and >= rope_head_dim)");
    }
    if (a->candidate_source_ && (a->candidate_blocks_ <= 0 || a->candidate_block_size_ <= 0)) {
      return Status::Error(where + ": candidate source needs candidate_topk_blocks and candidate_block_size > 0");
    }
  }
  a->rope_ = Rope::for_layer(config, layer);

  const std::string prefix =
      backbone ? "layers." + std::to_string(layer) + ".attn" : "mtp." + std::to_string(layer - config.n_layers) + ".attn";
  Binder b(find, origin);
  const int64_t hd = a->heads_ * a->head_dim_;
  a->wq_a_ = b.fp8(prefix + ".wq_a", a->q_lora_, a->dim_);
  a->q_norm_ = b.bf16_vector(prefix + ".q_norm.weight", a->q_lora_);
  a->wq_b_ = b.fp8(prefix + ".wq_b", hd, a->q_lora_);
  a->wkv_ = b.fp8(prefix + ".wkv", a->head_dim_, a->dim_);
  a->kv_norm_ = b.bf16_vector(prefix + ".kv_norm.weight", a->head_dim_);
  a->wo_a_ = b.fp8(prefix + ".wo_a", a->groups_ * a->o_lora_, hd / a->groups_);
  a->wo_b_ = b.fp8(prefix + ".wo_b", a->dim_, a->groups_ * a->o_lora_);
  if (const TensorView* sink = b.get(prefix + ".attn_sink", DType::kF32, {a->heads_})) {
    a->sink_.resize(static_cast<size_t>(a->heads_));
    std::memcpy(a->sink_.data(), sink->data, a->sink_.size() * sizeof(float));
  }
  if (a->kv_source_) {
    a->compressor_wkv_ = b.bf16(prefix + ".compressor.wkv.weight", a->head_dim_, a->dim_);
    if (a->ratio_ > 1) a->compressor_wgate_ = b.bf16(prefix + ".compressor.wgate.weight", a->head_dim_, a->dim_);
    a->compressor_norm_ = b.bf16_vector(prefix + ".compressor.norm.weight", a->head_dim_);
    a->index_wk_ = b.bf16(prefix + ".indexer.wk.weight", a->index_head_dim_, a->head_dim_);
    a->index_k_norm_ = b.bf16_vector(prefix + ".indexer.k_norm.weight", a->index_head_dim_);
  }
  if (a->index_source_) {
    a->index_wq_b_ = b.fp8(prefix + ".indexer.wq_b", a->index_heads_ * a->index_head_dim_, a->q_lora_);
    a->index_weights_proj_ = b.bf16(prefix + ".indexer.weights_proj.weight", a->index_heads_, a->dim_);
  }
  if (!b.status().ok()) return b.status().with_context("attention layer " + std::to_string(layer));

  // Each group's wo_a rows are a weight of their own (project_output): they must start on a 32-row scale block
  // and span whole 32-K blocks.
  if (Status s = check_fp8_as_bf16_grouped_linear(hd, a->groups_, a->wo_a_); !s.ok())
    return s.with_context("attention layer " + std::to_string(layer) + ": " + prefix + ".wo_a");
  return a;
}

int64_t AttentionLayer::copy_wo_a_to_bf16(const Checkpoint& checkpoint) {
  if (!wo_a_bf16_.empty()) return 0;
  wo_a_bf16_.resize(static_cast<size_t>(wo_a_.out * wo_a_.in));
  const int64_t scale_cols = wo_a_.in / 32;
  for (int64_t o = 0; o < wo_a_.out; ++o) {
    for (int64_t b = 0; b < scale_cols; ++b) {
      uint8_t gathered[32];
      const uint8_t* codes = fp8_block_codes(wo_a_, o, b, gathered);
      const float scale = e8m0_to_f32(wo_a_.scales[(o / 32) * scale_cols + b]);
      for (int j = 0; j < 32; ++j)
        wo_a_bf16_[static_cast<size_t>(o * wo_a_.in + 32 * b + j)] = f32_to_bf16(e4m3_to_f32(codes[j]) * scale);
    }
  }
  checkpoint.release(wo_a_.codes, static_cast<size_t>(wo_a_.out * wo_a_.in));
  const int64_t fp8_bytes = wo_a_.out * wo_a_.in + (wo_a_.out / 32) * scale_cols;
  return 2 * wo_a_.out * wo_a_.in - fp8_bytes;
}

// Compressor (spec §4.4; model.py Compressor.forward): the latents (normalised, bf16 values, before RoPE and FP4)
// of the groups completed in this call, and their group indices.
void AttentionLayer::project_compressor(const float* x, int64_t rows, const ComputeContext& ctx, float* kv,
                                        float* score) const {
  if (ratio_ == 1) {
    bf16_linear(x, rows, compressor_wkv_, kv, ctx, true);  // the bf16 weight with a bf16 output
    return;
  }
  // kv, score = wkv(x.float()), wgate(x.float()): fp32 weights, fp32 outputs (no rounding).
  bf16_linear(x, rows, compressor_wkv_, kv, ctx, false);
  bf16_linear(x, rows, compressor_wgate_, score, ctx, false);
}

Status AttentionLayer::run_compressor(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                                      SequenceState& state, const ComputeContext& ctx, std::span<float>* latents,
                                      std::span<int64_t>* groups) {
  const int64_t d = head_dim_;
  Arena& frame = ctx.workspace->frame();  // the caller's scope holds latents and groups
  // Groups completed in [start_pos, end_pos): those whose last position p has (p + 1) % ratio == 0.
  const int64_t end_pos = start_pos + num_tokens;
  const int64_t completed = end_pos / ratio_ - start_pos / ratio_;
  *latents = frame.take<float>(static_cast<size_t>(completed * d));  // [completed, head_dim]
  *groups = frame.take<int64_t>(static_cast<size_t>(completed));
  if (ratio_ == 1) {
    // One token per group: latent = norm(wkv(x)).
    ctx.backend->rmsnorm_bf16(kv, num_tokens, d, compressor_norm_, eps_, latents->data(), ctx.pool);
    for (int64_t t = 0; t < num_tokens; ++t) (*groups)[static_cast<size_t>(t)] = start_pos + t;
    return Status::Ok();
  }
  CompressorTail* tail = state.tail(layer_);
  if (tail == nullptr || tail->ratio != ratio_ || tail->head_dim != d) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": the state has no ratio-" +
                         std::to_string(ratio_) + " compressor tail for this layer");
  }
  ArenaScope scope(frame);  // latents and groups were taken before: they outlive this scope
  const std::span<const float*> slot_kv = frame.take<const float*>(static_cast<size_t>(ratio_));
  const std::span<const float*> slot_score = frame.take<const float*>(static_cast<size_t>(ratio_));
  const std::span<float> e = frame.take<float>(static_cast<size_t>(ratio_));
  int64_t emitted = 0;
  for (int64_t p = start_pos; p < end_pos; ++p) {
    if ((p + 1) % ratio_ != 0) continue;
    const int64_t group = p / ratio_;
    for (int i = 0; i < ratio_; ++i) {
      const int64_t pos = group * ratio_ + i;
      const bool fresh = pos >= start_pos;
      slot_kv[static_cast<size_t>(i)] = fresh ? &kv[static_cast<size_t>((pos - start_pos) * d)] : &tail->kv[static_cast<size_t>(i * d)];
      slot_score[static_cast<size_t>(i)] =
          fresh ? &score[static_cast<size_t>((pos - start_pos) * d)] : &tail->score[static_cast<size_t>(i * d)];
    }
    for (int64_t c = 0; c < d; ++c) {
      // softmax over the group per channel (torch CPU, non-last dim, vectorised along the channels: SLEEF exp):
      // max, exp(s - max), sum from 0, e / sum; then (kv * w).sum(dim) from 0 in slot order.
      float m = slot_score[0][c];
      for (int i = 1; i < ratio_; ++i) m = std::max(m, slot_score[static_cast<size_t>(i)][c]);
      float sum = 0.0f;
      for (int i = 0; i < ratio_; ++i) {
        e[static_cast<size_t>(i)] = sleef_expf_u10(slot_score[static_cast<size_t>(i)][c] - m);
        sum += e[static_cast<size_t>(i)];
      }
      float acc = 0.0f;
      for (int i = 0; i < ratio_; ++i) {
        const float w = e[static_cast<size_t>(i)] / sum;
        const float product = slot_kv[static_cast<size_t>(i)][c] * w;
        acc += product;
      }
      (*latents)[static_cast<size_t>(emitted * d + c)] = round_to_bf16(acc);  // kv.to(bf16) before the norm
    }
    (*groups)[static_cast<size_t>(emitted++)] = group;
  }
  // The pending part: model.py's prefill (start_pos 0) stores only the trailing partial group; a step after
  // prefill stores its token whether or not the group completes.
  const int64_t first_stored = start_pos == 0 ? end_pos - end_pos % ratio_ : start_pos;
  for (int64_t p = first_stored; p < end_pos; ++p) {
    tail->store(p, &kv[static_cast<size_t>((p - start_pos) * d)], &score[static_cast<size_t>((p - start_pos) * d)]);
  }
  if (emitted > 0) {
    ctx.backend->rmsnorm_bf16(latents->data(), emitted, d, compressor_norm_, eps_, latents->data(), ctx.pool);
  }
  return Status::Ok();
}

// Indexer keys and main KV entries of the emitted groups (model.py Indexer keys, then Attention._compress_kv):
//   key = MXFP4(rope(k_norm(wk(latent)))), kv = FP4-e4m3(rope(latent)), RoPE at the group's first position.
Status AttentionLayer::store_entries(std::span<const float> latents, std::span<const int64_t> groups,
                                     SequenceState& state, const ComputeContext& ctx) {
  CompressedKv* kv = state.compressed(layer_);
  if (kv == nullptr) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": the state has no compressed KV for this layer");
  }
  const int64_t n = static_cast<int64_t>(groups.size());
  if (n == 0) return Status::Ok();
  const int64_t d = head_dim_, id = index_head_dim_;
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const std::span<float> keys = frame.take<float>(static_cast<size_t>(n * id));  // [n, index_head_dim]
  bf16_linear(latents.data(), n, index_wk_, keys.data(), ctx, true);
  ctx.backend->rmsnorm_bf16(keys.data(), n, id, index_k_norm_, eps_, keys.data(), ctx.pool);
  const std::span<float> row = frame.take<float>(static_cast<size_t>(d));
  const std::span<uint8_t> kv_packed = frame.take<uint8_t>(static_cast<size_t>(d / 2));   // e2m1 pairs
  const std::span<uint8_t> kv_scales = frame.take<uint8_t>(static_cast<size_t>(d / 16));  // e4m3 per 16
  const std::span<uint8_t> key_packed = frame.take<uint8_t>(static_cast<size_t>(id / 2));
  const std::span<uint8_t> key_scales = frame.take<uint8_t>(static_cast<size_t>(id / 32));
  for (int64_t i = 0; i < n; ++i) {
    if (groups[static_cast<size_t>(i)] != kv->num_entries()) {
      return Status::Error("attention layer " + std::to_string(layer_) + ": compressed KV holds " +
                           std::to_string(kv->num_entries()) + " entries, cannot append group " +
                           std::to_string(groups[static_cast<size_t>(i)]) + " (state out of step with start_pos)");
    }
    const int64_t position = groups[static_cast<size_t>(i)] * ratio_;
    float* key = &keys[static_cast<size_t>(i * id)];
    rope_.rotate(*ctx.backend, key + id - rope_dim_, position);
    fp4_quant_ue8m0_block32(key, id, key_packed.data(), key_scales.data());
    std::memcpy(row.data(), &latents[static_cast<size_t>(i * d)], static_cast<size_t>(d) * sizeof(float));
    rope_.rotate(*ctx.backend, row.data() + d - rope_dim_, position);
    fp4_quant_e4m3_block16(row.data(), d, kv_packed.data(), kv_scales.data());
    const Status appended = kv->append(kv_packed.data(), kv_scales.data(), key_packed.data(), key_scales.data());
    if (!appended.ok()) return appended.with_context("attention layer " + std::to_string(layer_));
  }
  return Status::Ok();
}

// Indexer queries and top-k (spec §4.5; model.py Indexer.forward after the key update and
// select_candidate_blocks). Publishes the top-k (and on the candidate source the pool) into `shared`.
void AttentionLayer::project_index_queries(const float* x, const float* qr, int64_t rows, const float* cos,
                                           const float* sin, const ComputeContext& ctx, float* index_q,
                                           float* index_weights) const {
  const int ih = index_heads_;
  const int64_t id = index_head_dim_;
  const size_t half = static_cast<size_t>(rope_dim_ / 2);
  fp8_linear_bf16(qr, rows, index_wq_b_, index_q, ctx);
  for (int64_t t = 0; t < rows; ++t) {
    rope_.rotate(*ctx.backend, &index_q[t * ih * id + id - rope_dim_], ih, id, &cos[t * half], &sin[t * half]);
  }
  fake_quant_fp4_ue8m0_block32(index_q, rows * ih * id);
  bf16_linear(x, rows, index_weights_proj_, index_weights, ctx, true);
  const float weight_scale =
      static_cast<float>(std::pow(static_cast<double>(id), -0.5) * std::pow(static_cast<double>(ih), -0.5));
  for (int64_t i = 0; i < rows * ih; ++i) index_weights[i] = round_to_bf16(index_weights[i] * weight_scale);
}

Status AttentionLayer::run_indexer(const float* index_q, const float* index_weights, int64_t num_tokens,
                                   int64_t start_pos, const SequenceState& state, Csa2Shared& shared,
                                   const ComputeContext& ctx, AttentionTrace* trace) {
  ProfileScope profile_scope(ctx.profile, ProfilePhase::kIndexer);  // its projections charge kLinear
  const int64_t end_pos = start_pos + num_tokens;
  const int64_t width = end_pos / ratio_;  // compressed positions of the call's last query
  const int ih = index_heads_;
  const int64_t id = index_head_dim_;
  const CompressedKv* source = state.compressed(kv_source_layer_);
  if (source == nullptr || source->num_entries() < width) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": KV source L" +
                         std::to_string(kv_source_layer_) + " holds " +
                         std::to_string(source ? source->num_entries() : 0) + " entries, the indexer needs " +
                         std::to_string(width));
  }
  if (candidate_restricted_ && (shared.candidate_layer < 0 || shared.candidate_width != width ||
                                static_cast<int64_t>(shared.candidates.size()) != num_tokens * width)) {
    return Status::Error("attention layer " + std::to_string(layer_) +
                         ": Reindex layer needs the candidate pool of this call (run the candidate source first)");
  }
  Arena& frame = ctx.workspace->frame();
  ArenaScope frame_scope(frame);

  const int64_t k = std::min<int64_t>(index_topk_, width);
  const int64_t blocks = candidate_source_ ? (width + candidate_block_size_ - 1) / candidate_block_size_ : 0;
  // Published through `shared` (step memory): [tokens, k] and, on the candidate source, the pool [tokens, width].
  const std::span<int32_t> topk = shared.new_topk(static_cast<size_t>(num_tokens * k));
  std::span<uint8_t> pool_mask;
  if (candidate_source_) {
    pool_mask = shared.new_candidates(static_cast<size_t>(num_tokens * width));
    std::fill(pool_mask.begin(), pool_mask.end(), uint8_t{0});
  }
  if (trace != nullptr) {
    trace->index_width = width;
    trace->index_scores.assign(static_cast<size_t>(num_tokens * width), 0.0f);
    trace->topk_width = k;
    if (candidate_source_) {
      trace->candidate_blocks = blocks;
      trace->candidate_block_scores.assign(static_cast<size_t>(num_tokens * blocks), 0.0f);
    }
  }
  const std::span<float> scores =
      frame.take<float>(static_cast<size_t>(std::min(kQueryTile, num_tokens) * width));  // [tile, width]
  for (int64_t tile = 0; tile < num_tokens; tile += kQueryTile) {
    const int64_t tile_n = std::min(kQueryTile, num_tokens - tile);
    const float* tile_q = &index_q[tile * ih * id];
    const float* tile_w = &index_weights[tile * ih];
    // score[t][j] = bf16( Σ_h bf16( relu(bf16(q_h · k_j)) * w_h ) ), the head sum in torch's cascade order
    // (kernels/index_score.h); threads split the key blocks.
    if (candidate_restricted_) {
      // Reindex: only keys in the query's candidate pool can rank (the rest are -inf), so only the tile's pooled
      // columns are scored (gathered, same kernel, same bits) and each query's own pool is scattered into its row.
      ArenaScope columns_scope(frame);
      const uint8_t* masks = &shared.candidates[static_cast<size_t>(tile * width)];  // [tile_n, width]
      const std::span<int32_t> columns = frame.take<int32_t>(static_cast<size_t>(width));  // pooled j, ascending
      const int64_t num_columns = pooled_columns(masks, tile_n, width, columns.data());
      const std::span<float> pooled_scores =
          frame.take<float>(static_cast<size_t>(std::max<int64_t>(1, tile_n * num_columns)));  // [tile, columns]
      score_key_rows(*source, columns.data(), num_columns, tile_q, tile_w, tile_n, ih, id, pooled_scores.data(),
                     num_columns, ctx);
      for (int64_t t = 0; t < tile_n; ++t) {
        float* row = &scores[static_cast<size_t>(t * width)];
        const uint8_t* mask = masks + t * width;
        std::fill(row, row + width, kNegInf);
        for (int64_t c = 0; c < num_columns; ++c) {
          const int32_t j = columns[static_cast<size_t>(c)];
          if (mask[j] != 0) row[j] = pooled_scores[static_cast<size_t>(t * num_columns + c)];
        }
      }
    } else {
      score_key_rows(*source, nullptr, width, tile_q, tile_w, tile_n, ih, id, scores.data(), width, ctx);
    }
    // Per query: visibility, candidate pool (source), top-k. With fewer queries than threads (batch-1 decode) the
    // queries run one after another and each splits its long rows over the pool instead: block maxima by ranges,
    // the top-k by chunks (the same values and indices for any thread count).
    const bool split_rows = ctx.pool != nullptr && tile_n < ctx.pool->num_threads();
    ThreadPool* row_pool = split_rows ? ctx.pool : nullptr;
    auto select = [&](int64_t t_begin, int64_t t_end, int thread) {
      ThreadScratch scratch(ctx.pool, thread);
      const std::span<float> block_scores = scratch.take<float>(static_cast<size_t>(blocks));
      const std::span<int32_t> chosen = scratch.take<int32_t>(
          static_cast<size_t>(std::max<int64_t>(k, std::min<int64_t>(candidate_blocks_, blocks))));
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t query = tile + t;
        float* row = &scores[static_cast<size_t>(t * width)];
        const int64_t visible = (start_pos + query + 1) / ratio_;
        for (int64_t j = visible; j < width; ++j) row[j] = kNegInf;
        if (candidate_source_) {
          block_maxima(row, width, candidate_block_size_, blocks, block_scores.data(), row_pool);
          // the block holding the newest visible position is pinned in (python floor division: none if visible == 0)
          if (visible > 0) block_scores[static_cast<size_t>((visible - 1) / candidate_block_size_)] = kPosInf;
          const int64_t kb = std::min<int64_t>(candidate_blocks_, blocks);
          ctx.backend->topk_select(block_scores.data(), blocks, kb, chosen.data(), row_pool, &scratch.arena());
          uint8_t* mask = &pool_mask[static_cast<size_t>(query * width)];
          for (int64_t i = 0; i < kb; ++i) {
            const int64_t bi = chosen[static_cast<size_t>(i)];
            if (!(block_scores[static_cast<size_t>(bi)] > kNegInf)) continue;
            const int64_t j0 = bi * candidate_block_size_, j1 = std::min(width, j0 + candidate_block_size_);
            for (int64_t j = j0; j < j1; ++j) mask[j] = 1;
          }
          if (trace != nullptr) {
            std::copy(block_scores.begin(), block_scores.end(),
                      trace->candidate_block_scores.begin() + query * blocks);
          }
        }
        if (trace != nullptr) std::copy(row, row + width, trace->index_scores.begin() + query * width);
        int32_t* out = &topk[static_cast<size_t>(query * k)];
        ctx.backend->topk_select(row, width, k, out, row_pool, &scratch.arena());
        std::sort(out, out + k);
        for (int64_t i = 0; i < k; ++i) {
          if (out[i] >= visible) out[i] = -1;
        }
      }
    };
    if (ctx.pool != nullptr && tile_n > 1 && !split_rows) {
      ctx.pool->parallel_for(tile_n, select);
    } else {
      select(0, tile_n, 0);
    }
  }
  shared.topk_layer = layer_;
  shared.topk_width = k;
  shared.topk = topk;
  if (candidate_source_) {
    shared.candidate_layer = layer_;
    shared.candidate_width = width;
    shared.candidates = pool_mask;
    if (trace != nullptr) trace->candidates.assign(pool_mask.begin(), pool_mask.end());
  }
  if (trace != nullptr) trace->index_topk.assign(topk.begin(), topk.end());
  return Status::Ok();
}

Result<int64_t> AttentionLayer::stored_rows(const SequenceState& state, int64_t start_pos, int64_t num_tokens) const {
  const CompressedKv* own = state.compressed(layer_);
  if (own == nullptr || own->num_entries() < start_pos / ratio_) {
    return Status::Error("compressed KV holds " + std::to_string(own ? own->num_entries() : -1) +
                         " entries at start_pos " + std::to_string(start_pos) + ", expected " +
                         std::to_string(start_pos / ratio_));
  }
  // A replayed cached prefix ends on a group boundary; its global KV is reused as it is.
  return std::clamp<int64_t>(own->num_entries() * ratio_ - start_pos, 0, num_tokens);
}

Status AttentionLayer::compress_rows(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                                     SequenceState& state, const ComputeContext& ctx, AttentionTrace* trace) {
  if (num_tokens == 0) return Status::Ok();
  ArenaScope scope(ctx.workspace->frame());
  std::span<float> latents;
  std::span<int64_t> groups;
  Status st = run_compressor(kv, score, num_tokens, start_pos, state, ctx, &latents, &groups);
  if (!st.ok()) return st;
  st = store_entries(latents, groups, state, ctx);
  if (!st.ok()) return st;
  if (trace != nullptr) {
    trace->compressor_latent.assign(latents.begin(), latents.end());
    trace->compressor_groups.assign(groups.begin(), groups.end());
  }
  return Status::Ok();
}

Status AttentionLayer::forward_global_kv(const float* x, int64_t num_tokens, int64_t start_pos, SequenceState& state,
                                         const ComputeContext& ctx, AttentionTrace* trace) {
  auto where = [this] { return "attention layer " + std::to_string(layer_) + " global-KV path"; };  // errors only
  if (!kv_source_) return Status::Error(where() + ": the layer is not a KV source");
  if (x == nullptr || num_tokens <= 0 || start_pos < 0) return Status::Error(where() + ": bad arguments");
  if (ctx.backend == nullptr) return Status::Error(where() + ": ComputeContext has no kernel backend");
  if (ctx.workspace == nullptr) {
    Workspace private_workspace;
    ComputeContext with_workspace = ctx;
    with_workspace.workspace = &private_workspace;
    return forward_global_kv(x, num_tokens, start_pos, state, with_workspace, trace);
  }
  if (trace != nullptr) trace->clear();
  auto skip = stored_rows(state, start_pos, num_tokens);
  if (!skip.ok()) return skip.status().with_context(where());
  const int64_t rows = num_tokens - *skip;
  if (rows == 0) return Status::Ok();
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const std::span<float> kv = frame.take<float>(static_cast<size_t>(rows * head_dim_));  // [rows, head_dim]
  const std::span<float> score = frame.take<float>(static_cast<size_t>(ratio_ > 1 ? rows * head_dim_ : 0));
  project_compressor(x + *skip * dim_, rows, ctx, kv.data(), score.data());
  Status st = compress_rows(kv.data(), score.data(), rows, start_pos + *skip, state, ctx, trace);
  if (!st.ok()) return st.with_context(where());
  return Status::Ok();
}

Status AttentionLayer::forward(const float* x, const AttentionSegment* segments, int64_t num_segments,
                               const ComputeContext& ctx, float* out) {
  auto where = [this] { return "attention layer " + std::to_string(layer_); };  // error paths only
  if (x == nullptr || out == nullptr || segments == nullptr || num_segments <= 0) {
    return Status::Error(where() + ": bad arguments (no rows or no segments)");
  }
  if (ctx.backend == nullptr) return Status::Error(where() + ": ComputeContext has no kernel backend");
  if (ctx.workspace == nullptr) {
    Workspace private_workspace;
    ComputeContext with_workspace = ctx;
    with_workspace.workspace = &private_workspace;
    return forward(x, segments, num_segments, with_workspace, out);
  }
  int64_t t_n = 0;  // rows of the call
  for (int64_t i = 0; i < num_segments; ++i) {
    const AttentionSegment& seg = segments[i];
    auto seg_where = [&] { return where() + ", segment " + std::to_string(i); };
    if (seg.state == nullptr || seg.shared == nullptr || seg.num_tokens <= 0 || seg.start_pos < 0) {
      return Status::Error(seg_where() + ": bad arguments (num_tokens " + std::to_string(seg.num_tokens) +
                           ", start_pos " + std::to_string(seg.start_pos) + ")");
    }
    const SequenceState& state = *seg.state;
    if (layer_ >= state.num_layers() || state.window(layer_).window() != window_ ||
        state.window(layer_).head_dim() != head_dim_) {
      return Status::Error(seg_where() + ": the attention state was not made for this model");
    }
    if (seg.shared->start_pos != seg.start_pos || seg.shared->num_tokens != seg.num_tokens) {
      return Status::Error(seg_where() + ": Csa2Shared was reset for positions [" +
                           std::to_string(seg.shared->start_pos) + ", +" + std::to_string(seg.shared->num_tokens) +
                           "), the call is [" + std::to_string(seg.start_pos) + ", +" +
                           std::to_string(seg.num_tokens) + ")");
    }
    for (int64_t j = 0; j < i; ++j) {
      if (segments[j].state == seg.state) return Status::Error(seg_where() + ": its sequence appears twice in the call");
    }
    if (seg.trace != nullptr) seg.trace->clear();
    t_n += seg.num_tokens;
  }
  const int64_t d = head_dim_, h_n = heads_, rd = rope_dim_;
  const size_t half = static_cast<size_t>(rd / 2);
  Arena& frame = ctx.workspace->frame();
  ArenaScope frame_scope(frame);
  // Per row: the RoPE angles of its absolute position [rows, rope_dim / 2].
  const std::span<float> cos_t = frame.take<float>(static_cast<size_t>(t_n) * half);
  const std::span<float> sin_t = frame.take<float>(static_cast<size_t>(t_n) * half);
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    for (int64_t t = 0; t < segments[i].num_tokens; ++t, ++row) {
      rope_.angles(segments[i].start_pos + t, &cos_t[row * half], &sin_t[row * half]);
    }
  }

  // q path: qr = q_norm(wq_a(x)) [rows, q_lora]; q = rope(wq_b(qr)) [rows, H, D].
  const std::span<float> qr = frame.take<float>(static_cast<size_t>(t_n * q_lora_));
  fp8_linear_bf16(x, t_n, wq_a_, qr.data(), ctx);
  ctx.backend->rmsnorm_bf16(qr.data(), t_n, q_lora_, q_norm_, eps_, qr.data(), ctx.pool);
  const std::span<float> q = frame.take<float>(static_cast<size_t>(t_n * h_n * d));
  fp8_linear_bf16(qr.data(), t_n, wq_b_, q.data(), ctx);
  for (int64_t t = 0; t < t_n; ++t) {
    rope_.rotate(*ctx.backend, &q[static_cast<size_t>(t * h_n * d + d - rd)], h_n, d, &cos_t[t * half], &sin_t[t * half]);
  }

  // The single latent K = V: kv = FP8(rope(kv_norm(wkv(x)))) [rows, D]; codes/scales are the window ring's bytes,
  // kv their dequantised values.
  const std::span<float> kv = frame.take<float>(static_cast<size_t>(t_n * d));
  fp8_linear_bf16(x, t_n, wkv_, kv.data(), ctx);
  ctx.backend->rmsnorm_bf16(kv.data(), t_n, d, kv_norm_, eps_, kv.data(), ctx.pool);
  for (int64_t t = 0; t < t_n; ++t) {
    rope_.rotate(*ctx.backend, &kv[static_cast<size_t>(t * d + d - rd)], 1, d, &cos_t[t * half], &sin_t[t * half]);
  }
  const std::span<uint8_t> kv_codes = frame.take<uint8_t>(static_cast<size_t>(t_n * d));        // e4m3
  const std::span<uint8_t> kv_scales = frame.take<uint8_t>(static_cast<size_t>(t_n * d / 32));  // ue8m0
  ctx.backend->act_quant(kv.data(), t_n, d, kv_codes.data(), kv_scales.data(), ctx.pool);
  dequant_e4m3_ue8m0(kv_codes.data(), kv_scales.data(), t_n * d, 32, kv.data());

  // KV sources: the compressor projections of every row that has no compressed entry yet, in one pass.
  const std::span<SegmentRows> segment_rows = frame.take_filled<SegmentRows>(static_cast<size_t>(num_segments), {});
  if (kv_source_ && ratio_ > 0) {
    int64_t compress_n = 0;
    for (int64_t i = 0; i < num_segments; ++i) {
      auto skip = stored_rows(*segments[i].state, segments[i].start_pos, segments[i].num_tokens);
      if (!skip.ok()) return skip.status().with_context(where() + ", segment " + std::to_string(i));
      segment_rows[static_cast<size_t>(i)].compressor_rows = segments[i].num_tokens - *skip;
      compress_n += segments[i].num_tokens - *skip;
    }
    // The rows to project, back to back: x itself unless a replayed prefix skips some.
    const float* compress_x = x;
    if (compress_n < t_n) {
      const std::span<float> gathered = frame.take<float>(static_cast<size_t>(compress_n * dim_));
      for (int64_t i = 0, row = 0, to = 0; i < num_segments; ++i) {
        const int64_t n = segment_rows[static_cast<size_t>(i)].compressor_rows;
        row += segments[i].num_tokens;
        std::memcpy(&gathered[static_cast<size_t>(to * dim_)], x + (row - n) * dim_,
                    static_cast<size_t>(n * dim_) * sizeof(float));
        to += n;
      }
      compress_x = gathered.data();
    }
    const std::span<float> compressor_kv = frame.take<float>(static_cast<size_t>(compress_n * d));
    const std::span<float> compressor_score = frame.take<float>(static_cast<size_t>(ratio_ > 1 ? compress_n * d : 0));
    if (compress_n > 0) project_compressor(compress_x, compress_n, ctx, compressor_kv.data(), compressor_score.data());
    for (int64_t i = 0, from = 0; i < num_segments; ++i) {
      SegmentRows& r = segment_rows[static_cast<size_t>(i)];
      r.compressor_kv = &compressor_kv[static_cast<size_t>(from * d)];
      r.compressor_score = ratio_ > 1 ? &compressor_score[static_cast<size_t>(from * d)] : nullptr;
      from += r.compressor_rows;
    }
  }
  // Index sources: the indexer's queries and head weights of every row, in one pass (when some segment sees a
  // compressed entry).
  std::span<float> index_q, index_weights;
  bool index_needed = false;
  for (int64_t i = 0; i < num_segments && index_source_ && ratio_ > 0; ++i) {
    index_needed |= (segments[i].start_pos + segments[i].num_tokens) / ratio_ > 0;
  }
  if (index_needed) {
    index_q = frame.take<float>(static_cast<size_t>(t_n * index_heads_ * index_head_dim_));
    index_weights = frame.take<float>(static_cast<size_t>(t_n * index_heads_));
    project_index_queries(x, qr.data(), t_n, cos_t.data(), sin_t.data(), ctx, index_q.data(), index_weights.data());
  }

  // Per sequence: the compressed branch (compressor, indexer: they split their own work over the pool), then the
  // window rows and the sparse attention -> o [rows, H, D].
  const std::span<float> o = frame.take<float>(static_cast<size_t>(t_n * h_n * d));
  const std::span<int64_t> first_row = frame.take<int64_t>(static_cast<size_t>(num_segments));
  const std::span<CompressedBranch> branches =
      frame.take_filled<CompressedBranch>(static_cast<size_t>(num_segments), {});
  int64_t single_rows = 0;  // segments of one row (decode)
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    SegmentRows& r = segment_rows[static_cast<size_t>(i)];
    r.q = &q[static_cast<size_t>(row * h_n * d)];
    r.kv = &kv[static_cast<size_t>(row * d)];
    r.kv_codes = &kv_codes[static_cast<size_t>(row * d)];
    r.kv_scales = &kv_scales[static_cast<size_t>(row * d / 32)];
    if (index_needed) {
      r.index_q = &index_q[static_cast<size_t>(row * index_heads_ * index_head_dim_)];
      r.index_weights = &index_weights[static_cast<size_t>(row * index_heads_)];
    }
    Status st = compressed_branch(segments[i], r, ctx, &branches[static_cast<size_t>(i)]);
    if (!st.ok()) return num_segments > 1 ? st.with_context("segment " + std::to_string(i)) : st;
    first_row[static_cast<size_t>(i)] = row;
    row += segments[i].num_tokens;
    single_rows += segments[i].num_tokens == 1;
  }
  // With at least as many one-row segments as threads, each of them runs on one thread (its nested kernel calls
  // inline): one parallel pass per layer instead of a few short ones per sequence, and each sequence's gathered
  // rows stay in the cache of the thread that reads them (at batch 4 and 16 on 2 threads the attention took ~0.65x
  // the time of splitting every sequence over the pool). Not when the last round of sequences would leave more
  // than a third of the threads' turns idle (65 sequences on 64 threads). Longer segments split their work over
  // the pool. The kernels give the same bits on any number of threads.
  const int64_t threads = ctx.pool != nullptr ? ctx.pool->num_threads() : 1;
  const int64_t rounds = (single_rows + threads - 1) / threads;
  const bool one_thread_each = threads > 1 && single_rows >= threads && 2 * rounds * threads <= 3 * single_rows;
  for (int64_t i = 0; i < num_segments; ++i) {
    if (one_thread_each && segments[i].num_tokens == 1) continue;
    const size_t at = static_cast<size_t>(i);
    attend_segment(segments[i], segment_rows[at], branches[at], frame, ctx,
                   &o[static_cast<size_t>(first_row[at] * h_n * d)]);
  }
  if (one_thread_each) {
    const std::span<int64_t> singles = frame.take<int64_t>(static_cast<size_t>(single_rows));
    for (int64_t i = 0, k = 0; i < num_segments; ++i) {
      if (segments[i].num_tokens == 1) singles[static_cast<size_t>(k++)] = i;
    }
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kAttention);
    ComputeContext thread_ctx = ctx;
    thread_ctx.profile = nullptr;  // one profile per step, timed by the calling thread
    ctx.pool->parallel_for(single_rows, [&](int64_t begin, int64_t end, int thread) {
      ThreadScratch scratch(ctx.pool, thread);
      for (int64_t k = begin; k < end; ++k) {
        const size_t at = static_cast<size_t>(singles[static_cast<size_t>(k)]);
        attend_segment(segments[at], segment_rows[at], branches[at], scratch.arena(), thread_ctx,
                       &o[static_cast<size_t>(first_row[at] * h_n * d)]);
      }
    });
  }

  project_output(o.data(), t_n, cos_t.data(), sin_t.data(), ctx, out);
  return Status::Ok();
}

void AttentionLayer::project_output(float* o, int64_t rows, const float* cos, const float* sin,
                                    const ComputeContext& ctx, float* out) const {
  const int64_t d = head_dim_, h_n = heads_, rd = rope_dim_;
  const size_t half = static_cast<size_t>(rd / 2);
  // Remove the query rotation from the output, then the grouped wo_a (bf16 einsum) and wo_b (FP8), all rows.
  for (int64_t t = 0; t < rows; ++t) {
    rope_.rotate(*ctx.backend, &o[static_cast<size_t>(t * h_n * d + d - rd)], h_n, d, &cos[t * half], &sin[t * half],
                 true);
  }
  Workspace private_workspace;  // only when the caller has none
  Arena& frame = (ctx.workspace != nullptr ? *ctx.workspace : private_workspace).frame();
  ArenaScope scope(frame);
  const int64_t group_in = h_n * d / groups_;
  // [rows, groups * o_lora]
  const std::span<float> oa = frame.take<float>(static_cast<size_t>(rows * groups_ * o_lora_));
  if (wo_a_bf16_.empty()) {
    // o [rows, groups * group_in] is the groups' inputs side by side; wo_a's groups are its o_lora-row slices.
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kLinear);
    ctx.backend->fp8_as_bf16_grouped_gemm(o, rows, groups_, wo_a_, oa.data(), ctx.pool);
    round_to_bf16_inplace(oa.data(), rows * groups_ * o_lora_);
  } else {
    const std::span<float> group_x = frame.take<float>(static_cast<size_t>(rows * group_in));  // [rows, group_in]
    const std::span<float> group_y = frame.take<float>(static_cast<size_t>(rows * o_lora_));   // [rows, o_lora]
    for (int g = 0; g < groups_; ++g) {
      for (int64_t t = 0; t < rows; ++t) {
        std::memcpy(&group_x[static_cast<size_t>(t * group_in)], &o[static_cast<size_t>(t * h_n * d + g * group_in)],
                    static_cast<size_t>(group_in) * sizeof(float));
      }
      const Bf16Weight w{wo_a_bf16_.data() + g * o_lora_ * group_in, o_lora_, group_in};
      bf16_linear(group_x.data(), rows, w, group_y.data(), ctx, true);
      for (int64_t t = 0; t < rows; ++t) {
        std::memcpy(&oa[static_cast<size_t>(t * groups_ * o_lora_ + g * o_lora_)],
                    &group_y[static_cast<size_t>(t * o_lora_)], static_cast<size_t>(o_lora_) * sizeof(float));
      }
    }
  }
  fp8_linear_bf16(oa.data(), rows, wo_b_, out, ctx);
}

Status AttentionLayer::compressed_branch(const AttentionSegment& segment, const SegmentRows& rows,
                                         const ComputeContext& ctx, CompressedBranch* out) {
  auto where = [this] { return "attention layer " + std::to_string(layer_); };  // error paths only
  SequenceState& state = *segment.state;
  Csa2Shared& shared = *segment.shared;
  AttentionTrace* trace = segment.trace;
  const int64_t start_pos = segment.start_pos, t_n = segment.num_tokens;
  const int64_t end_pos = start_pos + t_n;
  *out = CompressedBranch{};
  if (ratio_ > 0) {
    const int64_t compress_len = end_pos / ratio_;
    if (kv_source_) {
      Status st = compress_rows(rows.compressor_kv, rows.compressor_score, rows.compressor_rows,
                                end_pos - rows.compressor_rows, state, ctx, trace);
      if (!st.ok()) return st.with_context(where());
    }
    const CompressedKv* compressed = state.compressed(kv_source_layer_);
    if (compressed == nullptr || compressed->num_entries() < compress_len) {
      return Status::Error(where() + ": KV source L" + std::to_string(kv_source_layer_) + " holds " +
                           std::to_string(compressed ? compressed->num_entries() : 0) + " entries, " +
                           std::to_string(compress_len) + " are visible at end position " + std::to_string(end_pos));
    }
    if (index_source_) {
      if (compress_len == 0) {
        shared.topk_layer = layer_;
        shared.topk_width = 0;
        shared.topk = {};
      } else {
        Status st = run_indexer(rows.index_q, rows.index_weights, t_n, start_pos, state, shared, ctx, trace);
        if (!st.ok()) return st;
      }
    } else if (shared.topk_layer != index_source_layer_ ||
               static_cast<int64_t>(shared.topk.size()) != t_n * shared.topk_width) {
      return Status::Error(where() + ": Reuse layer needs the top-k of index source L" +
                           std::to_string(index_source_layer_) + " from this call (found L" +
                           std::to_string(shared.topk_layer) + ")");
    }
    *out = CompressedBranch{compressed, shared.topk_width};
  }
  return Status::Ok();
}

void AttentionLayer::attend_segment(const AttentionSegment& segment, const SegmentRows& rows,
                                    const CompressedBranch& branch, Arena& frame, const ComputeContext& ctx,
                                    float* o) {
  ArenaScope frame_scope(frame);
  SequenceState& state = *segment.state;
  const Csa2Shared& shared = *segment.shared;
  const int64_t start_pos = segment.start_pos, t_n = segment.num_tokens;
  const int64_t end_pos = start_pos + t_n;
  const int64_t d = head_dim_, h_n = heads_;
  const CompressedKv* compressed = branch.kv;
  const int64_t topk_width = branch.topk_width;

  // Window rows and each query's window entries (see the header for the layout).
  WindowRing& ring = state.window(layer_);
  const int64_t win = window_;
  const bool decode_layout = start_pos > 0 && t_n == 1 && shared.prefill_end == 0;
  const int64_t window_entries = decode_layout ? win : std::min(std::max(end_pos, shared.prefill_end), win);
  const int64_t floor = shared.window_floor;
  std::span<float> window_rows;  // dequantised rows
  const std::span<const float*> window_list =
      frame.take_filled<const float*>(static_cast<size_t>(t_n * window_entries), nullptr);
  if (decode_layout) {
    ring.write(start_pos, rows.kv_codes, rows.kv_scales);
    window_rows = frame.take<float>(static_cast<size_t>(win * d));
    const int64_t oldest = start_pos % win + 1;
    // Row gathers count as attention (ProfilePhase); the rows are independent, so they dequantise on the pool.
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kAttention);
    parallel_rows(ctx, win, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int slot = static_cast<int>((oldest + i) % win);
        const int64_t pos = ring.slot_position(slot);
        if (pos < 0 || pos > start_pos || pos <= start_pos - win || pos < floor) continue;
        float* row = &window_rows[static_cast<size_t>(i * d)];
        ring.read_slot(slot, row, ctx.backend->dequant_window_row);
        window_list[static_cast<size_t>(i)] = row;
      }
    }, kGatherGrain);
  } else {
    const int64_t first = std::max<int64_t>(0, start_pos - win + 1);
    window_rows = frame.take<float>(static_cast<size_t>((end_pos - first) * d));
    const std::span<uint8_t> present = frame.take_filled<uint8_t>(static_cast<size_t>(end_pos - first), 0);
    for (int64_t p = first; p < end_pos; ++p) {
      float* row = &window_rows[static_cast<size_t>((p - first) * d)];
      if (p >= start_pos) {
        std::memcpy(row, &rows.kv[(p - start_pos) * d], static_cast<size_t>(d) * sizeof(float));
        present[static_cast<size_t>(p - first)] = 1;
      } else if (ring.holds(p)) {
        ring.read_slot(static_cast<int>(p % win), row, ctx.backend->dequant_window_row);
        present[static_cast<size_t>(p - first)] = 1;
      }
    }
    for (int64_t t = 0; t < t_n; ++t) {
      const int64_t s = start_pos + t;
      const int64_t base = std::max<int64_t>(0, s - win + 1);
      for (int64_t i = 0; i < window_entries; ++i) {
        const int64_t p = base + i;
        if (p > s || p < floor || p < first || !present[static_cast<size_t>(p - first)]) continue;
        window_list[static_cast<size_t>(t * window_entries + i)] = &window_rows[static_cast<size_t>((p - first) * d)];
      }
    }
    for (int64_t p = std::max(start_pos, end_pos - win); p < end_pos; ++p) {
      ring.write(p, &rows.kv_codes[(p - start_pos) * d], &rows.kv_scales[(p - start_pos) * d / 32]);
    }
  }

  // Sparse attention over [window entries ; compressed entries], in tiles of queries; the compressed rows a tile
  // uses are dequantised once per tile.
  const int64_t entries = window_entries + topk_width;
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  for (int64_t tile = 0; tile < t_n; tile += kQueryTile) {
    const int64_t tile_n = std::min(kQueryTile, t_n - tile);
    ArenaScope tile_scope(frame);
    // Sorted distinct compressed positions of the tile; row r of compressed_rows [loaded, head_dim] holds loaded[r].
    const std::span<int32_t> loaded_all = frame.take<int32_t>(static_cast<size_t>(tile_n * topk_width));
    size_t num_loaded = 0;
    for (int64_t t = tile; t < tile + tile_n; ++t) {
      for (int64_t i = 0; i < topk_width; ++i) {
        const int32_t pos = shared.topk[static_cast<size_t>(t * topk_width + i)];
        if (pos >= 0) loaded_all[num_loaded++] = pos;
      }
    }
    std::sort(loaded_all.begin(), loaded_all.begin() + static_cast<std::ptrdiff_t>(num_loaded));
    const std::span<int32_t> loaded = loaded_all.first(static_cast<size_t>(
        std::unique(loaded_all.begin(), loaded_all.begin() + static_cast<std::ptrdiff_t>(num_loaded)) -
        loaded_all.begin()));
    const std::span<float> compressed_rows = frame.take<float>(loaded.size() * static_cast<size_t>(d));
    {
      ProfileScope profile_scope(ctx.profile, ProfilePhase::kAttention);
      parallel_rows(ctx, static_cast<int64_t>(loaded.size()), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          compressed->read_kv(loaded[static_cast<size_t>(r)], &compressed_rows[static_cast<size_t>(r * d)],
                              ctx.backend->dequant_compressed_row);
        }
      }, kGatherGrain);
    }
    // [tile, entries] row pointers: window entries, then the compressed ones (nullptr = -1).
    const std::span<const float*> list = frame.take_filled<const float*>(static_cast<size_t>(tile_n * entries), nullptr);
    for (int64_t t = 0; t < tile_n; ++t) {
      const float* const* wl = &window_list[static_cast<size_t>((tile + t) * window_entries)];
      std::copy(wl, wl + window_entries, list.begin() + t * entries);
      for (int64_t i = 0; i < topk_width; ++i) {
        const int32_t pos = shared.topk[static_cast<size_t>((tile + t) * topk_width + i)];
        if (pos >= 0) {
          const size_t r = static_cast<size_t>(std::lower_bound(loaded.begin(), loaded.end(), pos) - loaded.begin());
          list[static_cast<size_t>(t * entries + window_entries + i)] = &compressed_rows[r * static_cast<size_t>(d)];
        }
      }
    }
    SparseAttentionArgs args;
    args.q = &rows.q[tile * h_n * d];
    args.rows = list.data();
    args.sink = sink_.data();
    args.out = &o[static_cast<size_t>(tile * h_n * d)];
    args.num_queries = tile_n;
    args.num_entries = entries;
    args.heads = static_cast<int>(h_n);
    args.dim = d;
    args.scale = scale;
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kAttention);
    ctx.backend->sparse_attention(args, ctx.pool);
  }
}

}  // namespace dsflash
