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
// Every loop over rows carries `#pragma GCC unroll`: one loop left rolled (NibbleDots' final sum)
// made GCC keep the rows' accumulators in memory, and Q4_0 / Q4_1 ran 8 rows at half speed.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/kquant_tile_impl.h"

namespace {

// acc += u8 w . s8 (4 bytes at x, broadcast to every lane): vpdpbusd with an embedded broadcast
// from memory, one instruction (GCC 12 emits a separate vpbroadcastd for the intrinsic).
inline __m512i DpbusdBcast(__m512i acc, __m512i w, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// ---------------------------------------------------------------------------------------------
// Q4_K

// Per (tile, super-block): d * scale and dmin * min of the 8 sub-blocks, 16 outputs each.
// Kept in memory (L1) on purpose: as 16 zmm values they crowded out 8 rows' accumulators, and GCC
// spilled and reloaded both around every pass; as arrays each use is one load folded into its
// multiply (8-row Q4_K: see docs/performance.md, stop 20).
struct Q4KScales {
  alignas(64) float dsc[8][16];
  alignas(64) float dmm[8][16];
};

// acc plus one row's activation group k of a Q4_K / Q5_K super-block: the integer sums of its
// sub-blocks 2k (lo) and 2k + 1 (hi) scaled by d * sc and the activation scale, minus the
// minimum terms dmin * m * sum(x). xs: the row's scales from the group's, s32: its sums32 from
// the group's first sub-block; consecutive scales and sums `stride` floats apart. Every kernel of these formats (VNNI
// and AMX) ends a group here, so a row's result is the same whichever kernel and row count computed it.
[[gnu::always_inline]] inline __m512 Q4KGroupTail(__m512i lo, __m512i hi, const Q4KScales& m, int k, const float* xs,
                                                  const float* s32, __m512 acc, int64_t stride = 1) {
  if constexpr (kActGroup == 64) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_load_ps(m.dsc[2 * k]));
    f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_load_ps(m.dsc[2 * k + 1]), f);
    acc = _mm512_fmadd_ps(f, _mm512_set1_ps(xs[0]), acc);
  } else {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(_mm512_load_ps(m.dsc[2 * k]), _mm512_set1_ps(xs[0])),
                          acc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi),
                          _mm512_mul_ps(_mm512_load_ps(m.dsc[2 * k + 1]), _mm512_set1_ps(xs[stride])), acc);
  }
  acc = _mm512_fnmadd_ps(_mm512_load_ps(m.dmm[2 * k]), _mm512_set1_ps(s32[0]), acc);
  return _mm512_fnmadd_ps(_mm512_load_ps(m.dmm[2 * k + 1]), _mm512_set1_ps(s32[stride]), acc);
}

// Q4_K, and Q5_K (kFifth) whose quants add a fifth bit from qh: per 64-input group k, bit 2k of
// qh byte l for input l, bit 2k + 1 for input 32 + l (chunk c of the tile's qh holds qh[4c..+3]
// of the 16 rows, the same bytes for every k). Q5_K's quants (<= 31) are exact in int32 as well.
template <bool kFifth>
struct K4 {
  static constexpr KFormat kFormat = kFifth ? KFormat::kQ5K : KFormat::kQ4K;
  static constexpr int kHeadBytes = kFifth ? 768 : 256;  // d, dmin, scales (and qh), before the quants
  static constexpr int kPassRows = 4;                    // rows per pass over a super-block (registers)
  using Scales = Q4KScales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, Q4KScales* m) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    // Odd sub-blocks are the high nibbles, which the Q4_K kernel multiplies in place (16 q): 1/16
    // here. Q5_K shifts them down to add the fifth bit.
    const __m512 d16 = kFifth ? d : _mm512_mul_ps(d, _mm512_set1_ps(1.0f / 16));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m128i p[12];  // plane j: packed scale byte j of the 16 rows
    for (int j = 0; j < 12; ++j) p[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j));
    const __m128i m63 = _mm_set1_epi8(63), m0f = _mm_set1_epi8(0x0F), m30 = _mm_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {  // ggml get_scale_min_k4, 16 rows at a time (16-bit shifts, byte masks)
      __m128i sc, mn;
      if (j < 4) {
        sc = _mm_and_si128(p[j], m63);
        mn = _mm_and_si128(p[j + 4], m63);
      } else {
        sc = _mm_or_si128(_mm_and_si128(p[j + 4], m0f), _mm_and_si128(_mm_srli_epi16(p[j - 4], 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(p[j + 4], 4), m0f), _mm_and_si128(_mm_srli_epi16(p[j], 2), m30));
      }
      _mm512_store_ps(m->dsc[j], _mm512_mul_ps((j & 1) ? d16 : d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc))));
      _mm512_store_ps(m->dmm[j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn))));
    }
  }

  // Super-block s of the tile (blk) against rows 0..R-1 of a: acc[r] += the scaled dot products
  // minus the minimum terms, for every R: a row's floating-point operations are the same whatever
  // the number of rows, so its result is too (greedy speculative decoding relies on it). With
  // fewer than 4 rows the chunks alternate between two sets of integer accumulators (exact), so
  // the dependency chains stay short (decode is the 1-row case); with more rows there is
  // parallelism across rows instead. `mins` is unused (the minimum terms go into acc, which
  // leaves 8 rows' accumulators room in the registers).
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const Q4KScales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    // The 4 activation groups unrolled only for Q4_K's decode rows: unrolled with more rows (or
    // Q5_K's extra bit work) GCC ran out of registers and spilled around every dot product
    // (Zen 4, 1 thread: 8-row Q4_K 7.6 -> 8.7 GB/s, 1-row Q5_K 12.5 -> 28 GB/s; 1-row Q4_K
    // loses ~15 % rolled).
    if constexpr (!kFifth && R < 4) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) Group<R>(blk, m, a, s, k, acc);
    } else {
#pragma GCC unroll 1
      for (int k = 0; k < 4; ++k) Group<R>(blk, m, a, s, k, acc);
    }
  }

  // Activation group k of 64 inputs: sub-blocks 2k (low nibbles) and 2k+1 (high).
  template <int R>
  [[gnu::always_inline]] static void Group(const uint8_t* blk, const Q4KScales& m, const ActRows& a, int64_t s, int k,
                                           __m512* acc) {
    constexpr int kSets = R < 4 ? 2 : 1;
    const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
    const __m512i m10 = _mm512_set1_epi8(0x10);
    const uint8_t* q = blk + kHeadBytes + 512 * k;
    const int64_t i0 = s * kKSuper + 64 * k;  // first input of the group
    __m512i ilo[kSets][R], ihi[kSets][R];
#pragma GCC unroll 8
    for (int u = 0; u < kSets; ++u) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) ilo[u][r] = ihi[u][r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      PrefetchLine(q + 64 * c);
      const __m512i v = _mm512_loadu_si512(q + 64 * c);
      __m512i lo = _mm512_and_si512(v, m0f), hi;
      if constexpr (kFifth) {
        // Bits 2k and 2k + 1 of each qh byte to bit 4 (16-bit shifts: the masked bit never
        // crosses a byte); the high nibbles shifted down to take theirs.
        const __m512i h = _mm512_srli_epi16(_mm512_loadu_si512(blk + 256 + 64 * c), 2 * k);
        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4), m10));
        hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m0f),
                             _mm512_and_si512(_mm512_slli_epi16(h, 3), m10));
      } else {
        // Q4_K: high nibbles in place (16 q <= 240): vpdpbusd sums u8 x s8 products in int32
        // without saturation, and the 1/16 is folded into the scale, so no shift is needed.
        hi = _mm512_and_si512(v, mf0);
      }
      const int u = c % kSets;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        ilo[u][r] = DpbusdBcast(ilo[u][r], lo, a.template X4<R>(i0 + 4 * c, r));
        ihi[u][r] = DpbusdBcast(ihi[u][r], hi, a.template X4<R>(i0 + 32 + 4 * c, r));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i lo = ilo[0][r], hi = ihi[0][r];
      if constexpr (kSets == 2) {
        lo = _mm512_add_epi32(lo, ilo[1][r]);
        hi = _mm512_add_epi32(hi, ihi[1][r]);
      }
      acc[r] = Q4KGroupTail(lo, hi, m, k, a.Xs(r) + i0 / kActGroup, a.S32(r) + i0 / 32, acc[r]);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q6_K

