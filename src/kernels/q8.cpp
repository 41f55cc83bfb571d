#include "kernels/q8.h"

#include <cmath>
#include <cstring>

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
      for (int i = 0; i < kQ8Group; ++i) {  // branch-free: the compiler vectorizes it
        float v = RoundNearestEven(src[i] * inv);
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        dst[i] = static_cast<int8_t>(v);
      }
      if (err) {
        for (int i = 0; i < kQ8Group; ++i) {
          const double e = static_cast<double>(src[i]) - static_cast<double>(dst[i]) * scale;
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

QMatrix NewPackedQ8(int64_t rows, int64_t cols) {
  MR_CHECK(cols % kQ8Group == 0);
  QMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed = true;
  m.q.assign(static_cast<size_t>(m.tiles() * kQ8Tile * cols), 0);
  m.scales.assign(static_cast<size_t>(m.tiles() * kQ8Tile * m.groups()), 0);
  return m;
}

void PackRowsInto(const QMatrix& part, int64_t r0, QMatrix* dst) {
  MR_CHECK(!part.packed && dst->packed && part.cols == dst->cols && r0 % kQ8Tile == 0 && r0 + part.rows <= dst->rows);
  const int64_t cols = part.cols, groups = part.groups();
  for (int64_t r = 0; r < part.rows; ++r) {
    const int64_t o = r0 + r;
    const int8_t* src = part.q.data() + r * cols;
    for (int64_t i = 0; i < cols; i += 4) {
      std::memcpy(dst->q.data() + dst->q_index(o, i), src + i, 4);  // 4 inputs stay adjacent
    }
    for (int64_t g = 0; g < groups; ++g) dst->scales[dst->scale_index(o, g)] = part.scales[r * groups + g];
  }
}

QMatrix PackQ8(const QMatrix& m) {
  MR_CHECK(!m.packed);
  QMatrix p = NewPackedQ8(m.rows, m.cols);
  PackRowsInto(m, 0, &p);
  return p;
}

QMatrix UnpackQ8(const QMatrix& m) {
  MR_CHECK(m.packed);
  QMatrix u;
  u.rows = m.rows;
  u.cols = m.cols;
  u.q.resize(static_cast<size_t>(m.rows * m.cols));
  u.scales.resize(static_cast<size_t>(m.rows * m.groups()));
  for (int64_t o = 0; o < m.rows; ++o) {
    for (int64_t i = 0; i < m.cols; i += 4) std::memcpy(u.q.data() + o * m.cols + i, m.q.data() + m.q_index(o, i), 4);
    for (int64_t g = 0; g < m.groups(); ++g) u.scales[o * m.groups() + g] = m.scales[m.scale_index(o, g)];
  }
  return u;
}

void DequantizeQ8Row(const QMatrix& m, int64_t o, float* dst) {
  for (int64_t g = 0; g < m.groups(); ++g) {
    const float scale = Bf16ToF32(m.scales[m.scale_index(o, g)]);
    for (int64_t i = g * kQ8Group; i < (g + 1) * kQ8Group; i += 4) {
      const int8_t* q = m.q.data() + m.q_index(o, i);
      for (int k = 0; k < 4; ++k) dst[i + k] = q[k] * scale;
    }
  }
}

void QActs::Resize(int64_t rows, int64_t c) {
  n_rows = rows;
  cols = c;
  if (q.size() < static_cast<size_t>(rows * c)) q.resize(static_cast<size_t>(rows * c));
  if (scales.size() < static_cast<size_t>(rows * (c / kActGroup)))
    scales.resize(static_cast<size_t>(rows * (c / kActGroup)));
  if (sums16.size() < static_cast<size_t>(rows * (c / 16))) sums16.resize(static_cast<size_t>(rows * (c / 16)));
  if (sums32.size() < static_cast<size_t>(rows * (c / 32))) sums32.resize(static_cast<size_t>(rows * (c / 32)));
  const int64_t blocks = (rows + kInterleaveRows - 1) / kInterleaveRows;
  if (qi.size() < static_cast<size_t>(blocks * kInterleaveRows * c)) {
    qi.resize(static_cast<size_t>(blocks * kInterleaveRows * c));
  }
  if (rows >= kBlockRows) {
    const int64_t padded = (rows + kBlockRows - 1) / kBlockRows * kBlockRows;
    const int64_t ng = c / kActGroup, ns = c / 32;
    if (xs_t.size() < static_cast<size_t>(padded * ng)) xs_t.resize(static_cast<size_t>(padded * ng));
    if (s32_t.size() < static_cast<size_t>(padded * ns)) s32_t.resize(static_cast<size_t>(padded * ns));
    const int64_t b = rows / kBlockRows;  // the last block's padding rows: 0
    for (int64_t r = rows % kBlockRows; r > 0 && r < kBlockRows; ++r) {
      for (int64_t g = 0; g < ng; ++g) xs_t[static_cast<size_t>((b * ng + g) * kBlockRows + r)] = 0.0f;
      for (int64_t j = 0; j < ns; ++j) s32_t[static_cast<size_t>((b * ns + j) * kBlockRows + r)] = 0.0f;
    }
  }
}

void QActs::ComputeSums(int64_t r_begin, int64_t r_end) {
  // Sizes and base pointers in locals: the int8 stores below may alias any member, so the
  // compiler would otherwise reload cols on every 4-byte store of the interleave.
  const int64_t c = cols, n16 = c / 16, n32 = c / 32, ng = c / kActGroup;
  const bool interleave = n_rows >= kInterleaveMinRows, blocks = n_rows >= kBlockRows;
  const int8_t* const q0 = q.data();
  int8_t* const qi0 = qi.data();
  int16_t* const s16_0 = sums16.data();
  float* const s32_0 = sums32.data();
  const float* const sc0 = scales.data();
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int8_t* xr = q0 + r * c;
    if (interleave) {
      int8_t* xi = qi0 + (r / kInterleaveRows) * c * kInterleaveRows + (r % kInterleaveRows) * 4;
      for (int64_t k = 0; k < c / 4; ++k) std::memcpy(xi + k * 4 * kInterleaveRows, xr + 4 * k, 4);
    }
    int16_t* s16 = s16_0 + r * n16;
    for (int64_t j = 0; j < n16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += xr[16 * j + i];
      s16[j] = static_cast<int16_t>(s);
    }
    float* s32 = s32_0 + r * n32;
    for (int64_t j = 0; j < n32; ++j) {
      const float scale = sc0[r * ng + (32 * j) / kActGroup];
      s32[j] = scale * static_cast<float>(s16[2 * j] + s16[2 * j + 1]);
    }
    if (blocks) {
      const int64_t b = r / kBlockRows, o = r % kBlockRows;
      float* xt = xs_t.data() + b * ng * kBlockRows + o;
      float* st = s32_t.data() + b * n32 * kBlockRows + o;
      for (int64_t g = 0; g < ng; ++g) xt[g * kBlockRows] = sc0[r * ng + g];
      for (int64_t j = 0; j < n32; ++j) st[j * kBlockRows] = s32[j];
    }
  }
}

}  // namespace mr
