// Native K-quant formats (kquant.h): the repack is a pure permutation of the ggml bytes, the
// packed rows dequantize exactly as the GGUF reader does, and every kernel variant matches the
// scalar reference on odd sizes, partial tile ranges and 1..13 activation rows.
#include "kernels/kquant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace mr {
namespace {

void PutF16(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// Byte offset of the f16 d in a ggml block of format f; whether an f16 dmin (Q4_K) or m (Q4_1)
// follows it at byte 2.
int64_t DOffset(KFormat f) {
  return f == KFormat::kQ6K ? 208 : 0;
}
bool HasSecondScale(KFormat f) {
  return f == KFormat::kQ4K || f == KFormat::kQ5K || f == KFormat::kQ4_1;
}

// Row-major ggml blocks with random quants and scales and realistic (finite, small) d / dmin
// (MXFP4: e in [116, 130], scales 2^-12..2^2); F16 / BF16 rows of normally distributed values.
std::vector<uint8_t> RandomBlocks(KFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  if (KFormatIsFloat(f)) {
    std::normal_distribution<float> value(0.0f, 0.05f);
    std::vector<uint8_t> v(static_cast<size_t>(rows * cols * 2));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float x = value(rng);
      const uint16_t h = f == KFormat::kF16 ? F32ToF16(x) : F32ToBf16(x);
      std::memcpy(v.data() + 2 * i, &h, 2);
    }
    return v;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  const int64_t sb = KSuperBytes(f), n = rows * (cols / KSuperInputs(f));
  std::vector<uint8_t> v(static_cast<size_t>(n * sb));
  for (auto& b : v) b = static_cast<uint8_t>(byte(rng));
  std::uniform_int_distribution<int> exponent(116, 130);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* x = v.data() + i * sb;
    if (f == KFormat::kMXFP4) {
      x[0] = static_cast<uint8_t>(exponent(rng));
      continue;
    }
    PutF16(x + DOffset(f), scale(rng));
    if (HasSecondScale(f)) PutF16(x + 2, f == KFormat::kQ4_1 ? -scale(rng) : scale(rng));  // dmin / m
  }
  return v;
}

KMatrix Pack(KFormat f, const std::vector<uint8_t>& src, int64_t rows, int64_t cols) {
  KMatrix m = NewKMatrix(f, rows, cols);
  EXPECT_TRUE(PackKTiles(src.data(), 0, m.tiles(), &m).ok());
  return m;
}

class KFormatTest : public ::testing::TestWithParam<KFormat> {};

TEST_P(KFormatTest, ByteOffsetsAreABijection) {
  const KFormat f = GetParam();
  std::vector<int> hits(static_cast<size_t>(KBlockBytes(f)), 0);
  for (int64_t o = 0; o < kKTile; ++o) {
    for (int64_t b = 0; b < KSuperBytes(f); ++b) {
      const int64_t off = KByteOffset(f, o, b);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, KBlockBytes(f));
      ++hits[static_cast<size_t>(off)];
    }
  }
  for (int h : hits) ASSERT_EQ(h, 1);
}

TEST_P(KFormatTest, PackIsAPermutationThatUnpackRestores) {
  const KFormat f = GetParam();
  for (int64_t rows : {1, 15, 16, 17, 40}) {
    for (int64_t cols : {256, 768}) {
      const auto src = RandomBlocks(f, rows, cols, static_cast<uint32_t>(rows * 7 + cols));
      const KMatrix m = Pack(f, src, rows, cols);
      ASSERT_EQ(m.tiles(), (rows + 15) / 16);
      ASSERT_EQ(m.data.size(), static_cast<size_t>(m.tiles() * m.supers() * KBlockBytes(f)));
      EXPECT_EQ(m.bytes(), src.size());
      EXPECT_EQ(UnpackK(m), src);
      // The packed bytes are the file's bytes plus zero padding rows: same multiset of values.
      std::vector<int64_t> count_src(256, 0), count_packed(256, 0);
      for (uint8_t b : src) ++count_src[b];
      for (uint8_t b : m.data) ++count_packed[b];
      count_packed[0] -= (m.tiles() * kKTile - rows) * m.supers() * KSuperBytes(f);
      EXPECT_EQ(count_src, count_packed);
    }
  }
}