// Per (tile, super-block): d, the int8 sub-block scales widened to int32, and (sc[2p], sc[2p+1])
// int16 pairs for the offset term, 16 outputs each.
struct Q6KScales {
  __m512 d;
  __m512i sc[16];
  __m512i offp[8];
};

struct Q6K {
  static constexpr KFormat kFormat = KFormat::kQ6K;
  static constexpr int kHeadBytes = 288;  // d and scales, before the quants
  static constexpr int kPassRows = 4;     // rows per pass over a super-block (registers)
  using Scales = Q6KScales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, Q6KScales* m) {
    m->d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      m->sc[j] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * j)));
    }
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      m->offp[p] = _mm512_or_si512(_mm512_and_si512(m->sc[2 * p], lo16), _mm512_slli_epi32(m->sc[2 * p + 1], 16));
    }
  }

  // 6-bit quant vector mm (0..3) of a 192-byte group g: the quants of inputs 32 mm + 4c..+3 of
  // the half (ggml's ql nibble | qh bit pair << 4), u8 in [0, 63], 16 rows. mm is a constant
  // once the callers' loops are unrolled.
  [[gnu::always_inline]] static __m512i Unpack(int mm, const uint8_t* g, __m512i m0f, __m512i m30) {
    const __m512i l = _mm512_loadu_si512(g + (mm & 1) * 64), h = _mm512_loadu_si512(g + 128);
    const __m512i lo = (mm & 2) ? _mm512_srli_epi16(l, 4) : l;
    const __m512i hi = mm == 0   ? _mm512_slli_epi16(h, 4)
                       : mm == 1 ? _mm512_slli_epi16(h, 2)
                       : mm == 2 ? h
                                 : _mm512_srli_epi16(h, 2);
    return _mm512_or_si512(_mm512_and_si512(lo, m0f), _mm512_and_si512(hi, m30));
  }

  // The 6-bit quants against s8 activations with vpdpbusd, one sub-block of 16 inputs at a time
  // (32-input block mm of the half, chunks 4h..4h+3): its int32 sums (|sum| <= 16 * 63 * 127)
  // are multiplied by the sub-block scale in int32 (|sc * sum| < 2^24) and summed per
  // activation group; ggml's -32 offset is subtracted as 32 * sum(sc * sum16(x)) (vpdpwssd on
  // the activation sums). Exact in int32; one FP scale per (row, group). Only R sub-block and
  // 2R (or 4R) group accumulators are live, so 8 rows fit the registers. `mins` is unused.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const Q6KScales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    constexpr int kGroups = kActGroup == 64 ? 2 : 4;  // activation groups per 128-input half
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int n = 0; n < 2; ++n) {  // 128-input halves of the super-block
      const int64_t i0 = s * kKSuper + 128 * n;
      __m512i tot[kGroups][R];  // per group: sum of sc * dot over its sub-blocks
      for (int gi = 0; gi < kGroups; ++gi) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) tot[gi][r] = _mm512_setzero_si512();
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
        for (int mm = 0; mm < 4; ++mm) {
          __m512i iacc[R];
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) iacc[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int c = 4 * h; c < 4 * h + 4; ++c) {
            if (mm < 3) PrefetchLine(blk + 288 + (8 * n + c) * 192 + 64 * mm);
            const __m512i q = Unpack(mm, blk + 288 + (8 * n + c) * 192, m0f, m30);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) iacc[r] = DpbusdBcast(iacc[r], q, a.template X4<R>(i0 + 32 * mm + 4 * c, r));
          }
          const __m512i sc = m.sc[8 * n + 2 * mm + h];
          const int gi = mm * kGroups / 4;
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) tot[gi][r] = _mm512_add_epi32(tot[gi][r], _mm512_mullo_epi32(iacc[r], sc));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int16_t* s16 = a.S16(r) + i0 / 16;
        const float* xs = a.Xs(r);
        // Offset: 32 * sum over the sub-blocks of sc * sum16(x); block mm spans sub-blocks
        // 8n + 2mm, +1 (one offp pair).
#pragma GCC unroll 4
        for (int gi = 0; gi < kGroups; ++gi) {
          __m512i off = _mm512_setzero_si512();
          for (int mm = gi * 4 / kGroups; mm < (gi + 1) * 4 / kGroups; ++mm) {
            off = _mm512_dpwssd_epi32(off, m.offp[4 * n + mm], _mm512_set1_epi32(Load4(s16 + 2 * mm)));
          }
          const __m512i v = _mm512_sub_epi32(tot[gi][r], _mm512_slli_epi32(off, 5));
          const __m512 ds = _mm512_mul_ps(m.d, _mm512_set1_ps(xs[(i0 + gi * kActGroup) / kActGroup]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, acc[r]);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q5_0 and Q4_1: 32-input blocks, one f16 d per (row, block)

// The FP32 steps of one (row, 32-input block) of the 32-input formats, shared by their VNNI and
// AMX kernels so that a row's result is the same whichever computed it. `dot`: the block's exact
// integer dot product (offsets removed); xs: the row's activation scale; d: the 16 outputs' d.
// acc + d * (xs * dot): Q8_0, Q4_0 and Q4_1 (whose minimum goes to a separate accumulator).
[[gnu::always_inline]] inline __m512 BlockTail(__m512i dot, float xs, __m512 d, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs)), d, acc);
}
// Q5_0 (sum over u8 quants in [0, 31], ggml's -16 offset from sums32 s): acc + d * (xs * sum - 16 s).
[[gnu::always_inline]] inline __m512 Q50BlockTail(__m512i sum, float xs, float s, __m512 d, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xs), _mm512_set1_ps(16 * s)), d, acc);
}

