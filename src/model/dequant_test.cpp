// Dequantization tests. Expected values are computed here from the ggml formulas written out per
// element (y = f(q, scale, min)), and blocks are assembled by packers written independently of
// dequant.cpp (per-element placement rules rather than the decoder's loop structure). Scales are
// small powers of two or short binary fractions so every expected value is exact in float and
// the comparisons can be exact regardless of the order of float operations.
#include "model/dequant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/gguf.h"
#include "model/test_models.h"

namespace mr {
namespace {

// ggml type ids (ggml.h).
constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13,
                   kQ6_K = 14, kBF16 = 30, kMXFP4 = 39;

// Half-precision constants, written as bit patterns so the tests do not depend on F32ToF16.
constexpr uint16_t kH0_5 = 0x3800;     // 0.5
constexpr uint16_t kH0_25 = 0x3400;    // 0.25
constexpr uint16_t kH1 = 0x3C00;       // 1.0
constexpr uint16_t kH2 = 0x4000;       // 2.0
constexpr uint16_t kHm1_5 = 0xBE00;    // -1.5
constexpr uint16_t kH0_125 = 0x3000;   // 0.125
constexpr uint16_t kH0_0625 = 0x2C00;  // 0.0625
constexpr uint16_t kHm3 = 0xC200;      // -3.0

void PutU16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> Dequant(uint32_t type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  Status st = DequantizeRow(type, bytes.data(), out.data(), n);
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

// ---- Legacy 32-element blocks -------------------------------------------------------------

// Element j of a q4_0/q4_1 block: j < 16 is the low nibble of qs[j], j >= 16 the high nibble of
// qs[j - 16].
void PutNibble(std::vector<uint8_t>& b, size_t qs_at, int j, int q) {
  if (j < 16) {
    b[qs_at + j] = static_cast<uint8_t>((b[qs_at + j] & 0xF0) | (q & 0x0F));
  } else {
    b[qs_at + j - 16] = static_cast<uint8_t>((b[qs_at + j - 16] & 0x0F) | ((q & 0x0F) << 4));
  }
}

TEST(DequantQ4_0, HandWrittenBlock) {
  // d = 0.5; qs[0] = 0x9F: element 0 = (0xF - 8) * 0.5 = 3.5, element 16 = (0x9 - 8) * 0.5 = 0.5.
  // qs[15] = 0x08: element 15 = 0, element 31 = (0 - 8) * 0.5 = -4.
  std::vector<uint8_t> b(18, 0x88);  // all quants 8 -> 0
  PutU16(b, 0, kH0_5);
  b[2 + 0] = 0x9F;
  b[2 + 15] = 0x08;
  std::vector<float> y = Dequant(kQ4_0, b, 32);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], 0.5f);
  EXPECT_EQ(y[15], 0.0f);
  EXPECT_EQ(y[31], -4.0f);
  for (int j : {1, 2, 14, 17, 30}) EXPECT_EQ(y[j], 0.0f) << j;
}

TEST(DequantQ4_0, RandomBlocks) {
  std::mt19937 rng(1);
  const uint16_t ds[3] = {kH0_5, kHm1_5, kH0_0625};
  const float dv[3] = {0.5f, -1.5f, 0.0625f};
  std::vector<uint8_t> b(3 * 18);
  std::vector<float> expect(96);
  for (int blk = 0; blk < 3; ++blk) {
    PutU16(b, blk * 18, ds[blk]);
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(rng() % 16);
      PutNibble(b, blk * 18 + 2, j, q);
      expect[blk * 32 + j] = static_cast<float>(q - 8) * dv[blk];  // y = (q - 8) * d
    }
  }
  EXPECT_EQ(Dequant(kQ4_0, b, 96), expect);
}