TEST_P(KFormatTest, PackedRowsDequantizeLikeTheGgufReader) {
  const KFormat f = GetParam();
  const int64_t rows = 19, cols = 512;
  const auto src = RandomBlocks(f, rows, cols, 3);
  const KMatrix m = Pack(f, src, rows, cols);
  std::vector<float> a(cols), b(cols);
  for (int64_t o = 0; o < rows; ++o) {
    // The GGUF reader (model/dequant.cpp) dequantizes K-quant rows with DequantizeKBlocks.
    DequantizeKBlocks(f, src.data() + o * (src.size() / rows), a.data(), cols / KSuperInputs(f));
    DequantizeKRow(m, o, b.data());
    ASSERT_EQ(a, b) << "row " << o;  // bit-identical
  }
}

TEST_P(KFormatTest, NonFiniteScaleIsRejectedWithItsRow) {
  const KFormat f = GetParam();
  auto src = RandomBlocks(f, 20, 256, 4);
  // The last f16 scale of the block (dmin / m where there is one; an F16 / BF16 value), in row
  // 17's first block.
  const int64_t per_row = 256 / KSuperInputs(f);
  uint8_t* at = src.data() + 17 * per_row * KSuperBytes(f) + (HasSecondScale(f) ? 2 : DOffset(f));
  if (f == KFormat::kMXFP4) {
    *at = 0xFF;  // e: NaN in the OCP MX spec
  } else if (f == KFormat::kBF16) {
    const uint16_t inf = F32ToBf16(INFINITY);
    std::memcpy(at, &inf, 2);
  } else {
    PutF16(at, INFINITY);  // an F16 value, or an f16 scale
  }
  KMatrix m = NewKMatrix(f, 20, 256);
  const Status st = PackKTiles(src.data(), 0, m.tiles(), &m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("row 17"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(Formats, KFormatTest, ::testing::ValuesIn(kAllKFormats),
                         [](const auto& info) { return std::string(KFormatName(info.param)); });

// The writer (`mererun convert`): QuantizeKBlocks then the reader's DequantizeKBlocks gives the
// values back within each format's step: rms error relative to the values' rms under a bound
// set by the bits (measured: Q8_0 0.004, Q6_K 0.021, Q4_K 0.077 on Gaussian values), with an offset
// (Q4_K's minimum), an all-zero block and a block with one outlier; the other formats are refused.
TEST(KQuantize, WrittenBlocksReadBackWithinTheFormatsStep) {
  struct Case {
    KFormat f;
    double bound;
  };
  for (const Case c :
       {Case{KFormat::kQ8_0, 0.006}, Case{KFormat::kQ6K, 0.03}, Case{KFormat::kQ4K, 0.1}, Case{KFormat::kF16, 1e-3}}) {
    const int64_t nb = 24, n = nb * KSuperInputs(c.f);
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = g(rng) + (i / 256 == 1 ? 3.0f : 0.0f);  // an offset block
    for (int64_t i = 512; i < 768 && i < n; ++i) x[i] = 0.0f;                      // an all-zero block
    if (n > 900) x[900] = 40.0f;                                                   // an outlier
    std::vector<uint8_t> q(static_cast<size_t>(nb * KSuperBytes(c.f)));
    ASSERT_TRUE(QuantizeKBlocks(c.f, x.data(), q.data(), nb)) << KFormatName(c.f);
    std::vector<float> y(n);
    DequantizeKBlocks(c.f, q.data(), y.data(), nb);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(y[i]));
      err += (x[i] - y[i]) * (x[i] - y[i]);
      norm += x[i] * x[i];
      if (i >= 512 && i < 768) {
        EXPECT_EQ(y[i], 0.0f) << KFormatName(c.f) << " zero block, input " << i;
      }
    }
    const double rel = std::sqrt(err / norm);
    EXPECT_LT(rel, c.bound) << KFormatName(c.f);
    std::printf("[%s] relative rms error %.5f\n", KFormatName(c.f), rel);
  }
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> q(4096);
  for (KFormat f : {KFormat::kQ5_0, KFormat::kQ4_1, KFormat::kQ4_0, KFormat::kQ5K, KFormat::kBF16}) {
    EXPECT_FALSE(QuantizeKBlocks(f, x.data(), q.data(), 1)) << KFormatName(f);
  }
}

// ---- MXFP4, from the OCP Microscaling Formats (MX) v1.0 spec rather than ggml's tables --------

// An E2M1 element: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0 is
// subnormal (0 or 0.5). Largest magnitude 6.
double E2M1(int q) {
  const int ex = (q >> 1) & 3, m = q & 1;
  const double mag = ex == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, ex - 1);
  return (q & 8) ? -mag : mag;
}
// An MX element q under E8M0 exponent e (scale 2^(e - 127)) as a float: infinite past FLT_MAX.
float MxValue(int q, int e) {
  const double v = E2M1(q) * std::ldexp(1.0, e - 127);
  if (std::fabs(v) > std::numeric_limits<float>::max()) return v > 0 ? INFINITY : -INFINITY;
  return static_cast<float>(v);
}
// One block_mxfp4: e, then qs[j] = input j (low nibble) | input j + 16 (high nibble).
std::vector<uint8_t> MxBlock(int e, const int (&q)[32]) {
  std::vector<uint8_t> b(17);
  b[0] = static_cast<uint8_t>(e);
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  return b;
}