// Bit i (0..3) of x at bit 4 of byte i: table of the 16 values of x, for vpermd. A lane of
// (qh >> 4c) indexes it with its low 4 bits: the fifth bits of inputs 4c..4c+3, in place for the
// 4 quant bytes of chunk c.
inline __m512i FifthBitTable() {
  return _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010, 0x00101000,
                           0x00101010, 0x10000000, 0x10000010, 0x10001000, 0x10001010, 0x10100000, 0x10100010,
                           0x10101000, 0x10101010);
}

// Rows 0..R-1's int32 dot products of a 32-input block: Add(lo, hi, a, i) adds u8 weight
// vectors lo (inputs i..i+3) and hi (i+16..i+19) against each row's activations. Two sets of
// accumulators (lo, hi) below 6 rows, so the vpdpbusd dependency chains stay short; one from 6 rows
// on, where the rows give the parallelism and 8 rows' sums and accumulators still fit the
// registers. Integer sums: exact in either order, so a row's result is the same at every count.
template <int R>
struct DotSets {
  static constexpr bool kSplit = R < 6;
  __m512i lo[R], hi[kSplit ? R : 1];
  DotSets() {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) lo[r] = _mm512_setzero_si512();
    if constexpr (kSplit) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) hi[r] = _mm512_setzero_si512();
    }
  }
  [[gnu::always_inline]] void Add(__m512i wlo, __m512i whi, const ActRows& a, int64_t i) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      lo[r] = DpbusdBcast(lo[r], wlo, a.template X4<R>(i, r));
      if constexpr (kSplit) {
        hi[r] = DpbusdBcast(hi[r], whi, a.template X4<R>(i + 16, r));
      } else {
        lo[r] = DpbusdBcast(lo[r], whi, a.template X4<R>(i + 16, r));
      }
    }
  }
  [[gnu::always_inline]] __m512i Sum(int r) const {
    if constexpr (kSplit) {
      return _mm512_add_epi32(lo[r], hi[r]);
    } else {
      return lo[r];
    }
  }
};

struct Q50Scales {
  __m512 d;
  __m512i qh;
};

struct Q50 {
  static constexpr KFormat kFormat = KFormat::kQ5_0;
  static constexpr int kHeadBytes = 96;  // d and qh, before the quants
  static constexpr int kPassRows = 8;
  using Scales = Q50Scales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, Q50Scales* m) {
    m->d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    m->qh = _mm512_loadu_si512(blk + 32);
  }

  // The 5-bit quants (u8 in [0, 31]) against s8 activations with vpdpbusd, exact in int32
  // (|sum| <= 32 * 31 * 127); ggml's -16 offset is 16 * (scale * sum(x)) (QActs::sums32), so
  // per (row, block): acc += d * (xs * sum - 16 * sums32). All the rows in one pass, so the
  // quants are unpacked once per block (DotSets: the accumulators). `mins` is unused.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const Q50Scales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    const int64_t i0 = s * mr::kKBlock32;
    const __m512i m0f = _mm512_set1_epi8(0x0F), table = FifthBitTable();
    DotSets<R> dots;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(blk + 96 + 64 * c);
      const __m512i lo =
          _mm512_or_si512(_mm512_and_si512(v, m0f), _mm512_permutexvar_epi32(_mm512_srli_epi32(m.qh, 4 * c), table));
      const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m0f),
                                         _mm512_permutexvar_epi32(_mm512_srli_epi32(m.qh, 16 + 4 * c), table));
      dots.Add(lo, hi, a, i0 + 4 * c);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = Q50BlockTail(dots.Sum(r), a.Xs(r)[i0 / kActGroup], a.S32(r)[i0 / 32], m.d, acc[r]);
    }
  }
};

// Rows 0..R-1's int32 dot products of a 32-input block's nibbles (4 chunks of 64 bytes from q:
// low nibbles inputs 4c..+3, high 16 + 4c..+3, u8 for vpdpbusd) with their activations. Q4_1 and
// Q4_0.
template <int R>
[[gnu::always_inline]] inline void NibbleDots(const uint8_t* q, const ActRows& a, int64_t i0, __m512i* dot) {
  const __m512i m0f = _mm512_set1_epi8(0x0F);
  DotSets<R> dots;
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i v = _mm512_loadu_si512(q + 64 * c);
    dots.Add(_mm512_and_si512(v, m0f), _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f), a, i0 + 4 * c);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = dots.Sum(r);
}

struct Q41Scales {
  __m512 d;
  __m512 m;
};

struct Q41 {
  static constexpr KFormat kFormat = KFormat::kQ4_1;
  static constexpr int kHeadBytes = 64;  // d and m, before the quants
  static constexpr int kPassRows = 4;
  using Scales = Q41Scales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, Q41Scales* m) {
    m->d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    m->m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
  }

  // The nibbles against s8 activations with vpdpbusd (exact in int32); the block minimum adds
  // m * (scale * sum(x)) (QActs::sums32): acc += d * xs * sum, mins -= m * sums32.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const Q41Scales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512* mins) {
    const int64_t i0 = s * mr::kKBlock32;
    __m512i dot[R];
    NibbleDots<R>(blk + 64, a, i0, dot);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = BlockTail(dot[r], a.Xs(r)[i0 / kActGroup], m.d, acc[r]);
      mins[r] = _mm512_fnmadd_ps(m.m, _mm512_set1_ps(a.S32(r)[i0 / 32]), mins[r]);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q8_0 and Q4_0: 32-input blocks, one f16 d per (row, block), a signed quant (ggml's -8 offset
// for Q4_0). vpdpbusd takes u8 weights, so the quants become unsigned (Q8_0: w ^ 0x80 = w + 128,
// once per chunk for every row; Q4_0: the nibbles as stored) and the offset comes back in the
// integer sum per (row, block): sum((w + k) x) - k * sum(x) with sum(x) the int16 activation sums
// of the block's two halves (QActs::sums16). Exact in int32: |sum| <= 32 * 255 * 127.

struct D16Scales {
  __m512 d;
};

// The exact integer dot product of row r's block at input i0, acc += d * xs * (sum - off * sum(x)).
template <int kOffset>
[[gnu::always_inline]] inline __m512 ScaleBlock(__m512i sum, const ActRows& a, int r, int64_t i0, __m512 d,
                                                __m512 acc) {
  const int16_t* s16 = a.S16(r) + i0 / 16;
  const __m512i dot = _mm512_sub_epi32(sum, _mm512_set1_epi32(kOffset * (int32_t{s16[0]} + int32_t{s16[1]})));
  return BlockTail(dot, a.Xs(r)[i0 / kActGroup], d, acc);
}

// Q8_0 and Q4_0's block head: the f16 d of the 16 rows.
struct D16Block {
  static constexpr int kHeadBytes = 32;  // d, before the quants
  static constexpr int kPassRows = 8;    // 8 rows' sums and accumulators fit the registers
  using Scales = D16Scales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, D16Scales* m) {
    m->d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  }
};

