// FP16/BF16 conversion tests. Expected values come from the IEEE formulas evaluated in double
// (value = (-1)^s * 2^(e - bias) * (1 + m / 2^mbits), subnormals 2^(1 - bias) * m / 2^mbits) and
// from a nearest-value search over all representable halves, not from the code under test.
#include "base/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace mr {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Exact value of a half bit pattern by the IEEE 754 binary16 formula (NaN for NaNs).
double HalfValue(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);  // 2^-14 * m / 1024
  } else if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1024.0 + m, e - 25);  // 2^(e-15) * (1024 + m) / 1024
  }
  return s ? -v : v;
}

bool IsHalfNaN(uint16_t h) {
  return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
}

TEST(Half, F16ToF32MatchesFormulaForAll65536) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const double want = HalfValue(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // covers -0
    }
  }
}

TEST(Half, RoundTripAll65536) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = F32ToF16(F16ToF32(static_cast<uint16_t>(h)));
    if (IsHalfNaN(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(IsHalfNaN(back)) << std::hex << h << " -> " << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Half, TiesRoundToEvenAcrossAllAdjacentPairs) {
  // For every pair of adjacent positive finite halves (h, h+1), including subnormals and the
  // subnormal/normal boundary, the midpoint is exact in float; it must round to the even one,
  // and the floats just below/above it to h and h+1.
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const double lo = HalfValue(static_cast<uint16_t>(h));
    const double hi = HalfValue(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    EXPECT_EQ(F32ToF16(mid), even) << std::hex << h;
    EXPECT_EQ(F32ToF16(-mid), even | 0x8000) << std::hex << h;
    EXPECT_EQ(F32ToF16(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    EXPECT_EQ(F32ToF16(std::nextafter(mid, 1e9f)), h + 1) << std::hex << h;
  }
}

TEST(Half, SubnormalsZeroAndOverflow) {
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);     // tie with 0 -> even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);     // above the tie
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -26)), 0x0000);     // underflow
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -26)), 0x8000);    // signed underflow
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp tie -> even (2)
  EXPECT_EQ(F32ToF16(std::ldexp(1023.0f, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(F32ToF16(65519.0f), 0x7BFF);  // below the overflow tie
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // tie with 2^16 -> inf (even)
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::max()), 0x7C00);
}

TEST(Half, InfAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(F32ToF16(inf), 0x7C00);
  EXPECT_EQ(F32ToF16(-inf), 0xFC00);
  EXPECT_TRUE(std::isinf(F16ToF32(0x7C00)));
  EXPECT_TRUE(std::isinf(F16ToF32(0xFC00)) && F16ToF32(0xFC00) < 0);
  EXPECT_TRUE(IsHalfNaN(F32ToF16(std::numeric_limits<float>::quiet_NaN())));
  // NaN whose payload lives only in low float mantissa bits must not become inf.
  EXPECT_TRUE(IsHalfNaN(F32ToF16(FromBits(0x7F800001u))));
  EXPECT_TRUE(IsHalfNaN(F32ToF16(FromBits(0xFF800001u))));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));
  EXPECT_TRUE(std::isnan(F16ToF32(0xFE00)));
}

