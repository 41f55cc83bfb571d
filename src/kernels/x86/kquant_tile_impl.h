// Shared driver of the x86 native K-quant kernels (kquant.h), included by kquant_avx2.cpp and
// kquant_avx512.cpp after they define, per format, a tile kernel
//   struct Tile { static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr,
//                                 float (*out)[kKTile]); };
// which writes the 16 outputs of tile t for activation rows 0..nr-1 (nr <= kKRows) of `a`.
// Everything sits in an anonymous namespace, so each ISA's translation unit compiles its own
// copy with its own flags.
//
// Row blocking: a tile kernel keeps up to kKRows = 8 rows' accumulators across the tile and runs
// its passes of rows per super-block, so a super-block's weights (2304 or 3360 bytes) and its
// decoded scales stay in L1 for every row: decode and 1-8-row verify read each weight byte from
// memory once. With more rows (prefill) tiles are taken in L2-sized chunks and each group of
// 8 rows runs over the chunk while it is in L2.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/kquant.h"
#include "kernels/ops.h"
#include "kernels/q8.h"
#include "kernels/x86/vec_math.h"

namespace {

using mr::kActGroup;
using mr::KFormat;
using mr::kKSuper;
using mr::kKTile;
using mr::KMatrix;
using mr::QActs;

constexpr int kKRows = 8;  // activation rows per tile visit (QActs::kInterleaveRows)
static_assert(kKRows == QActs::kInterleaveRows);
constexpr int64_t kKChunkBytes = 96 * 1024;  // weight bytes per L2-resident chunk of tiles
// Software prefetch distance in the weight stream: mr::kernel_prefetch_bytes (ops.h), chosen at
// start-up by CPU vendor. MR_KPREFETCH=BYTES at compile time fixes it (0: none) for experiments.
#ifdef MR_KPREFETCH
inline int64_t KPrefetchBytes() {
  return MR_KPREFETCH;
}
#else
inline int64_t KPrefetchBytes() {
  return mr::kernel_prefetch_bytes;
}
#endif

// Rows of quantized activations as the tile kernels read them (row r at q + r * cols, ...).
// qi: the interleaved copy (QActs::qi) at row 0 of these rows: the 4 quantized inputs i..i+3
// (i % 4 == 0) of row r are at I(i) + 4 r, so all the rows' broadcasts of one step are at
// constant offsets from one pointer.
struct ActRows {
  const int8_t* q;     // (rows, cols)
  const float* xs;     // (rows, cols / kActGroup)
  const int16_t* s16;  // (rows, cols / 16)
  const float* s32;    // (rows, cols / 32)
  const int8_t* qi;    // QActs::qi at row 0 of these rows
  const float* xf;     // (rows, cols) FP32 (QActs::x; F16 / BF16 kernels), null when not given
  int64_t cols;
  const int8_t* Q(int r) const { return q + r * cols; }
  const float* Xs(int r) const { return xs + r * (cols / kActGroup); }
  const int16_t* S16(int r) const { return s16 + r * (cols / 16); }
  const float* S32(int r) const { return s32 + r * (cols / 32); }
  const int8_t* I(int64_t i) const { return qi + i * QActs::kInterleaveRows; }
  // Row r's quantized inputs i..i+3 (i % 4 == 0) as a pass of R rows reads them: the interleaved
  // copy when 3 or more rows share each step (every row's word at a constant offset from one
  // pointer), the rows' own row-major q in passes of 1 or 2 rows (decode, 2-row verify). There a
  // row's inputs are contiguous, so the rows of a wide matrix (8960 inputs) stay in L1, where the
  // interleaved copy spreads them over 8 times the cache lines: on Zen 4 a 1-row Q4_K pass over
  // 1536x8960 went from 55 % to ~90 % of the memory bandwidth. Row-major for 4-row passes as well
  // helps 4 rows but costs 8 rows (two such passes) ~20 %: too many base registers.
  static constexpr int kRowMajorRows = QActs::kInterleaveMinRows - 1;  // ComputeSums skips qi below
  template <int R>
  const int8_t* X4(int64_t i, int r) const {
    if constexpr (R <= kRowMajorRows) {
      return q + r * cols + i;
    } else {
      return I(i) + 4 * r;
    }
  }
  const float* Xf(int r) const { return xf + r * cols; }
  // Rows r.. of these rows (r + their count <= QActs::kInterleaveRows for the interleaved copy).
  ActRows From(int r) const { return {Q(r), Xs(r), S16(r), S32(r), qi + 4 * r, xf ? Xf(r) : nullptr, cols}; }
};

inline ActRows RowsOf(const QActs& x, int64_t r0) {
  constexpr int64_t kIr = QActs::kInterleaveRows;
  return {x.q.data() + r0 * x.cols,
          x.scales.data() + r0 * (x.cols / kActGroup),
          x.sums16.data() + r0 * (x.cols / 16),
          x.sums32.data() + r0 * (x.cols / 32),
          x.qi.data() + (r0 / kIr) * x.cols * kIr + (r0 % kIr) * 4,
          x.x ? x.x + r0 * x.cols : nullptr,
          x.cols};
}

inline int32_t Load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Prefetches the line KPrefetchBytes() ahead of p (kernels call it once per 64 bytes they read).
inline void PrefetchLine(const uint8_t* p) {
  if (const int64_t d = KPrefetchBytes(); d > 0) _mm_prefetch(reinterpret_cast<const char*>(p + d), _MM_HINT_T0);
}

// Prefetches the 64-byte lines of [p, p + n) KPrefetchBytes() ahead.
inline void PrefetchAhead(const uint8_t* p, int64_t n) {
  const int64_t d = KPrefetchBytes();
  if (d == 0) return;
  for (int64_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + d + i), _MM_HINT_T0);
}

