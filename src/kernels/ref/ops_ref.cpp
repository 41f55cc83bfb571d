#include "kernels/ref/ops_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/half.h"

namespace mr::ref {

void MatmulQ8(const QMatrix& w, const float* x, int64_t n_rows, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  const int64_t groups = w.groups();
  for (int64_t o = o_begin; o < o_end; ++o) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * w.cols;
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0;
        for (int64_t i = g * kQ8Group; i < (g + 1) * kQ8Group; ++i)
          part += static_cast<float>(w.q[w.q_index(o, i)]) * xr[i];
        acc += part * Bf16ToF32(w.scales[w.scale_index(o, g)]);
      }
      y[r * ldy + o] = acc;
    }
  }
}

namespace {

float DotQ8Int(const QMatrix& w, int64_t o, const int8_t* xr, const float* xsr) {
  float acc = 0;
  for (int64_t g = 0; g < w.groups(); ++g) {
    const float sw = Bf16ToF32(w.scales[w.scale_index(o, g)]);
    for (int64_t a = g * kActPerWeightGroup; a < (g + 1) * kActPerWeightGroup; ++a) {  // activation groups of g
      int32_t dot = 0;
      for (int64_t i = a * kActGroup; i < (a + 1) * kActGroup; ++i)
        dot += int32_t{w.q[w.q_index(o, i)]} * int32_t{xr[i]};
      acc += static_cast<float>(dot) * (sw * xsr[a]);
    }
  }
  return acc;
}

}  // namespace

void MatmulQ8Int(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                 int64_t o_begin, int64_t o_end) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    for (int64_t r = 0; r < n_rows; ++r)
      y[r * ldy + o] = DotQ8Int(w, o, xq + r * w.cols, xs + r * (w.cols / kActGroup));
  }
}

void MatmulQ8IntGlu(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                    GluAct act, float* y, int64_t ldy, int64_t o_begin, int64_t o_end) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float g = DotQ8Int(gate, o, xq + r * gate.cols, xs + r * (gate.cols / kActGroup));
      const float u = DotQ8Int(up, o, xq + r * up.cols, xs + r * (up.cols / kActGroup));
      y[r * ldy + o] = (act == GluAct::kSilu ? Silu(g) : GeluTanh(g)) * u;
    }
  }
}

void MatmulQ8Tiles(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                   int64_t t_begin, int64_t t_end) {
  MatmulQ8Int(w, xq, xs, n_rows, y, ldy, t_begin * kQ8Tile, std::min(w.rows, t_end * kQ8Tile));
}

void MatmulQ8GluTiles(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                      GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulQ8IntGlu(gate, up, xq, xs, n_rows, act, y, ldy, t_begin * kQ8Tile, std::min(gate.rows, t_end * kQ8Tile));
}

namespace {

// One dequantized output row of w against row r of x (int8 q * FP32 group scale; the FP32 rows
// for the F16 / BF16 formats), in double.
float DotKInt(const float* wrow, const QActs& x, int64_t r, KFormat f) {
  if (KFormatIsFloat(f)) {
    MR_CHECK(x.x != nullptr);
    double acc = 0;
    for (int64_t i = 0; i < x.cols; ++i) acc += static_cast<double>(wrow[i]) * x.x[r * x.cols + i];
    return static_cast<float>(acc);
  }
  const int8_t* xq = x.q.data() + r * x.cols;
  const float* xs = x.scales.data() + r * (x.cols / kActGroup);
  double acc = 0;
  for (int64_t i = 0; i < x.cols; ++i)
    acc += static_cast<double>(wrow[i]) * (static_cast<double>(xq[i]) * xs[i / kActGroup]);
  return static_cast<float>(acc);
}

}  // namespace

void MatmulKInt(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t o_begin,
                int64_t o_end) {
  MR_CHECK(x.cols == w.cols);
  std::vector<float> wrow(static_cast<size_t>(w.cols));
  for (int64_t o = o_begin; o < o_end; ++o) {
    DequantizeKRow(w, o, wrow.data());
    for (int64_t r = 0; r < n_rows; ++r) y[r * ldy + o] = DotKInt(wrow.data(), x, r, w.format);
  }
}

void MatmulKIntGlu(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                   int64_t ldy, int64_t o_begin, int64_t o_end) {
  MR_CHECK(x.cols == gate.cols && x.cols == up.cols);
  std::vector<float> wg(static_cast<size_t>(gate.cols)), wu(static_cast<size_t>(up.cols));
  for (int64_t o = o_begin; o < o_end; ++o) {
    DequantizeKRow(gate, o, wg.data());
    DequantizeKRow(up, o, wu.data());
    for (int64_t r = 0; r < n_rows; ++r) {
      const float g = DotKInt(wg.data(), x, r, gate.format), u = DotKInt(wu.data(), x, r, up.format);
      y[r * ldy + o] = (act == GluAct::kSilu ? Silu(g) : GeluTanh(g)) * u;
    }
  }
}

void MatmulKTiles(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                  int64_t t_end) {
  MatmulKInt(w, x, n_rows, y, ldy, t_begin * kKTile, std::min(w.rows, t_end * kKTile));
}

void MatmulKGluTiles(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                     int64_t ldy, int64_t t_begin, int64_t t_end) {
  MatmulKIntGlu(gate, up, x, n_rows, act, y, ldy, t_begin * kKTile, std::min(gate.rows, t_end * kKTile));
}

