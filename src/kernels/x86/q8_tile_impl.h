// Shared body of the x86 Q8/g64 tile kernels, included by matmul_avx2.cpp and
// matmul_avx512.cpp after they define the ISA-specific pieces:
//   struct Isa { static __m256i Dot(__m256i acc, __m256i sw, __m256i ax); };
// (acc += per-lane sums of 4 products of u8 ax = |x| and s8 sw = sign(w, x); with |x|, |w| <= 127
// each product equals w*x and no intermediate saturates).
// Everything here sits in an anonymous namespace, so each ISA's translation unit gets its own
// copy compiled with its own flags (no inline function is shared across ISA files).
//
// Packed layout (q8.h): a 32-byte chunk holds 4 inputs for the 8 outputs of a tile, so
// broadcasting 4 activation bytes and Dot-ing gives 8 per-output partial sums in 8 lanes.
// Per (tile, activation group): int32 lane sums, then one FMA per activation row:
// acc[r] += float(isum[r]) * (wscale[8 lanes] * xscale[r, activation group]).  FP32 accumulation.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/q8.h"
#include "kernels/x86/vec_math.h"

namespace {

using mr::kActGroup;
using mr::kQ8Block;
using mr::kQ8Group;
using mr::kQ8Tile;
using mr::QMatrix;

constexpr int kPassRows = 4;  // activation rows per pass over a tile
#ifndef MR_PREFETCH
#define MR_PREFETCH 4096
#endif
constexpr int64_t kPrefetchBytes = MR_PREFETCH;  // software prefetch distance in the weight stream
constexpr int64_t kChunkBytes = 96 * 1024;       // weight bytes per L2-resident chunk of tiles

inline __m256 LoadScales8(const uint16_t* s) {
  return LoadBf16x8(s);
}
inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc[r] (8 outputs of tile t) += rows r of x · tile t, for R activation rows.
template <class Isa, int R>
inline void TilePass(const QMatrix& w, int64_t t, const int8_t* xq, int64_t cols, const float* xs, __m256* acc) {
  const int64_t groups = cols / kQ8Group, agroups = cols / kActGroup;
  const int8_t* blk = w.block(t, 0);
  const uint16_t* sc = w.block_scales(t, 0);
  for (int64_t g = 0; g < groups; ++g, blk += kQ8Block, sc += kQ8Tile) {
    __m256i isum[R];
    // |x| of this group's activations, once per (tile, group) for all 16 chunks: the dot
    // products take |x| (u8) times sign(w, x) (s8), which equals w*x exactly.
    alignas(32) int8_t ax[R][kQ8Group];
    const int8_t* xg = xq + g * kQ8Group;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + r * cols + 32 * h));
        _mm256_store_si256(reinterpret_cast<__m256i*>(ax[r] + 32 * h), _mm256_abs_epi8(v));
      }
    }
    const __m256 ws = LoadScales8(sc);
    constexpr int kChunks = 16 / mr::kActPerWeightGroup;         // 32-byte chunks per activation group
    for (int half = 0; half < mr::kActPerWeightGroup; ++half) {  // activation groups of weight group g
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 16
      for (int k = kChunks * half; k < kChunks * (half + 1); ++k) {
        if (kPrefetchBytes > 0 && (k & 1) == 0)
          _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 32 * k), _MM_HINT_T0);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * k));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i xb = _mm256_set1_epi32(Load4(xg + r * cols + 4 * k));
          const __m256i xa = _mm256_set1_epi32(Load4(ax[r] + 4 * k));
          isum[r] = Isa::Dot(isum[r], _mm256_sign_epi8(wv, xb), xa);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(ws, _mm256_set1_ps(xs[r * agroups + mr::kActPerWeightGroup * g + half]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), s, acc[r]);
      }
    }
  }
}

template <class Isa>
inline void TileRows(const QMatrix& w, int64_t t, const int8_t* xq, const float* xs, int nr, __m256* acc) {
  const int64_t cols = w.cols;
  for (int r = 0; r < nr; ++r) acc[r] = _mm256_setzero_ps();
  switch (nr) {
    case 1:
      TilePass<Isa, 1>(w, t, xq, cols, xs, acc);
      break;
    case 2:
      TilePass<Isa, 2>(w, t, xq, cols, xs, acc);
      break;
    case 3:
      TilePass<Isa, 3>(w, t, xq, cols, xs, acc);
      break;
    default:
      TilePass<Isa, 4>(w, t, xq, cols, xs, acc);
      break;
  }
}

inline void StoreTile(__m256 v, const QMatrix& w, int64_t t, float* y) {
  const int64_t o0 = t * kQ8Tile;
  if (o0 + kQ8Tile <= w.rows) {
    _mm256_storeu_ps(y + o0, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int64_t o = o0; o < w.rows; ++o) y[o] = tmp[o - o0];
  }
}

inline int64_t ChunkTiles(int64_t cols, int64_t n_mats) {
  const int64_t per_tile = kQ8Tile * cols * n_mats;
  const int64_t c = kChunkBytes / per_tile;
  return c < 1 ? 1 : c;
}

// Tiles in L2-sized chunks; inside a chunk, passes of up to 4 rows over every tile. With
// <= 4 rows this is a single streaming pass over the weights.
template <class Isa>
void MatmulTiles(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                 int64_t t_begin, int64_t t_end) {
  const int64_t groups = w.cols / kActGroup, chunk = n_rows <= kPassRows ? (t_end - t_begin) : ChunkTiles(w.cols, 1);
  __m256 acc[kPassRows];
  for (int64_t c0 = t_begin; c0 < t_end; c0 += chunk) {
    const int64_t c1 = c0 + chunk < t_end ? c0 + chunk : t_end;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPassRows) {
      const int nr = static_cast<int>(n_rows - r0 < kPassRows ? n_rows - r0 : kPassRows);
      for (int64_t t = c0; t < c1; ++t) {
        TileRows<Isa>(w, t, xq + r0 * w.cols, xs + r0 * groups, nr, acc);
        for (int r = 0; r < nr; ++r) StoreTile(acc[r], w, t, y + (r0 + r) * ldy);
      }
    }
  }
}

template <class Isa>
void MatmulGluTiles(const QMatrix& wg, const QMatrix& wu, const int8_t* xq, const float* xs, int64_t n_rows,
                    mr::GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {
  const int64_t groups = wg.cols / kActGroup, chunk = n_rows <= kPassRows ? (t_end - t_begin) : ChunkTiles(wg.cols, 2);
  __m256 ag[kPassRows], au[kPassRows];
  for (int64_t c0 = t_begin; c0 < t_end; c0 += chunk) {
    const int64_t c1 = c0 + chunk < t_end ? c0 + chunk : t_end;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPassRows) {
      const int nr = static_cast<int>(n_rows - r0 < kPassRows ? n_rows - r0 : kPassRows);
      for (int64_t t = c0; t < c1; ++t) {
        TileRows<Isa>(wg, t, xq + r0 * wg.cols, xs + r0 * groups, nr, ag);
        TileRows<Isa>(wu, t, xq + r0 * wg.cols, xs + r0 * groups, nr, au);
        for (int r = 0; r < nr; ++r) StoreTile(Glu8(ag[r], au[r], act), wg, t, y + (r0 + r) * ldy);
      }
    }
  }
}

}  // namespace
