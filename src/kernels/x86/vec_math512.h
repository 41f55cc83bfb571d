// Small AVX-512 helpers shared by the AVX-512, AVX-512 BF16 and AMX attention kernels (anonymous
// namespace, like vec_math.h: each translation unit compiles its own copy with its own flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/x86/vec_math.h"

namespace {

// exp of 16 lanes: vec_math.h's Exp8 in 512-bit registers, the same operations in the same order,
// so the same results bit for bit at half the instructions.
inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// SoftCap8 (vec_math.h) on 16 lanes.
inline __m512 SoftCap16(__m512 x, float cap) {
  const __m256 lo = SoftCap8(_mm512_castps512_ps256(x), cap);
  const __m256 hi = SoftCap8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)), cap);
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// In-place transpose of a 16 x 16 matrix of 32-bit words (r[j] lane i -> r[i] lane j): 32-bit
// and 64-bit interleaves inside 128-bit lanes, then a 4 x 4 transpose of the 128-bit lanes.
[[gnu::always_inline]] inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);  // lane L: r[j][4L], r[j+1][4L], r[j][4L+1], r[j+1][4L+1]
    t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: u[4g + e] lane L = column 4L + e of those rows
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {  // column 4L + e = lane L of u[e], u[4 + e], u[8 + e], u[12 + e]
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// The 16 K pair words (dims i0 + 2p, i0 + 2p + 1, p < 16) of the 16 positions k + j * stride,
// j < 16, transposed: r[p] lane j = position j's pair p. Positions outside [j0, j1) are zero and
// never read from memory (the attention kernels' block edges).
[[gnu::always_inline]] inline void LoadKPairs16(const uint16_t* k, int64_t stride, int64_t i0, int64_t j0, int64_t j1,
                                                __m512i r[16]) {
#pragma GCC unroll 16
  for (int64_t j = 0; j < 16; ++j)
    r[j] = j >= j0 && j < j1 ? _mm512_loadu_si512(k + j * stride + i0) : _mm512_setzero_si512();
  Transpose16x16(r);
}

// Bit j set for the positions j < 32 of a block that a row reads, given the row's [lo, hi)
// relative to the block's start (lo < 32, hi > 0).
inline uint32_t BlockMask32(int64_t lo, int64_t hi) {
  const uint32_t below_hi = hi >= 32 ? 0xFFFFFFFFu : (1u << hi) - 1;
  const uint32_t from_lo = lo <= 0 ? 0xFFFFFFFFu : ~((1u << lo) - 1);
  return below_hi & from_lo;
}

// The BF16 kernels' block of 32 cache positions (b0..b0+31) in pair words, 64-byte rows of 16
// words, tiles of 16 rows (kKvTileWords):
//   - K: tile (c, h) (kb + (2c + h) * kKvTileWords) holds dims 32c..32c+31 of positions
//     16h..16h+15, row i the pair (32c + 2i, 32c + 2i + 1) of each position (the VNNI layout of
//     an AMX B tile: a row is one dim pair of 16 positions, a vdpbf16ps operand);
//   - V: tile e (vb + e * kKvTileWords) holds dims 16e..16e+15, row k the pairs (V[2k][d],
//     V[2k + 1][d]) (a position pair of 16 dims).
// Positions outside [j0, j1) are zero (never read from memory). kb and vb: 64-byte aligned, hd / 16
// tiles each.
constexpr int64_t kKvTileWords = 256;
inline void LoadKvBlockPairs(const mr::AttnChunk& a, int64_t b0, int64_t j0, int64_t j1, uint32_t* kb, uint32_t* vb) {
  const int64_t hd = a.hd;
  const uint16_t* kp = a.k + b0 * a.kv_stride;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i0 = 0; i0 < hd; i0 += 32) {
      __m512i r[16];
      LoadKPairs16(kp + 16 * h * a.kv_stride, a.kv_stride, i0, j0 - 16 * h, j1 - 16 * h, r);
      uint32_t* tile = kb + (2 * (i0 / 32) + h) * kKvTileWords;
#pragma GCC unroll 16
      for (int64_t i = 0; i < 16; ++i) _mm512_store_si512(tile + 16 * i, r[i]);
    }
  }
  // Word 2k of lo = x0[k], 2k + 1 = x1[k]; hi the same for k + 16 (index bit 5 picks x1).
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  const uint16_t* vp = a.v + b0 * a.kv_stride;
  for (int64_t k = 0; k < 16; ++k) {
    const int64_t j = 2 * k;
    const bool in0 = j >= j0 && j < j1, in1 = j + 1 >= j0 && j + 1 < j1;
    const uint16_t* v0 = vp + j * a.kv_stride;
    const uint16_t* v1 = v0 + a.kv_stride;
    for (int64_t d = 0; d < hd; d += 32) {
      const __m512i x0 = in0 ? _mm512_loadu_si512(v0 + d) : _mm512_setzero_si512();
      const __m512i x1 = in1 ? _mm512_loadu_si512(v1 + d) : _mm512_setzero_si512();
      _mm512_store_si512(vb + (d / 16) * kKvTileWords + 16 * k, _mm512_permutex2var_epi16(x0, lo_idx, x1));
      _mm512_store_si512(vb + (d / 16 + 1) * kKvTileWords + 16 * k, _mm512_permutex2var_epi16(x0, hi_idx, x1));
    }
  }
}

}  // namespace
