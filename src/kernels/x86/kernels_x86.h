// Declarations of the x86 vector kernels (definitions in *_avx2.cpp / *_avx512.cpp).
#pragma once

#include <cstdint>

#include "kernels/q8.h"

namespace mr::x86 {

void MatmulQ8Avx2(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                  int64_t o_begin, int64_t o_end);
void QuantizeActsAvx2(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales);

}  // namespace mr::x86
