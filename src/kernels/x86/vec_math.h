// Small AVX2 math helpers shared by the x86 kernel files (anonymous namespace: each ISA's
// translation unit compiles its own copy with its own flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/ops.h"

namespace {

// exp(x) for x in [-88, 88] (clamped), Cephes-style: 2^n * p(r), r = x - n ln2, |r| <= ln2/2.
inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// cap * tanh(x / cap) (attention logit soft-capping), tanh(z) = 1 - 2 / (1 + exp(2z)); Exp8's
// clamp gives +-1 for |z| beyond ~44.
inline __m256 SoftCap8(__m256 x, float cap) {
  const __m256 z2 = _mm256_mul_ps(x, _mm256_set1_ps(2.0f / cap));
  const __m256 th = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                  _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), Exp8(z2))));
  return _mm256_mul_ps(th, _mm256_set1_ps(cap));
}

inline float HSum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float HMax8(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// 8 BF16 -> 8 FP32 (exact).
inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// act(g) * u for 8 outputs (the fused GLU): SiLU or tanh-GELU with Exp8.
inline __m256 Glu8(__m256 g, __m256 u, mr::GluAct act) {
  const __m256 one = _mm256_set1_ps(1.0f);
  if (act == mr::GluAct::kSilu) {  // g / (1 + exp(-g))
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
  }
  // 0.5 g (1 + tanh(c (g + 0.044715 g^3))), tanh(z) = 1 - 2 / (1 + exp(2z)).
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 z =
      _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  const __m256 e = Exp8(_mm256_add_ps(z, z));
  const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, th)), u);
}

}  // namespace