struct Q80 : D16Block {
  static constexpr KFormat kFormat = KFormat::kQ8_0;

  // 8 chunks of 4 inputs; with fewer than 4 rows two sets of accumulators alternate (exact), so
  // decode's dependency chains stay short.
  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const D16Scales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    constexpr int kSets = R < 4 ? 2 : 1;
    const int64_t i0 = s * mr::kKBlock32;
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i isum[kSets][R];
#pragma GCC unroll 8
    for (int u = 0; u < kSets; ++u) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[u][r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      PrefetchLine(blk + 32 + 64 * c);
      const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(blk + 32 + 64 * c), bias);
      const int u = c % kSets;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[u][r] = DpbusdBcast(isum[u][r], w, a.template X4<R>(i0 + 4 * c, r));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i sum = isum[0][r];
      if constexpr (kSets == 2) sum = _mm512_add_epi32(sum, isum[1][r]);
      acc[r] = ScaleBlock<128>(sum, a, r, i0, m.d, acc[r]);
    }
  }
};

struct Q40 : D16Block {
  static constexpr KFormat kFormat = KFormat::kQ4_0;

  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const D16Scales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    const int64_t i0 = s * mr::kKBlock32;
    __m512i dot[R];
    NibbleDots<R>(blk + 32, a, i0, dot);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = ScaleBlock<8>(dot[r], a, r, i0, m.d, acc[r]);
  }
};

// ---------------------------------------------------------------------------------------------
// MXFP4: 32-input blocks, one E8M0 exponent per (row, block). A vpshufb of each nibble through
// MXFP4ShuffleTable gives u8 weights kvalue + 12 in [0, 24] for vpdpbusd, and ggml's values come
// back as sum((kvalue + 12) x) - 12 sum(x) per (row, block), exact in int32 (|sum| <= 32 * 24 *
// 127), then one FP step d * xs * dot with d = 2^(e - 128): Q4_0's structure with a table
// instead of an offset nibble.

// 2^(e - 128) for the 16 rows' E8M0 bytes at e (E8M0Half): (e - 1) << 23 as float bits for e >= 2,
// the subnormals 0x200000 << e for e = 0, 1.
inline __m512 E8M0Half16(const uint8_t* e) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
  const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v);
  return _mm512_castsi512_ps(
      _mm512_mask_mov_epi32(normal, _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2)), subnormal));
}

struct MXFP4 {
  static constexpr KFormat kFormat = KFormat::kMXFP4;
  static constexpr int kHeadBytes = 16;  // e, before the quants
  static constexpr int kPassRows = 8;    // as Q4_0: 8 rows' sums and accumulators fit the registers
  using Scales = D16Scales;

  [[gnu::always_inline]] static void Decode(const uint8_t* blk, D16Scales* m) { m->d = E8M0Half16(blk); }

  template <int R>
  [[gnu::always_inline]] static void Pass(const uint8_t* blk, const D16Scales& m, const ActRows& a, int64_t s,
                                          __m512* acc, __m512*) {
    const int64_t i0 = s * mr::kKBlock32;
    const __m512i m0f = _mm512_set1_epi8(0x0F), table = _mm512_broadcast_i32x4(MXFP4ShuffleTable());
    DotSets<R> dots;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(blk + kHeadBytes + 64 * c);
      const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m0f));
      const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f));
      dots.Add(lo, hi, a, i0 + 4 * c);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = ScaleBlock<kMXFP4Offset>(dots.Sum(r), a, r, i0, m.d, acc[r]);
  }
};

// The tile kernel of format F (Q4K, Q6K, ...): up to kKRows rows with their accumulators in
// registers over the whole tile; per super-block F's scales are decoded once and the rows run in
// passes of up to F::kPassRows against the block while it is in L1.
template <class F>
struct KTile {
  template <int R>
  [[gnu::always_inline]] static void Passes(const uint8_t* blk, const typename F::Scales& m, const ActRows& a,
                                            int64_t s, __m512* acc, __m512* mins) {
    if constexpr (R <= F::kPassRows) {
      F::template Pass<R>(blk, m, a, s, acc, mins);
    } else {
      F::template Pass<F::kPassRows>(blk, m, a, s, acc, mins);
      Passes<R - F::kPassRows>(blk, m, a.From(F::kPassRows), s, acc + F::kPassRows, mins + F::kPassRows);
    }
  }

  template <int R>
  static void RunRows(const KMatrix& w, int64_t t, const ActRows& a, float (*out)[kKTile]) {
    __m512 acc[R], mins[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = mins[r] = _mm512_setzero_ps();
    typename F::Scales m;
    for (int64_t s = 0; s < w.supers(); ++s) {
      const uint8_t* blk = w.block(t, s);
      PrefetchAhead(blk, mr::KBlockBytes(F::kFormat));
      F::Decode(blk, &m);
      Passes<R>(blk, m, a, s, acc, mins);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], _mm512_sub_ps(acc[r], mins[r]));
  }

  static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr, float (*out)[kKTile]) {
    RunRowsOf<KTile>(nr, w, t, a, out);
  }
};

// ---------------------------------------------------------------------------------------------
// F16 / BF16: a 32-byte load holds input i of the 16 rows; widened to FP32 (vcvtph2ps, or a
// zero-extension and 16-bit shift for BF16) it meets each row's FP32 activation in one FMA with an
// embedded broadcast. Even and odd inputs go to separate accumulators (two dependency chains per
// row, so one row is not bound by the FMA latency); the same order for every row count.

template <bool kBf16>
inline __m512 Widen16(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (kBf16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}

template <bool kBf16>
struct FTile {
  template <int R>
  static void RunRows(const KMatrix& w, int64_t t, const ActRows& a, float (*out)[kKTile]) {
    __m512 even[R], odd[R];
    const float* x[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      even[r] = odd[r] = _mm512_setzero_ps();
      x[r] = a.Xf(r);
    }
    const int64_t supers = w.supers();
    const uint8_t* blk = w.block(t, 0);  // the tile's blocks are consecutive
    for (int64_t s = 0; s < supers; ++s, blk += mr::KBlockBytes(mr::KFormat::kF16)) {
      const int64_t i0 = s * mr::kKBlock32;
#pragma GCC unroll 2
      for (int i = 0; i < mr::kKBlock32; i += 2) {
        PrefetchLine(blk + 32 * i);
        const __m512 w0 = Widen16<kBf16>(blk + 32 * i), w1 = Widen16<kBf16>(blk + 32 * (i + 1));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          even[r] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[r][i0 + i]), even[r]);
          odd[r] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[r][i0 + i + 1]), odd[r]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], _mm512_add_ps(even[r], odd[r]));
  }

  static void Run(const KMatrix& w, int64_t t, const ActRows& a, int nr, float (*out)[kKTile]) {
    RunRowsOf<FTile>(nr, w, t, a, out);
  }
};

