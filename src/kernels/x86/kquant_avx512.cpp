// AVX-512 VNNI kernels of the native K-quant formats (kquant.h): one 512-bit register holds the
// 16 outputs of a tile, one 64-byte load holds 4 quant bytes of each of the 16 rows, so the dot
// products need no horizontal sums and each weight load serves every activation row.
// Compiled with the AVX-512 flags (file suffix); dispatch selects it only when cpuid reports
// AVX512F/BW/VL/DQ + VNNI and the OS saves the zmm state.
//
// Q4_K: the nibbles are u8 already: vpdpbusd (u8 weights x s8 activations broadcast, 4 products
// per lane) accumulates one int32 per (row, output, 32-input sub-block); per sub-block the sum
// is scaled in FP32 by d * sc (per output) and the activation group scale, and the minimum term
// dmin * m * sum(x) uses the activation sums (QActs::sums32). High nibbles stay in place (16 q;
// the 1/16 goes into the scale). Exact integer part: |sum| <= 32 * 240 * 127 < 2^31.
// Q6_K: the 6-bit quants (ql nibble | qh bits << 4) are u8 in [0, 63]; vpmaddubsw gives pairs of
// products (<= 2 * 63 * 127, no saturation), vpdpwssd multiplies them by the int8 sub-block scale
// and accumulates in int32; ggml's -32 offset is subtracted once per sub-block pair as
// 32 * sc * sum(x) (QActs::sums16, also with vpdpwssd). Exact in int32 (|sum| < 2^27).
// GCC 12's 512-bit conversion intrinsics start from a self-initialized "undefined" register
// (avx512fintrin.h), which -Wmaybe-uninitialized reports once inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/kquant_tile_impl.h"

namespace {

// Activation rows per pass over a super-block: up to 8 (16 int32 accumulators of Q4_K or Q6_K
// plus the unpacked weights fit the 32 zmm registers), so verify steps unpack each weight once.
constexpr int kPass = 8;

inline __m512i Bcast4(const void* p) {
  return _mm512_set1_epi32(Load4(p));
}

// ---------------------------------------------------------------------------------------------
// Q4_K

// Per (tile, super-block): d * scale and dmin * min of the 8 sub-blocks, 16 outputs each.
struct Q4KScales {
  __m512 dsc[8];
  __m512 dmm[8];
};

struct Q4K {
  static constexpr KFormat kFormat = KFormat::kQ4K;
  using Scales = Q4KScales;

