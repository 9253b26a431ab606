#include "model/forward.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "model/attention.h"

namespace dsflash {

void ForwardBatch::add(SequenceState& seq, const int32_t* tokens, int64_t num_tokens, const RowOptions& options) {
  segments_.push_back(ForwardSegment{&seq, num_rows(), num_tokens, options});
  tokens_.insert(tokens_.end(), tokens, tokens + std::max<int64_t>(num_tokens, 0));
}

void ForwardBatch::clear() {
  tokens_.clear();
  segments_.clear();
}

namespace {

// A segment while the layers run: its rows still in the streams and its CSA2 sharing.
struct LiveSegment {
  const ForwardSegment* source = nullptr;
  int64_t start_pos = 0;   // absolute position of its first live row
  int64_t num_tokens = 0;  // live rows
  Csa2Shared shared;
};

// The residual streams of the live rows, segment after segment, and what each row carries between layers; in the
// step arena of the call's workspace (the spans shrink when the CED split drops rows).
struct Streams {
  int64_t rows = 0;
  std::span<float> h;           // [rows, hc, dim] bf16 values
  std::span<float> pre_mix;     // [rows, hc] fp32: the pre each row's next attention collapses with
  std::span<int64_t> hash_ids;  // [rows, hash_row] Engram ids (empty without Engram)
};

// Scratch of one block, sized for the call's first (largest) row count n; a layer uses its first rows.
struct BlockScratch {
  std::span<float> mid, x, y, a_pre, a_post, a_comb, f_pre, f_post, f_comb;
  void take(Arena& arena, int64_t n, int hc, int64_t dim) {
    mid = arena.take<float>(static_cast<size_t>(n * hc * dim));  // [n, hc, dim]
    x = arena.take<float>(static_cast<size_t>(n * dim));         // [n, dim]
    y = arena.take<float>(static_cast<size_t>(n * dim));         // [n, dim]
    for (auto* v : {&a_pre, &a_post, &f_pre, &f_post}) *v = arena.take<float>(static_cast<size_t>(n * hc));
    for (auto* v : {&a_comb, &f_comb}) *v = arena.take<float>(static_cast<size_t>(n * hc * hc));
  }
};

Status check_batch(const ModelConfig& config, const ForwardBatch& batch, const ForwardTrace* trace) {
  if (batch.empty()) return Status::Error("forward: the batch has no rows");
  const auto& segments = batch.segments();
  for (size_t i = 0; i < segments.size(); ++i) {
    const ForwardSegment& seg = segments[i];
    auto where = [i] { return "forward: segment " + std::to_string(i); };  // error paths only
    if (seg.seq == nullptr) return Status::Error(where() + " has no sequence");
    if (seg.num_tokens <= 0) return Status::Error(where() + " has no tokens to process");
    if (seg.options.global_only < 0 || seg.options.global_only > seg.num_tokens) {
      return Status::Error(where() + ": global_only " + std::to_string(seg.options.global_only) + " outside [0, " +
                           std::to_string(seg.num_tokens) + "]");
    }
    if (seg.options.window_floor < 0) return Status::Error(where() + ": negative window floor");
    if (seg.options.dspark_hidden && config.dspark_target_layer_ids.empty()) {
      return Status::Error(where() + " asks for DSpark hidden states, the model has no DSpark target layers");
    }
    for (size_t j = 0; j < i; ++j) {
      if (segments[j].seq == seg.seq) return Status::Error(where() + ": its sequence appears twice in the batch");
    }
    for (int64_t t = 0; t < seg.num_tokens; ++t) {
      const int32_t id = batch.tokens()[static_cast<size_t>(seg.first_row + t)];
      if (id < 0 || id >= config.vocab_size) {
        return Status::Error("token id " + std::to_string(id) + " at input index " + std::to_string(t) +
                             " is outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
      }
    }
    const int64_t end = seg.seq->num_positions() + seg.num_tokens;
    if (end > config.max_position_embeddings) {
      return Status::Error("context of " + std::to_string(end) + " positions exceeds max_position_embeddings " +
                           std::to_string(config.max_position_embeddings));
    }
    // The forward never allocates KV: the caller reserved the pages (kv::KvCacheManager::reserve).
    if (seg.seq->pages().capacity_positions() < end) {
      return Status::Error(where() + ": its KV pages hold " + std::to_string(seg.seq->pages().capacity_positions()) +
                           " positions, the call needs " + std::to_string(end) + " (reserve before the forward)");
    }
  }
  if (trace != nullptr && (segments.size() != 1 || segments[0].options.global_only != 0)) {
    return Status::Error("forward: a trace records one segment without global-only rows");
  }
  return Status::Ok();
}

// Embedding rows copied into every stream; pre-mix one-hot on stream 0 (spec §4.1).
void embed(const ModelWeights& weights, const std::vector<int32_t>& tokens, Arena& arena, Streams* s) {
  const int hc = weights.hc_shape().hc;
  const int64_t dim = weights.hc_shape().dim;
  const int64_t n = static_cast<int64_t>(tokens.size());
  s->rows = n;
  s->h = arena.take<float>(static_cast<size_t>(n * hc * dim));
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = weights.embed().data + static_cast<int64_t>(tokens[static_cast<size_t>(t)]) * dim;
    for (int j = 0; j < hc; ++j) {
      float* dst = s->h.data() + (t * hc + j) * dim;
      for (int64_t i = 0; i < dim; ++i) dst[i] = bf16_to_f32(row[i]);
    }
  }
  s->pre_mix = arena.take_filled<float>(static_cast<size_t>(n * hc), 0.0f);
  for (int64_t t = 0; t < n; ++t) s->pre_mix[static_cast<size_t>(t * hc)] = 1.0f;
}

// The attention input of `block` for `rows` stream rows from `first`: attn_norm(hc_pre(h, pre_mix)) -> x.
void attention_input(const ModelWeights& weights, const BlockWeights& block, const Streams& s, int64_t first,
                     int64_t rows, const ComputeContext& ctx, float* x) {
  const HcShape& shape = weights.hc_shape();
  ctx.backend->hc_pre(s.h.data() + first * shape.hc * shape.dim, rows, shape.hc, shape.dim,
                      s.pre_mix.data() + first * shape.hc, x, ctx.pool);
  ctx.backend->rmsnorm_bf16(x, rows, shape.dim, block.attn_norm, shape.norm_eps, x, ctx.pool);
}

// CED split point (layer d): the global-only rows of each segment feed layer d's global-KV path, then leave the
// streams; each segment's sharing restarts on its remaining rows and the decoder's window floor applies.
Status split_at_decoder(const ModelWeights& weights, const BlockWeights& block, const ComputeContext& ctx,
                        Streams& s, std::span<LiveSegment>& live) {
  const HcShape& shape = weights.hc_shape();
  const int64_t stream_row = shape.hc * shape.dim;
  const int64_t hash_row = s.rows > 0 ? static_cast<int64_t>(s.hash_ids.size()) / s.rows : 0;
  Arena& frame = ctx.workspace->frame();
  int64_t read = 0, write = 0;  // stream rows: next to read, next to keep
  size_t kept = 0;              // live segments kept, compacted in place
  for (LiveSegment& seg : live) {
    const int64_t drop = seg.source->options.global_only;
    if (drop > 0) {
      ArenaScope scope(frame);
      const std::span<float> x = frame.take<float>(static_cast<size_t>(drop * shape.dim));  // [drop, dim]
      attention_input(weights, block, s, read, drop, ctx, x.data());
      Status st = block.attention->forward_global_kv(x.data(), drop, seg.start_pos, *seg.source->seq, ctx);
      if (!st.ok()) return st.with_context("layer " + std::to_string(block.layer) + " global-KV path");
    }
    const int64_t keep = seg.num_tokens - drop;
    const int64_t from = read + drop;  // first kept row; rows move down over the dropped ones
    if (keep > 0 && write != from) {
      std::memmove(&s.h[static_cast<size_t>(write * stream_row)], &s.h[static_cast<size_t>(from * stream_row)],
                   static_cast<size_t>(keep * stream_row) * sizeof(float));
      std::memmove(&s.pre_mix[static_cast<size_t>(write * shape.hc)], &s.pre_mix[static_cast<size_t>(from * shape.hc)],
                   static_cast<size_t>(keep * shape.hc) * sizeof(float));
      if (hash_row > 0) {
        std::memmove(&s.hash_ids[static_cast<size_t>(write * hash_row)], &s.hash_ids[static_cast<size_t>(from * hash_row)],
                     static_cast<size_t>(keep * hash_row) * sizeof(int64_t));
      }
    }
    read += seg.num_tokens;
    write += keep;
    if (keep == 0) continue;
    if (drop > 0) {
      seg.start_pos += drop;
      seg.num_tokens = keep;
      seg.shared.reset(seg.start_pos, keep);  // the decoder's call covers the remaining rows only
    }
    seg.shared.window_floor = seg.source->options.window_floor;
    if (&live[kept] != &seg) live[kept] = std::move(seg);
    ++kept;
  }
  live = live.first(kept);
  s.rows = write;
  s.h = s.h.first(static_cast<size_t>(write * stream_row));
  s.pre_mix = s.pre_mix.first(static_cast<size_t>(write * shape.hc));
  s.hash_ids = s.hash_ids.first(static_cast<size_t>(write * hash_row));
  return Status::Ok();
}

// DSpark's main_hidden (spec §4.1, §4.10; model.py Transformer.forward): for the segments with
// RowOptions::dspark_hidden, the mean over the hc streams of each target layer's input, rows past global_only.
struct DSparkCapture {
  std::vector<int> targets;        // ascending target layers (the order of model.py's concatenation)
  int64_t width = 0;               // targets * dim
  std::vector<int64_t> first_row;  // per segment: its first row in `hidden` (-1: not asked)
  std::vector<float> hidden;       // [rows, width] bf16 values
  std::vector<ForwardOutput::Row> rows;