TEST(DequantQ4_1, RandomBlocks) {
  std::mt19937 rng(2);
  const uint16_t ds[2] = {kH0_25, kH2}, ms[2] = {kHm3, kH0_125};
  const float dv[2] = {0.25f, 2.0f}, mv[2] = {-3.0f, 0.125f};
  std::vector<uint8_t> b(2 * 20);
  std::vector<float> expect(64);
  for (int blk = 0; blk < 2; ++blk) {
    PutU16(b, blk * 20, ds[blk]);
    PutU16(b, blk * 20 + 2, ms[blk]);
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(rng() % 16);
      PutNibble(b, blk * 20 + 4, j, q);
      expect[blk * 32 + j] = static_cast<float>(q) * dv[blk] + mv[blk];  // y = q * d + m
    }
  }
  EXPECT_EQ(Dequant(kQ4_1, b, 64), expect);
}

// q5: element j takes nibble j as in q4 and its fifth bit from bit j of the u32 qh.
void PutQ5(std::vector<uint8_t>& b, size_t qh_at, size_t qs_at, int j, int q) {
  PutNibble(b, qs_at, j, q & 0x0F);
  uint32_t qh;
  std::memcpy(&qh, &b[qh_at], 4);
  qh = (qh & ~(1u << j)) | (static_cast<uint32_t>((q >> 4) & 1) << j);
  std::memcpy(&b[qh_at], &qh, 4);
}

TEST(DequantQ5_0, HandWrittenBlock) {
  // d = 2; qh = 0x80000001 (bits 0 and 31); qs[0] = 0x00, qs[15] = 0xF3.
  // element 0: (0 | 16) - 16 = 0 -> 0; element 16: (0 | 0) - 16 = -16 -> -32;
  // element 15: (3 | 0) - 16 = -13 -> -26; element 31: (15 | 16) - 16 = 15 -> 30.
  std::vector<uint8_t> b(22, 0);
  PutU16(b, 0, kH2);
  b[2] = 0x01;
  b[5] = 0x80;
  b[6 + 15] = 0xF3;
  std::vector<float> y = Dequant(kQ5_0, b, 32);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[16], -32.0f);
  EXPECT_EQ(y[15], -26.0f);
  EXPECT_EQ(y[31], 30.0f);
  EXPECT_EQ(y[1], -32.0f);
}

TEST(DequantQ5_0, RandomBlocks) {
  std::mt19937 rng(3);
  std::vector<uint8_t> b(2 * 22, 0);
  std::vector<float> expect(64);
  const uint16_t ds[2] = {kH0_5, kHm1_5};
  const float dv[2] = {0.5f, -1.5f};
  for (int blk = 0; blk < 2; ++blk) {
    PutU16(b, blk * 22, ds[blk]);
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(rng() % 32);
      PutQ5(b, blk * 22 + 2, blk * 22 + 6, j, q);
      expect[blk * 32 + j] = static_cast<float>(q - 16) * dv[blk];  // y = (q - 16) * d
    }
  }
  EXPECT_EQ(Dequant(kQ5_0, b, 64), expect);
}

TEST(DequantQ5_1, RandomBlocks) {
  std::mt19937 rng(4);
  std::vector<uint8_t> b(2 * 24, 0);
  std::vector<float> expect(64);
  const uint16_t ds[2] = {kH0_125, kH1}, ms[2] = {kH0_5, kHm3};
  const float dv[2] = {0.125f, 1.0f}, mv[2] = {0.5f, -3.0f};
  for (int blk = 0; blk < 2; ++blk) {
    PutU16(b, blk * 24, ds[blk]);
    PutU16(b, blk * 24 + 2, ms[blk]);
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(rng() % 32);
      PutQ5(b, blk * 24 + 4, blk * 24 + 8, j, q);
      expect[blk * 32 + j] = static_cast<float>(q) * dv[blk] + mv[blk];  // y = q * d + m
    }
  }
  EXPECT_EQ(Dequant(kQ5_1, b, 64), expect);
}

