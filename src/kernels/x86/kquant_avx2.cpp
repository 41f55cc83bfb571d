// AVX2 kernels of the native K-quant formats (kquant.h), for CPUs without AVX-512 VNNI. A tile
// of 16 outputs is two halves of 8: half h reads bytes [32h, 32h + 32) of every 64-byte chunk
// (rows 8h..8h+7), with the 8 outputs in the 8 lanes of one register. Both halves run per
// super-block, so the block is read from memory once. Compiled with -mavx2 -mfma -mf16c.
//
// Q4_K (and Q5_K, with a fifth bit): vpmaddubsw (u8 nibbles x s8 activations; a pair of products <= 2 * 15 * 127)
// summed in int16 over a 32-input sub-block (8 of them: <= 30480, no overflow), then vpmaddwd by the (sc, sc) pair
// gives sc * sum in int32: the 6-bit scale costs no FP op. The minimum term dmin * m * sum(x) uses the activation sums
// (QActs::sums32). Q6_K: 6-bit quants as u8 in [0, 63]; vpmaddubsw, then vpmaddwd by the int8 sub-block scale pair; the
// -32 offset is 32 * sc * sum(x) per sub-block (QActs::sums16), also with vpmaddwd.
// Every loop over rows carries `#pragma GCC unroll`: one loop left rolled (NibbleDots' final sum)
// made GCC keep the rows' accumulators in memory, and Q4_0 / Q4_1 ran 8 rows at half speed.
#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/kquant_tile_impl.h"