  static void Decode(const uint8_t* blk, Q4KScales* m) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m128i p[12];  // plane j: packed scale byte j of the 16 rows
    for (int j = 0; j < 12; ++j) p[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j));
    const __m128i m63 = _mm_set1_epi8(63), m0f = _mm_set1_epi8(0x0F), m30 = _mm_set1_epi8(0x30);
    for (int j = 0; j < 8; ++j) {  // ggml get_scale_min_k4, 16 rows at a time (16-bit shifts, byte masks)
      __m128i sc, mn;
      if (j < 4) {
        sc = _mm_and_si128(p[j], m63);
        mn = _mm_and_si128(p[j + 4], m63);
      } else {
        sc = _mm_or_si128(_mm_and_si128(p[j + 4], m0f), _mm_and_si128(_mm_srli_epi16(p[j - 4], 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(p[j + 4], 4), m0f), _mm_and_si128(_mm_srli_epi16(p[j], 2), m30));
      }
      // Odd sub-blocks are the high nibbles, which the kernel multiplies in place (16 q): 1/16 here.
      const __m512 dj = (j & 1) ? _mm512_mul_ps(d, _mm512_set1_ps(1.0f / 16)) : d;
      m->dsc[j] = _mm512_mul_ps(dj, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
      m->dmm[j] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
    }
  }

  // acc[r] += rows r0..r0+R-1 of a . super-block s of the tile (blk).
  template <int R>
  static void Pass(const uint8_t* blk, const Q4KScales& m, const ActRows& a, int64_t s, int r0, __m512* acc) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
    for (int k = 0; k < 4; ++k) {  // activation group of 64: sub-blocks 2k (low nibbles), 2k+1 (high)
      const uint8_t* q = blk + 256 + 512 * k;
      const int64_t i0 = s * kKSuper + 64 * k;  // first input of the group
      __m512i ilo[R], ihi[R];
      for (int r = 0; r < R; ++r) ilo[r] = ihi[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i v = _mm512_loadu_si512(q + 64 * c);
        const __m512i lo = _mm512_and_si512(v, m0f);
        // High nibbles in place (16 q <= 240): vpdpbusd sums u8 x s8 products in int32 without
        // saturation, and the 1/16 is folded into the scale, so no shift is needed.
        const __m512i hi = _mm512_and_si512(v, mf0);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.Q(r0 + r) + i0 + 4 * c;
          ilo[r] = _mm512_dpbusd_epi32(ilo[r], lo, Bcast4(x));
          ihi[r] = _mm512_dpbusd_epi32(ihi[r], hi, Bcast4(x + 32));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float* xs = a.Xs(r0 + r);
        if constexpr (kActGroup == 64) {
          __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ilo[r]), m.dsc[2 * k]);
          f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ihi[r]), m.dsc[2 * k + 1], f);
          acc[r] = _mm512_fmadd_ps(f, _mm512_set1_ps(xs[i0 / kActGroup]), acc[r]);
        } else {
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ilo[r]),
                                   _mm512_mul_ps(m.dsc[2 * k], _mm512_set1_ps(xs[i0 / kActGroup])), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ihi[r]),
                                   _mm512_mul_ps(m.dsc[2 * k + 1], _mm512_set1_ps(xs[i0 / kActGroup + 1])), acc[r]);
        }
        const float* s32 = a.S32(r0 + r) + i0 / 32;
        acc[r] = _mm512_fnmadd_ps(m.dmm[2 * k], _mm512_set1_ps(s32[0]), acc[r]);
        acc[r] = _mm512_fnmadd_ps(m.dmm[2 * k + 1], _mm512_set1_ps(s32[1]), acc[r]);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q6_K

// Int accumulators per (row, pass): with 64-input activation groups, one per group (2 per
// 128-input half); with 32, one per quant vector of a group of 192 bytes.
constexpr int kQ6Acc = kActGroup == 64 ? 2 : 4;

// Per (tile, super-block): (sc, sc) int16 pairs per sub-block for the dot products, and
// (sc[2p], sc[2p+1]) pairs for the offset term, 16 outputs each.
struct Q6KScales {
  __m512 d;
  __m512i scp[16];
  __m512i offp[8];
};

struct Q6K {
  static constexpr KFormat kFormat = KFormat::kQ6K;
  using Scales = Q6KScales;

