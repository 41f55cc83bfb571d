#include "kernels/ref/ops_ref.h"

#include <cmath>

#include "base/half.h"

namespace mr::ref {

void MatmulQ8(const QMatrix& w, const float* x, int64_t n_rows, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  const int64_t groups = w.groups();
  for (int64_t o = o_begin; o < o_end; ++o) {
    const int8_t* q = w.row_q(o);
    const uint16_t* s = w.row_scales(o);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * w.cols;
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0;
        for (int i = 0; i < kQ8Group; ++i) part += static_cast<float>(q[g * kQ8Group + i]) * xr[g * kQ8Group + i];
        acc += part * Bf16ToF32(s[g]);
      }
      y[r * ldy + o] = acc;
    }
  }
}

void MatmulQ8Int(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                 int64_t o_begin, int64_t o_end) {
  const int64_t groups = w.groups();
  for (int64_t o = o_begin; o < o_end; ++o) {
    const int8_t* q = w.row_q(o);
    const uint16_t* s = w.row_scales(o);
    for (int64_t r = 0; r < n_rows; ++r) {
      const int8_t* xr = xq + r * w.cols;
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int i = 0; i < kQ8Group; ++i) dot += int32_t{q[g * kQ8Group + i]} * int32_t{xr[g * kQ8Group + i]};
        acc += static_cast<float>(dot) * (Bf16ToF32(s[g]) * xs[r * groups + g]);
      }
      y[r * ldy + o] = acc;
    }
  }
}

void QuantizeActs(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales) {
  const int64_t groups = cols / kQ8Group;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * cols + g * kQ8Group;
      float amax = 0;
      for (int i = 0; i < kQ8Group; ++i) amax = std::fmax(amax, std::fabs(src[i]));
      const float scale = amax / 127.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      scales[r * groups + g] = scale;
      for (int i = 0; i < kQ8Group; ++i) {
        q[r * cols + g * kQ8Group + i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
      }
    }
  }
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void Rope(float* v, int64_t head_dim, int64_t pos, float freq_base, bool neox) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // theta_i = pos * base^(-2i/d), as in RoFormer / llama.cpp's ggml_rope.
    const float theta = static_cast<float>(pos) * std::pow(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(head_dim));
    const float c = std::cos(theta), s = std::sin(theta);
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

void Softmax(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::fmax(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

}  // namespace mr::ref
