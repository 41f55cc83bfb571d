// AVX-512 attention over the BF16 KV cache (KernelTable::attention, ops.h), for head sizes that
// are a multiple of 32 (up to 256): blocks of 16 cache positions, one position per lane.
//
// Per block, K is read once for all n_q query heads of the GQA group, transposed on the way in
// (16 x 16 transposes of 32-bit words, each word a BF16 pair (i, i+1); shift and mask make them
// two FP32 rows of K^T), so the scores of a head are hd FMAs with the query element broadcast
// from memory and no horizontal sums; the online softmax runs on the 16 lanes; V is converted once
// per block and each head's output stays in registers while the block's probabilities are
// applied. Same online-softmax algorithm as ref::AttentionGqa, so results agree to rounding.
// GCC 12's 512-bit conversion intrinsics start from a self-initialized "undefined" register
// (avx512fintrin.h), which -Wmaybe-uninitialized reports once inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>

#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/vec_math.h"

namespace {

constexpr int64_t kBlock = 16;  // cache positions per block, one per lane

// exp of 16 lanes (vec_math.h's Exp8 on each half).
inline __m512 Exp16(__m512 x) {
  const __m256 lo = Exp8(_mm512_castps512_ps256(x));
  const __m256 hi = Exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
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

// out (nc x 16 floats) = out * corr + sum over the block's nb positions of p[jj] * vf[jj]: the
// head's output in NC registers (one chain per 16-float chunk).
template <int NC>
inline void AccumulateV(const float* p, const float* vf, int64_t nb, float corr, float* out) {
  __m512 acc[NC];
  const __m512 cv = _mm512_set1_ps(corr);
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_mul_ps(_mm512_loadu_ps(out + 16 * c), cv);
  for (int64_t jj = 0; jj < nb; ++jj) {
    const __m512 pj = _mm512_set1_ps(p[jj]);
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vf + jj * 16 * NC + 16 * c), acc[c]);
  }
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

}  // namespace

namespace mr::x86 {

void AttentionGqaAvx512(const float* q, int64_t n_q, int64_t hd, const uint16_t* k, const uint16_t* v,
                        int64_t kv_stride, int64_t j_begin, int64_t j_end, float scale, float* out, float* scratch) {
  if (hd % 32 != 0 || hd > 256) {
    AttentionGqaAvx2(q, n_q, hd, k, v, kv_stride, j_begin, j_end, scale, out, scratch);
    return;
  }
  const int64_t nc = hd / kBlock;  // 16-float chunks of a head
  float* kt = scratch;             // (hd, 16): K^T of the block
  float* vf = kt + hd * kBlock;    // (16, hd): V of the block in FP32
  float* m = vf + kBlock * hd;     // (n_q) running max
  float* l = m + n_q;              // (n_q) running sum of exp
  for (int64_t h = 0; h < n_q; ++h) {
    m[h] = -INFINITY;
    l[h] = 0;
    for (int64_t c = 0; c < nc; ++c) _mm512_storeu_ps(out + h * hd + kBlock * c, _mm512_setzero_ps());
  }
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t b0 = j_begin; b0 < j_end; b0 += kBlock) {
    const int64_t nb = j_end - b0 < kBlock ? j_end - b0 : kBlock;
    const __mmask16 valid = static_cast<__mmask16>((1u << nb) - 1);
    const uint16_t* kb = k + b0 * kv_stride;
    for (int64_t i0 = 0; i0 < hd; i0 += 32) {  // 16 BF16 pairs of each position, transposed
      __m512i r[16];
#pragma GCC unroll 16
      for (int64_t jj = 0; jj < kBlock; ++jj) {
        r[jj] = jj < nb ? _mm512_loadu_si512(kb + jj * kv_stride + i0) : _mm512_setzero_si512();
      }
      Transpose16x16(r);  // r[p]: pair (i0 + 2p, i0 + 2p + 1) of the 16 positions
#pragma GCC unroll 16
      for (int64_t pr = 0; pr < 16; ++pr) {
        _mm512_storeu_ps(kt + (i0 + 2 * pr) * kBlock, _mm512_castsi512_ps(_mm512_slli_epi32(r[pr], 16)));
        _mm512_storeu_ps(kt + (i0 + 2 * pr + 1) * kBlock, _mm512_castsi512_ps(_mm512_and_si512(r[pr], hi_mask)));
      }
    }
    for (int64_t jj = 0; jj < nb; ++jj) {
      const uint16_t* vr = v + (b0 + jj) * kv_stride;
      for (int64_t c = 0; c < nc; ++c) {
        const __m256i h16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + kBlock * c));
        _mm512_storeu_ps(vf + jj * hd + kBlock * c,
                         _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h16), 16)));
      }
    }
    for (int64_t h = 0; h < n_q; ++h) {
      const float* qh = q + h * hd;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;  // four chains over i
      for (int64_t i = 0; i < hd; i += 4) {
        s0 = _mm512_fmadd_ps(_mm512_set1_ps(qh[i]), _mm512_loadu_ps(kt + i * kBlock), s0);
        s1 = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 1]), _mm512_loadu_ps(kt + (i + 1) * kBlock), s1);
        s2 = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 2]), _mm512_loadu_ps(kt + (i + 2) * kBlock), s2);
        s3 = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + 3]), _mm512_loadu_ps(kt + (i + 3) * kBlock), s3);
      }
      const __m512 s = _mm512_mask_blend_ps(
          valid, _mm512_set1_ps(-INFINITY),
          _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)), _mm512_set1_ps(scale)));
      const float bm = std::fmax(m[h], _mm512_reduce_max_ps(s));
      const float corr = std::exp(m[h] - bm);  // exp(-inf) = 0 on the first block
      m[h] = bm;
      alignas(64) float p[kBlock];
      const __m512 pv = _mm512_maskz_mov_ps(valid, Exp16(_mm512_sub_ps(s, _mm512_set1_ps(bm))));
      _mm512_store_ps(p, pv);
      l[h] = l[h] * corr + _mm512_reduce_add_ps(pv);
      switch (nc) {
        case 4:
          AccumulateV<4>(p, vf, nb, corr, out + h * hd);
          break;
        case 8:
          AccumulateV<8>(p, vf, nb, corr, out + h * hd);
          break;
        case 16:
          AccumulateV<16>(p, vf, nb, corr, out + h * hd);
          break;
        default:  // other multiples of 16: 16 floats at a time
          for (int64_t c = 0; c < nc; ++c) {
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(out + h * hd + kBlock * c), _mm512_set1_ps(corr));
            for (int64_t jj = 0; jj < nb; ++jj) {
              acc = _mm512_fmadd_ps(_mm512_set1_ps(p[jj]), _mm512_loadu_ps(vf + jj * hd + kBlock * c), acc);
            }
            _mm512_storeu_ps(out + h * hd + kBlock * c, acc);
          }
      }
    }
  }
  for (int64_t h = 0; h < n_q; ++h) {
    const __m512 inv = _mm512_set1_ps(l[h] > 0 ? 1.0f / l[h] : 0.0f);
    for (int64_t c = 0; c < nc; ++c) {
      _mm512_storeu_ps(out + h * hd + kBlock * c, _mm512_mul_ps(_mm512_loadu_ps(out + h * hd + kBlock * c), inv));
    }
  }
}

}  // namespace mr::x86
