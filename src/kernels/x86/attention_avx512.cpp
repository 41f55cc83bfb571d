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

#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/vec_math512.h"

namespace {

constexpr int64_t kBlock = 32;  // cache positions per block, one per lane of two registers
static_assert(kBlock == 32, "BlockMask32");

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

// out_p = out_p * corr_p + sum over the block's 32 positions of prob_p[jj] * vf[jj], for P pairs
// whose outputs (NC 16-float chunks each) stay in registers; each V load serves the P pairs.
template <int NC, int P>
[[gnu::always_inline]] inline void AccumulateV(const float* const* prob, const float* corr, const float* vf,
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

using AccumulateFn = void (*)(int np, const float* const* prob, const float* corr, const float* vf, float* const* out);

// np (<= 4) pairs through AccumulateV, as many at once as the registers hold.
template <int NC>
void AccumulateGroup(int np, const float* const* prob, const float* corr, const float* vf, float* const* out) {
  constexpr int P = NC <= 4 ? 4 : NC <= 8 ? 2 : 1;
  int p = 0;
  for (; p + P <= np; p += P) AccumulateV<NC, P>(prob + p, corr + p, vf, out + p);
  for (; p < np; ++p) AccumulateV<NC, 1>(prob + p, corr + p, vf, out + p);
}

AccumulateFn PickAccumulate(int64_t nc) {
  switch (nc) {
    case 2:
      return &AccumulateGroup<2>;
    case 4:
      return &AccumulateGroup<4>;
    case 6:
      return &AccumulateGroup<6>;
    case 8:
      return &AccumulateGroup<8>;
    case 10:
      return &AccumulateGroup<10>;
    case 12:
      return &AccumulateGroup<12>;
    case 14:
      return &AccumulateGroup<14>;
    default:
      return &AccumulateGroup<16>;
  }
}

// Up to four pairs waiting for the block: their query heads, outputs, lane masks and running
// softmax state.
struct Group {
  int n = 0;
  const float* q[4];
  float* out[4];
  __mmask16 valid[4][2];  // positions 0-15 and 16-31 of the block
  float* m[4];
  float* l[4];
};

template <int P>
void ScoreGroup(const Group& g, const float* kt, int64_t hd, float scale, float softcap, float (*prob)[kBlock],
                float* corr) {
  __m512 s[2 * P];
  Scores<P>(g.q, kt, hd, s);
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    __m512 sv[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512 x = _mm512_mul_ps(s[2 * p + h], _mm512_set1_ps(scale));
      if (softcap > 0) x = SoftCap16(x, softcap);
      sv[h] = _mm512_mask_blend_ps(g.valid[p][h], _mm512_set1_ps(-INFINITY), x);
    }
    const float bm = std::max(*g.m[p], _mm512_reduce_max_ps(_mm512_max_ps(sv[0], sv[1])));
    // exp(-inf) = 0 on the row's first block; exp(0) = 1 exactly, without the call, while the max
    // holds (most blocks).
    corr[p] = bm == *g.m[p] ? 1.0f : std::exp(*g.m[p] - bm);
    *g.m[p] = bm;
    const __m512 bmv = _mm512_set1_ps(bm);
    const __m512 pv0 = _mm512_maskz_mov_ps(g.valid[p][0], Exp16(_mm512_sub_ps(sv[0], bmv)));
    const __m512 pv1 = _mm512_maskz_mov_ps(g.valid[p][1], Exp16(_mm512_sub_ps(sv[1], bmv)));
    _mm512_storeu_ps(prob[p], pv0);
    _mm512_storeu_ps(prob[p] + 16, pv1);
    *g.l[p] = *g.l[p] * corr[p] + _mm512_reduce_add_ps(_mm512_add_ps(pv0, pv1));
  }
}

// Scores, softmax update and V accumulation of a group against the current block.
void RunGroup(Group& g, const float* kt, const float* vf, int64_t hd, float scale, float softcap,
              AccumulateFn accumulate) {
  alignas(64) float prob[4][kBlock];
  float corr[4];
  switch (g.n) {
    case 1:
      ScoreGroup<1>(g, kt, hd, scale, softcap, prob, corr);
      break;
    case 2:
      ScoreGroup<2>(g, kt, hd, scale, softcap, prob, corr);
      break;
    case 3:
      ScoreGroup<3>(g, kt, hd, scale, softcap, prob, corr);
      break;
    default:
      ScoreGroup<4>(g, kt, hd, scale, softcap, prob, corr);
  }
  const float* pp[4] = {prob[0], prob[1], prob[2], prob[3]};
  accumulate(g.n, pp, corr, vf, g.out);
  g.n = 0;
}

}  // namespace

namespace mr::x86 {

void AttentionGqaAvx512(const AttnChunk& a, float* scratch) {
  const int64_t hd = a.hd, n_q = a.n_q, n_rows = a.n_rows;
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
  float* l = m + n_rows * n_q;                 // (n_rows * n_q) running sum of exp
  int64_t jmin = a.lo[0], jmax = a.hi[0];
  for (int64_t r = 0; r < n_rows; ++r) {
    jmin = std::min(jmin, a.lo[r]);
    jmax = std::max(jmax, a.hi[r]);
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < n_q; ++h) {
      m[r * n_q + h] = -INFINITY;
      l[r * n_q + h] = 0;
      for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(out + h * hd + i, _mm512_setzero_ps());
    }
  }
  const AccumulateFn accumulate = PickAccumulate(hd / 16);
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
    Group g;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t lo = a.lo[r] - b0, hi = a.hi[r] - b0;  // the row's positions, relative to the block
      if (lo >= kBlock || hi <= 0) continue;
      const uint32_t valid = BlockMask32(lo, hi);
      for (int64_t h = 0; h < n_q; ++h) {
        g.q[g.n] = a.q + r * a.q_stride + h * hd;
        g.out[g.n] = a.out + r * a.out_stride + h * hd;
        g.valid[g.n][0] = static_cast<__mmask16>(valid);
        g.valid[g.n][1] = static_cast<__mmask16>(valid >> 16);
        g.m[g.n] = m + r * n_q + h;
        g.l[g.n] = l + r * n_q + h;
        if (++g.n == 4) RunGroup(g, kt, vf, hd, a.scale, a.softcap, accumulate);
      }
    }
    if (g.n > 0) RunGroup(g, kt, vf, hd, a.scale, a.softcap, accumulate);
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < n_q; ++h) {
      const float lv = l[r * n_q + h];
      const __m512 inv = _mm512_set1_ps(lv > 0 ? 1.0f / lv : 0.0f);
      for (int64_t i = 0; i < hd; i += 16)
        _mm512_storeu_ps(out + h * hd + i, _mm512_mul_ps(_mm512_loadu_ps(out + h * hd + i), inv));
    }
  }
}

}  // namespace mr::x86