namespace {

constexpr int kPass = 4;  // activation rows per pass over a half super-block

inline __m256i Bcast4(const void* p) {
  return _mm256_set1_epi32(Load4(p));
}

// 8 int8 -> 8 int32.
inline __m256i WidenS8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// ---------------------------------------------------------------------------------------------
// Q4_K

struct Q4KHalf {
  __m256 d;
  __m256i scp[8];  // (sc, sc) pairs per sub-block
  __m256 dmm[8];   // dmin * min per sub-block
};

// Q4_K, and Q5_K (kFifth) whose quants add a fifth bit from qh (bits 2k and 2k + 1 of qh byte
// l for inputs l and 32 + l of 64-input group k; chunk c of the tile's qh holds qh[4c..+3]).
// Scales of rows 8h..8h+7 of a tile block (ggml get_scale_min_k4 on 8 rows at a time).
template <bool kFifth>
struct K4 {
  static constexpr KFormat kFormat = kFifth ? KFormat::kQ5K : KFormat::kQ4K;
  static constexpr int kQuantsAt = kFifth ? 768 : 256;  // d, dmin, scales (and qh), before the quants
  using Scales = Q4KHalf;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, int h, Q4KHalf* m) {
    m->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * h)));
    __m128i p[12];
    for (int j = 0; j < 12; ++j) p[j] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j + 8 * h));
    const __m128i m63 = _mm_set1_epi8(63), m0f = _mm_set1_epi8(0x0F), m30 = _mm_set1_epi8(0x30);
    for (int j = 0; j < 8; ++j) {
      __m128i sc, mn;
      if (j < 4) {
        sc = _mm_and_si128(p[j], m63);
        mn = _mm_and_si128(p[j + 4], m63);
      } else {
        sc = _mm_or_si128(_mm_and_si128(p[j + 4], m0f), _mm_and_si128(_mm_srli_epi16(p[j - 4], 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(p[j + 4], 4), m0f), _mm_and_si128(_mm_srli_epi16(p[j], 2), m30));
      }
      const __m256i s32 = _mm256_cvtepu8_epi32(sc);
      m->scp[j] = _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));
      m->dmm[j] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    }
  }

  // Half h of super-block s against rows 0..R-1 of a: acc[r] += the scaled dot products minus
  // the minimum terms.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const Q4KHalf& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    for (int k = 0; k < 4; ++k) {
      const uint8_t* q = blk + kQuantsAt + 512 * k + 32 * h;
      const int64_t i0 = s * kKSuper + 64 * k;
      // int16 sums per sub-block: Q4_K's 8 chunks stay below 2^15 (8 * 2 * 15 * 127), Q5_K's
      // (<= 2 * 31 * 127 each) go to int32 after 4 chunks.
      __m256i slo[R], shi[R], plo[R], phi[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) slo[r] = shi[r] = plo[r] = phi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
        __m256i lo = _mm256_and_si256(v, m0f);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
        if constexpr (kFifth) {  // bits 2k, 2k + 1 of each qh byte to bit 4 (16-bit shifts, byte masks)
          const __m256i qh = _mm256_srli_epi16(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 256 + 64 * c + 32 * h)), 2 * k);
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), m10));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), m10));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          slo[r] = _mm256_add_epi16(slo[r], _mm256_maddubs_epi16(lo, Bcast4(a.template X4<R>(i0 + 4 * c, r))));
          shi[r] = _mm256_add_epi16(shi[r], _mm256_maddubs_epi16(hi, Bcast4(a.template X4<R>(i0 + 32 + 4 * c, r))));
        }
        if constexpr (kFifth) {
          if (c == 3) {
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
              plo[r] = _mm256_madd_epi16(slo[r], m.scp[2 * k]);
              phi[r] = _mm256_madd_epi16(shi[r], m.scp[2 * k + 1]);
              slo[r] = shi[r] = _mm256_setzero_si256();
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float* xs = a.Xs(r);
        __m256i ilo = _mm256_madd_epi16(slo[r], m.scp[2 * k]), ihi = _mm256_madd_epi16(shi[r], m.scp[2 * k + 1]);
        if constexpr (kFifth) {
          ilo = _mm256_add_epi32(ilo, plo[r]);
          ihi = _mm256_add_epi32(ihi, phi[r]);
        }
        if constexpr (kActGroup == 64) {
          const __m256 ds = _mm256_mul_ps(m.d, _mm256_set1_ps(xs[i0 / kActGroup]));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(ilo, ihi)), ds, acc[r]);
        } else {
          acc[r] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(ilo), _mm256_mul_ps(m.d, _mm256_set1_ps(xs[i0 / kActGroup])), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ihi), _mm256_mul_ps(m.d, _mm256_set1_ps(xs[i0 / kActGroup + 1])),
                                   acc[r]);
        }
        const float* s32 = a.S32(r) + i0 / 32;
        acc[r] = _mm256_fnmadd_ps(m.dmm[2 * k], _mm256_set1_ps(s32[0]), acc[r]);
        acc[r] = _mm256_fnmadd_ps(m.dmm[2 * k + 1], _mm256_set1_ps(s32[1]), acc[r]);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q6_K

constexpr int kQ6Acc = kActGroup == 64 ? 2 : 4;  // int accumulators per row and 128-input half

struct Q6KHalf {
  __m256 d;
  __m256i scp[16];  // (sc, sc) int16 pairs per sub-block
  __m256i offp[8];  // (sc[2p], sc[2p+1]) pairs
};

struct Q6K {
  static constexpr KFormat kFormat = KFormat::kQ6K;
  using Scales = Q6KHalf;

  static void Decode(const uint8_t* blk, int h, Q6KHalf* m) {
    m->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    __m256i v[16];
    for (int j = 0; j < 16; ++j) {
      v[j] = WidenS8(blk + 32 + 16 * j + 8 * h);
      m->scp[j] = _mm256_or_si256(_mm256_and_si256(v[j], lo16), _mm256_slli_epi32(v[j], 16));
    }
    for (int p = 0; p < 8; ++p)
      m->offp[p] = _mm256_or_si256(_mm256_and_si256(v[2 * p], lo16), _mm256_slli_epi32(v[2 * p + 1], 16));
  }