TEST(DequantQ8_0, RandomBlocksIncludingExtremes) {
  std::mt19937 rng(5);
  std::vector<uint8_t> b(2 * 34, 0);
  std::vector<float> expect(64);
  const uint16_t ds[2] = {kH0_0625, kHm1_5};
  const float dv[2] = {0.0625f, -1.5f};
  for (int blk = 0; blk < 2; ++blk) {
    PutU16(b, blk * 34, ds[blk]);
    for (int j = 0; j < 32; ++j) {
      int q = static_cast<int>(rng() % 256) - 128;
      if (j == 0) q = -128;
      if (j == 1) q = 127;
      b[blk * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
      expect[blk * 32 + j] = static_cast<float>(q) * dv[blk];  // y = q * d
    }
  }
  EXPECT_EQ(Dequant(kQ8_0, b, 64), expect);
}

// ---- K-quants ------------------------------------------------------------------------------

// Packs 8 six-bit scales and mins into the 12-byte K-quant scales array: bytes 0..3 hold
// scale[0..3] in bits 0..5 and bits 4..5 of scale[4..7] in bits 6..7; bytes 4..7 likewise for
// the mins; bytes 8..11 hold the low 4 bits of scale[4..7] (low nibble) and min[4..7] (high).
std::array<uint8_t, 12> PackScaleMin(const int sc[8], const int mn[8]) {
  std::array<uint8_t, 12> q{};
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  return q;
}

TEST(DequantQ4_K, ScalePackingHandWritten) {
  // Scales bytes chosen by hand; per get_scale_min_k4:
  //   sub-block 0: sc = b[0] & 63 = 0x05, m = b[4] & 63 = 0x02
  //   sub-block 4: sc = (b[8] & 15) | (b[0] >> 6) << 4 = 0x3 | 0x30 = 51,
  //                m  = (b[8] >> 4) | (b[4] >> 6) << 4 = 0xA | 0x10 = 26
  //   sub-block 7: sc = (b[11] & 15) | (b[3] >> 6) << 4 = 0xF | 0x20 = 47,
  //                m  = (b[11] >> 4) | (b[7] >> 6) << 4 = 0x0 | 0x30 = 48
  // With d = 1, dmin = 0.5 and every quant 1: y = sc * 1 - m * 0.5.
  std::vector<uint8_t> b(144, 0x11);  // all quants 1
  PutU16(b, 0, kH1);
  PutU16(b, 2, kH0_5);
  const uint8_t scales[12] = {0xC5, 0x01, 0x01, 0x81, 0x42, 0x01, 0x01, 0xC1, 0xA3, 0x11, 0x11, 0x0F};
  std::memcpy(&b[4], scales, 12);
  std::vector<float> y = Dequant(kQ4_K, b, 256);
  EXPECT_EQ(y[0], 5.0f - 1.0f);  // sub-block 0 (elements 0..31)
  EXPECT_EQ(y[31], 5.0f - 1.0f);
  EXPECT_EQ(y[4 * 32], 51.0f - 13.0f);       // sub-block 4 (elements 128..159)
  EXPECT_EQ(y[7 * 32 + 31], 47.0f - 24.0f);  // sub-block 7 (elements 224..255)
  // sub-block 3: sc = b[3] & 63 = 1, m = b[7] & 63 = 1 -> 1 - 0.5
  EXPECT_EQ(y[3 * 32 + 5], 0.5f);
}

// Element e of a q4_K block: 64-element group g = e / 64 uses qs[32g .. 32g+31]; the first 32
// elements of the group (sub-block 2g) are the low nibbles, the next 32 (sub-block 2g+1) the high.
void PutQ4K(std::vector<uint8_t>& b, size_t qs_at, int e, int q) {
  const int g = e / 64, w = e % 64;
  uint8_t& byte = b[qs_at + 32 * g + (w % 32)];
  if (w < 32) {
    byte = static_cast<uint8_t>((byte & 0xF0) | q);
  } else {
    byte = static_cast<uint8_t>((byte & 0x0F) | (q << 4));
  }
}

TEST(DequantQ4_K, RandomBlocksDistinctScales) {
  std::mt19937 rng(6);
  const int nblk = 2;
  std::vector<uint8_t> b(nblk * 144, 0);
  std::vector<float> expect(nblk * 256);
  const uint16_t ds[2] = {kH0_25, kH0_0625}, dmins[2] = {kH0_125, kH2};
  const float dv[2] = {0.25f, 0.0625f}, dminv[2] = {0.125f, 2.0f};
  for (int blk = 0; blk < nblk; ++blk) {
    const size_t base = blk * 144;
    int sc[8], mn[8];
    for (int s = 0; s < 8; ++s) {  // distinct, covering both 6-bit halves
      sc[s] = (s * 9 + 7 + blk * 13) % 64;
      mn[s] = (63 - s * 8 - blk * 5 + 64) % 64;
    }
    PutU16(b, base, ds[blk]);
    PutU16(b, base + 2, dmins[blk]);
    const auto packed = PackScaleMin(sc, mn);
    std::memcpy(&b[base + 4], packed.data(), 12);
    for (int e = 0; e < 256; ++e) {
      const int q = static_cast<int>(rng() % 16);
      PutQ4K(b, base + 16, e, q);
      const int s = e / 32;                                              // sub-block of 32
      expect[blk * 256 + e] = dv[blk] * sc[s] * q - dminv[blk] * mn[s];  // y = d*sc*q - dmin*m
    }
  }
  EXPECT_EQ(Dequant(kQ4_K, b, nblk * 256), expect);
}

TEST(DequantQ5_K, RandomBlocksDistinctScales) {
  std::mt19937 rng(7);
  const int nblk = 2;
  const int kBytes = 176;  // d, dmin, scales[12], qh[32], qs[128]
  std::vector<uint8_t> b(nblk * kBytes, 0);
  std::vector<float> expect(nblk * 256);
  const uint16_t ds[2] = {kH0_5, kH0_125}, dmins[2] = {kH1, kH0_25};
  const float dv[2] = {0.5f, 0.125f}, dminv[2] = {1.0f, 0.25f};
  for (int blk = 0; blk < nblk; ++blk) {
    const size_t base = blk * kBytes;
    int sc[8], mn[8];
    for (int s = 0; s < 8; ++s) {
      sc[s] = (s * 11 + 3 + blk * 17) % 64;
      mn[s] = (s * 23 + 40 + blk) % 64;
    }
    PutU16(b, base, ds[blk]);
    PutU16(b, base + 2, dmins[blk]);
    const auto packed = PackScaleMin(sc, mn);
    std::memcpy(&b[base + 4], packed.data(), 12);
    for (int e = 0; e < 256; ++e) {
      const int q = static_cast<int>(rng() % 32);
      PutQ4K(b, base + 48, e, q & 15);
      // Fifth bit: sub-block s = e / 32 stores it in bit s of qh[e % 32].
      const int s = e / 32;
      uint8_t& h = b[base + 16 + e % 32];
      h = static_cast<uint8_t>((h & ~(1 << s)) | (((q >> 4) & 1) << s));
      expect[blk * 256 + e] = dv[blk] * sc[s] * q - dminv[blk] * mn[s];
    }
  }
  EXPECT_EQ(Dequant(kQ5_K, b, nblk * 256), expect);
}

TEST(DequantQ5_K, HandWrittenHighBits) {
  // d = 1, dmin = 0, all scales 1 (packed by hand: bytes 0..3 = 1, 8..11 = 0x01), quants 0;
  // qh[3] = 0b10000001: element 3 (sub-block 0, bit 0) and element 7*32 + 3 (sub-block 7,
  // bit 7) get +16. qs[32*1 + 3] high nibble = 0xA: element 64 + 32 + 3 = 99 (sub-block 3) = 10.
  std::vector<uint8_t> b(176, 0);
  PutU16(b, 0, kH1);
  for (int j = 0; j < 4; ++j) b[4 + j] = 1;
  for (int j = 0; j < 4; ++j) b[4 + 8 + j] = 0x01;
  b[16 + 3] = 0x81;
  b[48 + 32 + 3] = 0xA0;
  std::vector<float> y = Dequant(kQ5_K, b, 256);
  EXPECT_EQ(y[3], 16.0f);
  EXPECT_EQ(y[7 * 32 + 3], 16.0f);
  EXPECT_EQ(y[99], 10.0f);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_EQ(y[35], 0.0f);
}

// Element e of a q6_K block: half h = e / 128, r = e % 128, k = r / 32, l = r % 32. The low 4
// bits are in ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2); the top 2 bits
// are bits 2k..2k+1 of qh[32h + l]; the scale is scales[e / 16].
void PutQ6K(std::vector<uint8_t>& b, size_t base, int e, int q) {
  const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
  uint8_t& lo = b[base + 64 * h + l + 32 * (k & 1)];
  if (k < 2) {
    lo = static_cast<uint8_t>((lo & 0xF0) | (q & 15));
  } else {
    lo = static_cast<uint8_t>((lo & 0x0F) | ((q & 15) << 4));
  }
  uint8_t& hi = b[base + 128 + 32 * h + l];
  hi = static_cast<uint8_t>((hi & ~(3 << (2 * k))) | (((q >> 4) & 3) << (2 * k)));
}

TEST(DequantQ6_K, RandomBlocksSignedScales) {
  std::mt19937 rng(8);
  const int nblk = 2;
  const int kBytes = 210;  // ql[128], qh[64], scales[16], d
  std::vector<uint8_t> b(nblk * kBytes, 0);
  std::vector<float> expect(nblk * 256);
  const uint16_t ds[2] = {kH0_0625, kHm1_5};
  const float dv[2] = {0.0625f, -1.5f};
  for (int blk = 0; blk < nblk; ++blk) {
    const size_t base = blk * kBytes;
    int8_t sc[16];
    for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(s * 17 - 128 + blk * 3);
    sc[0] = -128;
    sc[15] = 127;
    std::memcpy(&b[base + 192], sc, 16);
    PutU16(b, base + 208, ds[blk]);
    for (int e = 0; e < 256; ++e) {
      const int q = static_cast<int>(rng() % 64);
      PutQ6K(b, base, e, q);
      expect[blk * 256 + e] = dv[blk] * sc[e / 16] * (q - 32);  // y = d * sc * (q - 32)
    }
  }
  EXPECT_EQ(Dequant(kQ6_K, b, nblk * 256), expect);
}

TEST(DequantQ6_K, HandWrittenBlock) {
  // d = 0.5, scales[0] = 2, scales[2] = -1, scales[8] = 4, all other scales 0.
  // ql[0] = 0x3F, qh[0] = 0b00000110: element 0 = (0xF | 2<<4) - 32 = 15 -> 0.5*2*15 = 15;
  //   element 32 uses ql[32] low nibble (0) and qh[0] bits 2..3 (1): (0 | 16) - 32 = -16 ->
  //   0.5 * (-1) * -16 = 8 (scale index 32/16 = 2).
  // ql[64] = 0x00, qh[32] = 0: element 128 = -32 -> 0.5 * 4 * -32 = -64.
  std::vector<uint8_t> b(210, 0);
  b[0] = 0x3F;
  b[128] = 0x06;
  b[192 + 0] = 2;
  b[192 + 2] = 0xFF;  // -1
  b[192 + 8] = 4;
  PutU16(b, 208, kH0_5);
  std::vector<float> y = Dequant(kQ6_K, b, 256);
  EXPECT_EQ(y[0], 15.0f);
  EXPECT_EQ(y[32], 8.0f);
  EXPECT_EQ(y[128], -64.0f);
  EXPECT_EQ(y[64], 0.0f);  // scale 4 is 0
}

// ---- MXFP4 ---------------------------------------------------------------------------------

// block_mxfp4 (17 bytes): e, the E8M0 shared exponent (scale 2^(e - 127)), then qs[16]; element
// j < 16 is the E2M1 code in the low nibble of qs[j], element j >= 16 the high nibble of
// qs[j - 16]. The codes' values as the OCP MX v1.0 spec lists them (sign bit 3).
constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

TEST(DequantMXFP4, EveryCodeTimesTheSharedScale) {
  const int exps[] = {127, 130, 100, 0, 1};  // scales 1, 8, 2^-27 and the subnormal 2^-127, 2^-126
  std::vector<uint8_t> b(5 * 17, 0);
  for (int k = 0; k < 5; ++k) {
    b[17 * k] = static_cast<uint8_t>(exps[k]);
    for (int j = 0; j < 32; ++j) PutNibble(b, 17 * k + 1, j, (j + k) % 16);
  }
  const std::vector<float> y = Dequant(kMXFP4, b, 160);
  for (int k = 0; k < 5; ++k) {
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(y[32 * k + j], std::ldexp(kE2M1[(j + k) % 16], exps[k] - 127)) << "block " << k << ", element " << j;
    }
  }
}

