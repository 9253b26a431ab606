#include "model/grouped_gemm.h"

#include <algorithm>
#include <cstring>

#include "core/numa_topology.h"
#include "core/thread_pool.h"

namespace dsflash {
namespace {

// Outputs [first, first + count) of a weight: the same bytes from output `first` on, in either order when first
// is a multiple of 16 (a tile-major tile's codes and scales are contiguous, kernels/linear.h).
Fp4Weight output_slice(const Fp4Weight& w, int64_t first, int64_t count) {
  Fp4Weight slice = w;
  slice.packed = w.packed + first * (w.in / 2);
  slice.scales = w.scales + first * (w.in / 32);
  slice.out = count;
  return slice;
}

// A run of one item's tiles in the job's index space: node by node, each node's tiles of every item in item order.
struct Piece {
  int64_t flat_begin = 0;  // its first index in the job
  int64_t tile_begin = 0;  // its first tile in the item's weight
  int64_t tiles = 0;
  size_t item = 0;
};

int64_t tiles_of(const Fp4Weight& w) { return (w.out + kTileMajorOutputs - 1) / kTileMajorOutputs; }

}  // namespace

void grouped_fp4_gemm(std::span<const Fp4GemmItem> items, const ComputeContext& ctx) {
  ThreadPool* pool = ctx.pool;
  ProfileScope profile_scope(ctx.profile, ProfilePhase::kLinear);
  if (pool == nullptr || pool->num_threads() == 1 || items.size() < 2) {
    for (const Fp4GemmItem& item : items) ctx.backend->fp4_gemm(item.x, item.w, item.y, pool);
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
  int64_t most_rows = 0;
  for (int k = 0; k < nodes; ++k) {
    node_bounds[static_cast<size_t>(k)] = flat;
    for (size_t i = 0; i < items.size(); ++i) {
      most_rows = std::max(most_rows, items[i].x.rows);
      // Node k's tiles of this weight, as parallel_for_nodes(tiles, ...) gives them to node k alone.
      const RowRange range = node_row_range(tiles_of(items[i].w), pool->node_first_thread(), k);
      if (range.end <= range.begin) continue;
      pieces[num_pieces++] = Piece{flat, range.begin, range.end - range.begin, i};
      flat += range.end - range.begin;
    }
  }
  node_bounds[static_cast<size_t>(nodes)] = flat;
  const std::span<const Piece> all = pieces.first(num_pieces);

  // Tiles [begin, end) of the job (any range: a thread's chunk, or all of it when run inline).
  auto body = [&](int64_t begin, int64_t end, int thread) {
    auto piece = std::upper_bound(all.begin(), all.end(), begin,
                                  [](int64_t at, const Piece& p) { return at < p.flat_begin; }) - 1;
    for (; piece != all.end() && piece->flat_begin < end; ++piece) {
      const int64_t lo = std::max(begin, piece->flat_begin), hi = std::min(end, piece->flat_begin + piece->tiles);
      if (lo >= hi) continue;
      const Fp4GemmItem& item = items[piece->item];
      const int64_t first = (piece->tile_begin + lo - piece->flat_begin) * kTileMajorOutputs;
      const int64_t count = std::min(item.w.out, (piece->tile_begin + hi - piece->flat_begin) * kTileMajorOutputs) - first;
      const Fp4Weight slice = output_slice(item.w, first, count);
      // Inside the job the kernel's own pool calls run inline on this thread, with its scratch.
      if (item.x.rows == 1) {
        ctx.backend->fp4_gemm(item.x, slice, item.y + first, pool);
        continue;
      }
      ThreadScratch scratch(pool, thread);
      const std::span<float> part = scratch.take<float>(static_cast<size_t>(item.x.rows * count));  // [rows, count]
      ctx.backend->fp4_gemm(item.x, slice, part.data(), pool);
      for (int64_t r = 0; r < item.x.rows; ++r) {
        std::memcpy(item.y + r * item.w.out + first, part.data() + r * count, static_cast<size_t>(count) * sizeof(float));
      }
    }
  };
  // One contiguous run of tiles per thread where the GEMMs are weight reads (decode's few rows), as the kernels
  // cut one GEMM; a few per thread otherwise, to rebalance.
  const int chunks_per_thread = most_rows <= 4 ? 1 : ThreadPool::kChunksPerThread;
  pool->parallel_for_node_ranges(flat, node_bounds, body, 1, chunks_per_thread);
}

}  // namespace dsflash