// MXFP4: the 16 doubled E2M1 values plus kMXFP4Offset (u8 in [0, 24]) as a vpshufb table, so a
// nibble becomes an unsigned weight in one byte shuffle; the offset times the activations' sum
// comes off the integer dot product (as Q4_0's 8).
constexpr int kMXFP4Offset = 12;
inline __m128i MXFP4ShuffleTable() {
  alignas(16) static constexpr auto kTable = [] {
    struct {
      uint8_t b[16];
    } t{};
    for (int i = 0; i < 16; ++i) t.b[i] = static_cast<uint8_t>(mr::kMXFP4Values[i] + kMXFP4Offset);
    return t;
  }();
  return _mm_load_si128(reinterpret_cast<const __m128i*>(kTable.b));
}

inline void StoreKTile(const float* out, int64_t rows, int64_t t, float* y) {
  const int64_t o0 = t * kKTile, n = rows - o0 < kKTile ? rows - o0 : kKTile;
  std::memcpy(y + o0, out, static_cast<size_t>(n) * sizeof(float));
}

// g[o] = act(g[o]) * u[o] for the 16 outputs of a tile (64-byte aligned).
inline void GluRow(float* g, const float* u, mr::GluAct act) {
  for (int h = 0; h < kKTile; h += 8) _mm256_store_ps(g + h, Glu8(_mm256_load_ps(g + h), _mm256_load_ps(u + h), act));
}

inline int64_t KChunkTiles(const KMatrix& w, int64_t n_mats) {
  const int64_t per_tile = w.supers() * mr::KBlockBytes(w.format) * n_mats;
  const int64_t c = kKChunkBytes / per_tile;
  return c < 1 ? 1 : c;
}

// Calls visit(t, a, r0, nr) for every tile of [t_begin, t_end) and group of up to kKRows rows
// (a = rows r0.. of x): one streaming pass for <= kKRows rows, L2 chunks of tiles beyond.
template <class Visit>
void ForEachTileRows(const QActs& x, int64_t n_rows, int64_t chunk_tiles, int64_t t_begin, int64_t t_end, Visit visit) {
  const int64_t chunk = n_rows <= kKRows ? t_end - t_begin : chunk_tiles;
  for (int64_t c0 = t_begin; c0 < t_end; c0 += chunk) {
    const int64_t c1 = c0 + chunk < t_end ? c0 + chunk : t_end;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kKRows) {
      const int nr = static_cast<int>(n_rows - r0 < kKRows ? n_rows - r0 : kKRows);
      const ActRows a = RowsOf(x, r0);
      for (int64_t t = c0; t < c1; ++t) visit(t, a, r0, nr);
    }
  }
}

// Tile::RunRows<R>(args...) with R = nr, 1 <= nr <= kKRows: one instantiation per row count, so
// the row loops unroll and the accumulators stay in registers.
template <class Tile, class... Args>
void RunRowsOf(int nr, Args&&... args) {
  static_assert(kKRows == 8);
  switch (nr) {
    case 1:
      return Tile::template RunRows<1>(args...);
    case 2:
      return Tile::template RunRows<2>(args...);
    case 3:
      return Tile::template RunRows<3>(args...);
    case 4:
      return Tile::template RunRows<4>(args...);
    case 5:
      return Tile::template RunRows<5>(args...);
    case 6:
      return Tile::template RunRows<6>(args...);
    case 7:
      return Tile::template RunRows<7>(args...);
    default:
      return Tile::template RunRows<8>(args...);
  }
}

template <class Tile>
void MatmulKTiles(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                  int64_t t_end) {
  alignas(64) float out[kKRows][kKTile];
  ForEachTileRows(x, n_rows, KChunkTiles(w, 1), t_begin, t_end, [&](int64_t t, const ActRows& a, int64_t r0, int nr) {
    Tile::Run(w, t, a, nr, out);
    for (int r = 0; r < nr; ++r) StoreKTile(out[r], w.rows, t, y + (r0 + r) * ldy);
  });
}

template <class Tile>
void MatmulKGluTiles(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, mr::GluAct act, float* y,
                     int64_t ldy, int64_t t_begin, int64_t t_end) {
  alignas(64) float og[kKRows][kKTile];
  alignas(64) float ou[kKRows][kKTile];
  ForEachTileRows(x, n_rows, KChunkTiles(gate, 2), t_begin, t_end,
                  [&](int64_t t, const ActRows& a, int64_t r0, int nr) {
                    Tile::Run(gate, t, a, nr, og);
                    Tile::Run(up, t, a, nr, ou);
                    for (int r = 0; r < nr; ++r) {
                      GluRow(og[r], ou[r], act);
                      StoreKTile(og[r], gate.rows, t, y + (r0 + r) * ldy);
                    }
                  });
}

}  // namespace

// The KernelTable entry points of format Fmt for ISA Isa (kernels_x86.h), over Tile.
#define MR_DEFINE_K_KERNELS(Fmt, Isa, Tile)                                                                       \
  void Matmul##Fmt##Isa(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin, \
                        int64_t t_end) {                                                                          \
    MatmulKTiles<Tile>(w, x, n_rows, y, ldy, t_begin, t_end);                                                     \
  }                                                                                                               \
  void Matmul##Fmt##Glu##Isa(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act,  \
                             float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {                             \
    MatmulKGluTiles<Tile>(gate, up, x, n_rows, act, y, ldy, t_begin, t_end);                                      \
  }