// Every code in both nibble positions, at the extreme exponents (2^-127 and 2^-126 are the
// subnormal scales ggml special-cases) and in between, against the spec's values: the reader's
// DequantizeKBlocks and, through the tiles, DequantizeKRow.
TEST(KMXFP4, DequantizesEveryCodeAndExponentAsTheSpecSays) {
  int q[32];
  for (int j = 0; j < 16; ++j) {
    q[j] = j;            // low nibbles: codes 0..15
    q[j + 16] = 15 - j;  // high nibbles: codes 15..0
  }
  for (int e : {0, 1, 2, 3, 64, 126, 127, 128, 200, 252, 253, 254}) {
    const std::vector<uint8_t> b = MxBlock(e, q);
    float y[32];
    DequantizeKBlocks(KFormat::kMXFP4, b.data(), y, 1);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(y[i], MxValue(q[i], e)) << "e " << e << ", input " << i << ", code " << q[i];
    if (e >= 253) continue;  // its codes of 8 (253) or 4 (254) and up overflow: PackKTiles refuses the block
    KMatrix m = NewKMatrix(KFormat::kMXFP4, 3, 32);
    std::vector<uint8_t> rows(3 * 17, 0);
    std::copy(b.begin(), b.end(), rows.begin() + 17);  // row 1 of 3
    ASSERT_TRUE(PackKTiles(rows.data(), 0, 1, &m).ok()) << "e " << e;
    float z[32];
    DequantizeKRow(m, 1, z);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(z[i], y[i]) << "packed, e " << e << ", input " << i;
  }
}

// e = 0xFF is NaN in the spec; with e = 253 / 254 the larger codes overflow. Both are refused with
// the row; the largest codes that stay finite are not.
TEST(KMXFP4, PackRefusesNanExponentsAndOverflowingValues) {
  struct Case {
    int e, code;
    bool ok;
  };
  for (const Case c :
       {Case{0xFF, 0, false}, Case{254, 4, false}, Case{254, 12, false}, Case{254, 3, true}, Case{254, 11, true},
        Case{253, 5, true}, Case{253, 6, false}, Case{253, 15, false}, Case{252, 7, true}, Case{252, 15, true}}) {
    int q[32] = {};
    q[21] = c.code;
    std::vector<uint8_t> rows(5 * 2 * 17, 0);
    const std::vector<uint8_t> b = MxBlock(c.e, q);
    std::copy(b.begin(), b.end(), rows.begin() + (3 * 2 + 1) * 17);  // row 3, second block
    KMatrix m = NewKMatrix(KFormat::kMXFP4, 5, 64);
    const Status st = PackKTiles(rows.data(), 0, m.tiles(), &m);
    ASSERT_EQ(st.ok(), c.ok) << "e " << c.e << ", code " << c.code << ": " << st.message();
    if (!c.ok) {
      EXPECT_NE(st.message().find("row 3, block 1"), std::string::npos) << st.message();
    }
  }
}