// ---------------------------------------------------------------------------------------------
// AMX-INT8 (CpuVariant::kAmx: Intel Sapphire Rapids and later): the integer formats against 16
// or more activation rows. The tile layout's 64-byte chunks (4 quants of each of 16 outputs) are
// rows of an AMX B tile (K/4 rows x 64 bytes: 16 outputs x 4 inputs) once the quants are
// unpacked: per 32 inputs, 8 rows of u8 (Q4_K, Q4_1, Q5_0) or s8 (Q8_0, Q4_0 minus its offset)
// quants. A is 16 activation rows x 32 int8 inputs read straight from QActs::q (stride cols), and
// one TDPBSUD / TDPBSSD per 32 inputs leaves the exact int32 sum of every (row, output): the
// same integers the VNNI kernels compute, which the same FP32 tail (Q4KGroupTail, BlockTail,
// Q50BlockTail) then scales in the same order, so a row's result is bit-identical to the VNNI
// kernel's (speculative verification and prefill agree with decode). Per L2 chunk of tiles the
// B tiles and decoded scales are made once (AmxChunk) and reused by every block of 16 rows.
// What AMX removes is the vpdpbusd work per row; the FP32 tail per (row, 32 inputs) and the tile
// stores remain (docs/architecture.md has the measured split).
// Functions using the tiles carry the target attribute; AmxPermitted() asks the kernel for the
// tile state (arch_prctl) once per process, and CpuSupports(kAmx) requires it.

#define MR_AMX_TARGET __attribute__((target("amx-tile,amx-int8")))

constexpr int kAmxRows = 16;  // activation rows per A tile
// Fewer rows run the VNNI kernel (it reads the rows' activations from registers and L1; the AMX
// kernel's per-step cost is the same from 1 to 16 rows but for the FP32 tails).
constexpr int64_t kAmxMinRows = 16;
constexpr int64_t kAmxBTileBytes = 512;  // 8 rows x 64 bytes: 32 inputs of 16 outputs

// Palette 1: tmm0/1 and tmm2/3 two pairs of int32 sums (16 rows x 16 outputs; steps alternate
// between them so one step's tile work overlaps the previous step's FP32 tails), tmm4/5 the
// activation rows' inputs (16 rows x 32 bytes), tmm6/7 the weights (8 rows x 64 bytes).
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 32, 32, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 8, 8};
};

// 16 activation rows as the AMX kernel reads them: q row-major with stride cols (tile loads), and
// their scales and sums32 transposed (QActs::xs_t, s32_t: xs[g * 16 + r], s32[j * 16 + r]), so
// each row's values sit at a constant offset from one pointer.
struct AmxRows {
  const int8_t* q;
  const float* xs;
  const float* s32;
  int64_t cols;
};
static_assert(QActs::kBlockRows == kAmxRows && kAmxMinRows >= QActs::kBlockRows);

// Rows [r0, r0 + 16) of x (r0 % 16 == 0); past n_rows, q is a copy padded with zero rows (their
// scales and sums are 0, and their outputs are not stored), made once per call.
class AmxRowBlocks {
 public:
  AmxRowBlocks(const QActs& x, int64_t n_rows) : x_(x), n_rows_(n_rows) {}
  AmxRows At(int64_t r0) {
    const int64_t c = x_.cols, n = n_rows_ - r0 < kAmxRows ? n_rows_ - r0 : kAmxRows;
    const float* xs = x_.xs_t.data() + r0 * (c / kActGroup);
    const float* s32 = x_.s32_t.data() + r0 * (c / 32);
    if (n == kAmxRows) return {x_.q.data() + r0 * c, xs, s32, c};
    if (q_.empty()) {  // the last block, again for every chunk of tiles: copied the first time
      q_.assign(static_cast<size_t>(kAmxRows * c), 0);
      std::memcpy(q_.data(), x_.q.data() + r0 * c, static_cast<size_t>(n * c));
    }
    return {q_.data(), xs, s32, c};
  }

 private:
  const QActs& x_;
  int64_t n_rows_;
  std::vector<int8_t> q_;  // the padded last block, once made
};

// The formats on AMX. A step is kTdp tile products over kInputs inputs (Q4_K: a 64-input group,
// its two sub-blocks of 32, whose FP32 tail is one; Q6_K: a 32-input group, its two sub-blocks
// of 16 against the same A tile; the others: one 32-input block), kSteps steps per super-block.
// Prepare decodes a super-block's scales and writes its steps' B tiles; Tail(r, ...) adds row r's
// step to acc; Min (kMins) is Q4_1's separate minimum accumulator.
struct AmxQ4K {
  static constexpr int kTdp = 2, kSteps = 4, kInputs = 64;
  static constexpr bool kSigned = false, kSameA = false, kMins = false;
  using Scales = Q4KScales;
  static void Prepare(const uint8_t* blk, Scales* sc, uint8_t* b) {
    K4<false>::Decode(blk, sc);
    const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
    const uint8_t* q = blk + K4<false>::kHeadBytes;
    for (int k = 0; k < 4; ++k, q += 512, b += 2 * kAmxBTileBytes) {
      for (int c = 0; c < 8; ++c) {  // low nibbles: sub-block 2k; high nibbles in place (16 q): 2k + 1
        const __m512i v = _mm512_loadu_si512(q + 64 * c);
        _mm512_store_si512(b + 64 * c, _mm512_and_si512(v, m0f));
        _mm512_store_si512(b + kAmxBTileBytes + 64 * c, _mm512_and_si512(v, mf0));
      }
    }
  }
  [[gnu::always_inline]] static __m512 Tail(const int32_t* c0, const int32_t* c1, const Scales& sc, int k,
                                            const AmxRows& a, int64_t i0, int r, __m512 acc, int32_t*) {
    return Q4KGroupTail(_mm512_load_si512(c0), _mm512_load_si512(c1), sc, k, a.xs + (i0 / kActGroup) * kAmxRows + r,
                        a.s32 + (i0 / 32) * kAmxRows + r, acc, kAmxRows);
  }
};

// The 32-input formats: d (and Q4_1's m) of the 16 outputs per block.
struct AmxBlockScales {
  alignas(64) float d[16];
  alignas(64) float m[16];
};
inline void AmxDecodeD(const uint8_t* blk, AmxBlockScales* sc) {
  _mm512_store_ps(sc->d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))));
}
// The 4 nibble chunks at q as a B tile: low nibbles (inputs 4c..+3) in rows 0..3, high nibbles
// (16 + 4c..+3) in rows 4..7, minus `off` (Q4_0's 8, as s8).
inline void AmxNibbleTile(const uint8_t* q, int off, uint8_t* b) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), o = _mm512_set1_epi8(static_cast<char>(off));
  for (int c = 0; c < 4; ++c) {
    const __m512i v = _mm512_loadu_si512(q + 64 * c);
    _mm512_store_si512(b + 64 * c, _mm512_sub_epi8(_mm512_and_si512(v, m0f), o));
    _mm512_store_si512(b + 256 + 64 * c, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m0f), o));
  }
}

