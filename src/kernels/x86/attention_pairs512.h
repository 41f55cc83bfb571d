// The steps the AVX-512 attention kernels share (attention_avx512.cpp in FP32,
// attention_bf16_avx512.cpp on BF16 dot products; the AMX kernel uses BlockSoftmax): the chunk's
// (row, head) pairs visit each block of 32 cache positions in groups of up to four, each group
// through its kernel's scores, online-softmax step and V accumulation. The kernel K supplies the
// arithmetic:
//   QWord, Prob, VWord          element types of its query heads, probability rows and V block
//   kProbWords                  Prob words per pair and block
//   Query(r, h)                 the query of row r, head h as its scores read it
//   ScoreGroup<P>(g, prob, corr)  scores, softmax step: probabilities and output rescale factors
//   AccumulateV<NC, P>(prob, corr, vb, out)  (static) out = out * corr + prob . V for P pairs of
//                               NC 16-float output chunks in registers
//   vb, accumulate              its V block and PickAccumulate<K>(hd / 16)
// Anonymous namespace like vec_math512.h: each translation unit compiles its own copy.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ops.h"
#include "kernels/x86/vec_math512.h"

namespace {

constexpr int64_t kPairBlock = 32;  // cache positions per block, one per lane of two registers

// One pair's online-softmax step on its 32 raw scores of a block (s0: positions 0-15, s1:
// 16-31; v0, v1: the positions the row reads): scaled, soft-capped, masked; *m becomes the new
// running max; e0, e1 = exp(s - max), zero where masked. Returns the factor the pair's output
// and sum are rescaled by: exp(old max - new) (0 on the row's first block, exp(-inf)), and 1
// exactly, without the call, while the max holds (most blocks).
[[gnu::always_inline]] inline float BlockSoftmax(__m512 s0, __m512 s1, __mmask16 v0, __mmask16 v1, float scale,
                                                 float softcap, float* m, __m512* e0, __m512* e1) {
  s0 = _mm512_mul_ps(s0, _mm512_set1_ps(scale));
  s1 = _mm512_mul_ps(s1, _mm512_set1_ps(scale));
  if (softcap > 0) {
    s0 = SoftCap16(s0, softcap);
    s1 = SoftCap16(s1, softcap);
  }
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  s0 = _mm512_mask_blend_ps(v0, ninf, s0);
  s1 = _mm512_mask_blend_ps(v1, ninf, s1);
  const float m_old = *m;
  const float bm = std::max(m_old, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
  *m = bm;
  const __m512 bmv = _mm512_set1_ps(bm);
  *e0 = _mm512_maskz_mov_ps(v0, Exp16(_mm512_sub_ps(s0, bmv)));
  *e1 = _mm512_maskz_mov_ps(v1, Exp16(_mm512_sub_ps(s1, bmv)));
  return bm == m_old ? 1.0f : std::exp(m_old - bm);
}

// The BF16 kernels' probabilities: e0, e1 (positions 0-15, 16-31) rounded to BF16 (round to
// nearest even) and stored at dst (64-byte aligned) as 16 words, word k the positions (2k, 2k + 1);
// returns the sum of the rounded values (the softmax divides by it).
__attribute__((target("avx512bf16"), always_inline)) inline float StoreProbsBf16(__m512 e0, __m512 e1, void* dst) {
  const __m512bh pb = _mm512_cvtne2ps_pbh(e1, e0);
  __m512i pw;
  std::memcpy(&pw, &pb, sizeof(pw));
  _mm512_store_si512(dst, pw);
  const __m512 r0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(pw)), 16));
  const __m512 r1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(pw, 1)), 16));
  return _mm512_reduce_add_ps(_mm512_add_ps(r0, r1));
}

// Up to four pairs waiting for the block: their query heads, outputs, lane masks and running
// softmax state.
template <class Q>
struct PairGroup {
  int n = 0;
  const Q* q[4];
  float* out[4];
  __mmask16 valid[4][2];  // positions 0-15 and 16-31 of the block
  float* m[4];
  float* l[4];
};

template <class Prob, class VWord>
using PairAccumulateFn = void (*)(int np, const Prob* const* prob, const float* corr, const VWord* vb,
                                  float* const* out);

// np (<= 4) pairs through K::AccumulateV, as many at once as the registers hold.
template <class K, int NC>
void AccumulateGroup(int np, const typename K::Prob* const* prob, const float* corr, const typename K::VWord* vb,
                     float* const* out) {
  constexpr int P = NC <= 4 ? 4 : NC <= 8 ? 2 : 1;
  int p = 0;
  for (; p + P <= np; p += P) K::template AccumulateV<NC, P>(prob + p, corr + p, vb, out + p);
  for (; p < np; ++p) K::template AccumulateV<NC, 1>(prob + p, corr + p, vb, out + p);
}