void AttentionGqa(const AttnChunk& a, float* scratch) {
  const int64_t n_q = a.n_q, hd = a.hd;
  float* s = scratch;                       // (n_q, kAttnBlock) scores, then probabilities
  float* row = s + n_q * kAttnBlock;        // (hd) one K or V row in FP32
  float* m = row + hd;                      // (n_q) running max
  float* l = m + n_q;                       // (n_q) running sum of exp
  for (int64_t r = 0; r < a.n_rows; ++r) {  // rows one at a time: no sharing in the oracle
    const float* q = a.q + r * a.q_stride;
    float* out = a.out + r * a.out_stride;
    const int64_t lo = a.lo[r], hi = a.hi[r];
    for (int64_t h = 0; h < n_q; ++h) {
      m[h] = a.sinks ? a.sinks[h] : -INFINITY;
      l[h] = a.sinks ? 1.0f : 0.0f;
      for (int64_t i = 0; i < hd; ++i) out[h * hd + i] = 0;
    }
    for (int64_t b0 = lo / kAttnBlock * kAttnBlock; b0 < hi; b0 += kAttnBlock) {
      const int64_t j0 = std::max(b0, lo), j1 = std::min(b0 + kAttnBlock, hi);
      for (int64_t j = j0; j < j1; ++j) {
        const uint16_t* kr = a.k + j * a.kv_stride;
        for (int64_t i = 0; i < hd; ++i) row[i] = Bf16ToF32(kr[i]);
        for (int64_t h = 0; h < n_q; ++h) {
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[h * hd + i] * row[i];
          const float x = dot * a.scale;
          s[h * kAttnBlock + j - b0] = a.softcap > 0 ? a.softcap * std::tanh(x / a.softcap) : x;
        }
      }
      for (int64_t h = 0; h < n_q; ++h) {
        float bm = m[h];
        for (int64_t j = j0; j < j1; ++j) bm = std::fmax(bm, s[h * kAttnBlock + j - b0]);
        const float corr = std::exp(m[h] - bm);  // exp(-inf) = 0 on the first block
        m[h] = bm;
        float sum = 0;
        for (int64_t j = j0; j < j1; ++j) {
          const float p = std::exp(s[h * kAttnBlock + j - b0] - bm);
          s[h * kAttnBlock + j - b0] = p;
          sum += p;
        }
        l[h] = l[h] * corr + sum;
        for (int64_t i = 0; i < hd; ++i) out[h * hd + i] *= corr;
      }
      for (int64_t j = j0; j < j1; ++j) {
        const uint16_t* vr = a.v + j * a.kv_stride;
        for (int64_t i = 0; i < hd; ++i) row[i] = Bf16ToF32(vr[i]);
        for (int64_t h = 0; h < n_q; ++h) {
          const float p = s[h * kAttnBlock + j - b0];
          for (int64_t i = 0; i < hd; ++i) out[h * hd + i] += p * row[i];
        }
      }
    }
    for (int64_t h = 0; h < n_q; ++h) {
      const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
      for (int64_t i = 0; i < hd; ++i) out[h * hd + i] *= inv;
    }
  }
}

float Dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Dot8x4(const float* const a[4], const float* b, int64_t n, float out[4]) {
  // Lanes 0-3 and 4-7 of each output's 8 partial sums as two 4-float vectors: the same IEEE
  // multiplications and additions as Dot8, element by element (no contraction: this file is
  // built without FMA), so the results are Dot8's.
  typedef float V4 __attribute__((vector_size(16)));
  const auto load = [](const float* p) {
    V4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
  V4 l0 = {}, l1 = {}, l2 = {}, l3 = {}, h0 = {}, h1 = {}, h2 = {}, h3 = {};  // in registers
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V4 b0 = load(b + i), b1 = load(b + i + 4);
    l0 += load(a0 + i) * b0;
    h0 += load(a0 + i + 4) * b1;
    l1 += load(a1 + i) * b0;
    h1 += load(a1 + i + 4) * b1;
    l2 += load(a2 + i) * b0;
    h2 += load(a2 + i + 4) * b1;
    l3 += load(a3 + i) * b0;
    h3 += load(a3 + i + 4) * b1;
  }
  const V4 lo[4] = {l0, l1, l2, l3}, hi[4] = {h0, h1, h2, h3};
  for (int k = 0; k < 4; ++k) {
    const V4 l = lo[k], h = hi[k];
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((h[0] + h[1]) + (h[2] + h[3]));
    for (int64_t t = i; t < n; ++t) s += a[k][t] * b[t];
    out[k] = s;
  }
}

void QuantizeActs(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales) {
  const int64_t groups = cols / kActGroup;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * cols + g * kActGroup;
      float amax = 0;
      for (int i = 0; i < kActGroup; ++i) amax = std::fmax(amax, std::fabs(src[i]));
      const float scale = amax / 127.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      scales[r * groups + g] = scale;
      for (int i = 0; i < kActGroup; ++i) {
        q[r * cols + g * kActGroup + i] = static_cast<int8_t>(std::nearbyint(src[i] * inv));
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

void Rope(float* v, int64_t head_dim, int64_t pos, float freq_base, bool neox, const float* freq_factors) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // theta_i = pos * base^(-2i/d) / factor_i, as in RoFormer / llama.cpp's ggml_rope_ext.
    float theta =
        static_cast<float>(pos) * std::pow(freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(head_dim));
    if (freq_factors != nullptr) theta /= freq_factors[i];
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

float Silu(float x) {
  return x / (1.0f + std::exp(-x));
}

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

void Glu(const float* g, const float* u, int64_t n, GluAct act, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (act == GluAct::kSilu ? Silu(g[i]) : GeluTanh(g[i])) * u[i];
}

}  // namespace mr::ref
