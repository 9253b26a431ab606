#include "model/grouped_gemm.h"

#include <algorithm>
#include <cstring>

#include "core/numa_topology.h"
#include "core/thread_pool.h"

namespace dsflash {
namespace {

// Outputs [first, first + count) of an MXFP4 weight: the same bytes from output `first` on, in either order (a
// tile-major tile's codes and scales are contiguous, kernels/linear.h). first: a multiple of 16. (FP8:
// fp8_output_slice.)
Fp4Weight output_slice(const Fp4Weight& w, int64_t first, int64_t count) {
  Fp4Weight slice = w;
  slice.packed = w.packed + first * (w.in / 2);
  slice.scales = w.scales + first * (w.in / 32);
  slice.out = count;
  return slice;
}

// The outputs a piece of an item is cut in: a tile, or for FP8 two (a scale block).
int64_t unit_outputs(const GroupedGemmItem& item) { return item.fp8 != nullptr ? 2 * kTileMajorOutputs : kTileMajorOutputs; }
int64_t outputs_of(const GroupedGemmItem& item) { return item.fp8 != nullptr ? item.fp8->out : item.fp4->out; }
// Indices of the job per unit, in proportion to the unit's weight bytes (8 KB each, at least one), so that the
// pool's equal cut of the indices is an equal cut of the bytes read: an FP8 unit is four MXFP4 tiles' worth.
int64_t unit_weight(const GroupedGemmItem& item) {
  constexpr int64_t kBytesPerIndex = 8192;
  const int64_t in = item.fp8 != nullptr ? item.fp8->in : item.fp4->in;
  const int64_t bytes = item.fp8 != nullptr ? 2 * kTileMajorOutputs * in : kTileMajorOutputs * (in / 2 + in / 32);
  return std::max<int64_t>(1, bytes / kBytesPerIndex);
}

// A run of one item's units in the job's index space (node by node, each node's units of every item in item order),
// unit_weight indices each: a unit belongs to the range its first index falls in.
struct Piece {
  int64_t flat_begin = 0;  // its first index in the job
  int64_t unit_begin = 0;  // its first unit in the item's weight
  int64_t units = 0;
  int64_t weight = 1;      // indices per unit
  size_t item = 0;
};

// y [x.rows, count] of the item's outputs [first, first + count), through `pool` (inline inside a job).
void run_slice(const GroupedGemmItem& item, int64_t first, int64_t count, float* y, const ComputeContext& ctx) {
  if (item.fp8 != nullptr) ctx.backend->fp8_gemm(item.x, fp8_output_slice(*item.fp8, first, count), y, ctx.pool);
  else ctx.backend->fp4_gemm(item.x, output_slice(*item.fp4, first, count), y, ctx.pool);
}

}  // namespace

void grouped_gemm(std::span<const GroupedGemmItem> items, const ComputeContext& ctx) {
  ThreadPool* pool = ctx.pool;
  ProfileScope profile_scope(ctx.profile, ProfilePhase::kLinear);
  if (pool == nullptr || pool->num_threads() == 1 || items.size() < 2) {
    for (const GroupedGemmItem& item : items) run_slice(item, 0, outputs_of(item), item.y, ctx);
    return;
  }
  Workspace own;  // only where the caller has none (holds no memory until used)
  Arena& frame = (ctx.workspace != nullptr ? *ctx.workspace : own).frame();
  ArenaScope scope(frame);
  const int nodes = pool->num_nodes();
  const std::span<Piece> pieces = frame.take<Piece>(items.size() * static_cast<size_t>(nodes));
  const std::span<int64_t> node_bounds = frame.take<int64_t>(static_cast<size_t>(nodes) + 1);
  size_t num_pieces = 0;
  int64_t flat = 0;
  for (int k = 0; k < nodes; ++k) {
    node_bounds[static_cast<size_t>(k)] = flat;
    for (size_t i = 0; i < items.size(); ++i) {
      // Node k's units of this weight, as parallel_for_nodes(units, ...) gives them to node k alone.
      const int64_t units = (outputs_of(items[i]) + unit_outputs(items[i]) - 1) / unit_outputs(items[i]);
      const RowRange range = node_row_range(units, pool->node_first_thread(), k);
      if (range.end <= range.begin) continue;
      const int64_t weight = unit_weight(items[i]);
      pieces[num_pieces++] = Piece{flat, range.begin, range.end - range.begin, weight, i};
      flat += (range.end - range.begin) * weight;
    }
  }
  node_bounds[static_cast<size_t>(nodes)] = flat;
  const std::span<const Piece> all = pieces.first(num_pieces);

  // The units whose first index lies in [begin, end) (any range: a thread's chunk, or all of it when run inline).
  auto body = [&](int64_t begin, int64_t end, int thread) {
    auto piece = std::upper_bound(all.begin(), all.end(), begin,
                                  [](int64_t at, const Piece& p) { return at < p.flat_begin; }) - 1;
    for (; piece != all.end() && piece->flat_begin < end; ++piece) {
      // Units [lo, hi) of the piece: ceil((begin - flat_begin) / weight) up to ceil((end - flat_begin) / weight).
      const auto first_unit_at = [&](int64_t at) {
        return std::clamp<int64_t>((at - piece->flat_begin + piece->weight - 1) / piece->weight, 0, piece->units);
      };
      const int64_t lo = first_unit_at(begin), hi = first_unit_at(end);
      if (lo >= hi) continue;
      const GroupedGemmItem& item = items[piece->item];
      const int64_t unit = unit_outputs(item), out = outputs_of(item);
      const int64_t first = (piece->unit_begin + lo) * unit;
      const int64_t count = std::min(out, (piece->unit_begin + hi) * unit) - first;
      // Inside the job the kernel's own pool calls run inline on this thread, with its scratch.
      if (item.x.rows == 1) {
        run_slice(item, first, count, item.y + first, ctx);
        continue;
      }
      ThreadScratch scratch(pool, thread);
      const std::span<float> part = scratch.take<float>(static_cast<size_t>(item.x.rows * count));  // [rows, count]
      run_slice(item, first, count, part.data(), ctx);
      for (int64_t r = 0; r < item.x.rows; ++r) {
        std::memcpy(item.y + r * out + first, part.data() + r * count, static_cast<size_t>(count) * sizeof(float));
      }
    }
  };
  // One contiguous run per thread where the GEMMs are weight reads (decode's few rows), as the kernels cut one
  // GEMM; a few per thread otherwise, to rebalance.
  int64_t most_rows = 0;
  for (const GroupedGemmItem& item : items) most_rows = std::max(most_rows, item.x.rows);
  const int chunks_per_thread = most_rows <= 4 ? 1 : ThreadPool::kChunksPerThread;
  pool->parallel_for_node_ranges(flat, node_bounds, body, 1, chunks_per_thread);
}

}  // namespace dsflash
