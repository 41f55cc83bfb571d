// AVX-512 (VNNI) Q8/g64 kernels: the AVX2 tile loops (q8_tile_impl.h) with the int8 dot done
// by vpdpbusd on 256-bit registers (AVX512-VL): acc += |w| (u8) * sign(x, w) (s8), 4 products
// per lane, no intermediate saturation. AVX-512 has no vpsignb, so the sign is applied with a
// masked subtract (mask = lanes where w < 0). Compiled with the AVX-512 flags (file suffix);
// dispatch only selects it when cpuid reports AVX512F/BW/VL/DQ + VNNI and the OS saves zmm state.
// Not executed on the development machine (AVX2 only); kernels_test runs it where available.
#include "kernels/x86/q8_tile_impl.h"

#include "kernels/x86/kernels_x86.h"

namespace {

struct Avx512Isa {
  static __m256i Dot(__m256i acc, __m256i w, __m256i aw, __m256i /*neg*/, __m256i x) {
    const __mmask32 neg = _mm256_movepi8_mask(w);
    const __m256i sx = _mm256_mask_sub_epi8(x, neg, _mm256_setzero_si256(), x);
    return _mm256_dpbusd_epi32(acc, aw, sx);
  }
};

}  // namespace

namespace mr::x86 {

void MatmulQ8Avx512(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                    int64_t t_begin, int64_t t_end) {
  MatmulTiles<Avx512Isa>(w, xq, xs, n_rows, y, ldy, t_begin, t_end);
}

void MatmulQ8GluAvx512(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                       GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulGluTiles<Avx512Isa>(gate, up, xq, xs, n_rows, act, y, ldy, t_begin, t_end);
}

}  // namespace mr::x86
