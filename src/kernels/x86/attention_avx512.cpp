// AVX-512 attention over the BF16 KV cache (KernelTable::attention, ops.h), for head sizes that
// are a multiple of 32 (up to 256): blocks of 32 cache positions aligned to multiples of 32, one
// position per lane of two registers.
//
// Per block, K is read and transposed once for every query row and head of the chunk (16 x 16
// transposes of 32-bit words, each word a BF16 pair (i, i+1); shift and mask make them two FP32
// rows of K^T), and V converted once. The (row, head) pairs of the chunk then take the block in
// groups of up to four: the scores are hd FMAs per pair and 16 positions, with the query element
// broadcast from memory and no horizontal sums (each K^T load serves the whole group, each
// broadcast two K^T rows: with 16 positions a block the score loop was bound by loads), the
// online softmax runs on the 32 lanes (its reductions and the output rescaling once per 32
// positions), and the probabilities are applied to V with the pairs' outputs in registers. A
// prefill chunk of R rows thus reads and converts each K/V block once instead of R times. Every
// pair's arithmetic is the same whatever group it falls in (fixed FMA chains), so a row's result
// does not depend on the rows that share its call. Same online-softmax algorithm as
// ref::AttentionGqa, so results agree to rounding.
// GCC 12's 512-bit conversion intrinsics start from a self-initialized "undefined" register
// (avx512fintrin.h), which -Wmaybe-uninitialized reports once inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>

#include "kernels/x86/attention_pairs512.h"
#include "kernels/x86/kernels_x86.h"

namespace {

constexpr int64_t kBlock = kPairBlock;  // cache positions per block, one per lane of two registers

// Scores of P (row, head) pairs against the block's K^T (hd x 32): s[2p + h] holds positions
// 16h..16h+15 of pair p. Two FMA chains per pair and half (even and odd i) for every P, so a
// pair's scores do not depend on the pairs computed with it.
template <int P>
[[gnu::always_inline]] inline void Scores(const float* const* qp, const float* kt, int64_t hd, __m512* s) {
  __m512 a[2 * P], b[2 * P];
#pragma GCC unroll 8
  for (int p = 0; p < 2 * P; ++p) a[p] = b[p] = _mm512_setzero_ps();
  for (int64_t i = 0; i < hd; i += 2) {
    const float* k = kt + i * kBlock;
    const __m512 k00 = _mm512_loadu_ps(k), k01 = _mm512_loadu_ps(k + 16);
    const __m512 k10 = _mm512_loadu_ps(k + kBlock), k11 = _mm512_loadu_ps(k + kBlock + 16);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 q0 = _mm512_set1_ps(qp[p][i]), q1 = _mm512_set1_ps(qp[p][i + 1]);
      a[2 * p] = _mm512_fmadd_ps(q0, k00, a[2 * p]);
      a[2 * p + 1] = _mm512_fmadd_ps(q0, k01, a[2 * p + 1]);
      b[2 * p] = _mm512_fmadd_ps(q1, k10, b[2 * p]);
      b[2 * p + 1] = _mm512_fmadd_ps(q1, k11, b[2 * p + 1]);
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < 2 * P; ++p) s[p] = _mm512_add_ps(a[p], b[p]);
}

// The FP32 arithmetic for the shared group steps (attention_pairs512.h).
struct Fp32Pairs {
  using QWord = float;
  using Prob = float;
  using VWord = float;
  static constexpr int kProbWords = kBlock;