  static void Decode(const uint8_t* blk, Q6KScales* m) {
    m->d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    __m512i v[16];
    for (int j = 0; j < 16; ++j) {
      v[j] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * j)));
      m->scp[j] = _mm512_or_si512(_mm512_and_si512(v[j], lo16), _mm512_slli_epi32(v[j], 16));
    }
    for (int p = 0; p < 8; ++p)
      m->offp[p] = _mm512_or_si512(_mm512_and_si512(v[2 * p], lo16), _mm512_slli_epi32(v[2 * p + 1], 16));
  }

  template <int R>
  static void Pass(const uint8_t* blk, const Q6KScales& m, const ActRows& a, int64_t s, int r0, __m512* acc) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {  // 128-input halves of the super-block
      const int64_t i0 = s * kKSuper + 128 * n;
      __m512i iacc[kQ6Acc][R];
      for (int j = 0; j < kQ6Acc; ++j) {
        for (int r = 0; r < R; ++r) iacc[j][r] = _mm512_setzero_si512();
      }
#pragma GCC unroll 2
      for (int c = 0; c < 8; ++c) {
        const uint8_t* g = blk + 288 + (8 * n + c) * 192;
        const __m512i va = _mm512_loadu_si512(g), vb = _mm512_loadu_si512(g + 64), vh = _mm512_loadu_si512(g + 128);
        // Quants of inputs i0 + 32 m + 4c..+3, m = 0..3 (ggml's ql nibble | qh bit pair << 4).
        __m512i q[4];
        q[0] = _mm512_or_si512(_mm512_and_si512(va, m0f), _mm512_and_si512(_mm512_slli_epi16(vh, 4), m30));
        q[1] = _mm512_or_si512(_mm512_and_si512(vb, m0f), _mm512_and_si512(_mm512_slli_epi16(vh, 2), m30));
        q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(va, 4), m0f), _mm512_and_si512(vh, m30));
        q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(vb, 4), m0f),
                               _mm512_and_si512(_mm512_srli_epi16(vh, 2), m30));
        const int sub = 8 * n + c / 4;  // sub-block (16 inputs) of q[0]; q[mm] is sub + 2 mm
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a.Q(r0 + r) + i0 + 4 * c;
#pragma GCC unroll 4
          for (int mm = 0; mm < 4; ++mm) {
            const __m512i p = _mm512_maddubs_epi16(q[mm], Bcast4(x + 32 * mm));
            iacc[mm * kQ6Acc / 4][r] = _mm512_dpwssd_epi32(iacc[mm * kQ6Acc / 4][r], p, m.scp[sub + 2 * mm]);
          }
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // Offset: 32 * sum over the sub-blocks of sc * sum(x); q[mm] spans sub-blocks 8n + 2mm, +1.
        const int16_t* s16 = a.S16(r0 + r) + i0 / 16;
        __m512i off[kQ6Acc];
        for (int j = 0; j < kQ6Acc; ++j) off[j] = _mm512_setzero_si512();
        for (int mm = 0; mm < 4; ++mm) {
          off[mm * kQ6Acc / 4] = _mm512_dpwssd_epi32(off[mm * kQ6Acc / 4], m.offp[4 * n + mm], Bcast4(s16 + 2 * mm));
        }
        const float* xs = a.Xs(r0 + r);
        for (int j = 0; j < kQ6Acc; ++j) {
          const __m512i v = _mm512_sub_epi32(iacc[j][r], _mm512_slli_epi32(off[j], 5));
          const __m512 ds = _mm512_mul_ps(m.d, _mm512_set1_ps(xs[(i0 + j * (128 / kQ6Acc)) / kActGroup]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, acc[r]);
        }
      }
    }
  }
};

// The tile kernel of format F (Q4K, Q6K): per super-block, F's scales are decoded once, then
// the rows run in passes of up to kPass against the block while it is in L1.
template <class F>
struct KTile {
  static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr, float (*out)[kKTile]) {
    __m512 acc[kKRows];
    for (int r = 0; r < nr; ++r) acc[r] = _mm512_setzero_ps();
    typename F::Scales m;
    for (int64_t s = 0; s < w.supers(); ++s) {
      const uint8_t* blk = w.block(t, s);
      PrefetchAhead(blk, mr::KBlockBytes(F::kFormat));
      F::Decode(blk, &m);
      for (int r0 = 0; r0 < nr;) {
        const int left = nr - r0;
        switch (left >= kPass ? kPass : (left >= 4 ? 4 : left)) {
          case 1:
            F::template Pass<1>(blk, m, a, s, r0, acc + r0);
            r0 += 1;
            break;
          case 2:
            F::template Pass<2>(blk, m, a, s, r0, acc + r0);
            r0 += 2;
            break;
          case 3:
            F::template Pass<3>(blk, m, a, s, r0, acc + r0);
            r0 += 3;
            break;
          case 4:
            F::template Pass<4>(blk, m, a, s, r0, acc + r0);
            r0 += 4;
            break;
          default:
            F::template Pass<kPass>(blk, m, a, s, r0, acc + r0);
            r0 += kPass;
            break;
        }
      }
    }
    for (int r = 0; r < nr; ++r) _mm512_store_ps(out[r], acc[r]);
  }
};

}  // namespace

namespace mr::x86 {

void MatmulQ4KAvx512(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                     int64_t t_end) {
  MatmulKTiles<KTile<Q4K>>(w, x, n_rows, y, ldy, t_begin, t_end);
}
void MatmulQ4KGluAvx512(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                        int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulKGluTiles<KTile<Q4K>>(gate, up, x, n_rows, act, y, ldy, t_begin, t_end);
}
void MatmulQ6KAvx512(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                     int64_t t_end) {
  MatmulKTiles<KTile<Q6K>>(w, x, n_rows, y, ldy, t_begin, t_end);
}
void MatmulQ6KGluAvx512(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                        int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulKGluTiles<KTile<Q6K>>(gate, up, x, n_rows, act, y, ldy, t_begin, t_end);
}

}  // namespace mr::x86
