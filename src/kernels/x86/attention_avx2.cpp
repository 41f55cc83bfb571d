// AVX2 attention over the BF16 KV cache (KernelTable::attention, ops.h), for head sizes that are
// a multiple of 8: the AVX-512 kernel's design on 8 lanes. Blocks of 8 cache positions aligned to
// multiples of 8; per block, K is converted and transposed (8 x 8) once for every query row and
// head of the chunk and V converted once; the (row, head) pairs take the block in groups of up to
// four (each K^T load serves the group; two fixed FMA chains per pair, so a pair's result does not
// depend on its group), then apply their probabilities to V in chunks of 64 outputs held in
// registers. Other head sizes take the scalar ref::AttentionGqa.
#include <algorithm>
#include <cmath>

#include "kernels/ref/ops_ref.h"
#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/vec_math.h"

namespace {

constexpr int64_t kBlock = 8;  // cache positions per block, one per lane

// In-place transpose of 8 x 8 floats (r[j] lane i -> r[i] lane j).
[[gnu::always_inline]] inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Scores of P pairs against K^T (hd x 8): two FMA chains per pair (even and odd i) for every P.
template <int P>
[[gnu::always_inline]] inline void Scores(const float* const* qp, const float* kt, int64_t hd, __m256* s) {
  __m256 a[P], b[P];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) a[p] = b[p] = _mm256_setzero_ps();
  for (int64_t i = 0; i < hd; i += 2) {
    const __m256 k0 = _mm256_loadu_ps(kt + i * kBlock), k1 = _mm256_loadu_ps(kt + (i + 1) * kBlock);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      a[p] = _mm256_fmadd_ps(_mm256_broadcast_ss(qp[p] + i), k0, a[p]);
      b[p] = _mm256_fmadd_ps(_mm256_broadcast_ss(qp[p] + i + 1), k1, b[p]);
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) s[p] = _mm256_add_ps(a[p], b[p]);
}

// out[0, 8N) = out * corr + sum over the block's 8 positions of prob[jj] * vf[jj][0, 8N).
template <int N>
[[gnu::always_inline]] inline void AccumulateV(const float* prob, float corr, const float* vf, int64_t hd, float* out) {
  __m256 acc[N];
  const __m256 cv = _mm256_set1_ps(corr);
#pragma GCC unroll 8
  for (int c = 0; c < N; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(out + 8 * c), cv);
  for (int64_t jj = 0; jj < kBlock; ++jj) {
    const __m256 pj = _mm256_broadcast_ss(prob + jj);
#pragma GCC unroll 8
    for (int c = 0; c < N; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vf + jj * hd + 8 * c), acc[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < N; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

void AccumulatePair(const float* prob, float corr, const float* vf, int64_t hd, float* out) {
  int64_t i = 0;
  for (; i + 64 <= hd; i += 64) AccumulateV<8>(prob, corr, vf + i, hd, out + i);
  switch ((hd - i) / 8) {
    case 1:
      AccumulateV<1>(prob, corr, vf + i, hd, out + i);
      break;
    case 2:
      AccumulateV<2>(prob, corr, vf + i, hd, out + i);
      break;
    case 3:
      AccumulateV<3>(prob, corr, vf + i, hd, out + i);
      break;
    case 4:
      AccumulateV<4>(prob, corr, vf + i, hd, out + i);
      break;
    case 5:
      AccumulateV<5>(prob, corr, vf + i, hd, out + i);
      break;
    case 6:
      AccumulateV<6>(prob, corr, vf + i, hd, out + i);
      break;
    case 7:
      AccumulateV<7>(prob, corr, vf + i, hd, out + i);
      break;
    default:
      break;
  }
}

struct Group {
  int n = 0;
  const float* q[4];
  float* out[4];
  __m256 valid[4];  // all-ones lanes: positions the pair's row attends
  float* m[4];
  float* l[4];
};

template <int P>
void ScoreGroup(const Group& g, const float* kt, int64_t hd, float scale, float softcap, float (*prob)[kBlock],
                float* corr) {
  __m256 s[P];
  Scores<P>(g.q, kt, hd, s);
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    __m256 x = _mm256_mul_ps(s[p], _mm256_set1_ps(scale));
    if (softcap > 0) x = SoftCap8(x, softcap);
    const __m256 sv = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, g.valid[p]);
    const float bm = std::max(*g.m[p], HMax8(sv));
    // exp(-inf) = 0 on the row's first block; exp(0) = 1 exactly, without the call, while the max
    // holds (most blocks).
    corr[p] = bm == *g.m[p] ? 1.0f : std::exp(*g.m[p] - bm);
    *g.m[p] = bm;
    const __m256 pv = _mm256_and_ps(g.valid[p], Exp8(_mm256_sub_ps(sv, _mm256_set1_ps(bm))));
    _mm256_storeu_ps(prob[p], pv);
    *g.l[p] = *g.l[p] * corr[p] + HSum8(pv);
  }
}

void RunGroup(Group& g, const float* kt, const float* vf, int64_t hd, float scale, float softcap) {
  alignas(32) float prob[4][kBlock];
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
  for (int p = 0; p < g.n; ++p) AccumulatePair(prob[p], corr[p], vf, hd, g.out[p]);
  g.n = 0;
}

}  // namespace