  // out_p = out_p * corr_p + sum over the block's 32 positions of prob_p[jj] * vf[jj], for P pairs
  // whose outputs (NC 16-float chunks each) stay in registers; each V load serves the P pairs.
  template <int NC, int P>
  [[gnu::always_inline]] static void AccumulateV(const float* const* prob, const float* corr, const float* vf,
                                                 float* const* out) {
    __m512 acc[P][NC];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 cv = _mm512_set1_ps(corr[p]);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[p][c] = _mm512_mul_ps(_mm512_loadu_ps(out[p] + 16 * c), cv);
    }
    for (int64_t jj = 0; jj < kBlock; ++jj) {
      __m512 pj[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) pj[p] = _mm512_set1_ps(prob[p][jj]);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        const __m512 vv = _mm512_loadu_ps(vf + jj * 16 * NC + 16 * c);
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) acc[p][c] = _mm512_fmadd_ps(pj[p], vv, acc[p][c]);
      }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[p] + 16 * c, acc[p][c]);
    }
  }

  const mr::AttnChunk& a;
  const float* kt;  // (hd, 32): K^T of the block
  const float* vb;  // (32, hd): V of the block in FP32
  PairAccumulateFn<float, float> accumulate;

  const float* Query(int64_t r, int64_t h) const {
    return a.q + r * a.q_stride + h * a.hd;
  }

  template <int P>
  void ScoreGroup(const PairGroup<float>& g, float (*prob)[kBlock], float* corr) const {
    __m512 s[2 * P];
    Scores<P>(g.q, kt, a.hd, s);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 e0, e1;
      corr[p] =
          BlockSoftmax(s[2 * p], s[2 * p + 1], g.valid[p][0], g.valid[p][1], a.scale, a.softcap, g.m[p], &e0, &e1);
      _mm512_storeu_ps(prob[p], e0);
      _mm512_storeu_ps(prob[p] + 16, e1);
      *g.l[p] = *g.l[p] * corr[p] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    }
  }
};

}  // namespace

namespace mr::x86 {

void AttentionGqaAvx512(const AttnChunk& a, float* scratch) {
  const int64_t hd = a.hd;
  if (hd % 32 != 0 || hd > 256) {
    AttentionGqaAvx2(a, scratch);
    return;
  }
  // K^T and V on 64-byte lines: the score and V loops' loads would otherwise each span two (a
  // third of the kernel's time on the Xeon of docs/performance.md stop 25).
  static_assert(kBlock <= kAttnBlock);
  float* kt = AlignAttentionScratch(scratch);  // (hd, 32): K^T of the block
  float* vf = kt + hd * kBlock;                // (32, hd): V of the block in FP32
  float* m = vf + kBlock * hd;                 // (n_rows * n_q) running max
  float* l = m + a.n_rows * a.n_q;             // (n_rows * n_q) running sum of exp
  int64_t jmin, jmax;
  StartPairs(a, m, l, &jmin, &jmax);
  const Fp32Pairs k{a, kt, vf, PickAccumulate<Fp32Pairs>(hd / 16)};
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t b0 = jmin / kBlock * kBlock; b0 < jmax; b0 += kBlock) {
    // Positions of the block that some row reads; the others are zero (never read from memory).
    const int64_t j0 = std::max(b0, jmin) - b0, j1 = std::min(b0 + kBlock, jmax) - b0;
    const uint16_t* kb = a.k + b0 * a.kv_stride;
    for (int64_t half = 0; half < kBlock; half += 16) {  // positions half..half+15
      for (int64_t i0 = 0; i0 < hd; i0 += 32) {          // 16 BF16 pairs of each position, transposed
        __m512i r[16];                                   // r[p]: pair (i0 + 2p, i0 + 2p + 1) of the 16 positions
        LoadKPairs16(kb + half * a.kv_stride, a.kv_stride, i0, j0 - half, j1 - half, r);
#pragma GCC unroll 16
        for (int64_t pr = 0; pr < 16; ++pr) {
          float* row = kt + (i0 + 2 * pr) * kBlock + half;
          _mm512_storeu_ps(row, _mm512_castsi512_ps(_mm512_slli_epi32(r[pr], 16)));
          _mm512_storeu_ps(row + kBlock, _mm512_castsi512_ps(_mm512_and_si512(r[pr], hi_mask)));
        }
      }
    }
    for (int64_t jj = 0; jj < kBlock; ++jj) {
      const bool in = jj >= j0 && jj < j1;
      const uint16_t* vr = a.v + (b0 + jj) * a.kv_stride;
      for (int64_t i = 0; i < hd; i += 16) {
        const __m512 x =
            in ? _mm512_castsi512_ps(_mm512_slli_epi32(
                     _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + i))), 16))
               : _mm512_setzero_ps();
        _mm512_storeu_ps(vf + jj * hd + i, x);
      }
    }
    VisitBlock(a, b0, m, l, k);
  }
  FinishPairs(a, l);
}

}  // namespace mr::x86