template <bool kQ4_1>
struct AmxNibbles {  // Q4_1 (d, m; u8 nibbles) and Q4_0 (d; nibbles - 8 as s8)
  static constexpr int kTdp = 1, kSteps = 1, kInputs = 32;
  static constexpr bool kSigned = !kQ4_1, kSameA = false, kMins = kQ4_1;
  using Scales = AmxBlockScales;
  static void Prepare(const uint8_t* blk, Scales* sc, uint8_t* b) {
    AmxDecodeD(blk, sc);
    if constexpr (kQ4_1) {
      _mm512_store_ps(sc->m, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32))));
      AmxNibbleTile(blk + 64, 0, b);
    } else {
      AmxNibbleTile(blk + 32, 8, b);
    }
  }
  [[gnu::always_inline]] static __m512 Tail(const int32_t* c0, const int32_t*, const Scales& sc, int, const AmxRows& a,
                                            int64_t i0, int r, __m512 acc, int32_t*) {
    return BlockTail(_mm512_load_si512(c0), a.xs[(i0 / kActGroup) * kAmxRows + r], _mm512_load_ps(sc.d), acc);
  }
  [[gnu::always_inline]] static __m512 Min(const Scales& sc, const AmxRows& a, int64_t i0, int r, __m512 mins) {
    return _mm512_fnmadd_ps(_mm512_load_ps(sc.m), _mm512_set1_ps(a.s32[(i0 / 32) * kAmxRows + r]), mins);
  }
};

struct AmxQ50 {  // 5-bit quants, u8 in [0, 31]
  static constexpr int kTdp = 1, kSteps = 1, kInputs = 32;
  static constexpr bool kSigned = false, kSameA = false, kMins = false;
  using Scales = AmxBlockScales;
  static void Prepare(const uint8_t* blk, Scales* sc, uint8_t* b) {
    AmxDecodeD(blk, sc);
    const __m512i m0f = _mm512_set1_epi8(0x0F), table = FifthBitTable(), qh = _mm512_loadu_si512(blk + 32);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(blk + 96 + 64 * c);
      _mm512_store_si512(b + 64 * c, _mm512_or_si512(_mm512_and_si512(v, m0f),
                                                     _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 4 * c), table)));
      _mm512_store_si512(b + 256 + 64 * c,
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m0f),
                                         _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 16 + 4 * c), table)));
    }
  }
  [[gnu::always_inline]] static __m512 Tail(const int32_t* c0, const int32_t*, const Scales& sc, int, const AmxRows& a,
                                            int64_t i0, int r, __m512 acc, int32_t*) {
    return Q50BlockTail(_mm512_load_si512(c0), a.xs[(i0 / kActGroup) * kAmxRows + r], a.s32[(i0 / 32) * kAmxRows + r],
                        _mm512_load_ps(sc.d), acc);
  }
};

struct AmxQ80 {  // s8 quants: the 8 chunks are the B tile as stored
  static constexpr int kTdp = 1, kSteps = 1, kInputs = 32;
  static constexpr bool kSigned = true, kSameA = false, kMins = false;
  using Scales = AmxBlockScales;
  static void Prepare(const uint8_t* blk, Scales* sc, uint8_t* b) {
    AmxDecodeD(blk, sc);
    std::memcpy(b, blk + 32, kAmxBTileBytes);
  }
  [[gnu::always_inline]] static __m512 Tail(const int32_t* c0, const int32_t*, const Scales& sc, int, const AmxRows& a,
                                            int64_t i0, int r, __m512 acc, int32_t*) {
    return BlockTail(_mm512_load_si512(c0), a.xs[(i0 / kActGroup) * kAmxRows + r], _mm512_load_ps(sc.d), acc);
  }
};

// Q6_K: step (n, mm) of a super-block is the 32-input block mm of its 128-input half n, whose
// sub-blocks h = 0, 1 (16 inputs each, chunks 4h..4h+3) have their own int8 scales. Both B tiles
// of a step are 8 rows (32 inputs) of signed quants q - 32 (s8 in [-32, 31]) with the other
// sub-block's 4 rows zero, so two TDPBSSD against the same A tile give each sub-block's sum with
// ggml's offset already removed: c_h = sum16(q x) - 32 sum16(x). The tail forms sc_0 c_0 +
// sc_1 c_1 and sums it over the steps of an activation group in int32 (`carry`, the row's
// running sum) before the FP32 steps: the exact integer, and the same FP32 operations, of the
// VNNI kernel's group (Q6K::Pass).
struct AmxQ6K {
  static constexpr int kTdp = 2, kSteps = 8, kInputs = 32;
  static constexpr bool kSigned = true, kSameA = true, kMins = false;
  static constexpr int kGroupSteps = kActGroup / kInputs;  // steps per activation group
  using Scales = Q6KScales;
  static_assert(kActGroup % kInputs == 0 && 128 % kActGroup == 0);
  static void Prepare(const uint8_t* blk, Scales* sc, uint8_t* b) {
    Q6K::Decode(blk, sc);
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    const __m512i zero = _mm512_setzero_si512();
    for (int n = 0; n < 2; ++n) {
      for (int mm = 0; mm < 4; ++mm, b += 2 * kAmxBTileBytes) {
        for (int c = 0; c < 8; ++c) {  // chunk c: row c of sub-block c / 4's tile; row c of the other is 0
          const __m512i q = _mm512_sub_epi8(Q6K::Unpack(mm, blk + 288 + (8 * n + c) * 192, m0f, m30), k32);
          _mm512_store_si512(b + 64 * c, c < 4 ? q : zero);
          _mm512_store_si512(b + kAmxBTileBytes + 64 * c, c < 4 ? zero : q);
        }
      }
    }
  }
  [[gnu::always_inline]] static __m512 Tail(const int32_t* c0, const int32_t* c1, const Scales& sc, int k,
                                            const AmxRows& a, int64_t i0, int r, __m512 acc, int32_t* carry) {
    const int j = 8 * (k / 4) + 2 * (k % 4);  // sub-block scales j, j + 1
    __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c0), sc.sc[j]),
                                 _mm512_mullo_epi32(_mm512_load_si512(c1), sc.sc[j + 1]));
    if (k % kGroupSteps != 0) v = _mm512_add_epi32(v, _mm512_load_si512(carry));
    if (k % kGroupSteps != kGroupSteps - 1) {
      _mm512_store_si512(carry, v);
      return acc;
    }
    const __m512 ds = _mm512_mul_ps(sc.d, _mm512_set1_ps(a.xs[(i0 / kActGroup) * kAmxRows + r]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, acc);
  }
};

