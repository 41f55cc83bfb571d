// Attention on AVX-512 BF16 dot products (KernelTable::attention of the avx512bf16 variant, ops.h),
// for head sizes that are a multiple of 32 (up to 256); others run the AVX-512 FP32 kernel.
//
// The AVX-512 kernel's structure (attention_avx512.cpp) with the AMX kernel's arithmetic
// (attention_amx_avx512.cpp): blocks of 32 cache positions aligned to multiples of 32, read once
// for every (row, head) pair of the chunk, in the pair words of LoadKvBlockPairs (vec_math512.h),
// which are vdpbf16ps operands as they lie:
//   - scores: per dim pair, one K row (16 positions' pairs) times the query's pair broadcast, so
//     each vdpbf16ps is 32 multiply-adds where the FP32 kernel's FMA is 16, and K needs no
//     conversion to FP32;
//   - the online softmax on the 32 lanes, its probabilities rounded to BF16 (RNE) in position
//     pairs, the running sum over the rounded values;
//   - V: per position pair, one V row (16 dims' pairs) times the probability pair broadcast into
//     the pairs' FP32 outputs in registers.
// The query is rounded to BF16 once per call. The products of two BF16 values are exact in FP32,
// so the rounding beyond the FP32 kernel's is the query's and the probabilities' (relative 2^-9
// each), the same as the amx variant's; kernels_test checks the result against that arithmetic
// done exactly. Every pair's chains are the same whatever group it falls in, so a row's result does
// not depend on the rows that share its call.
//
// Zen 4 runs vdpbf16ps zmm at about the FMA's instruction rate, so about 1.8x the multiply-adds a
// cycle (docs/performance.md stop 26); Intel's Xeon of stop 25 at a quarter of it, so the variant is
// picked by default on AMD only (dispatch.cpp).
// Compiled with -mavx512bf16 besides the AVX-512 flags (CMakeLists.txt: *_bf16_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/x86/attention_pairs512.h"
#include "kernels/x86/kernels_x86.h"

namespace {

constexpr int64_t kBlock = kPairBlock;  // cache positions per block (LoadKvBlockPairs)

inline __m512 Dot(__m512 acc, __m512i a, __m512i b) {
  __m512bh x, y;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  return _mm512_dpbf16_ps(acc, x, y);
}

// Scores of P pairs against the block: s[2p + h] holds positions 16h..16h+15 of pair p. q[p]: the
// pair's query in BF16 pair words (hd / 2). Two chains per half (even and odd dim pairs) for every
// P, so a pair's scores do not depend on the pairs computed with it.
template <int P>
[[gnu::always_inline]] inline void Scores(const uint32_t* const* q, const uint32_t* kb, int64_t hd, __m512* s) {
  __m512 a[2 * P], b[2 * P];
#pragma GCC unroll 8
  for (int p = 0; p < 2 * P; ++p) a[p] = b[p] = _mm512_setzero_ps();
  for (int64_t c = 0; c < hd / 32; ++c) {
    const uint32_t* t0 = kb + 2 * c * kKvTileWords;  // positions 0-15
    const uint32_t* t1 = t0 + kKvTileWords;          // positions 16-31
    for (int64_t i = 0; i < 16; i += 2) {
      const __m512i k00 = _mm512_load_si512(t0 + 16 * i), k01 = _mm512_load_si512(t1 + 16 * i);
      const __m512i k10 = _mm512_load_si512(t0 + 16 * i + 16), k11 = _mm512_load_si512(t1 + 16 * i + 16);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const __m512i q0 = _mm512_set1_epi32(static_cast<int>(q[p][16 * c + i]));
        const __m512i q1 = _mm512_set1_epi32(static_cast<int>(q[p][16 * c + i + 1]));
        a[2 * p] = Dot(a[2 * p], k00, q0);
        a[2 * p + 1] = Dot(a[2 * p + 1], k01, q0);
        b[2 * p] = Dot(b[2 * p], k10, q1);
        b[2 * p + 1] = Dot(b[2 * p + 1], k11, q1);
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < 2 * P; ++p) s[p] = _mm512_add_ps(a[p], b[p]);
}

// The BF16 arithmetic for the shared group steps (attention_pairs512.h).
struct Bf16Pairs {
  using QWord = uint32_t;  // BF16 pair words
  using Prob = uint32_t;   // BF16 probabilities of positions (2k, 2k + 1)
  using VWord = uint32_t;
  static constexpr int kProbWords = kBlock / 2;

  // out_p = out_p * corr_p + sum over the block's 16 position pairs of prob_p[k] . V[k], for P pairs
  // whose outputs (NC 16-float chunks each) stay in registers; each V load serves the P pairs.
  template <int NC, int P>
  [[gnu::always_inline]] static void AccumulateV(const uint32_t* const* prob, const float* corr, const uint32_t* vb,
                                                 float* const* out) {
    __m512 acc[P][NC];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 cv = _mm512_set1_ps(corr[p]);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[p][c] = _mm512_mul_ps(_mm512_loadu_ps(out[p] + 16 * c), cv);
    }
    for (int64_t k = 0; k < kBlock / 2; ++k) {
      __m512i pk[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) pk[p] = _mm512_set1_epi32(static_cast<int>(prob[p][k]));
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const __m512i vv = _mm512_load_si512(vb + c * kKvTileWords + 16 * k);
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) acc[p][c] = Dot(acc[p][c], vv, pk[p]);
      }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[p] + 16 * c, acc[p][c]);
    }
  }

  const mr::AttnChunk& a;
  const uint32_t* kb;  // the block's K and V pair words (LoadKvBlockPairs, or the cache's copy)
  const uint32_t* vb;
  const uint32_t* qb;  // per pair (row-major), the query in BF16 pair words
  PairAccumulateFn<uint32_t, uint32_t> accumulate;

  const uint32_t* Query(int64_t r, int64_t h) const {
    return qb + (r * a.n_q + h) * a.hd / 2;
  }

  // The group's scores, their softmax step, and the probabilities rounded to BF16 (RNE) in
  // position pairs; the running sum adds the rounded values.
  template <int P>
  void ScoreGroup(const PairGroup<uint32_t>& g, uint32_t (*prob)[kBlock / 2], float* corr) const {
    __m512 s[2 * P];
    Scores<P>(g.q, kb, a.hd, s);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 e0, e1;
      corr[p] =
          BlockSoftmax(s[2 * p], s[2 * p + 1], g.valid[p][0], g.valid[p][1], a.scale, a.softcap, g.m[p], &e0, &e1);
      *g.l[p] = *g.l[p] * corr[p] + StoreProbsBf16(e0, e1, prob[p]);
    }
  }
};

