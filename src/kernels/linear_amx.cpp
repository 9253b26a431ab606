// The multi-row FP8 / MXFP4 GEMM step on Intel AMX tiles (AMX-TILE + AMX-BF16: Sapphire Rapids and later), used by
// the AVX-512 tables for MXFP4 GEMMs of kFp4AmxMinRows rows or more, with GemmArgs::exact_blocks (the tile unit's sum
// serves only where every order gives the same bits, the bf16 chain forms the other blocks), and by the "amx" kernel
// table (linear_avx512.cpp, amx_kernels()) for FP8 GEMMs of every row count.
//
// gemm_tiles_rows converts a chunk of a tile's weights into the scratch [block][pair j] of 16 outputs' bf16 pairs;
// one block of it (16 x 64 bytes) is exactly a TDPBF16PS B tile, and 16 rows of bf16 activations at one block
// (16 x 32 values, row stride k) are its A tile. One TDPBF16PS from a zero tile then leaves the block partials of
// 16 rows x 16 outputs, the work of 256 vdpbf16ps. Numerics (spec/MODEL.md §4.9): each product of bf16 values
// is exact in fp32, so where a block's sum is exact (nearly always) the partial is the reference's; otherwise
// TDPBF16PS sums in an order of its own (it matches neither the pairwise odd-then-even chain of vdpbf16ps nor a
// plain k-order sum on a Xeon measured here). Denormal inputs and outputs flush to zero as in vdpbf16ps, so the
// folding conditions of the AVX-512 path hold unchanged. Then y = y + (partial * sa) * sw per block in K order,
// as rows_chunk does, so a row's result depends only on that row: the table routes every row count here.
//
// Measured on one 2-core Xeon (bench_linear --threads=2, tile-major FP8 wq_b/wo_b and MXFP4 w1/w2 shapes, against
// the "avx512" table): 1.8-2.2x faster at 16 rows, 2.7-3.2x at 64, 3.4-4.0x at 256 and 2048; at 4 rows from 5%
// slower (wo_b) to 1.4x faster (w2); at 1 row 1.4-1.7x slower (wo_b, w2): the tile unit needs the converted weights
// stored and reloaded, vdpbf16ps takes them from registers.
// The tile unit itself runs at only ~0.11 of its peak (~0.72 TFLOP/s of 6.4 on 2 threads): every block partial must
// leave the tile (TILESTORED) to be scaled into y in K order, and the 16-row activation tiles are re-read per
// pass (1 thread, rows 2048: ~0.14 with the scaling skipped, ~0.2 with the tile stores skipped too).
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

#include <algorithm>
#include <array>

#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_impl.h"
#include "kernels/linear_tables.h"

#define DSFLASH_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace dsflash::linear_impl {
namespace {

// Tile registers: C0, C1 (fp32 partials [16 rows, 16 outputs] of the chunk's two weight tiles), A (bf16 [16 rows,
// 32 k]), B0, B1 (the two weight tiles' block, [16 pairs, 16 outputs x 2]). All 16 rows of 64 bytes.
constexpr int kTilesUsed = 5;
constexpr int kTileRows = 16;
static_assert(kTileRows == kTile);

// LDTILECFG's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // CPUID.(7,0):EDX
  return (edx & kAmxBf16) != 0 && (edx & kAmxTile) != 0;
}

// Linux enables the 8 KB tile-data state per process, on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); a process that uses tiles without it dies of SIGILL.
bool os_grants_tile_data() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// The chunk's block partials of weight tile 0 (C0 = A x B0) and tile 1 (C1 = A x B1), each from a zero tile, stored
// to partial[t] (fp32 [16 rows, 16 outputs]). The intrinsics take tile numbers as literals (they are pasted into
// the instruction text): 0, 1 = C0, C1; 2 = A; 3, 4 = B0, B1.
DSFLASH_AMX inline void block_partial_tile0(const __m512i* weights, float (*partial)[kTile]) {
  _tile_loadd(3, weights, 64);
  _tile_zero(0);
  _tile_dpbf16ps(0, 2, 3);
  _tile_stored(0, partial, kTile * sizeof(float));
}
DSFLASH_AMX inline void block_partial_tile1(const __m512i* weights, float (*partial)[kTile]) {
  _tile_loadd(4, weights, 64);
  _tile_zero(1);
  _tile_dpbf16ps(1, 2, 4);
  _tile_stored(1, partial, kTile * sizeof(float));
}

}  // namespace

