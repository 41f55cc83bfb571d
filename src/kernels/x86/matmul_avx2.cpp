// AVX2 Q8/g64 kernels. Compiled with -mavx2 -mfma -mf16c (file suffix); only called when the
// CPU has them. The tile loops are in q8_tile_impl.h (shared with the AVX-512 file).
//
// int8 x int8 dot products use the maddubs sign trick: |x| (u8) * sign(w, x) (s8) gives the
// same products as w * x; |w|, |x| <= 127 so the pairwise i16 sums cannot saturate. |x| is
// computed once per (tile, group), so per 32 weight bytes and row the loop issues one vpsignb,
// one vpmaddubsw, one vpmaddwd and one add (on Zen 1 the two multiplies share one pipe and
// bound the kernel: ~8 int8 MACs per cycle per core).
#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/q8_tile_impl.h"

namespace {

struct Avx2Isa {
  static __m256i Dot(__m256i acc, __m256i sw, __m256i ax) {
    const __m256i p16 = _mm256_maddubs_epi16(ax, sw);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
  }
};

}  // namespace

namespace mr::x86 {

void MatmulQ8Avx2(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                  int64_t t_begin, int64_t t_end) {
  MatmulTiles<Avx2Isa>(w, xq, xs, n_rows, y, ldy, t_begin, t_end);
}

void MatmulQ8GluAvx2(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                     GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulGluTiles<Avx2Isa>(gate, up, xq, xs, n_rows, act, y, ldy, t_begin, t_end);
}

void GluAvx2(const float* g, const float* u, int64_t n, GluAct act, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Glu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i), act));
  if (i < n) {  // the tail through a zero-padded vector
    alignas(32) float gt[8] = {}, ut[8] = {}, ot[8];
    for (int64_t j = i; j < n; ++j) {
      gt[j - i] = g[j];
      ut[j - i] = u[j];
    }
    _mm256_store_ps(ot, Glu8(_mm256_load_ps(gt), _mm256_load_ps(ut), act));
    for (int64_t j = i; j < n; ++j) out[j] = ot[j - i];
  }
}

void QuantizeActsAvx2(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales) {
  constexpr int kVecs = kActGroup / 8;
  const int64_t groups = cols / kActGroup;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * cols + g * kActGroup;
      __m256 v[kVecs];
      __m256 amax = _mm256_setzero_ps();
      for (int k = 0; k < kVecs; ++k) {
        v[k] = _mm256_loadu_ps(src + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[k]));
      }
      const float scale = HMax8(amax) / 127.0f;
      const __m256 inv = _mm256_set1_ps(scale > 0 ? 1.0f / scale : 0.0f);
      scales[r * groups + g] = scale;
      // 32 values at a time: int32 -> int8 keeping order (packs work per 128-bit lane; fix with
      // a permute).
      for (int h = 0; h < kVecs / 4; ++h) {
        __m256i i32[4];
        for (int k = 0; k < 4; ++k) {
          i32[k] = _mm256_cvtps_epi32(
              _mm256_round_ps(_mm256_mul_ps(v[4 * h + k], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        const __m256i a = _mm256_packs_epi32(i32[0], i32[1]);
        const __m256i b = _mm256_packs_epi32(i32[2], i32[3]);
        __m256i c = _mm256_packs_epi16(a, b);
        c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + r * cols + g * kActGroup + 32 * h), c);
      }
    }
  }
}

}  // namespace mr::x86
