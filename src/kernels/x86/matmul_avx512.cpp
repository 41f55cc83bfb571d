// AVX-512 (VNNI) Q8/g64 kernels: the AVX2 tile loops (q8_tile_impl.h) with the int8 dot done
// by vpdpbusd on 256-bit registers (AVX512-VL): acc += |x| (u8) * sign(w, x) (s8), 4 products
// per lane, no intermediate saturation (the sign comes from VEX vpsignb). Compiled with the AVX-512 flags (file
// suffix); dispatch only selects it when cpuid reports AVX512F/BW/VL/DQ + VNNI and the OS saves zmm state. Not executed
// on the development machine (AVX2 only); kernels_test runs it where available.
#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/q8_tile_impl.h"

namespace {

struct Avx512Isa {
  static __m256i Dot(__m256i acc, __m256i sw, __m256i ax) { return _mm256_dpbusd_epi32(acc, ax, sw); }
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