// QuantizeKBlocks follows quantize_row_mxfp4_ref: e = floor(log2(amax)) + 125 (here from frexp;
// 0 for an all-zero block and below 2^-125), and every value decodes to a code nearest to it among
// the 16 (so within half a step of the grid, or past its end by what the largest code cannot
// reach: at most 4 * 2^(e - 128)).
TEST(KMXFP4, QuantizeTakesTheMaxExponentAndTheNearestCode) {
  const int64_t nb = 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(nb * 32);
  for (int64_t b = 0; b < nb; ++b) {
    const int k = static_cast<int>(b % 41) - 20;  // block magnitudes 2^-20 .. 2^20
    for (int i = 0; i < 32; ++i) x[b * 32 + i] = std::ldexp(g(rng), k);
  }
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // block 1: all zero
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // block 2: one subnormal value
  x[64 + 5] = std::ldexp(1.0f, -130);
  for (int i = 0; i < 32; ++i) x[96 + i] = (i % 3) * 0.25f;  // block 3: amax 0.5, a power of two
  x[128 + 7] = -std::ldexp(1.0f, 100);                       // block 4: a large negative outlier
  std::vector<uint8_t> q(nb * 17);
  ASSERT_TRUE(QuantizeKBlocks(KFormat::kMXFP4, x.data(), q.data(), nb));
  std::vector<float> y(nb * 32);
  DequantizeKBlocks(KFormat::kMXFP4, q.data(), y.data(), nb);
  double err = 0, norm = 0;
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    int ex = 0;
    std::frexp(amax, &ex);  // amax = m * 2^ex, m in [0.5, 1): floor(log2(amax)) = ex - 1
    const int want_e = amax > 0 ? std::max(0, ex + 124) : 0;
    ASSERT_EQ(q[b * 17], want_e) << "block " << b << ", amax " << amax;
    const double d = std::ldexp(1.0, want_e - 127);  // the spec's scale of the undoubled codes
    for (int i = 0; i < 32; ++i) {
      const double xi = x[b * 32 + i], yi = y[b * 32 + i];
      double best = INFINITY;
      for (int c = 0; c < 16; ++c) best = std::min(best, std::fabs(E2M1(c) * d - xi));
      ASSERT_LE(std::fabs(yi - xi), best * (1 + 1e-6))
          << "block " << b << ", input " << i << ": " << xi << " -> " << yi;
      ASSERT_LE(std::fabs(yi - xi), 2 * d) << "block " << b << ", input " << i;
      if (b >= 5) {
        err += (xi - yi) * (xi - yi) / (d * d);
        norm += xi * xi / (d * d);
      }
    }
  }
  const double rel = std::sqrt(err / norm);  // Gaussian blocks, each in units of its own scale
  EXPECT_LT(rel, 0.2);
  std::printf("[mxfp4] relative rms error %.4f\n", rel);
}

std::vector<float> RandomActs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Quantized activations that keep their FP32 rows (QActs::x, read by the F16 / BF16 kernels).
// Not copyable: x points into xf.
struct Acts : QActs {
  std::vector<float> xf;
  Acts() = default;
  Acts(const Acts&) = delete;
  Acts& operator=(const Acts&) = delete;
};

std::unique_ptr<Acts> Quantize(std::vector<float> x, int64_t n, int64_t cols) {
  auto a = std::make_unique<Acts>();
  a->xf = std::move(x);
  a->Resize(n, cols);
  ref::QuantizeActs(a->xf.data(), n, cols, a->q.data(), a->scales.data());
  a->ComputeSums(0, n);
  a->x = a->xf.data();
  return a;
}

// sum_i |w_i x_i| for output o, row r (x as the format's kernels read it): the scale of the
// rounding error of any summation order.
double AbsDot(const KMatrix& m, int64_t o, const QActs& a, int64_t r) {
  std::vector<float> w(static_cast<size_t>(m.cols));
  DequantizeKRow(m, o, w.data());
  double s = 0;
  for (int64_t i = 0; i < m.cols; ++i) {
    const double x = KFormatIsFloat(m.format)
                         ? a.x[r * m.cols + i]
                         : a.q[r * m.cols + i] * a.scales[r * (m.cols / kActGroup) + i / kActGroup];
    s += std::fabs(w[i] * x);
  }
  return s;
}