// ---- Float types ---------------------------------------------------------------------------

TEST(DequantFloat, F32F16BF16) {
  const float f32[4] = {1.5f, -0.0f, 3.0e38f, -7.25f};
  std::vector<uint8_t> b(sizeof f32);
  std::memcpy(b.data(), f32, sizeof f32);
  std::vector<float> y = Dequant(kF32, b, 4);
  EXPECT_EQ(std::memcmp(y.data(), f32, sizeof f32), 0);

  // F16: 0x3C00 = 1, 0xC000 = -2, 0x0001 = 2^-24, 0x7BFF = 65504.
  std::vector<uint8_t> h(8);
  PutU16(h, 0, 0x3C00);
  PutU16(h, 2, 0xC000);
  PutU16(h, 4, 0x0001);
  PutU16(h, 6, 0x7BFF);
  y = Dequant(kF16, h, 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(y[3], 65504.0f);

  // BF16: upper half of the float bits. 0x3FC0 = 1.5, 0xC0E8 = -7.25.
  std::vector<uint8_t> bf(4);
  PutU16(bf, 0, 0x3FC0);
  PutU16(bf, 2, 0xC0E8);
  y = Dequant(kBF16, bf, 2);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], -7.25f);
}

TEST(DequantFloat, UnalignedSource) {
  // GGUF data may sit at any byte offset inside a buffer; reading must not assume alignment.
  std::vector<uint8_t> buf(1 + 34);
  PutU16(buf, 1, kH2);
  for (int j = 0; j < 32; ++j) buf[3 + j] = static_cast<uint8_t>(j);
  std::vector<float> y(32);
  ASSERT_TRUE(DequantizeRow(kQ8_0, buf.data() + 1, y.data(), 32).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * j);
}