template <class K>
PairAccumulateFn<typename K::Prob, typename K::VWord> PickAccumulate(int64_t nc) {
  switch (nc) {
    case 2:
      return &AccumulateGroup<K, 2>;
    case 4:
      return &AccumulateGroup<K, 4>;
    case 6:
      return &AccumulateGroup<K, 6>;
    case 8:
      return &AccumulateGroup<K, 8>;
    case 10:
      return &AccumulateGroup<K, 10>;
    case 12:
      return &AccumulateGroup<K, 12>;
    case 14:
      return &AccumulateGroup<K, 14>;
    default:
      return &AccumulateGroup<K, 16>;
  }
}

// Scores, softmax step and V accumulation of a group against the current block.
template <class K>
void RunGroup(PairGroup<typename K::QWord>& g, const K& k) {
  alignas(64) typename K::Prob prob[4][K::kProbWords];
  float corr[4];
  switch (g.n) {
    case 1:
      k.template ScoreGroup<1>(g, prob, corr);
      break;
    case 2:
      k.template ScoreGroup<2>(g, prob, corr);
      break;
    case 3:
      k.template ScoreGroup<3>(g, prob, corr);
      break;
    default:
      k.template ScoreGroup<4>(g, prob, corr);
  }
  const typename K::Prob* pp[4] = {prob[0], prob[1], prob[2], prob[3]};
  k.accumulate(g.n, pp, corr, k.vb, g.out);
  g.n = 0;
}

// Every pair of the chunk that reads the block at b0, in groups of four in (row, head) order.
// m, l: the pairs' running max and sum (row-major).
template <class K>
void VisitBlock(const mr::AttnChunk& a, int64_t b0, float* m, float* l, const K& k) {
  PairGroup<typename K::QWord> g;
  for (int64_t r = 0; r < a.n_rows; ++r) {
    const int64_t lo = a.lo[r] - b0, hi = a.hi[r] - b0;  // the row's positions, relative to the block
    if (lo >= kPairBlock || hi <= 0) continue;
    const uint32_t valid = BlockMask32(lo, hi);
    for (int64_t h = 0; h < a.n_q; ++h) {
      const int64_t p = r * a.n_q + h;
      g.q[g.n] = k.Query(r, h);
      g.out[g.n] = a.out + r * a.out_stride + h * a.hd;
      g.valid[g.n][0] = static_cast<__mmask16>(valid);
      g.valid[g.n][1] = static_cast<__mmask16>(valid >> 16);
      g.m[g.n] = m + p;
      g.l[g.n] = l + p;
      if (++g.n == 4) RunGroup(g, k);
    }
  }
  if (g.n > 0) RunGroup(g, k);
}

// Before the blocks: every pair's output zero, max -inf and sum 0 (with sinks: the sink's logit
// and 1); [*jmin, *jmax) the positions some row reads.
inline void StartPairs(const mr::AttnChunk& a, float* m, float* l, int64_t* jmin, int64_t* jmax) {
  *jmin = a.lo[0];
  *jmax = a.hi[0];
  for (int64_t r = 0; r < a.n_rows; ++r) {
    *jmin = std::min(*jmin, a.lo[r]);
    *jmax = std::max(*jmax, a.hi[r]);
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < a.n_q; ++h) {
      m[r * a.n_q + h] = a.sinks ? a.sinks[h] : -INFINITY;
      l[r * a.n_q + h] = a.sinks ? 1.0f : 0.0f;
      for (int64_t i = 0; i < a.hd; i += 16) _mm512_storeu_ps(out + h * a.hd + i, _mm512_setzero_ps());
    }
  }
}

// After the blocks: every pair's output divided by its sum (0 for a pair that read nothing).
inline void FinishPairs(const mr::AttnChunk& a, const float* l) {
  for (int64_t r = 0; r < a.n_rows; ++r) {
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < a.n_q; ++h) {
      const float lv = l[r * a.n_q + h];
      const __m512 inv = _mm512_set1_ps(lv > 0 ? 1.0f / lv : 0.0f);
      for (int64_t i = 0; i < a.hd; i += 16)
        _mm512_storeu_ps(out + h * a.hd + i, _mm512_mul_ps(_mm512_loadu_ps(out + h * a.hd + i), inv));
    }
  }
}

}  // namespace
