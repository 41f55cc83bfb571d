// AVX2 attention over the BF16 KV cache (KernelTable::attention, ops.h): the scalar
// ref::AttentionGqa algorithm with 8-wide dot products, exp and accumulation. Head sizes that
// are not a multiple of 8 take the scalar path.
#include <cmath>

#include "kernels/ref/ops_ref.h"
#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/vec_math.h"

namespace mr::x86 {

void AttentionGqaAvx2(const float* q, int64_t n_q, int64_t hd, const uint16_t* k, const uint16_t* v, int64_t kv_stride,
                      int64_t j_begin, int64_t j_end, float scale, float* out, float* scratch) {
  if (hd % 8 != 0) {
    ref::AttentionGqa(q, n_q, hd, k, v, kv_stride, j_begin, j_end, scale, out, scratch);
    return;
  }
  float* s = scratch;
  float* row = s + n_q * kAttnBlock;
  float* m = row + 2 * hd;
  float* l = m + n_q;
  for (int64_t h = 0; h < n_q; ++h) {
    m[h] = -INFINITY;
    l[h] = 0;
    for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(out + h * hd + i, _mm256_setzero_ps());
  }
  for (int64_t b0 = j_begin; b0 < j_end; b0 += kAttnBlock) {
    const int64_t nb = j_end - b0 < kAttnBlock ? j_end - b0 : kAttnBlock;
    for (int64_t jj = 0; jj < nb; ++jj) {
      const uint16_t* kr = k + (b0 + jj) * kv_stride;
      for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(row + i, LoadBf16x8(kr + i));
      for (int64_t h = 0; h < n_q; ++h) {
        const float* qh = q + h * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= hd; i += 16) {
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(row + i), a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), _mm256_loadu_ps(row + i + 8), a1);
        }
        if (i < hd) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(row + i), a0);
        s[h * kAttnBlock + jj] = HSum8(_mm256_add_ps(a0, a1)) * scale;
      }
    }
    for (int64_t h = 0; h < n_q; ++h) {
      float* sh = s + h * kAttnBlock;
      float bm = m[h];
      for (int64_t jj = 0; jj < nb; ++jj) bm = sh[jj] > bm ? sh[jj] : bm;
      const float corr = std::exp(m[h] - bm);
      m[h] = bm;
      __m256 sum = _mm256_setzero_ps();
      int64_t jj = 0;
      for (; jj + 8 <= nb; jj += 8) {
        const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + jj), _mm256_set1_ps(bm)));
        _mm256_storeu_ps(sh + jj, p);
        sum = _mm256_add_ps(sum, p);
      }
      float tail = 0;
      for (; jj < nb; ++jj) {
        sh[jj] = std::exp(sh[jj] - bm);
        tail += sh[jj];
      }
      l[h] = l[h] * corr + HSum8(sum) + tail;
      if (corr != 1.0f) {
        const __m256 c = _mm256_set1_ps(corr);
        for (int64_t i = 0; i < hd; i += 8)
          _mm256_storeu_ps(out + h * hd + i, _mm256_mul_ps(_mm256_loadu_ps(out + h * hd + i), c));
      }
    }
    for (int64_t jj = 0; jj < nb; ++jj) {
      const uint16_t* vr = v + (b0 + jj) * kv_stride;
      for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(row + i, LoadBf16x8(vr + i));
      for (int64_t h = 0; h < n_q; ++h) {
        const __m256 p = _mm256_set1_ps(s[h * kAttnBlock + jj]);
        float* oh = out + h * hd;
        for (int64_t i = 0; i < hd; i += 8)
          _mm256_storeu_ps(oh + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(row + i), _mm256_loadu_ps(oh + i)));
      }
    }
  }
  for (int64_t h = 0; h < n_q; ++h) {
    const __m256 inv = _mm256_set1_ps(l[h] > 0 ? 1.0f / l[h] : 0.0f);
    for (int64_t i = 0; i < hd; i += 8)
      _mm256_storeu_ps(out + h * hd + i, _mm256_mul_ps(_mm256_loadu_ps(out + h * hd + i), inv));
  }
}

}  // namespace mr::x86