bool amx_usable() {
  static const bool usable = cpu_has_amx_bf16() && os_grants_tile_data();
  return usable;
}

namespace {
// (GCC applies target attributes to free functions, not to constructors.) The configuration is a constant in
// memory: GCC's _tile_loadconfig tells the compiler it reads only the operand's first 8 bytes, so stores to a
// local one may be dropped as dead.
// Configuration g (1..16): A and C tiles of g rows, B tiles of 16. Fewer than 16 rows in all load and store only
// theirs (rows 1..15: a decode batch); measured at one row against 16-row tiles on the zero padding (bench_linear,
// 2 threads): wo_b 2.34 -> 2.33 ms, w2 0.450 -> 0.421 ms.
constexpr std::array<TileConfig, kTileRows + 1> tile_configs() {
  std::array<TileConfig, kTileRows + 1> configs{};
  for (int g = 1; g <= kTileRows; ++g)
    for (int t = 0; t < kTilesUsed; ++t) {
      configs[g].bytes_per_row[t] = 64;
      configs[g].rows[t] = t == 3 || t == 4 ? kTileRows : g;  // B0, B1 : C0, C1, A
    }
  return configs;
}
constexpr std::array<TileConfig, kTileRows + 1> kTileConfigs = tile_configs();
DSFLASH_AMX void configure_tiles(int group_rows) { _tile_loadconfig(&kTileConfigs[group_rows]); }
DSFLASH_AMX void release_tiles() { _tile_release(); }
}  // namespace

// The peak probe's loop: A (tile 1) and B (tile 2) of bf16 ones (so the sums stay finite), 4 accumulators (0, 3, 4,
// 5) taking 3 TDPBF16PS each per round: more in flight than the unit's latency over its throughput.
DSFLASH_AMX float amx_dot_rounds(int64_t rounds) {
  constexpr TileConfig kProbeConfig = [] {
    TileConfig config;
    for (int t = 0; t < 6; ++t) {
      config.bytes_per_row[t] = 64;
      config.rows[t] = kTileRows;
    }
    return config;
  }();
  alignas(64) static constexpr std::array<uint16_t, kTileRows * 32> kOnes = [] {
    std::array<uint16_t, kTileRows * 32> ones{};
    ones.fill(0x3f80);  // bf16 1.0
    return ones;
  }();
  alignas(64) float out[kTileRows][kTile];
  _tile_loadconfig(&kProbeConfig);
  _tile_loadd(1, kOnes.data(), 64);
  _tile_loadd(2, kOnes.data(), 64);
  _tile_zero(0);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t i = 0; i < rounds; ++i)
    for (int step = 0; step < 3; ++step) {
      _tile_dpbf16ps(0, 1, 2);
      _tile_dpbf16ps(3, 1, 2);
      _tile_dpbf16ps(4, 1, 2);
      _tile_dpbf16ps(5, 1, 2);
    }
  _tile_stored(5, out, sizeof(out[0]));
  _tile_release();
  return out[0][0];
}

AmxTiles::AmxTiles(int64_t rows) { configure_tiles(static_cast<int>(std::clamp<int64_t>(rows, 1, kTileRows))); }
AmxTiles::~AmxTiles() { release_tiles(); }