  void init(const ModelConfig& config, const ForwardBatch& batch) {
    const auto& segments = batch.segments();
    // Nothing (and no allocation) unless a segment asks.
    if (std::none_of(segments.begin(), segments.end(),
                     [](const ForwardSegment& seg) { return seg.options.dspark_hidden; })) {
      return;
    }
    first_row.assign(segments.size(), -1);
    for (size_t i = 0; i < segments.size(); ++i) {
      const ForwardSegment& seg = segments[i];
      if (!seg.options.dspark_hidden) continue;
      first_row[i] = static_cast<int64_t>(rows.size());
      const int64_t p0 = seg.seq->num_positions() + seg.options.global_only;
      for (int64_t t = seg.options.global_only; t < seg.num_tokens; ++t) {
        rows.push_back(ForwardOutput::Row{static_cast<int64_t>(i), p0 + t - seg.options.global_only});
      }
    }
    if (rows.empty()) return;
    targets = config.dspark_target_layer_ids;
    std::sort(targets.begin(), targets.end());
    targets.erase(std::unique(targets.begin(), targets.end()), targets.end());  // model.py captures a layer once
    width = static_cast<int64_t>(targets.size()) * config.dim;
    hidden.assign(rows.size() * static_cast<size_t>(width), 0.0f);
  }