void AttentionBf16(const mr::AttnChunk& a, float* scratch) {
  const int64_t hd = a.hd, np = a.n_rows * a.n_q;
  // Scratch: the block's K and V pair words (hd / 16 tiles each), then per pair the BF16 query
  // (hd / 2 words), running max and sum.
  auto* kb = reinterpret_cast<uint32_t*>(mr::AlignAttentionScratch(scratch));
  uint32_t* vb = kb + hd / 16 * kKvTileWords;
  uint32_t* qb = vb + hd / 16 * kKvTileWords;
  auto* m = reinterpret_cast<float*>(qb + np * hd / 2);
  float* l = m + np;
  int64_t jmin, jmax;
  StartPairs(a, m, l, &jmin, &jmax);
  for (int64_t r = 0; r < a.n_rows; ++r) {
    for (int64_t h = 0; h < a.n_q; ++h) {
      const float* q = a.q + r * a.q_stride + h * hd;
      for (int64_t d = 0; d < hd; d += 32) {
        const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + d + 16), _mm512_loadu_ps(q + d));
        std::memcpy(qb + (r * a.n_q + h) * hd / 2 + d / 2, &b, sizeof(b));
      }
    }
  }
  Bf16Pairs k{a, kb, vb, qb, PickAccumulate<Bf16Pairs>(hd / 16)};
  for (int64_t b0 = jmin / kBlock * kBlock; b0 < jmax; b0 += kBlock) {
    const int64_t j0 = std::max(b0, jmin) - b0, j1 = std::min(b0 + kBlock, jmax) - b0;
    if (j0 == 0 && j1 == kBlock && b0 / kBlock < a.pair_blocks) {
      // A full block the cache holds in pair words: the same words LoadKvBlockPairs would write.
      k.kb = a.kpairs + b0 / kBlock * 16 * hd;
      k.vb = a.vpairs + b0 / kBlock * 16 * hd;
    } else {
      LoadKvBlockPairs(a, b0, j0, j1, kb, vb);
      k.kb = kb;
      k.vb = vb;
    }
    VisitBlock(a, b0, m, l, k);
  }
  FinishPairs(a, l);
}

}  // namespace

namespace mr::x86 {

void AttentionGqaAvx512Bf16(const AttnChunk& a, float* scratch) {
  if (!mr::PairLayoutHeadSize(a.hd)) return AttentionGqaAvx512(a, scratch);
  AttentionBf16(a, scratch);
}

void KvBlockPairsAvx512Bf16(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t hd, uint32_t* kb,
                            uint32_t* vb) {
  AttnChunk a{};
  a.k = k;
  a.v = v;
  a.kv_stride = kv_stride;
  a.hd = hd;
  LoadKvBlockPairs(a, 0, 0, kBlock, kb, vb);
}

}  // namespace mr::x86