// Relative tolerance against AbsDot: the integer kernels' sums are exact and only their scaling
// rounds; the F16 / BF16 kernels sum FP32 products (two chains of up to 448 terms here).
double RelTol(KFormat f) {
  return KFormatIsFloat(f) ? 2e-5 : 2e-6;
}

struct KCase {
  CpuVariant cpu;
  KFormat format;
};

class KKernelTest : public ::testing::TestWithParam<KCase> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam().cpu)) {
      GTEST_SKIP() << CpuVariantName(GetParam().cpu)
                   << " (VNNI for avx512, AMX-INT8 for amx) not supported on this CPU: skipped";
    }
  }
};

TEST_P(KKernelTest, MatmulMatchesReferenceOnOddSizes) {
  const auto [cpu, f] = GetParam();
  const KernelTable& k = GetKernels(cpu);
  // Outputs not multiples of the 16-row tile, 1..13 activation rows (every row count of a tile
  // visit, passes of 4 within groups of 8, a second group), tile ranges that start after 0 and
  // stop before the end.
  for (int64_t cols : {192, 256, 768, 896}) {
    if (cols % KSuperInputs(f) != 0) continue;  // 192 and 896 (Qwen2.5-0.5B's width): 32-input blocks only
    for (int64_t out : {1, 15, 17, 50}) {
      const auto src = RandomBlocks(f, out, cols, static_cast<uint32_t>(out * 13 + cols));
      const KMatrix m = Pack(f, src, out, cols);
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 21, 38}) {
        const auto ap = Quantize(RandomActs(n * cols, static_cast<uint32_t>(n * 5 + cols)), n, cols);
        const QActs& a = *ap;
        const int64_t t0 = m.tiles() > 2 ? 1 : 0, t1 = m.tiles() > 3 ? m.tiles() - 1 : m.tiles();
        const int64_t o0 = t0 * kKTile, o1 = std::min(out, t1 * kKTile);
        std::vector<float> y_ref(n * out, -1.0f), y(n * out, -1.0f);
        ref::MatmulKInt(m, a, n, y_ref.data(), out, o0, o1);
        k.matmul_k[static_cast<int>(f)](m, a, n, y.data(), out, t0, t1);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            const float want = y_ref[r * out + o], got = y[r * out + o];
            if (o < o0 || o >= o1) {
              ASSERT_EQ(got, -1.0f) << "wrote outside its tile range: o " << o;
            } else {
              ASSERT_NEAR(got, want, RelTol(f) * AbsDot(m, o, a, r) + 1e-6)
                  << KFormatName(f) << " cols " << cols << " out " << out << " n " << n << " r " << r << " o " << o;
            }
          }
        }
      }
    }
  }
}