  // Half h of super-block s against rows 0..R-1 of a: acc[r] += the scaled dot products.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const Q6KHalf& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {
      const int64_t i0 = s * kKSuper + 128 * n;
      __m256i iacc[kQ6Acc][R];
      for (int j = 0; j < kQ6Acc; ++j) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) iacc[j][r] = _mm256_setzero_si256();
      }
#pragma GCC unroll 2
      for (int c = 0; c < 8; ++c) {
        const uint8_t* g = blk + 288 + (8 * n + c) * 192 + 32 * h;
        const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
        const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 64));
        const __m256i vh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 128));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(va, m0f), _mm256_and_si256(_mm256_slli_epi16(vh, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(vb, m0f), _mm256_and_si256(_mm256_slli_epi16(vh, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(va, 4), m0f), _mm256_and_si256(vh, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(vb, 4), m0f),
                               _mm256_and_si256(_mm256_srli_epi16(vh, 2), m30));
        const int sub = 8 * n + c / 4;
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
          for (int mm = 0; mm < 4; ++mm) {
            const __m256i p = _mm256_maddubs_epi16(q[mm], Bcast4(a.template X4<R>(i0 + 32 * mm + 4 * c, r)));
            __m256i& ia = iacc[mm * kQ6Acc / 4][r];
            ia = _mm256_add_epi32(ia, _mm256_madd_epi16(p, m.scp[sub + 2 * mm]));
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int16_t* s16 = a.S16(r) + i0 / 16;
        __m256i off[kQ6Acc];
        for (int j = 0; j < kQ6Acc; ++j) off[j] = _mm256_setzero_si256();
        for (int mm = 0; mm < 4; ++mm) {
          off[mm * kQ6Acc / 4] =
              _mm256_add_epi32(off[mm * kQ6Acc / 4], _mm256_madd_epi16(m.offp[4 * n + mm], Bcast4(s16 + 2 * mm)));
        }
        const float* xs = a.Xs(r);
        for (int j = 0; j < kQ6Acc; ++j) {
          const __m256i v = _mm256_sub_epi32(iacc[j][r], _mm256_slli_epi32(off[j], 5));
          const __m256 ds = _mm256_mul_ps(m.d, _mm256_set1_ps(xs[(i0 + j * (128 / kQ6Acc)) / kActGroup]));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), ds, acc[r]);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q5_0 and Q4_1: 32-input blocks, one f16 d per (row, block)

// Bits 0..3 of each lane of t at bit 4 of its bytes 0..3: t * (2^4 + 2^11 + 2^18 + 2^25) puts
// copies of the 4 bits at 4, 11, 18 and 25 without overlap, the mask keeps bits 4, 12, 20, 28.
inline __m256i FifthBits(__m256i t) {
  const __m256i x = _mm256_and_si256(t, _mm256_set1_epi32(0xF));
  return _mm256_and_si256(_mm256_mullo_epi32(x, _mm256_set1_epi32(0x02040810)), _mm256_set1_epi32(0x10101010));
}

struct Q50Half {
  __m256 d;
  __m256i qh;
};

struct Q50 {
  static constexpr KFormat kFormat = KFormat::kQ5_0;
  using Scales = Q50Half;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, int h, Q50Half* m) {
    m->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    m->qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * h));
  }

  // vpmaddubsw of the 5-bit quants (u8 <= 31) summed in int16 over the block's 4 chunks
  // (<= 4 * 2 * 31 * 127, no overflow), then vpmaddwd by ones; the -16 offset uses sums32.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const Q50Half& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const int64_t i0 = s * mr::kKBlock32;
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    __m256i slo[R], shi[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) slo[r] = shi[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 96 + 64 * c + 32 * h));
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m0f), FifthBits(_mm256_srli_epi32(m.qh, 4 * c)));
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m0f),
                                         FifthBits(_mm256_srli_epi32(m.qh, 16 + 4 * c)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        slo[r] = _mm256_add_epi16(slo[r], _mm256_maddubs_epi16(lo, Bcast4(a.template X4<R>(i0 + 4 * c, r))));
        shi[r] = _mm256_add_epi16(shi[r], _mm256_maddubs_epi16(hi, Bcast4(a.template X4<R>(i0 + 16 + 4 * c, r))));
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(slo[r], ones), _mm256_madd_epi16(shi[r], ones));
      const __m256 f = _mm256_fmsub_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(a.Xs(r)[i0 / kActGroup]),
                                       _mm256_set1_ps(16 * a.S32(r)[i0 / 32]));
      acc[r] = _mm256_fmadd_ps(f, m.d, acc[r]);
    }
  }
};

