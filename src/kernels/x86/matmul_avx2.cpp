// AVX2 Q8/g64 kernels. Compiled with -mavx2 -mfma (file suffix); only called when the CPU has them.
//
// int8 x int8 dot products use the maddubs sign trick: |w| (u8) * sign(x, w) (s8) gives the
// same products as w * x; |w|, |x| <= 127 so the pairwise i16 sums cannot saturate.
#include <immintrin.h>

#include <cmath>

#include "base/half.h"
#include "kernels/x86/kernels_x86.h"

namespace mr::x86 {
namespace {

inline __m256i DotI8x32(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  const __m256i p16 = _mm256_maddubs_epi16(aw, sx);
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

inline float HSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

template <int R>
void MatmulRows(const QMatrix& w, const int8_t* xq, const float* xs, float* y, int64_t ldy, int64_t o_begin,
                int64_t o_end) {
  const int64_t groups = w.groups();
  const int64_t cols = w.cols;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const int8_t* q = w.row_q(o);
    const uint16_t* s = w.row_scales(o);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 64));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * 64 + 32));
      const float sw = Bf16ToF32(s[g]);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = xq + r * cols + g * 64;
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + 32));
        const __m256i d = _mm256_add_epi32(DotI8x32(w0, x0), DotI8x32(w1, x1));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sw * xs[r * groups + g]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) y[r * ldy + o] = HSum(acc[r]);
  }
}

}  // namespace

void MatmulQ8Avx2(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                  int64_t o_begin, int64_t o_end) {
  const int64_t groups = w.groups();
  for (int64_t r0 = 0; r0 < n_rows; r0 += 8) {
    const int64_t nr = n_rows - r0 < 8 ? n_rows - r0 : 8;
    const int8_t* xq_r = xq + r0 * w.cols;
    const float* xs_r = xs + r0 * groups;
    float* y_r = y + r0 * ldy;
    switch (nr) {
      case 1: MatmulRows<1>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 2: MatmulRows<2>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 3: MatmulRows<3>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 4: MatmulRows<4>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 5: MatmulRows<5>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 6: MatmulRows<6>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      case 7: MatmulRows<7>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
      default: MatmulRows<8>(w, xq_r, xs_r, y_r, ldy, o_begin, o_end); break;
    }
  }
}

void QuantizeActsAvx2(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales) {
  const int64_t groups = cols / 64;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * cols + g * 64;
      __m256 v[8];
      __m256 amax = _mm256_setzero_ps();
      for (int k = 0; k < 8; ++k) {
        v[k] = _mm256_loadu_ps(src + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
      }
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      m = _mm_max_ss(m, _mm_movehdup_ps(m));
      const float scale = _mm_cvtss_f32(m) / 127.0f;
      const __m256 inv = _mm256_set1_ps(scale > 0 ? 1.0f / scale : 0.0f);
      scales[r * groups + g] = scale;
      __m256i i32[8];
      for (int k = 0; k < 8; ++k) {
        i32[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      // Pack 64 int32 -> 64 int8 keeping order (packs work per 128-bit lane; fix with a permute).
      for (int h = 0; h < 2; ++h) {
        __m256i a = _mm256_packs_epi32(i32[4 * h + 0], i32[4 * h + 1]);
        __m256i b = _mm256_packs_epi32(i32[4 * h + 2], i32[4 * h + 3]);
        __m256i c = _mm256_packs_epi16(a, b);
        c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r * cols + g * 64 + 32 * h), c);
      }
    }
  }
}

}  // namespace mr::x86