// The integer bounds the kernels rely on (int16 partial sums, vpmaddubsw's saturation, int32
// sums): every quant byte at an extreme (0xFF: the largest nibbles and 5-/6-bit quants with every
// high bit, and the largest scales and mins; 0x80: Q8_0's -128; 0x77: MXFP4's +12 in both nibbles,
// the largest u8 weight, 24, after its offset) against activations that all quantize to +127 or
// -127, so every product has the same sign and the largest magnitude.
TEST_P(KKernelTest, ExtremeQuantsAndActivationsStayExact) {
  const auto [cpu, f] = GetParam();
  if (KFormatIsFloat(f)) GTEST_SKIP() << KFormatName(f) << ": FP32 arithmetic, no integer bounds to test";
  const KernelTable& k = GetKernels(cpu);
  const int64_t cols = 512, out = 17, n = 17;  // two 8-row groups and one more; an AMX block and a tail
  for (uint8_t fill : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}, uint8_t{0x77}}) {
    auto src = RandomBlocks(f, out, cols, 5);
    const int64_t sb = KSuperBytes(f), d_at = DOffset(f);
    for (size_t i = 0; i < src.size(); ++i) {
      const int64_t b = static_cast<int64_t>(i) % sb;
      const bool scale_field =
          f == KFormat::kMXFP4 ? b == 0 : (b >= d_at && b < d_at + 2) || (HasSecondScale(f) && b >= 2 && b < 4);
      if (!scale_field) src[i] = fill;
    }
    const KMatrix m = Pack(f, src, out, cols);
    for (float sign : {1.0f, -1.0f}) {
      const auto ap = Quantize(std::vector<float>(static_cast<size_t>(n * cols), sign), n, cols);
      const QActs& a = *ap;
      ASSERT_EQ(a.q[0], sign > 0 ? 127 : -127);
      std::vector<float> y_ref(n * out), y(n * out);
      ref::MatmulKInt(m, a, n, y_ref.data(), out, 0, out);
      k.matmul_k[static_cast<int>(f)](m, a, n, y.data(), out, 0, m.tiles());
      for (int64_t i = 0; i < n * out; ++i) {
        ASSERT_NEAR(y[i], y_ref[i], 2e-6 * AbsDot(m, i % out, a, i / out) + 1e-6)
            << KFormatName(f) << " fill " << int{fill} << " sign " << sign << " at " << i;
      }
    }
  }
}

// A row's outputs are bit-identical whatever the number of rows in the call (1 in decode, k + 1
// in verification, 64 in prefill): greedy speculative decoding emits exactly what plain decoding
// does only if the kernels keep this.
TEST_P(KKernelTest, RowResultDoesNotDependOnRowCount) {
  const auto [cpu, f] = GetParam();
  const KernelTable& k = GetKernels(cpu);
  const int64_t cols = 512, out = 33, n_max = 37;
  const KMatrix m = Pack(f, RandomBlocks(f, out, cols, 77), out, cols);
  const KMatrix u = Pack(f, RandomBlocks(f, out, cols, 78), out, cols);
  const auto x = RandomActs(n_max * cols, 79);
  const auto allp = Quantize(x, n_max, cols);
  const QActs& all = *allp;
  std::vector<float> y_all(n_max * out), g_all(n_max * out);
  k.matmul_k[static_cast<int>(f)](m, all, n_max, y_all.data(), out, 0, m.tiles());
  k.matmul_k_glu[static_cast<int>(f)](m, u, all, n_max, GluAct::kSilu, g_all.data(), out, 0, m.tiles());
  for (int64_t n = 1; n < n_max; ++n) {  // the first n rows alone
    const auto partp = Quantize(std::vector<float>(x.begin(), x.begin() + n * cols), n, cols);
    const QActs& part = *partp;
    std::vector<float> y(n * out), g(n * out);
    k.matmul_k[static_cast<int>(f)](m, part, n, y.data(), out, 0, m.tiles());
    k.matmul_k_glu[static_cast<int>(f)](m, u, part, n, GluAct::kSilu, g.data(), out, 0, m.tiles());
    for (int64_t i = 0; i < n * out; ++i) {
      ASSERT_EQ(y[i], y_all[i]) << KFormatName(f) << " " << n << " rows, row " << i / out << " output " << i % out;
      ASSERT_EQ(g[i], g_all[i]) << KFormatName(f) << " GLU, " << n << " rows, row " << i / out;
    }
  }
}