DSFLASH_AMX void amx_rows_chunk(const TileScratch* scratch, int nt, int nb, const float (*const* sw)[kTile],
                                const uint16_t* act, int64_t k, const uint8_t* sa, int64_t kb, float* y, int64_t out,
                                int64_t rows, bool first, const __mmask16* masks, BlockScales scales,
                                const uint8_t* exact_blocks) {
  const float* e8m0 = linear_decode_tables().e8m0_f32;
  // C tiles of two blocks: block b's are formed while block b - 1's are scaled into y (reading a tile store back
  // waits for it to complete; this way the tile unit runs ahead of the scaling instead of in turn with it).
  alignas(64) float partial[2][kAmxTilesPerPass][kTileRows][kTile];
  alignas(64) float ybuf[kTileRows][kAmxTilesPerPass][kTile];  // y of the 16 rows, in L1 for the chunk
  const int64_t a_stride = k * static_cast<int64_t>(sizeof(uint16_t));
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int m = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
    const uint16_t* a = act + r0 * k;  // 16 rows, the last 16 - m of them ignored
    for (int i = 0; i < m; ++i)
      for (int t = 0; t < nt; ++t) {
        const float* src = y + (r0 + i) * out + t * kTile;
        _mm512_store_ps(ybuf[i][t], first                ? _mm512_setzero_ps()
                                    : masks[t] == 0xffff ? _mm512_loadu_ps(src)
                                                         : _mm512_maskz_loadu_ps(masks[t], src));
      }
    // Block b's partials of the rows whose block may sum inexactly (exact_blocks), every tile, by rows_chunk's
    // vdpbf16ps chain (16 pairs in j order from a zero accumulator) over the same scratch, in place of the tile
    // unit's: the bits of the bf16 chain. Up to eight chains at a time, so that their latencies overlap.
    auto chain_inexact_blocks = [&](int b) DSFLASH_AMX {
      struct Chain {
        const __m512i* weights;  // the block's 16 pair vectors
        const uint16_t* pairs;   // the row's 32 bf16 activations of the block
        float* partial;
      };
      Chain chains[kTileRows * kAmxTilesPerPass];
      int count = 0;
      for (int i = 0; i < m; ++i)
        if (exact_blocks[(r0 + i) * kb + b] == 0)
          for (int t = 0; t < nt; ++t) chains[count++] = {scratch[t] + 16 * b, a + i * k + 32 * b, partial[b % 2][t][i]};
      // N chains at once from chains[c0]: groups of 8, then pairs, then one.
      auto run_chains = [&]<int N>(int c0) DSFLASH_AMX {
        __m512 acc[N];
        for (int q = 0; q < N; ++q) acc[q] = _mm512_setzero_ps();
        for (int j = 0; j < 16; ++j)
          for (int q = 0; q < N; ++q)
            acc[q] = _mm512_dpbf16_ps(acc[q], (__m512bh)_mm512_load_si512(chains[c0 + q].weights + j),
                                      (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(chains[c0 + q].pairs + 2 * j)));
        for (int q = 0; q < N; ++q) _mm512_store_ps(chains[c0 + q].partial, acc[q]);
      };
      int c0 = 0;
      for (; c0 + 8 <= count; c0 += 8) run_chains.template operator()<8>(c0);
      for (; c0 + 2 <= count; c0 += 2) run_chains.template operator()<2>(c0);
      if (c0 < count) run_chains.template operator()<1>(c0);
    };
    // y = y + (partial * sa) * sw of block b (blocks in K order).
    auto scale_into_y = [&](int b) DSFLASH_AMX {
      if (exact_blocks != nullptr) chain_inexact_blocks(b);
      for (int i = 0; i < m; ++i) {
        const __m512 row_scale = _mm512_set1_ps(e8m0[sa[(r0 + i) * kb + b]]);
        for (int t = 0; t < nt; ++t) {
          __m512 p = _mm512_load_ps(partial[b % 2][t][i]);
          if (scales == BlockScales::kActAndWeight) p = _mm512_mul_ps(p, row_scale);
          if (scales != BlockScales::kNone) p = _mm512_mul_ps(p, _mm512_load_ps(sw[t][b]));
          _mm512_store_ps(ybuf[i][t], _mm512_add_ps(_mm512_load_ps(ybuf[i][t]), p));
        }
      }
    };
    for (int b = 0; b < nb; ++b) {
      _tile_loadd(2, a + 32 * b, a_stride);  // A, for every weight tile of the pass
      for (int t = 0; t < nt; t += 2) {
        block_partial_tile0(scratch[t] + 16 * b, partial[b % 2][t]);
        if (t + 1 < nt) block_partial_tile1(scratch[t + 1] + 16 * b, partial[b % 2][t + 1]);
      }
      if (b > 0) scale_into_y(b - 1);
    }
    scale_into_y(nb - 1);
    for (int i = 0; i < m; ++i)
      for (int t = 0; t < nt; ++t) {
        float* dst = y + (r0 + i) * out + t * kTile;
        if (masks[t] == 0xffff) _mm512_storeu_ps(dst, _mm512_load_ps(ybuf[i][t]));
        else _mm512_mask_storeu_ps(dst, masks[t], _mm512_load_ps(ybuf[i][t]));
      }
  }
}

}  // namespace dsflash::linear_impl