// Rows 0..R-1's int32 dot products of one half of a 32-input block's nibbles (4 chunks of 64
// bytes from q, this half's 32 bytes of each: low nibbles inputs 4c..+3, high 16 + 4c..+3) with
// their activations: vpmaddubsw summed in int16 over the block (<= 8 * 2 * 15 * 127, no overflow),
// then vpmaddwd by ones. Q4_1 and Q4_0.
template <int R>
[[gnu::always_inline]] inline void NibbleDots(const uint8_t* q, const ActRows& a, int64_t i0, __m256i* dot) {
  const __m256i m0f = _mm256_set1_epi8(0x0F);
  __m256i sum16[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sum16[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
    const __m256i lo = _mm256_and_si256(v, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      sum16[r] = _mm256_add_epi16(sum16[r], _mm256_maddubs_epi16(lo, Bcast4(a.template X4<R>(i0 + 4 * c, r))));
      sum16[r] = _mm256_add_epi16(sum16[r], _mm256_maddubs_epi16(hi, Bcast4(a.template X4<R>(i0 + 16 + 4 * c, r))));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = _mm256_madd_epi16(sum16[r], ones);
}

struct Q41Half {
  __m256 d;
  __m256 m;
};

struct Q41 {
  static constexpr KFormat kFormat = KFormat::kQ4_1;
  using Scales = Q41Half;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, int h, Q41Half* m) {
    m->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
    m->m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * h)));
  }

  // The nibbles' dot products (NibbleDots); the block minimum adds m * sums32.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const Q41Half& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const int64_t i0 = s * mr::kKBlock32;
    __m256i dot[R];
    NibbleDots<R>(blk + 64 + 32 * h, a, i0, dot);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_set1_ps(a.Xs(r)[i0 / kActGroup]));
      acc[r] = _mm256_fmadd_ps(f, m.d, acc[r]);
      acc[r] = _mm256_fmadd_ps(m.m, _mm256_set1_ps(a.S32(r)[i0 / 32]), acc[r]);
    }
  }
};

// Q8_0 and Q4_0: one f16 d per (row, block) and an exact int32 dot product per block.
// Q8_0's quants are signed, so vpmaddubsw takes |w| (u8, once per chunk) against sign(x, w)
// (per row): a pair of products <= 2 * 128 * 127 fits int16, and vpmaddwd by ones widens each
// chunk to int32. Q4_0's nibbles go as Q4_1's; ggml's -8 offset is 8 * sum(x) in the integer sum
// (QActs::sums16 of the block's two halves).

struct D16Half {
  __m256 d;
};

// acc += d * xs * (sum - kOffset * sum(x)) for row r's block at input i0.
template <int kOffset>
[[gnu::always_inline]] inline __m256 ScaleBlock(__m256i sum, const ActRows& a, int r, int64_t i0, __m256 d,
                                                __m256 acc) {
  if constexpr (kOffset != 0) {
    const int16_t* s16 = a.S16(r) + i0 / 16;
    sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(kOffset * (int32_t{s16[0]} + int32_t{s16[1]})));
  }
  const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(a.Xs(r)[i0 / kActGroup]));
  return _mm256_fmadd_ps(f, d, acc);
}

// Q8_0 and Q4_0's block head: the f16 d of rows 8h..8h+7.
struct D16Block {
  using Scales = D16Half;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, int h, D16Half* m) {
    m->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
  }
};