// A chunk of tiles of one matrix made ready for the tiles once, for every row block: per (tile,
// super-block) the decoded scales and the B tiles of its steps.
template <class F>
struct AmxChunk {
  static constexpr int64_t kSuperBytes = F::kSteps * F::kTdp * kAmxBTileBytes;
  int64_t supers = 0;
  std::vector<typename F::Scales> scales;  // (tiles, supers)
  std::vector<uint8_t> b;                  // (tiles, supers, kSuperBytes), 64-byte aligned

  void Prepare(const KMatrix& w, int64_t t0, int64_t t1) {
    supers = w.supers();
    const int64_t n = (t1 - t0) * supers;
    scales.resize(static_cast<size_t>(n));
    b.resize(static_cast<size_t>(n * kSuperBytes + 64));
    for (int64_t i = 0; i < n; ++i) {
      F::Prepare(w.block(t0 + i / supers, i % supers), &scales[static_cast<size_t>(i)], Aligned() + i * kSuperBytes);
    }
  }
  // The B tiles and scales of tile i of the chunk, from its first super-block.
  const uint8_t* Tiles(int64_t i) const { return Aligned() + i * supers * kSuperBytes; }
  const typename F::Scales* Scales(int64_t i) const { return scales.data() + i * supers; }

 private:
  uint8_t* Aligned() const {
    auto p = reinterpret_cast<uintptr_t>(b.data());
    return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t{63});
  }
};

// One step's integer sums on the tiles: the activation rows' inputs at aq (row stride `stride`)
// against the step's B tiles at bt, into C0 (and C1 for the second 32 inputs when kTdp == 2);
// AMX_STORE writes them to c[0], c[1]. Macros: the tile operands must be literal register numbers.
#define MR_AMX_DOT1(C0, aq, stride, bt, kSigned) \
  do {                                           \
    _tile_zero(C0);                              \
    _tile_loadd(4, (aq), (stride));              \
    _tile_loadd(6, (bt), 64);                    \
    if constexpr (kSigned) {                     \
      _tile_dpbssd(C0, 4, 6);                    \
    } else {                                     \
      _tile_dpbsud(C0, 4, 6);                    \
    }                                            \
  } while (0)
#define MR_AMX_DOT2(C0, C1, aq, stride, bt) \
  do {                                      \
    _tile_zero(C0);                         \
    _tile_zero(C1);                         \
    _tile_loadd(4, (aq), (stride));         \
    _tile_loadd(5, (aq) + 32, (stride));    \
    _tile_loadd(6, (bt), 64);               \
    _tile_loadd(7, (bt) + 512, 64);         \
    _tile_dpbsud(C0, 4, 6);                 \
    _tile_dpbsud(C1, 5, 7);                 \
  } while (0)
#define MR_AMX_DOT2S(C0, C1, aq, stride, bt) \
  do {                                       \
    _tile_zero(C0);                          \
    _tile_zero(C1);                          \
    _tile_loadd(4, (aq), (stride));          \
    _tile_loadd(6, (bt), 64);                \
    _tile_loadd(7, (bt) + 512, 64);          \
    _tile_dpbssd(C0, 4, 6);                  \
    _tile_dpbssd(C1, 4, 7);                  \
  } while (0)
#define MR_AMX_STORE(C0, C1, c, kTdp)                      \
  do {                                                     \
    _tile_stored(C0, (c)[0], 64);                          \
    if constexpr (kTdp == 2) _tile_stored(C1, (c)[1], 64); \
  } while (0)

// Step g's tile products into C pair P (0: tmm0/1, 1: tmm2/3).
template <class F, int P>
MR_AMX_TARGET inline void AmxDot(const AmxRows& a, const uint8_t* bt, int64_t g) {
  const int8_t* aq = a.q + F::kInputs * g;
  const uint8_t* b = bt + g * F::kTdp * kAmxBTileBytes;
  if constexpr (F::kSameA) {
    static_assert(F::kTdp == 2 && F::kSigned);
    if constexpr (P == 0) {
      MR_AMX_DOT2S(0, 1, aq, a.cols, b);
    } else {
      MR_AMX_DOT2S(2, 3, aq, a.cols, b);
    }
  } else if constexpr (F::kTdp == 2) {
    static_assert(!F::kSigned);
    if constexpr (P == 0) {
      MR_AMX_DOT2(0, 1, aq, a.cols, b);
    } else {
      MR_AMX_DOT2(2, 3, aq, a.cols, b);
    }
  } else if constexpr (P == 0) {
    MR_AMX_DOT1(0, aq, a.cols, b, F::kSigned);
  } else {
    MR_AMX_DOT1(2, aq, a.cols, b, F::kSigned);
  }
}
template <class F, int P>
MR_AMX_TARGET inline void AmxStore(int32_t (*c)[kAmxRows][kKTile]) {
  if constexpr (P == 0) {
    MR_AMX_STORE(0, 1, c, F::kTdp);
  } else {
    MR_AMX_STORE(2, 3, c, F::kTdp);
  }
}