namespace mr::x86 {

void AttentionGqaAvx2(const AttnChunk& a, float* scratch) {
  const int64_t hd = a.hd, n_q = a.n_q, n_rows = a.n_rows;
  if (hd % 8 != 0) {
    ref::AttentionGqa(a, scratch);
    return;
  }
  float* kt = AlignAttentionScratch(scratch);  // (hd, 8): K^T of the block
  float* vf = kt + hd * kBlock;                // (8, hd): V of the block in FP32
  float* m = vf + kBlock * hd;                 // (n_rows * n_q) running max
  float* l = m + n_rows * n_q;                 // (n_rows * n_q) running sum of exp
  int64_t jmin = a.lo[0], jmax = a.hi[0];
  for (int64_t r = 0; r < n_rows; ++r) {
    jmin = std::min(jmin, a.lo[r]);
    jmax = std::max(jmax, a.hi[r]);
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < n_q; ++h) {
      m[r * n_q + h] = a.sinks ? a.sinks[h] : -INFINITY;  // a sink: a first position of value zero
      l[r * n_q + h] = a.sinks ? 1.0f : 0.0f;
      for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(out + h * hd + i, _mm256_setzero_ps());
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t b0 = jmin / kBlock * kBlock; b0 < jmax; b0 += kBlock) {
    const int64_t j0 = std::max(b0, jmin) - b0, j1 = std::min(b0 + kBlock, jmax) - b0;
    const uint16_t* kb = a.k + b0 * a.kv_stride;
    for (int64_t i0 = 0; i0 < hd; i0 += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int64_t jj = 0; jj < kBlock; ++jj)
        r[jj] = jj >= j0 && jj < j1 ? LoadBf16x8(kb + jj * a.kv_stride + i0) : _mm256_setzero_ps();
      Transpose8x8(r);
#pragma GCC unroll 8
      for (int64_t e = 0; e < 8; ++e) _mm256_storeu_ps(kt + (i0 + e) * kBlock, r[e]);
    }
    for (int64_t jj = 0; jj < kBlock; ++jj) {
      const bool in = jj >= j0 && jj < j1;
      const uint16_t* vr = a.v + (b0 + jj) * a.kv_stride;
      for (int64_t i = 0; i < hd; i += 8)
        _mm256_storeu_ps(vf + jj * hd + i, in ? LoadBf16x8(vr + i) : _mm256_setzero_ps());
    }
    Group g;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t lo = a.lo[r] - b0, hi = a.hi[r] - b0;
      if (lo >= kBlock || hi <= 0) continue;
      // lo <= lane < hi, as all-ones lanes (lo, hi clamped to [-1, 8] so they fit in 32 bits).
      const __m256i vlo = _mm256_set1_epi32(static_cast<int>(std::max<int64_t>(lo, -1)));
      const __m256i vhi = _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(hi, kBlock)));
      const __m256 valid =
          _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(vlo, lane), _mm256_cmpgt_epi32(vhi, lane)));
      for (int64_t h = 0; h < n_q; ++h) {
        g.q[g.n] = a.q + r * a.q_stride + h * hd;
        g.out[g.n] = a.out + r * a.out_stride + h * hd;
        g.valid[g.n] = valid;
        g.m[g.n] = m + r * n_q + h;
        g.l[g.n] = l + r * n_q + h;
        if (++g.n == 4) RunGroup(g, kt, vf, hd, a.scale, a.softcap);
      }
    }
    if (g.n > 0) RunGroup(g, kt, vf, hd, a.scale, a.softcap);
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    float* out = a.out + r * a.out_stride;
    for (int64_t h = 0; h < n_q; ++h) {
      const float lv = l[r * n_q + h];
      const __m256 inv = _mm256_set1_ps(lv > 0 ? 1.0f / lv : 0.0f);
      for (int64_t i = 0; i < hd; i += 8)
        _mm256_storeu_ps(out + h * hd + i, _mm256_mul_ps(_mm256_loadu_ps(out + h * hd + i), inv));
    }
  }
}

}  // namespace mr::x86