// ---- Golden hashes from an independent implementation -------------------------------------

// Pseudo-random block bytes: byte i is the top byte of the i-th step of a 64-bit LCG (Knuth's
// MMIX constants) seeded with type + 1. Random bytes include inf/NaN scales, so NaN outputs are
// canonicalized to 0x7fc00000 before hashing.
std::vector<uint8_t> LcgBytes(uint64_t seed, size_t n) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = static_cast<uint8_t>(x >> 56);
  }
  return out;
}

uint64_t Fnv1a64(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (float f : v) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if (std::isnan(f)) b = 0x7fc00000u;
    for (int k = 0; k < 4; ++k) {
      h ^= (b >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

TEST(DequantGolden, MatchesGgufPyOnPseudoRandomBlocks) {
  // Hashes of 2048 dequantized elements per type, computed with gguf-py 0.19
  // (gguf.quants.dequantize, the numpy port of ggml's dequantize_row_*) on the same bytes.
  struct Golden {
    uint32_t type;
    int64_t block_elems, block_bytes;
    uint64_t hash;
  };
  const Golden kGolden[] = {
      {kF32, 1, 4, 0xf478f8909fc9e64cull},      {kF16, 1, 2, 0xb0fc8a0b71c52b55ull},
      {kBF16, 1, 2, 0x4d264617546d71b5ull},     {kQ4_0, 32, 18, 0xfd348fc72322a56bull},
      {kQ4_1, 32, 20, 0x0eac66b4c2533eb4ull},   {kQ5_0, 32, 22, 0x68e07dfb535ed2b7ull},
      {kQ5_1, 32, 24, 0xcb776a4a14c36cc4ull},   {kQ8_0, 32, 34, 0xabf66e0423229028ull},
      {kQ4_K, 256, 144, 0xf1b32e65189313a5ull}, {kQ5_K, 256, 176, 0x8f4ae17a4fd8b202ull},
      {kQ6_K, 256, 210, 0x94df11759ab6cb6aull},
  };
  for (const Golden& g : kGolden) {
    const int64_t nb = 2048 / g.block_elems;
    const std::vector<uint8_t> raw = LcgBytes(g.type + 1, static_cast<size_t>(nb * g.block_bytes));
    std::vector<float> y(2048);
    ASSERT_TRUE(DequantizeRow(g.type, raw.data(), y.data(), 2048).ok());
    EXPECT_EQ(Fnv1a64(y), g.hash) << "type " << g.type;
  }
}

// ---- Errors --------------------------------------------------------------------------------

TEST(DequantErrors, UnsupportedTypesAndBadCounts) {
  std::vector<uint8_t> b(1024, 0);
  std::vector<float> y(512);
  for (uint32_t t : {4u, 5u, 9u, 10u, 11u, 15u, 24u, 28u, 31u, 999u}) {
    EXPECT_FALSE(CanDequantize(t)) << t;
    Status st = DequantizeRow(t, b.data(), y.data(), 256);
    EXPECT_FALSE(st.ok()) << t;
    EXPECT_NE(st.message().find(std::to_string(t)), std::string::npos) << st.message();
  }
  for (uint32_t t : {kF32, kF16, kBF16, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kMXFP4}) {
    EXPECT_TRUE(CanDequantize(t)) << t;
  }
  // An MXFP4 shared exponent of 0xFF is NaN in the MX spec (ggml would read it as 2^127).
  std::vector<uint8_t> mx(3 * 17, 0);
  mx[2 * 17] = 0xFF;
  Status st = DequantizeRow(kMXFP4, mx.data(), y.data(), 96);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("mxfp4 block 2"), std::string::npos) << st.message();
  EXPECT_TRUE(DequantizeRow(kMXFP4, mx.data(), y.data(), 64).ok());
  EXPECT_FALSE(DequantizeRow(kQ8_0, b.data(), y.data(), 33).ok());
  EXPECT_FALSE(DequantizeRow(kQ4_K, b.data(), y.data(), 128).ok());
  EXPECT_FALSE(DequantizeRow(kF32, b.data(), y.data(), -1).ok());
  EXPECT_TRUE(DequantizeRow(kQ6_K, b.data(), y.data(), 0).ok());
}

// ---- Real models ---------------------------------------------------------------------------

struct ModelCase {
  const char* names[2];
};

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0 : std::sqrt(s / static_cast<double>(v.size()));
}

// Dequantizes up to ~64K leading elements (whole rows) of every tensor of the model and checks
// that they are finite with a plausible RMS. For the smallest model every tensor is done in full.
void CheckModel(std::initializer_list<const char*> names, bool full) {
  const std::string path = FindModelFileAny(names);
  if (path.empty()) GTEST_SKIP() << "model " << *names.begin() << " not found";
  auto file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  int checked = 0;
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (!CanDequantize(t.type)) {
      ADD_FAILURE() << t.name << ": type " << gguf::TypeName(t.type) << " not dequantizable";
      continue;
    }
    const int64_t cols = t.cols();
    int64_t n = t.n_elements;
    if (!full) n = std::min<int64_t>(n, std::max<int64_t>(cols, (65536 / cols) * cols));
    std::vector<float> y(static_cast<size_t>(n));
    Status st = DequantizeRow(t.type, t.data, y.data(), n);
    ASSERT_TRUE(st.ok()) << t.name << ": " << st.message();
    int64_t bad = 0;
    for (float x : y) bad += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(bad, 0) << t.name << " (" << gguf::TypeName(t.type) << ")";
    const double rms = Rms(y);
    EXPECT_GT(rms, 1e-6) << t.name;
    EXPECT_LT(rms, 1e3) << t.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(DequantRealModel, SmolLM2AllTensorsInFull) {
  CheckModel({"SmolLM2-135M-Instruct.Q4_1.gguf"}, /*full=*/true);
}
TEST(DequantRealModel, Gemma3Sample) {
  CheckModel({"gemma-3-270m-q4_k_m.gguf"}, false);
}
TEST(DequantRealModel, Qwen05Sample) {
  CheckModel({"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen05.gguf"}, false);
}
TEST(DequantRealModel, Qwen15Sample) {
  CheckModel({"qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen15.gguf"}, false);
}

}  // namespace
}  // namespace mr