TEST_P(KKernelTest, FusedGluMatchesReference) {
  const auto [cpu, f] = GetParam();
  const KernelTable& k = GetKernels(cpu);
  const int64_t cols = 512;
  for (GluAct act : {GluAct::kSilu, GluAct::kGeluTanh}) {
    for (int64_t out : {7, 33}) {
      const KMatrix g = Pack(f, RandomBlocks(f, out, cols, 21 + static_cast<uint32_t>(out)), out, cols);
      const KMatrix u = Pack(f, RandomBlocks(f, out, cols, 22 + static_cast<uint32_t>(out)), out, cols);
      for (int64_t n : {1, 3, 8, 11}) {
        const auto ap = Quantize(RandomActs(n * cols, 23 + static_cast<uint32_t>(n)), n, cols);
        const QActs& a = *ap;
        std::vector<float> y_ref(n * out), y(n * out, -1.0f), yg(n * out), yu(n * out);
        ref::MatmulKIntGlu(g, u, a, n, act, y_ref.data(), out, 0, out);
        ref::MatmulKInt(g, a, n, yg.data(), out, 0, out);
        ref::MatmulKInt(u, a, n, yu.data(), out, 0, out);
        k.matmul_k_glu[static_cast<int>(f)](g, u, a, n, act, y.data(), out, 0, g.tiles());
        for (int64_t i = 0; i < n * out; ++i) {
          // The products' rounding (2e-6 of sum |w x|, as in the matmul test) propagates through
          // act(g) * u (|act'| <= 1.2); the vector tanh-GELU also rounds 1 + tanh(z) to 0 for
          // gates below about -5 (float cancellation; ref uses std::tanh): 1e-6 * |g| * |u|.
          const int64_t r = i / out, o = i % out;
          const double eg = RelTol(f) * AbsDot(g, o, a, r) + 1e-6, eu = RelTol(f) * AbsDot(u, o, a, r) + 1e-6;
          const double tol = 1e-4 * (1.0 + std::fabs(y_ref[i])) + 1.2 * eg * std::fabs(yu[i]) +
                             eu * (1.0 + std::fabs(yg[i])) + 1e-6 * (1.0 + std::fabs(yg[i])) * std::fabs(yu[i]);
          ASSERT_NEAR(y[i], y_ref[i], tol) << KFormatName(f) << " out " << out << " n " << n;
        }
      }
    }
  }
}

std::vector<KCase> AllCases() {
  std::vector<KCase> v;
  for (CpuVariant c : kAllCpuVariants) {
    if (c == CpuVariant::kAvx512Bf16) continue;  // avx512's matmul kernels (kernels_test checks the table)
    for (KFormat f : kAllKFormats) v.push_back({c, f});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllVariants, KKernelTest, ::testing::ValuesIn(AllCases()), [](const auto& info) {
  return std::string(CpuVariantName(info.param.cpu)) + "_" + KFormatName(info.param.format);
});

// MXFP4 rows whose every block has one exponent, the subnormal scales of e = 0 and 1 included
// (the kernels build 2^(e - 128) from bits with a separate case below e = 2), against the scalar
// reference with a purely relative tolerance, so the tiny rows are checked as closely as the rest.
class MXFP4KernelTest : public ::testing::TestWithParam<CpuVariant> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) GTEST_SKIP() << CpuVariantName(GetParam()) << " not supported on this CPU: skipped";
  }
};

TEST_P(MXFP4KernelTest, EveryExponentRangeMatchesReference) {
  const KFormat f = KFormat::kMXFP4;
  const KernelTable& k = GetKernels(GetParam());
  const int64_t cols = 512, out = 35, per_row = cols / 32;
  auto src = RandomBlocks(f, out, cols, 31);
  const int exps[] = {0, 1, 2, 3, 60, 127, 180};
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < per_row; ++b) src[(o * per_row + b) * 17] = static_cast<uint8_t>(exps[o % 7]);
  }
  const KMatrix m = Pack(f, src, out, cols);
  for (int64_t n : {1, 2, 5, 8, 19}) {
    const auto ap = Quantize(RandomActs(n * cols, 32 + static_cast<uint32_t>(n)), n, cols);
    std::vector<float> y_ref(n * out), y(n * out);
    ref::MatmulKInt(m, *ap, n, y_ref.data(), out, 0, out);
    k.matmul_k[static_cast<int>(f)](m, *ap, n, y.data(), out, 0, m.tiles());
    for (int64_t i = 0; i < n * out; ++i) {
      const double scale = AbsDot(m, i % out, *ap, i / out);
      ASSERT_GT(scale, 0.0);
      ASSERT_NEAR(y[i], y_ref[i], RelTol(f) * scale)
          << "n " << n << ", output " << i % out << ", e " << exps[i % out % 7];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, MXFP4KernelTest, ::testing::ValuesIn(kAllCpuVariants),
                         [](const auto& info) { return std::string(CpuVariantName(info.param)); });

}  // namespace
}  // namespace mr