// Tile i of a prepared chunk against the R (<= 16) first rows of a 16-row block: out[r] = the
// 16 outputs of row r. The steps of the whole tile run as one sequence g: the tile products of
// step g + 1 are issued before the FP32 tails of step g, its stores after them, and the lines of
// step g + 2 are prefetched into L1.
template <class F, int R>
MR_AMX_TARGET void AmxTile(const AmxChunk<F>& ch, int64_t i, const AmxRows& a, float (*out)[kKTile]) {
  constexpr int64_t kIn = F::kInputs;
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  alignas(64) int32_t c[2][2][kAmxRows][kKTile];
  alignas(64) int32_t carry[R][kKTile];  // a format's integer sums across steps (AmxQ6K)
  const int64_t steps = ch.supers * F::kSteps;
  const uint8_t* bt = ch.Tiles(i);
  const typename F::Scales* sc = ch.Scales(i);
  AmxDot<F, 0>(a, bt, 0);
  AmxStore<F, 0>(c[0]);
  for (int64_t g = 0; g < steps; ++g) {
    const bool next = g + 1 < steps;
    if (next) {
      if (g & 1) {
        AmxDot<F, 0>(a, bt, g + 1);
      } else {
        AmxDot<F, 1>(a, bt, g + 1);
      }
    }
    if (g + 2 < steps) {
      const uint8_t* pb = bt + (g + 2) * F::kTdp * kAmxBTileBytes;
#pragma GCC unroll 16
      for (int l = 0; l < 8 * F::kTdp; ++l) _mm_prefetch(reinterpret_cast<const char*>(pb + 64 * l), _MM_HINT_T0);
      const int8_t* pa = a.q + kIn * (g + 2);
#pragma GCC unroll 16
      for (int l = 0; l < kAmxRows; ++l) _mm_prefetch(reinterpret_cast<const char*>(pa + l * a.cols), _MM_HINT_T0);
    }
    const auto& cg = c[g & 1];
    const typename F::Scales& m = sc[g / F::kSteps];
    const int k = static_cast<int>(g % F::kSteps);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = F::Tail(cg[0][r], cg[1][r], m, k, a, kIn * g, r, acc[r], carry[r]);
    if (next) {
      if (g & 1) {
        AmxStore<F, 0>(c[0]);
      } else {
        AmxStore<F, 1>(c[1]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], acc[r]);
  // Q4_1's minimum terms: their own accumulator, block by block, as the VNNI kernel sums them.
  if constexpr (F::kMins) {
    __m512 mins[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) mins[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < ch.supers; ++s) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) mins[r] = F::Min(sc[s], a, 32 * s, r, mins[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], _mm512_sub_ps(_mm512_load_ps(out[r]), mins[r]));
  }
}

// AmxTile for the first nr rows (the row count rounded up to 4: fewer FP32 tails to run).
template <class F>
MR_AMX_TARGET void AmxRowsOf(int nr, const AmxChunk<F>& ch, int64_t i, const AmxRows& a, float (*out)[kKTile]) {
  if (nr <= 4) return AmxTile<F, 4>(ch, i, a, out);
  if (nr <= 8) return AmxTile<F, 8>(ch, i, a, out);
  if (nr <= 12) return AmxTile<F, 12>(ch, i, a, out);
  return AmxTile<F, 16>(ch, i, a, out);
}

// For every L2 chunk of tiles of [t_begin, t_end): prepare(c0, c1), then visit(i, t, a, r0, nr)
// for every block of up to 16 rows and tile t (the chunk's i-th) of the chunk, with the tile
// configuration loaded.
template <class Prepare, class Visit>
MR_AMX_TARGET void ForEachAmxBlock(const QActs& x, int64_t n_rows, int64_t chunk_tiles, int64_t t_begin, int64_t t_end,
                                   Prepare prepare, Visit visit) {
  static const AmxConfig kConfig;
  _tile_loadconfig(&kConfig);
  AmxRowBlocks blocks(x, n_rows);
  for (int64_t c0 = t_begin; c0 < t_end; c0 += chunk_tiles) {
    const int64_t c1 = c0 + chunk_tiles < t_end ? c0 + chunk_tiles : t_end;
    prepare(c0, c1);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kAmxRows) {
      const int nr = static_cast<int>(n_rows - r0 < kAmxRows ? n_rows - r0 : kAmxRows);
      const AmxRows a = blocks.At(r0);
      for (int64_t t = c0; t < c1; ++t) visit(t - c0, t, a, r0, nr);
    }
  }
  _tile_release();
}

template <class F>
void MatmulAmx(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
               int64_t t_end) {
  alignas(64) float out[kAmxRows][kKTile];
  thread_local AmxChunk<F> ch;
  ForEachAmxBlock(
      x, n_rows, KChunkTiles(w, 1), t_begin, t_end, [&](int64_t c0, int64_t c1) { ch.Prepare(w, c0, c1); },
      [&](int64_t i, int64_t t, const AmxRows& a, int64_t r0, int nr) {
        AmxRowsOf<F>(nr, ch, i, a, out);
        for (int r = 0; r < nr; ++r) StoreKTile(out[r], w.rows, t, y + (r0 + r) * ldy);
      });
}

template <class F>
void MatmulGluAmx(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, mr::GluAct act, float* y,
                  int64_t ldy, int64_t t_begin, int64_t t_end) {
  alignas(64) float og[kAmxRows][kKTile];
  alignas(64) float ou[kAmxRows][kKTile];
  thread_local AmxChunk<F> cg, cu;
  ForEachAmxBlock(
      x, n_rows, KChunkTiles(gate, 2), t_begin, t_end,
      [&](int64_t c0, int64_t c1) {
        cg.Prepare(gate, c0, c1);
        cu.Prepare(up, c0, c1);
      },
      [&](int64_t i, int64_t t, const AmxRows& a, int64_t r0, int nr) {
        AmxRowsOf<F>(nr, cg, i, a, og);
        AmxRowsOf<F>(nr, cu, i, a, ou);
        for (int r = 0; r < nr; ++r) {
          GluRow(og[r], ou[r], act);
          StoreKTile(og[r], gate.rows, t, y + (r0 + r) * ldy);
        }
      });
}

}  // namespace

namespace mr::x86 {

bool AmxPermitted() {
  // Linux: the AMX tile data state is off until a process asks for it (ARCH_REQ_XCOMP_PERM).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return ok;
}

// The KernelTable entry points of format Fmt on AMX (F) for 16 rows and more, else the AVX-512 ones.
#define MR_DEFINE_AMX_KERNELS(Fmt, F)                                                                              \
  void Matmul##Fmt##Amx(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,  \
                        int64_t t_end) {                                                                           \
    if (n_rows < kAmxMinRows || !AmxPermitted()) return Matmul##Fmt##Avx512(w, x, n_rows, y, ldy, t_begin, t_end); \
    MatmulAmx<F>(w, x, n_rows, y, ldy, t_begin, t_end);                                                            \
  }                                                                                                                \
  void Matmul##Fmt##GluAmx(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act,     \
                           float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {                                \
    if (n_rows < kAmxMinRows || !AmxPermitted()) {                                                                 \
      return Matmul##Fmt##GluAvx512(gate, up, x, n_rows, act, y, ldy, t_begin, t_end);                             \
    }                                                                                                              \
    MatmulGluAmx<F>(gate, up, x, n_rows, act, y, ldy, t_begin, t_end);                                             \
  }
MR_DEFINE_AMX_KERNELS(Q4K, AmxQ4K)
MR_DEFINE_AMX_KERNELS(Q6K, AmxQ6K)
MR_DEFINE_AMX_KERNELS(Q41, AmxNibbles<true>)
MR_DEFINE_AMX_KERNELS(Q40, AmxNibbles<false>)
MR_DEFINE_AMX_KERNELS(Q50, AmxQ50)
MR_DEFINE_AMX_KERNELS(Q80, AmxQ80)
#undef MR_DEFINE_AMX_KERNELS

}  // namespace mr::x86

namespace mr::x86 {

MR_DEFINE_K_KERNELS(Q4K, Avx512, KTile<K4<false>>)
MR_DEFINE_K_KERNELS(Q5K, Avx512, KTile<K4<true>>)
MR_DEFINE_K_KERNELS(Q6K, Avx512, KTile<Q6K>)
MR_DEFINE_K_KERNELS(Q50, Avx512, KTile<Q50>)
MR_DEFINE_K_KERNELS(Q41, Avx512, KTile<Q41>)
MR_DEFINE_K_KERNELS(Q80, Avx512, KTile<Q80>)
MR_DEFINE_K_KERNELS(Q40, Avx512, KTile<Q40>)
MR_DEFINE_K_KERNELS(F16, Avx512, FTile<false>)
MR_DEFINE_K_KERNELS(BF16, Avx512, FTile<true>)
MR_DEFINE_K_KERNELS(MXFP4, Avx512, KTile<MXFP4>)

}  // namespace mr::x86