// Nearest half to x by search over the sorted finite positive halves, ties to even; values at
// or beyond 65520 (max + half ulp) go to infinity.
uint16_t ReferenceF16(float x) {
  static const std::vector<double> kPos = [] {
    std::vector<double> v;
    for (uint32_t h = 0; h <= 0x7BFF; ++h) v.push_back(HalfValue(static_cast<uint16_t>(h)));
    return v;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7C00;
  const auto it = std::lower_bound(kPos.begin(), kPos.end(), a);
  if (it == kPos.end()) return sign | 0x7BFF;  // (65504, 65520)
  const auto hi = static_cast<uint16_t>(it - kPos.begin());
  if (kPos[hi] == a || hi == 0) return sign | hi;
  const auto lo = static_cast<uint16_t>(hi - 1);
  const double dl = a - kPos[lo], dh = kPos[hi] - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

TEST(Half, RandomFloatsMatchNearestSearch) {
  std::mt19937 rng(42);
  for (int k = 0; k < 300000; ++k) {
    // Exponents spread over the range that matters to halves (and beyond, both sides).
    const int e = static_cast<int>(rng() % 50) + 127 - 30;
    const uint32_t bits = (rng() & 0x807FFFFFu) | (static_cast<uint32_t>(e) << 23);
    const float x = FromBits(bits);
    ASSERT_EQ(F32ToF16(x), ReferenceF16(x)) << std::hex << bits;
  }
}

// ---- BF16 ----------------------------------------------------------------------------------

TEST(Bf16, ToF32IsUpperHalfForAll65536) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToF32(static_cast<uint16_t>(b));
    EXPECT_EQ(Bits(f), b << 16) << std::hex << b;
  }
}

TEST(Bf16, RoundTripAll65536) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t back = F32ToBf16(Bf16ToF32(static_cast<uint16_t>(b)));
    const bool nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    if (nan) {
      EXPECT_TRUE((back & 0x7F80) == 0x7F80 && (back & 0x7F) != 0) << std::hex << b;
      EXPECT_EQ(back & 0x8000, b & 0x8000);
    } else {
      EXPECT_EQ(back, b) << std::hex << b;
    }
  }
}

TEST(Bf16, RoundingTiesAndOverflow) {
  EXPECT_EQ(F32ToBf16(FromBits(0x3F808000u)), 0x3F80);  // tie, lower is even
  EXPECT_EQ(F32ToBf16(FromBits(0x3F818000u)), 0x3F82);  // tie, upper is even
  EXPECT_EQ(F32ToBf16(FromBits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(F32ToBf16(FromBits(0x3F817FFFu)), 0x3F81);  // just below the tie
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7F8000u)), 0x7F80);  // tie past max -> inf
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7F7FFFu)), 0x7F7F);  // stays max finite
  EXPECT_EQ(F32ToBf16(FromBits(0x00008000u)), 0x0000);  // subnormal tie -> even (0)
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000u)), 0x0002);  // subnormal tie -> even (2)
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  const uint16_t n1 = F32ToBf16(FromBits(0x7F800001u));  // NaN with low payload only
  EXPECT_TRUE((n1 & 0x7F80) == 0x7F80 && (n1 & 0x7F) != 0) << std::hex << n1;
  const uint16_t n2 = F32ToBf16(FromBits(0xFFC00000u));
  EXPECT_TRUE((n2 & 0x7F80) == 0x7F80 && (n2 & 0x7F) != 0 && (n2 & 0x8000)) << std::hex << n2;
}

TEST(Bf16, RandomFloatsRoundToNearestEven) {
  // Reference: the two bf16 neighbours by truncation, pick the nearer in double, ties to even;
  // the neighbour above the largest finite value stands for 2^128 (rounds to inf).
  std::mt19937 rng(7);
  for (int k = 0; k < 300000; ++k) {
    uint32_t bits = rng();
    if ((bits & 0x7F800000u) == 0x7F800000u) continue;  // inf/NaN covered above
    const float x = FromBits(bits);
    const uint16_t lo = static_cast<uint16_t>(bits >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double vlo = std::fabs(static_cast<double>(Bf16ToF32(lo)));
    const double vhi = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(Bf16ToF32(hi)));
    const double a = std::fabs(static_cast<double>(x));
    uint16_t want;
    if (a - vlo < vhi - a) {
      want = lo;
    } else if (a - vlo > vhi - a) {
      want = hi;
    } else {
      want = (lo & 1) ? hi : lo;
    }
    ASSERT_EQ(F32ToBf16(x), want) << std::hex << bits;
  }
}

}  // namespace
}  // namespace mr