  // Before block `layer` (after its Engram): the live rows' stream mean (fp32 sum in stream order, / hc, bf16).
  void capture(int layer, const Streams& s, std::span<const LiveSegment> live, const ForwardBatch& batch, int hc,
               int64_t dim) {
    const auto target = std::find(targets.begin(), targets.end(), layer);
    if (rows.empty() || target == targets.end()) return;
    const int64_t column = (target - targets.begin()) * dim;
    for (int64_t row = 0; const LiveSegment& seg : live) {
      const int64_t segment = seg.source - batch.segments().data();
      const int64_t p0 = seg.source->seq->num_positions() + seg.source->options.global_only;
      for (int64_t t = 0; first_row[static_cast<size_t>(segment)] >= 0 && t < seg.num_tokens; ++t) {
        const int64_t p = seg.start_pos + t;
        if (p < p0) continue;
        const float* h = s.h.data() + (row + t) * hc * dim;
        float* dst = &hidden[static_cast<size_t>((first_row[static_cast<size_t>(segment)] + p - p0) * width + column)];
        for (int64_t c = 0; c < dim; ++c) {
          float sum = 0.0f;
          for (int j = 0; j < hc; ++j) sum += h[j * dim + c];
          dst[c] = round_to_bf16(sum / static_cast<float>(hc));
        }
      }
      row += seg.num_tokens;
    }
  }
};

}  // namespace

Status forward(const ModelWeights& weights, const ForwardBatch& batch, const ComputeContext& caller_ctx,
               ForwardOutput* out, ForwardTrace* trace) {
  // Every buffer of the step comes from the caller's workspace (a private one when the context has none).
  Workspace private_workspace;
  ComputeContext ctx = caller_ctx;
  if (ctx.workspace == nullptr) ctx.workspace = &private_workspace;
  Workspace& ws = *ctx.workspace;
  ws.begin_step();
  if (ctx.pool != nullptr) ctx.pool->balance_scratch();
  Arena& step = ws.step();
  const ModelConfig& config = weights.config();
  const HcShape& shape = weights.hc_shape();
  const int hc = shape.hc;
  const int64_t dim = shape.dim;
  Status status = check_batch(config, batch, trace);
  if (!status.ok()) return status;

  Streams s;
  embed(weights, batch.tokens(), step, &s);
  const ArenaObjects<LiveSegment> live_segments(step, batch.segments().size());
  std::span<LiveSegment> live = live_segments.items();
  for (size_t i = 0; i < live.size(); ++i) {
    const ForwardSegment& seg = batch.segments()[i];
    live[i].source = &seg;
    live[i].start_pos = seg.seq->num_positions();
    live[i].num_tokens = seg.num_tokens;
    live[i].shared.reset(live[i].start_pos, seg.num_tokens);
    live[i].shared.publish_arena = &step;  // published top-k / pools live through the step
  }
  // Engram ids of every row (advances each sequence's n-gram history): [rows, engram layers, columns].
  if (const NgramHasher* hasher = weights.engram_hasher()) {
    const int64_t hash_row = static_cast<int64_t>(hasher->num_layers()) * hasher->columns();
    s.hash_ids = step.take<int64_t>(static_cast<size_t>(s.rows * hash_row));
    for (const ForwardSegment& seg : batch.segments()) {
      status = hasher->hash(&batch.tokens()[static_cast<size_t>(seg.first_row)], seg.num_tokens,
                            seg.seq->num_positions(), seg.seq->engram(),
                            &s.hash_ids[static_cast<size_t>(seg.first_row * hash_row)], nullptr, &ws.frame());
      if (!status.ok()) return status.with_context("Engram hashing");
    }
  }
  if (trace != nullptr) trace->layers.assign(static_cast<size_t>(config.n_layers), {});
  DSparkCapture dspark;
  dspark.init(config, batch);

  BlockScratch w;
  w.take(step, s.rows, hc, dim);
  const std::span<AttentionSegment> attention_segments = step.take<AttentionSegment>(live.size());
  const int decoder_start = config.ced_decoder_start();
  for (const BlockWeights& block : weights.blocks()) {
    if (block.layer == decoder_start) {
      status = split_at_decoder(weights, block, ctx, s, live);
      if (!status.ok()) return status;
      if (live.empty()) break;  // every row only fed the global KV
    }
    ForwardTrace::Layer* record = trace != nullptr ? &trace->layers[static_cast<size_t>(block.layer)] : nullptr;
    const int64_t n = s.rows;
    if (block.engram) {
      status = block.engram->forward(s.h.data(), n, s.hash_ids.data(), ctx);
      if (!status.ok()) return status.with_context("layer " + std::to_string(block.layer) + " Engram");
    }
    dspark.capture(block.layer, s, live, batch, hc, dim);
    // Attention site: coefficients from the block input; the input collapses with the previous site's pre.
    ctx.backend->hc_mixes(s.h.data(), n, block.hc_attn, shape, w.a_pre.data(), w.a_post.data(), w.a_comb.data(), ctx.pool);
    attention_input(weights, block, s, 0, n, ctx, w.x.data());
    if (record) record->attn_in.assign(w.x.begin(), w.x.begin() + n * dim);
    for (size_t i = 0; i < live.size(); ++i) {
      LiveSegment& seg = live[i];
      attention_segments[i] = AttentionSegment{&*seg.source->seq, &seg.shared, seg.start_pos, seg.num_tokens,
                                               record ? &record->attention : nullptr};
    }
    status = block.attention->forward(w.x.data(), attention_segments.data(), static_cast<int64_t>(live.size()), ctx,
                                      w.y.data());
    if (!status.ok()) return status.with_context("layer " + std::to_string(block.layer) + " attention");
    if (record) record->attn_out.assign(w.y.begin(), w.y.begin() + n * dim);
    ctx.backend->hc_post(w.y.data(), s.h.data(), n, hc, dim, w.a_post.data(), w.a_comb.data(), w.mid.data(), ctx.pool);

    // FFN site: coefficients from the post-attention streams; the input collapses with the attention site's pre.
    ctx.backend->hc_mixes(w.mid.data(), n, block.hc_ffn, shape, w.f_pre.data(), w.f_post.data(), w.f_comb.data(),
                          ctx.pool);
    ctx.backend->hc_pre(w.mid.data(), n, hc, dim, w.a_pre.data(), w.x.data(), ctx.pool);
    ctx.backend->rmsnorm_bf16(w.x.data(), n, dim, block.ffn_norm, shape.norm_eps, w.x.data(), ctx.pool);
    if (record) record->ffn_in.assign(w.x.begin(), w.x.begin() + n * dim);
    block.moe->forward(w.x.data(), n, ctx, w.y.data(), record ? &record->routing : nullptr);
    if (record) record->ffn_out.assign(w.y.begin(), w.y.begin() + n * dim);
    ctx.backend->hc_post(w.y.data(), w.mid.data(), n, hc, dim, w.f_post.data(), w.f_comb.data(), s.h.data(), ctx.pool);
    // The FFN site's pre feeds the next block's attention (Single-Pass mHC).
    std::copy(w.f_pre.begin(), w.f_pre.begin() + n * hc, s.pre_mix.begin());
    if (record) {
      record->out.assign(s.h.begin(), s.h.end());
      record->pre_mix.assign(s.pre_mix.begin(), s.pre_mix.end());
    }
  }
  for (const ForwardSegment& seg : batch.segments()) seg.seq->advance(seg.num_tokens);
  if (out == nullptr) return Status::Ok();
  out->dspark_hidden = std::move(dspark.hidden);
  out->dspark_rows = std::move(dspark.rows);

  // Final collapse with the last FFN site's pre, final norm, head (bf16 weight used in fp32), logits rows only.
  // The vectors keep their capacity: a ForwardOutput reused for calls of one shape allocates once.
  out->logits.clear();
  out->rows.clear();
  const std::span<int64_t> stream_rows = step.take<int64_t>(static_cast<size_t>(s.rows));
  int64_t count = 0;
  for (int64_t row = 0; const LiveSegment& seg : live) {
    const int64_t segment = seg.source - batch.segments().data();
    const LogitsRows which = seg.source->options.logits;
    const int64_t first = which == LogitsRows::kLast ? seg.num_tokens - 1 : 0;
    const int64_t rows_wanted = which == LogitsRows::kNone ? 0 : seg.num_tokens - first;
    for (int64_t r = first; r < first + rows_wanted; ++r) {
      stream_rows[static_cast<size_t>(count++)] = row + r;
      out->rows.push_back(ForwardOutput::Row{segment, seg.start_pos + r});
    }
    row += seg.num_tokens;
  }
  if (count == 0) return Status::Ok();
  const std::span<float> x = step.take<float>(static_cast<size_t>(count * dim));  // [count, dim]
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = stream_rows[static_cast<size_t>(i)];
    ctx.backend->hc_pre(s.h.data() + r * hc * dim, 1, hc, dim, s.pre_mix.data() + r * hc, x.data() + i * dim, nullptr);
  }
  if (trace) trace->final_hc.assign(x.begin(), x.end());
  ctx.backend->rmsnorm_bf16(x.data(), count, dim, weights.final_norm(), shape.norm_eps, x.data(), ctx.pool);
  if (trace) trace->final_norm.assign(x.begin(), x.end());
  out->logits.resize(static_cast<size_t>(count * config.vocab_size));  // every element written by the head
  ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
  ctx.backend->bf16_gemm(x.data(), count, weights.head(), out->logits.data(), ctx.pool);
  return Status::Ok();
}

}  // namespace dsflash
