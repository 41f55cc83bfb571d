#include "kernels/kquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/half.h"

namespace mr {
namespace {

inline float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToF32(h);
}

// One ggml block_q4_K / block_q6_K in file order -> 256 floats; same operation order as
// model/dequant.cpp (ggml-quants.c), so results are bit-identical to the reference path.
void DequantQ4KBlock(const uint8_t* x, float* y) {
  const float d = LoadF16(x), dmin = LoadF16(x + 2);
  const uint8_t* scales = x + 4;
  const uint8_t* q = x + 16;
  for (int is = 0; is < 8; is += 2, q += 32) {
    uint8_t sc, m;
    KScaleMin(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    KScaleMin(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// block_q5_K: Q4_K's scales and mins; quant l of 64-input group j has the fifth bit 2j (first 32
// inputs) or 2j + 1 (last 32) of qh[l].
void DequantQ5KBlock(const uint8_t* x, float* y) {
  const float d = LoadF16(x), dmin = LoadF16(x + 2);
  const uint8_t* scales = x + 4;
  const uint8_t* qh = x + 16;
  const uint8_t* ql = x + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    uint8_t sc, m;
    KScaleMin(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    KScaleMin(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
  }
}

void DequantQ6KBlock(const uint8_t* x, float* y) {
  const uint8_t* ql = x;
  const uint8_t* qh = x + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
  const float d = LoadF16(x + 208);
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// block_q5_0: 5-bit q = low nibble | (bit j of qh) << 4 for input j, high nibble | (bit j + 16
// of qh) << 4 for input j + 16; y = (q - 16) * d.
void DequantQ50Block(const uint8_t* x, float* y) {
  const float d = LoadF16(x);
  uint32_t qh;
  std::memcpy(&qh, x + 2, 4);
  const uint8_t* qs = x + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

// block_q4_1: y = q * d + m with q in [0, 15].
void DequantQ41Block(const uint8_t* x, float* y) {
  const float d = LoadF16(x), m = LoadF16(x + 2);
  const uint8_t* qs = x + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// block_q8_0: y = q * d with q int8.
void DequantQ80Block(const uint8_t* x, float* y) {
  const float d = LoadF16(x);
  const int8_t* qs = reinterpret_cast<const int8_t*>(x + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// block_q4_0: y = (q - 8) * d with q in [0, 15].
void DequantQ40Block(const uint8_t* x, float* y) {
  const float d = LoadF16(x);
  const uint8_t* qs = x + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// 32 F16 or BF16 values -> FP32 (exact).
void DequantF16Block(const uint8_t* x, float* y) {
  for (int j = 0; j < 32; ++j) y[j] = LoadF16(x + 2 * j);
}
void DequantBF16Block(const uint8_t* x, float* y) {
  for (int j = 0; j < 32; ++j) {
    uint16_t h;
    std::memcpy(&h, x + 2 * j, 2);
    y[j] = Bf16ToF32(h);
  }
}

// block_mxfp4: y = kvalues_mxfp4[q] * 2^(e - 128), low nibble of qs[j] input j, high input j + 16.
void DequantMXFP4Block(const uint8_t* x, float* y) {
  const float d = E8M0Half(x[0]);
  const uint8_t* qs = x + 1;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kMXFP4Values[qs[j] & 0x0F]) * d;
    y[j + 16] = static_cast<float>(kMXFP4Values[qs[j] >> 4]) * d;
  }
}

// KByteOffset as base + o * stride per ggml byte b, tabulated once per format.
struct OffsetTable {
  int32_t base[kKMaxSuperBytes];
  int32_t stride[kKMaxSuperBytes];
};

OffsetTable MakeTable(KFormat f) {
  OffsetTable t{};
  for (int64_t b = 0; b < KSuperBytes(f); ++b) {
    t.base[b] = static_cast<int32_t>(KByteOffset(f, 0, b));
    t.stride[b] = static_cast<int32_t>(KByteOffset(f, 1, b) - KByteOffset(f, 0, b));
  }
  return t;
}

const OffsetTable& Table(KFormat f) {
  static const OffsetTable tables[kKFormats] = {
      MakeTable(KFormat::kQ4K),  MakeTable(KFormat::kQ6K),  MakeTable(KFormat::kQ5_0), MakeTable(KFormat::kQ4_1),
      MakeTable(KFormat::kQ8_0), MakeTable(KFormat::kQ4_0), MakeTable(KFormat::kQ5K),  MakeTable(KFormat::kF16),
      MakeTable(KFormat::kBF16), MakeTable(KFormat::kMXFP4)};
  return tables[static_cast<int>(f)];
}

// Quant byte q of row o in 4-byte chunks of all 16 rows, from offset `at` of the block.
int64_t QsOffset(int64_t at, int64_t o, int64_t q) {
  return at + (q / 4) * 64 + 4 * o + q % 4;
}

}  // namespace

const char* KFormatName(KFormat f) {
  switch (f) {
    case KFormat::kQ4K:
      return "q4_k";
    case KFormat::kQ6K:
      return "q6_k";
    case KFormat::kQ5_0:
      return "q5_0";
    case KFormat::kQ4_1:
      return "q4_1";
    case KFormat::kQ8_0:
      return "q8_0";
    case KFormat::kQ4_0:
      return "q4_0";
    case KFormat::kQ5K:
      return "q5_k";
    case KFormat::kF16:
      return "f16";
    case KFormat::kBF16:
      return "bf16";
    case KFormat::kMXFP4:
      return "mxfp4";
  }
  return "?";
}

int64_t KByteOffset(KFormat f, int64_t o, int64_t b) {
  if (KFormatIsFloat(f)) return 32 * (b / 2) + 2 * o + b % 2;  // value b/2 of the 16 rows side by side
  if (f == KFormat::kMXFP4) {
    if (b < 1) return o;            // e
    return QsOffset(16, o, b - 1);  // qs
  }
  if (f == KFormat::kQ8_0 || f == KFormat::kQ4_0) {
    if (b < 2) return 2 * o + b;    // d
    return QsOffset(32, o, b - 2);  // qs
  }
  if (f == KFormat::kQ5_0) {
    if (b < 2) return 2 * o + b;             // d
    if (b < 6) return 32 + 4 * o + (b - 2);  // qh
    return QsOffset(96, o, b - 6);           // qs
  }
  if (f == KFormat::kQ4_1) {
    if (b < 2) return 2 * o + b;             // d
    if (b < 4) return 32 + 2 * o + (b - 2);  // m
    return QsOffset(64, o, b - 4);           // qs
  }
  if (f == KFormat::kQ4K || f == KFormat::kQ5K) {
    if (b < 2) return 2 * o + b;                              // d
    if (b < 4) return 32 + 2 * o + (b - 2);                   // dmin
    if (b < 16) return 64 + 16 * (b - 4) + o;                 // scales
    if (f == KFormat::kQ4K) return QsOffset(256, o, b - 16);  // qs
    if (b < 48) return QsOffset(256, o, b - 16);              // qh
    return QsOffset(768, o, b - 48);                          // qs
  }
  if (b < 128) {  // ql: half n, first or second 32 bytes of the half, chunk c
    const int64_t n = b / 64, w = b % 64;
    return 288 + (n * 8 + (w % 32) / 4) * 192 + (w / 32) * 64 + 4 * o + w % 4;
  }
  if (b < 192) {  // qh
    const int64_t h = b - 128, n = h / 32;
    return 288 + (n * 8 + (h % 32) / 4) * 192 + 128 + 4 * o + h % 4;
  }
  if (b < 208) return 32 + 16 * (b - 192) + o;  // scales
  return 2 * o + (b - 208);                     // d
}

KMatrix NewKMatrix(KFormat f, int64_t rows, int64_t cols) {
  MR_CHECK(rows > 0 && cols > 0 && cols % KSuperInputs(f) == 0);
  KMatrix m;
  m.format = f;
  m.rows = rows;
  m.cols = cols;
  m.data.assign(static_cast<size_t>(m.tiles() * m.supers() * KBlockBytes(f)), 0);
  return m;
}

namespace {

// An MXFP4 block the kernels can read: e = 0xFF is NaN in the OCP MX spec (ggml reads it as
// 2^127), and with e >= 253 the larger codes overflow to infinity; either would turn outputs into
// NaN, so the loader refuses them as it refuses the other formats' NaN / infinite scales.
Status CheckMXFP4Block(const uint8_t* x, int64_t o, int64_t s) {
  const std::string where = "[kquant] mxfp4 row " + std::to_string(o) + ", block " + std::to_string(s);
  if (x[0] == 0xFF) return InvalidArgument(where + ": shared exponent e = 0xff (NaN), expected 0..254");
  if (x[0] < 253) return Status::Ok();  // |y| <= 12 * 2^124 < FLT_MAX
  float v[32];
  DequantMXFP4Block(x, v);
  for (int j = 0; j < 32; ++j) {
    if (!std::isfinite(v[j])) {
      return InvalidArgument(where + ", input " + std::to_string(s * 32 + j) + ": e = " + std::to_string(x[0]) +
                             " overflows to infinity (expected a finite value)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status PackKTiles(const uint8_t* src, int64_t t_begin, int64_t t_end, KMatrix* dst) {
  const KFormat f = dst->format;
  const int64_t sb = KSuperBytes(f), supers = dst->supers(), row_bytes = supers * sb;
  const OffsetTable& tab = Table(f);
  const int64_t d_at = f == KFormat::kQ6K ? 208 : 0;  // f16 d (MXFP4: CheckMXFP4Block)
  const bool second = f == KFormat::kQ4K || f == KFormat::kQ5K || f == KFormat::kQ4_1;  // f16 dmin / m after d
  for (int64_t t = t_begin; t < t_end; ++t) {
    for (int64_t o = t * kKTile; o < std::min((t + 1) * kKTile, dst->rows); ++o) {
      const int64_t r = o % kKTile;
      for (int64_t s = 0; s < supers; ++s) {
        const uint8_t* x = src + o * row_bytes + s * sb;
        if (f == KFormat::kMXFP4) {
          MR_RETURN_IF_ERROR(CheckMXFP4Block(x, o, s));
        } else if (KFormatIsFloat(f)) {
          float v[32];
          DequantizeKBlocks(f, x, v, 1);
          for (int j = 0; j < 32; ++j) {
            if (!std::isfinite(v[j])) {
              return InvalidArgument(std::string("[kquant] ") + KFormatName(f) + " row " + std::to_string(o) +
                                     ", input " + std::to_string(s * 32 + j) + ": value is NaN or infinite");
            }
          }
        } else if (!std::isfinite(LoadF16(x + d_at)) || (second && !std::isfinite(LoadF16(x + 2)))) {
          return InvalidArgument(std::string("[kquant] ") + KFormatName(f) + " row " + std::to_string(o) +
                                 ", super-block " + std::to_string(s) + ": scale is NaN or infinite");
        }
        uint8_t* blk = dst->data.data() + (t * supers + s) * KBlockBytes(f);
        for (int64_t b = 0; b < sb; ++b) blk[tab.base[b] + r * tab.stride[b]] = x[b];
      }
    }
  }
  return Status::Ok();
}

namespace {

// The ggml block of row o, super-block s, gathered back into file order.
void GatherBlock(const KMatrix& m, int64_t o, int64_t s, uint8_t* out) {
  const OffsetTable& tab = Table(m.format);
  const uint8_t* blk = m.block(o / kKTile, s);
  const int64_t r = o % kKTile;
  for (int64_t b = 0; b < KSuperBytes(m.format); ++b) out[b] = blk[tab.base[b] + r * tab.stride[b]];
}

}  // namespace

std::vector<uint8_t> UnpackK(const KMatrix& m) {
  const int64_t sb = KSuperBytes(m.format);
  std::vector<uint8_t> out(static_cast<size_t>(m.rows * m.supers() * sb));
  for (int64_t o = 0; o < m.rows; ++o) {
    for (int64_t s = 0; s < m.supers(); ++s) GatherBlock(m, o, s, out.data() + (o * m.supers() + s) * sb);
  }
  return out;
}

void DequantizeKRow(const KMatrix& m, int64_t o, float* dst) {
  uint8_t buf[kKMaxSuperBytes];
  for (int64_t s = 0; s < m.supers(); ++s) {
    GatherBlock(m, o, s, buf);
    DequantizeKBlocks(m.format, buf, dst + s * KSuperInputs(m.format), 1);
  }
}

namespace {

void StoreF16(float v, uint8_t* p) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// block_q8_0: d = amax / 127, q = round(x / d) (ggml's quantize_row_q8_0_ref).
void QuantQ80Block(const float* x, uint8_t* y) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreF16(d, y);
  for (int i = 0; i < 32; ++i) y[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
}

// block_q4_K: sub-block j (32 inputs) spans [a, b] with a = min(0, min x); its scale (b - a) / 15
// and min -a become 6-bit multiples of the block's d and dmin (the largest over 63), and
// q = round((x + dmin * m) / (d * sc)) in 0..15. DequantQ4KBlock's layout in reverse.
void QuantQ4KBlock(const float* x, uint8_t* y) {
  float scale[8], mn[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float a = 0, b = x[32 * j];
    for (int i = 0; i < 32; ++i) {
      a = std::min(a, x[32 * j + i]);
      b = std::max(b, x[32 * j + i]);
    }
    scale[j] = std::max(b - a, 0.0f) / 15.0f;
    mn[j] = -a;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mn[j]);
  }
  StoreF16(max_scale / 63.0f, y);
  StoreF16(max_min / 63.0f, y + 2);
  const float d = LoadF16(y), dmin = LoadF16(y + 2);  // what a reader gets back
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0 ? static_cast<uint8_t>(std::min(63L, std::lround(scale[j] / d))) : 0;
    // Round the min up so that x + dmin * m >= 0 stays true for the smallest input.
    m[j] = dmin > 0 ? static_cast<uint8_t>(std::min(63.0f, std::ceil(mn[j] / dmin))) : 0;
  }
  uint8_t* s = y + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= sc[j] & 63;
      s[j + 4] |= m[j] & 63;
    } else {
      s[j + 4] |= static_cast<uint8_t>((sc[j] & 0x0F) | ((m[j] & 0x0F) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
  uint8_t q[256];
  for (int j = 0; j < 8; ++j) {
    const float dj = d * sc[j], mj = dmin * m[j];
    for (int i = 0; i < 32; ++i) {
      const long v = dj > 0 ? std::lround((x[32 * j + i] + mj) / dj) : 0;
      q[32 * j + i] = static_cast<uint8_t>(std::clamp(v, 0L, 15L));
    }
  }
  uint8_t* qs = y + 16;
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l) qs[32 * k + l] = static_cast<uint8_t>(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
  }
}

// block_q6_K: sub-block s (16 inputs) gets scale amax / 31 as an int8 multiple of d (the largest
// over 127); q = round(x / (d * sc)) in -32..31, stored + 32. DequantQ6KBlock's layout in reverse:
// half n, position l of its 32-input quarter m uses scale 8n + l / 16 + 2m.
void QuantQ6KBlock(const float* x, uint8_t* y) {
  float scale[16], max_scale = 0;
  auto sub = [](int s, int k) { return 128 * (s / 8) + 32 * ((s % 8) / 2) + 16 * (s % 2) + k; };
  for (int s = 0; s < 16; ++s) {
    float amax = 0;
    for (int k = 0; k < 16; ++k) amax = std::max(amax, std::fabs(x[sub(s, k)]));
    scale[s] = amax / 31.0f;
    max_scale = std::max(max_scale, scale[s]);
  }
  StoreF16(max_scale / 127.0f, y + 208);
  const float d = LoadF16(y + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(y + 192);
  uint8_t q[256];
  for (int s = 0; s < 16; ++s) {
    sc[s] = d > 0 ? static_cast<int8_t>(std::min(127L, std::lround(scale[s] / d))) : 0;
    const float ds = d * sc[s];
    for (int k = 0; k < 16; ++k) {
      const long v = ds > 0 ? std::lround(x[sub(s, k)] / ds) : 0;
      q[sub(s, k)] = static_cast<uint8_t>(std::clamp(v, -32L, 31L) + 32);
    }
  }
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = q[128 * n + l], q2 = q[128 * n + 32 + l], q3 = q[128 * n + 64 + l], q4 = q[128 * n + 96 + l];
      ql[64 * n + l] = static_cast<uint8_t>((q1 & 15) | ((q3 & 15) << 4));
      ql[64 * n + 32 + l] = static_cast<uint8_t>((q2 & 15) | ((q4 & 15) << 4));
      qh[32 * n + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

// block_mxfp4 by ggml's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127, so the largest
// code (12, i.e. 6.0 in E2M1) times 2^(e - 128) is 1.5 * 2^floor(log2(amax)), and each value goes
// to the code nearest it (the first of equals). ggml casts a negative e (amax < 2^-125) to uint8
// (undefined behaviour); 0 here, the smallest scale.
void QuantMXFP4Block(const float* x, uint8_t* y) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float fe = amax > 0.0f ? std::floor(std::log2(amax)) - 2 + 127 : 0.0f;
  const auto e = static_cast<uint8_t>(std::clamp(fe, 0.0f, 254.0f));
  const float d = E8M0Half(e);
  auto nearest = [d](float v) {
    int best = 0;
    float best_err = std::fabs(kMXFP4Values[0] * d - v);
    for (int i = 1; i < 16; ++i) {
      const float err = std::fabs(kMXFP4Values[i] * d - v);
      if (err < best_err) {
        best = i;
        best_err = err;
      }
    }
    return best;
  };
  y[0] = e;
  for (int j = 0; j < 16; ++j) y[1 + j] = static_cast<uint8_t>(nearest(x[j]) | (nearest(x[j + 16]) << 4));
}

}  // namespace

bool QuantizeKBlocks(KFormat f, const float* x, uint8_t* y, int64_t nb) {
  const int64_t in = KSuperInputs(f), out = KSuperBytes(f);
  for (int64_t b = 0; b < nb; ++b, x += in, y += out) {
    switch (f) {
      case KFormat::kQ4K:
        QuantQ4KBlock(x, y);
        break;
      case KFormat::kQ6K:
        QuantQ6KBlock(x, y);
        break;
      case KFormat::kQ8_0:
        QuantQ80Block(x, y);
        break;
      case KFormat::kF16:
        for (int i = 0; i < 32; ++i) StoreF16(x[i], y + 2 * i);
        break;
      case KFormat::kMXFP4:
        QuantMXFP4Block(x, y);
        break;
      default:
        return false;
    }
  }
  return true;
}

void DequantizeKBlocks(KFormat f, const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += KSuperBytes(f), y += KSuperInputs(f)) {
    switch (f) {
      case KFormat::kQ4K:
        DequantQ4KBlock(x, y);
        break;
      case KFormat::kQ6K:
        DequantQ6KBlock(x, y);
        break;
      case KFormat::kQ5_0:
        DequantQ50Block(x, y);
        break;
      case KFormat::kQ4_1:
        DequantQ41Block(x, y);
        break;
      case KFormat::kQ8_0:
        DequantQ80Block(x, y);
        break;
      case KFormat::kQ4_0:
        DequantQ40Block(x, y);
        break;
      case KFormat::kQ5K:
        DequantQ5KBlock(x, y);
        break;
      case KFormat::kF16:
        DequantF16Block(x, y);
        break;
      case KFormat::kBF16:
        DequantBF16Block(x, y);
        break;
      case KFormat::kMXFP4:
        DequantMXFP4Block(x, y);
        break;
    }
  }
}

}  // namespace mr
