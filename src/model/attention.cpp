// Attention of one layer (spec/MODEL.md §4.3-§4.6), following model.py's Attention step by step; the rounding
// points are those of the reference (bf16 tensors between ops, fp32 inside). Binding, the batched forward, the
// window rows and the sparse attention; the compressor and the indexer are in attention_compressed.cpp.
#include "model/attention.h"
#include "model/linear_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/sparse_attention.h"
#include "model/csa2.h"

namespace dsflash {
namespace {

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
  // [rows, groups * o_lora]
  const std::span<float> oa = frame.take<float>(static_cast<size_t>(rows * groups_ * o_lora_));
  {
    // o [rows, h_n * d] is the groups' inputs side by side; wo_a's groups are its o_lora-row slices.
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kLinear);
    ctx.backend->fp8_as_bf16_grouped_gemm(o, rows, groups_, wo_a_, oa.data(), ctx.pool);
    round_to_bf16_inplace(oa.data(), rows * groups_ * o_lora_);
  }
  fp8_linear_bf16(oa.data(), rows, wo_b_, out, ctx);
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
