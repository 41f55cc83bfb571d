#include "kernels/q8.h"

#include <cmath>

#include "base/half.h"

namespace mr {
namespace {

// Round to nearest, ties to even, for |x| < 2^22 (adding 1.5 * 2^23 forces the FPU's default
// rounding at integer precision); avoids a libm call on baseline x86-64.
inline float RoundNearestEven(float x) {
  constexpr float kMagic = 12582912.0f;
  const float t = x + kMagic;  // IEEE semantics (no -ffast-math) keep this from folding
  return t - kMagic;
}

}  // namespace

QMatrix QuantizeQ8(const float* w, int64_t rows, int64_t cols, QuantError* err) {
  MR_CHECK(cols % kQ8Group == 0);
  QMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.q.resize(static_cast<size_t>(rows * cols));
  m.scales.resize(static_cast<size_t>(rows * (cols / kQ8Group)));
  double err_sq = 0, w_sq = 0, err_max = 0;
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t g = 0; g < cols / kQ8Group; ++g) {
      const float* src = w + o * cols + g * kQ8Group;
      float amax = 0;
      for (int i = 0; i < kQ8Group; ++i) {
        const float a = std::fabs(src[i]);
        amax = a > amax ? a : amax;
      }
      const uint16_t sb = F32ToBf16(amax / 127.0f);
      const float scale = Bf16ToF32(sb);
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      m.scales[o * (cols / kQ8Group) + g] = sb;
      int8_t* dst = m.q.data() + o * cols + g * kQ8Group;
      for (int i = 0; i < kQ8Group; ++i) {
        float v = RoundNearestEven(src[i] * inv);
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        dst[i] = static_cast<int8_t>(v);
        if (err) {
          const double e = static_cast<double>(src[i]) - static_cast<double>(v) * scale;
          err_sq += e * e;
          w_sq += static_cast<double>(src[i]) * src[i];
          const double ae = std::fabs(e);
          err_max = ae > err_max ? ae : err_max;
        }
      }
    }
  }
  if (err) {
    const double n = static_cast<double>(rows * cols);
    err->max_abs = err_max;
    err->rms = std::sqrt(err_sq / n);
    err->rms_w = std::sqrt(w_sq / n);
  }
  return m;
}

void DequantizeQ8Row(const QMatrix& m, int64_t o, float* dst) {
  const int8_t* q = m.row_q(o);
  const uint16_t* s = m.row_scales(o);
  for (int64_t g = 0; g < m.groups(); ++g) {
    const float scale = Bf16ToF32(s[g]);
    for (int i = 0; i < kQ8Group; ++i) dst[g * kQ8Group + i] = q[g * kQ8Group + i] * scale;
  }
}

void QActs::Resize(int64_t rows, int64_t c) {
  n_rows = rows;
  cols = c;
  if (q.size() < static_cast<size_t>(rows * c)) q.resize(static_cast<size_t>(rows * c));
  if (scales.size() < static_cast<size_t>(rows * (c / kQ8Group))) scales.resize(static_cast<size_t>(rows * (c / kQ8Group)));
}

}  // namespace mr