struct Q80 : D16Block {
  static constexpr KFormat kFormat = KFormat::kQ8_0;

  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const D16Half& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const int64_t i0 = s * mr::kKBlock32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i isum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 64 * c + 32 * h));
      const __m256i aw = _mm256_abs_epi8(v);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Bcast4(a.template X4<R>(i0 + 4 * c, r)), v));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = ScaleBlock<0>(isum[r], a, r, i0, m.d, acc[r]);
  }
};

struct Q40 : D16Block {
  static constexpr KFormat kFormat = KFormat::kQ4_0;

  // The nibbles as Q4_1's; the -8 offset in the integer sum.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const D16Half& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const int64_t i0 = s * mr::kKBlock32;
    __m256i dot[R];
    NibbleDots<R>(blk + 32 + 32 * h, a, i0, dot);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = ScaleBlock<8>(dot[r], a, r, i0, m.d, acc[r]);
  }
};

// MXFP4: the nibbles through MXFP4ShuffleTable (vpshufb) to u8 weights kvalue + 12 in [0, 24];
// vpmaddubsw summed in int16 over the block's 4 chunks of low and of high nibbles apart (each
// <= 4 * 2 * 24 * 127, no overflow; all 8 together could reach 48768), vpmaddwd by ones, then
// the offset 12 * sum(x) and one FP step as Q4_0 with d = 2^(e - 128).

// 2^(e - 128) for rows 8h..8h+7's E8M0 bytes at e (E8M0Half): (e - 1) << 23 as float bits for
// e >= 2, the subnormals 0x200000 << e for e = 0, 1.
inline __m256 E8M0Half8(const uint8_t* e) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
  const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v)));
}

struct MXFP4 {
  static constexpr KFormat kFormat = KFormat::kMXFP4;
  using Scales = D16Half;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, int h, D16Half* m) { m->d = E8M0Half8(blk + 8 * h); }

  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, int h, const D16Half& m, const ActRows& a, int64_t s,
                                          __m256* acc) {
    const int64_t i0 = s * mr::kKBlock32;
    const __m256i m0f = _mm256_set1_epi8(0x0F), table = _mm256_broadcastsi128_si256(MXFP4ShuffleTable());
    __m256i slo[R], shi[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) slo[r] = shi[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 64 * c + 32 * h));
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m0f));
      const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        slo[r] = _mm256_add_epi16(slo[r], _mm256_maddubs_epi16(lo, Bcast4(a.template X4<R>(i0 + 4 * c, r))));
        shi[r] = _mm256_add_epi16(shi[r], _mm256_maddubs_epi16(hi, Bcast4(a.template X4<R>(i0 + 16 + 4 * c, r))));
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(slo[r], ones), _mm256_madd_epi16(shi[r], ones));
      acc[r] = ScaleBlock<kMXFP4Offset>(sum, a, r, i0, m.d, acc[r]);
    }
  }
};

// The tile kernel of format F (Q4K, Q6K, ...): up to kKRows rows with their accumulators (two
// halves of 8 outputs each) kept over the whole tile, in registers where the 16 ymm allow; per
// super-block and half tile F's scales are decoded once, then the rows run in passes of up to
// kPass against the block while it is in L1.
template <class F>
struct KTile {
  template <int R>
  [[gnu::always_inline]] static void Passes(const uint8_t* blk, int h, const typename F::Scales& m, const ActRows& a,
                                            int64_t s, __m256* acc) {
    if constexpr (R <= kPass) {
      F::template Pass<R>(blk, h, m, a, s, acc);
    } else {
      F::template Pass<kPass>(blk, h, m, a, s, acc);
      Passes<R - kPass>(blk, h, m, a.From(kPass), s, acc + kPass);
    }
  }

  template <int R>
  static void RunRows(const KMatrix& w, int64_t t, const ActRows& a, float (*out)[kKTile]) {
    __m256 acc[2][R];
#pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
    }
    typename F::Scales m;
    for (int64_t s = 0; s < w.supers(); ++s) {
      const uint8_t* blk = w.block(t, s);
      PrefetchAhead(blk, mr::KBlockBytes(F::kFormat));
      for (int h = 0; h < 2; ++h) {
        F::Decode(blk, h, &m);
        Passes<R>(blk, h, m, a, s, acc[h]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(out[r], acc[0][r]);
      _mm256_store_ps(out[r] + 8, acc[1][r]);
    }
  }

  static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr, float (*out)[kKTile]) {
    RunRowsOf<KTile>(nr, w, t, a, out);
  }
};

// ---------------------------------------------------------------------------------------------
// F16 / BF16: a 32-byte load holds input i of the 16 rows; each 16-byte half widened to 8 FP32
// lanes (vcvtph2ps, or a zero-extension and 16-bit shift for BF16) meets each row's FP32
// activation in one FMA against a broadcast. Two accumulators per row (the tile's halves) fill 8
// of the 16 ymm registers at 4 rows, so more rows run in passes of 4 over the whole tile (its
// 32 bytes per input come from L1/L2 again; each row's summation order does not change).

template <bool kBf16>
inline __m256 Widen8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kBf16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

template <bool kBf16>
struct FTile {
  static constexpr int kPassRows = 4;

  template <int R>
  static void Pass(const KMatrix& w, int64_t t, const ActRows& a, float (*out)[kKTile]) {
    __m256 lo[R], hi[R];
    const float* x[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      lo[r] = hi[r] = _mm256_setzero_ps();
      x[r] = a.Xf(r);
    }
    const int64_t supers = w.supers();
    const uint8_t* blk = w.block(t, 0);  // the tile's blocks are consecutive
    for (int64_t s = 0; s < supers; ++s, blk += mr::KBlockBytes(mr::KFormat::kF16)) {
      const int64_t i0 = s * mr::kKBlock32;
#pragma GCC unroll 2
      for (int i = 0; i < mr::kKBlock32; ++i) {
        if (i % 2 == 0) PrefetchLine(blk + 32 * i);
        const __m256 w0 = Widen8<kBf16>(blk + 32 * i), w1 = Widen8<kBf16>(blk + 32 * i + 16);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 xb = _mm256_broadcast_ss(x[r] + i0 + i);
          lo[r] = _mm256_fmadd_ps(w0, xb, lo[r]);
          hi[r] = _mm256_fmadd_ps(w1, xb, hi[r]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(out[r], lo[r]);
      _mm256_store_ps(out[r] + 8, hi[r]);
    }
  }

  template <int R>
  static void RunRows(const KMatrix& w, int64_t t, const ActRows& a, float (*out)[kKTile]) {
    if constexpr (R <= kPassRows) {
      Pass<R>(w, t, a, out);
    } else {
      Pass<kPassRows>(w, t, a, out);
      Pass<R - kPassRows>(w, t, a.From(kPassRows), out + kPassRows);
    }
  }

  static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr, float (*out)[kKTile]) {
    RunRowsOf<FTile>(nr, w, t, a, out);
  }
};

}  // namespace

namespace mr::x86 {

MR_DEFINE_K_KERNELS(Q4K, Avx2, KTile<K4<false>>)
MR_DEFINE_K_KERNELS(Q5K, Avx2, KTile<K4<true>>)
MR_DEFINE_K_KERNELS(Q6K, Avx2, KTile<Q6K>)
MR_DEFINE_K_KERNELS(Q50, Avx2, KTile<Q50>)
MR_DEFINE_K_KERNELS(Q41, Avx2, KTile<Q41>)
MR_DEFINE_K_KERNELS(Q80, Avx2, KTile<Q80>)
MR_DEFINE_K_KERNELS(Q40, Avx2, KTile<Q40>)
MR_DEFINE_K_KERNELS(F16, Avx2, FTile<false>)
MR_DEFINE_K_KERNELS(BF16, Avx2, FTile<true>)
MR_DEFINE_K_KERNELS(MXFP4, Avx2, KTile<MXFP4>)

}  // namespace mr::x86
