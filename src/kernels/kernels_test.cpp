// Every kernel variant against the scalar reference, on odd and edge sizes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <utility>

#include "base/half.h"
#include "kernels/ops.h"
#include "kernels/q8.h"
#include "kernels/ref/ops_ref.h"

namespace mr {
namespace {

std::vector<float> RandomVec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(Q8, QuantizeIsSymmetricPerGroupWithBf16Scales) {
  // One row, two groups with known maxima: scale = bf16(amax / 127), q = round(w / scale).
  std::vector<float> w(128, 0.0f);
  w[0] = 1.27f;
  w[1] = -0.635f;
  w[64] = -2.54f;
  w[65] = 0.01f;
  QuantError err;
  QMatrix m = QuantizeQ8(w.data(), 1, 128, &err);
  ASSERT_EQ(m.scales.size(), 2u);
  EXPECT_EQ(m.scales[0], F32ToBf16(1.27f / 127.0f));
  EXPECT_EQ(m.scales[1], F32ToBf16(2.54f / 127.0f));
  const float s0 = Bf16ToF32(m.scales[0]), s1 = Bf16ToF32(m.scales[1]);
  EXPECT_EQ(m.q[0], static_cast<int8_t>(std::lround(std::min(127.0f, 1.27f / s0))));
  EXPECT_EQ(m.q[1], static_cast<int8_t>(std::lround(-0.635f / s0)));
  EXPECT_EQ(m.q[64], static_cast<int8_t>(std::lround(std::max(-127.0f, -2.54f / s1))));
  EXPECT_EQ(m.q[65], static_cast<int8_t>(std::lround(0.01f / s1)));
  EXPECT_EQ(m.q[2], 0);
  // Error bounded by half a step of the bf16-rounded scale (plus clamping at 127).
  EXPECT_LE(err.max_abs, 0.5 * s1 + 0.01 * 2.54);
}

TEST(Q8, ZeroGroupHasZeroScale) {
  std::vector<float> w(64, 0.0f);
  QMatrix m = QuantizeQ8(w.data(), 1, 64, nullptr);
  EXPECT_EQ(Bf16ToF32(m.scales[0]), 0.0f);
  std::vector<float> back(64, 1.0f);
  DequantizeQ8Row(m, 0, back.data());
  for (float x : back) EXPECT_EQ(x, 0.0f);
}

TEST(Q8, RelativeErrorIsSmallOnGaussianWeights) {
  auto w = RandomVec(64 * 7 * 3, 1);
  QuantError err;
  QuantizeQ8(w.data(), 3, 64 * 7, &err);
  EXPECT_LT(err.rms / err.rms_w, 0.01);  // int8 with per-64 scales: ~0.3% typical
}

TEST(Q8, PackingIsAPermutationThatUnpackRestores) {
  for (int64_t rows : {1, 8, 13, 64}) {
    for (int64_t cols : {64, 320}) {
      auto w = RandomVec(rows * cols, static_cast<uint32_t>(rows + cols));
      QMatrix m = QuantizeQ8(w.data(), rows, cols, nullptr);
      QMatrix p = PackQ8(m);
      ASSERT_TRUE(p.packed);
      ASSERT_EQ(p.tiles(), (rows + 7) / 8);
      // Every word lands where q_index says, padding rows are zero, and unpacking is exact.
      for (int64_t o = 0; o < rows; ++o) {
        for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(p.q[p.q_index(o, i)], m.q[o * cols + i]);
        for (int64_t g = 0; g < m.groups(); ++g) ASSERT_EQ(p.scales[p.scale_index(o, g)], m.scales[o * m.groups() + g]);
      }
      int64_t nonzero_pad = 0;
      for (int64_t o = rows; o < p.tiles() * 8; ++o) {
        for (int64_t i = 0; i < cols; ++i) nonzero_pad += p.q[p.q_index(o, i)] != 0;
      }
      EXPECT_EQ(nonzero_pad, 0);
      QMatrix u = UnpackQ8(p);
      EXPECT_EQ(u.q, m.q);
      EXPECT_EQ(u.scales, m.scales);
      std::vector<float> a(cols), b(cols);
      DequantizeQ8Row(m, rows - 1, a.data());
      DequantizeQ8Row(p, rows - 1, b.data());
      EXPECT_EQ(a, b);
    }
  }
}

// The reference path's matmul computes four outputs per Dot8x4 call: each must be Dot8's result
// bit for bit (same products, same partial sums, same order), at every length, tails included.
TEST(Ref, Dot8x4IsFourDot8sBitForBit) {
  for (int64_t n : {1, 7, 8, 9, 31, 64, 895, 2053}) {
    const auto b = RandomVec(static_cast<size_t>(n), 7, 3.0f);
    std::vector<std::vector<float>> a;
    for (uint32_t k = 0; k < 4; ++k) a.push_back(RandomVec(static_cast<size_t>(n), 11 + k, 0.5f + k));
    const float* const rows[4] = {a[0].data(), a[1].data(), a[2].data(), a[3].data()};
    float out[4];
    ref::Dot8x4(rows, b.data(), n, out);
    for (int k = 0; k < 4; ++k) {
      const float want = ref::Dot8(rows[k], b.data(), n);
      EXPECT_EQ(std::bit_cast<uint32_t>(out[k]), std::bit_cast<uint32_t>(want)) << "n " << n << " row " << k;
    }
  }
}

TEST(Ref, MatmulQ8MatchesDequantizedDoubleDot) {
  const int64_t rows = 5, cols = 192, n = 3;
  auto w = RandomVec(rows * cols, 2);
  auto x = RandomVec(n * cols, 3);
  QMatrix m = QuantizeQ8(w.data(), rows, cols, nullptr);
  std::vector<float> y(n * rows);
  ref::MatmulQ8(m, x.data(), n, y.data(), rows, 0, rows);
  std::vector<float> wr(cols);
  for (int64_t o = 0; o < rows; ++o) {
    DequantizeQ8Row(m, o, wr.data());
    for (int64_t r = 0; r < n; ++r) {
      double acc = 0;
      for (int64_t i = 0; i < cols; ++i) acc += static_cast<double>(wr[i]) * x[r * cols + i];
      EXPECT_NEAR(y[r * rows + o], acc, 1e-4 * (1 + std::fabs(acc)));
    }
  }
}

class VariantTest : public ::testing::TestWithParam<CpuVariant> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) GTEST_SKIP() << CpuVariantName(GetParam()) << " not supported on this CPU";
  }
};

TEST_P(VariantTest, QuantizeActsMatchesReference) {
  const KernelTable& k = GetKernels(GetParam());
  for (int64_t cols : {64, 128, 576, 896}) {
    for (int64_t rows : {1, 3}) {
      auto x = RandomVec(rows * cols, static_cast<uint32_t>(cols + rows), 3.0f);
      x[5] = 0.0f;
      std::vector<int8_t> q1(rows * cols), q2(rows * cols);
      std::vector<float> s1(rows * cols / kActGroup), s2(rows * cols / kActGroup);
      ref::QuantizeActs(x.data(), rows, cols, q1.data(), s1.data());
      k.quantize_acts(x.data(), rows, cols, q2.data(), s2.data());
      for (size_t i = 0; i < s1.size(); ++i) EXPECT_FLOAT_EQ(s1[i], s2[i]);
      int diffs = 0;
      for (size_t i = 0; i < q1.size(); ++i) {
        EXPECT_LE(std::abs(q1[i] - q2[i]), 1) << i;  // x*inv may round differently at exact .5 only
        diffs += q1[i] != q2[i];
      }
      EXPECT_LE(diffs, 2);
    }
  }
}

TEST_P(VariantTest, MatmulMatchesIntegerReferenceOnOddSizes) {
  const KernelTable& k = GetParam() == CpuVariant::kScalar ? GetKernels(CpuVariant::kScalar) : GetKernels(GetParam());
  // Output sizes not multiples of the 8-row tile, inputs not multiples of 256, row counts
  // 1..8 and beyond (passes of 4 rows, L2 chunks of tiles), a sub-range of tiles as a thread
  // would get.
  for (int64_t cols : {64, 192, 640}) {
    for (int64_t out : {1, 7, 33, 100}) {
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13}) {
        auto w = RandomVec(out * cols, static_cast<uint32_t>(out * 31 + cols));
        auto x = RandomVec(n * cols, static_cast<uint32_t>(n * 17 + cols), 2.0f);
        QMatrix m = QuantizeQ8(w.data(), out, cols, nullptr);
        QMatrix p = PackQ8(m);
        std::vector<int8_t> xq(n * cols);
        std::vector<float> xs(n * cols / kActGroup);
        ref::QuantizeActs(x.data(), n, cols, xq.data(), xs.data());
        std::vector<float> y_ref(n * out, -1.0f), y(n * out, -1.0f);
        const int64_t t0 = p.tiles() > 2 ? 1 : 0, t1 = p.tiles();
        const int64_t o0 = t0 * kQ8Tile;
        ref::MatmulQ8Int(m, xq.data(), xs.data(), n, y_ref.data(), out, o0, out);
        k.matmul_q8(p, xq.data(), xs.data(), n, y.data(), out, t0, t1);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t o = 0; o < out; ++o) {
            const float a = y_ref[r * out + o], b = y[r * out + o];
            if (o < o0) {
              EXPECT_EQ(b, -1.0f) << "wrote outside its output range";
            } else {
              EXPECT_NEAR(a, b, 1e-4f * (1.0f + std::fabs(a))) << "cols " << cols << " out " << out << " n " << n;
            }
          }
        }
      }
    }
  }
}

TEST_P(VariantTest, FusedGluMatchesReference) {
  const KernelTable& k = GetKernels(GetParam());
  for (GluAct act : {GluAct::kSilu, GluAct::kGeluTanh}) {
    for (int64_t out : {5, 24, 41}) {
      for (int64_t n : {1, 3, 8, 11}) {
        const int64_t cols = 320;
        auto wg = RandomVec(out * cols, 5 + out), wu = RandomVec(out * cols, 6 + out);
        auto x = RandomVec(n * cols, 7 + n, 1.5f);
        QMatrix g = QuantizeQ8(wg.data(), out, cols, nullptr), u = QuantizeQ8(wu.data(), out, cols, nullptr);
        QMatrix gp = PackQ8(g), up = PackQ8(u);
        std::vector<int8_t> xq(n * cols);
        std::vector<float> xs(n * cols / kActGroup);
        ref::QuantizeActs(x.data(), n, cols, xq.data(), xs.data());
        std::vector<float> y_ref(n * out), y(n * out, -1.0f);
        ref::MatmulQ8IntGlu(g, u, xq.data(), xs.data(), n, act, y_ref.data(), out, 0, out);
        k.matmul_q8_glu(gp, up, xq.data(), xs.data(), n, act, y.data(), out, 0, gp.tiles());
        for (int64_t i = 0; i < n * out; ++i) {
          EXPECT_NEAR(y_ref[i], y[i], 2e-4f * (1.0f + std::fabs(y_ref[i])))
              << "out " << out << " n " << n << " i " << i;
        }
      }
    }
  }
}

// The GLU of outputs computed apart (KernelTable::glu, the fine-activation path): act(g) * u against
// the scalar functions, on lengths with and without a vector tail, large |g| included (Exp8's clamp);
// out may alias g.
TEST_P(VariantTest, GluMatchesScalarActivations) {
  const KernelTable& k = GetKernels(GetParam());
  for (GluAct act : {GluAct::kSilu, GluAct::kGeluTanh}) {
    for (int64_t n : {1, 7, 8, 13, 64, 101}) {
      auto g = RandomVec(n, 11 + n, 6.0f), u = RandomVec(n, 12 + n);
      g[0] = 95.0f;
      if (n > 1) g[n - 1] = -95.0f;
      std::vector<float> y(n, -1.0f);
      k.glu(g.data(), u.data(), n, act, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const float want = (act == GluAct::kSilu ? ref::Silu(g[i]) : ref::GeluTanh(g[i])) * u[i];
        EXPECT_NEAR(y[i], want, 2e-6f * (1.0f + std::fabs(want))) << "n " << n << " i " << i << " g " << g[i];
      }
      k.glu(g.data(), u.data(), n, act, g.data());  // in place
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(g[i], y[i]) << "in place, n " << n << " i " << i;
    }
  }
}

// A KV head's cache of n_pos positions (K and V of two heads, the second one used) and query rows.
struct AttnCase {
  int64_t hd, n_q, n_rows, n_pos;
  std::vector<uint16_t> K, V;
  std::vector<float> q;
  float softcap = 0.0f;      // gemma2's attention logit soft-capping (0: none)
  std::vector<float> sinks;  // gpt-oss's attention sinks, one logit per query head (empty: none)
  static constexpr int64_t kKvHeads = 2, kHead = 1;
  AttnCase(int64_t hd_, int64_t n_q_, int64_t n_rows_, int64_t n_pos_, uint32_t seed)
      : hd(hd_), n_q(n_q_), n_rows(n_rows_), n_pos(n_pos_) {
    auto kf = RandomVec(n_pos * stride(), seed, 2.0f), vf = RandomVec(n_pos * stride(), seed + 1);
    K.resize(kf.size());
    V.resize(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      K[i] = F32ToBf16(kf[i]);
      V[i] = F32ToBf16(vf[i]);
    }
    q = RandomVec(n_rows * q_stride(), seed + 2);
  }
  int64_t stride() const { return kKvHeads * hd; }
  int64_t q_stride() const { return n_q * hd + 5; }  // rows padded: strides are honoured
  // Runs rows [r0, r0 + n) of the case through the kernel into out (row stride q_stride()).
  // kp, vp, pair_blocks: AttnChunk's pair-word copies of the head's first blocks (none by default).
  void Run(const KernelTable& k, int64_t r0, int64_t n, const int64_t* lo, const int64_t* hi, float* out,
           const uint32_t* kp = nullptr, const uint32_t* vp = nullptr, int64_t pair_blocks = 0) const {
    std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(n, n_q, hd)));
    AttnChunk a{q.data() + r0 * q_stride(),
                q_stride(),
                n,
                n_q,
                hd,
                K.data() + kHead * hd,
                V.data() + kHead * hd,
                stride(),
                lo + r0,
                hi + r0,
                1.0f / std::sqrt(static_cast<float>(hd)),
                out + r0 * q_stride(),
                q_stride(),
                softcap};
    a.sinks = sinks.empty() ? nullptr : sinks.data();
    a.kpairs = kp;
    a.vpairs = vp;
    a.pair_blocks = pair_blocks;
    k.attention(a, scratch.data());
  }
  // The head's full blocks of kAttnPairBlock positions in k.kv_block_pairs' words, block b at
  // b * 16 * hd (KvCache::kp's layout), from K and V, or from K and V of `other` when given.
  struct Pairs {
    std::vector<uint32_t> kbuf, vbuf;
    const uint32_t* k = nullptr;  // 64-byte aligned, inside kbuf / vbuf
    const uint32_t* v = nullptr;
    int64_t blocks = 0;
  };
  Pairs PairCopies(const KernelTable& k, const AttnCase* other = nullptr) const {
    const AttnCase& src = other ? *other : *this;
    Pairs p;
    p.blocks = n_pos / kAttnPairBlock;
    const int64_t words = 16 * hd;
    p.kbuf.resize(static_cast<size_t>(p.blocks * words + 16));
    p.vbuf.resize(p.kbuf.size());
    uint32_t* kb = p.kbuf.data() + (-reinterpret_cast<uintptr_t>(p.kbuf.data()) / 4 & 15);
    uint32_t* vb = p.vbuf.data() + (-reinterpret_cast<uintptr_t>(p.vbuf.data()) / 4 & 15);
    for (int64_t b = 0; b < p.blocks; ++b) {
      const int64_t row = b * kAttnPairBlock * stride() + kHead * hd;
      k.kv_block_pairs(src.K.data() + row, src.V.data() + row, stride(), hd, kb + b * words, vb + b * words);
    }
    p.k = kb;
    p.v = vb;
    return p;
  }
  // Whether kernel table k runs this head size on BF16 products (ops.h attention_bf16).
  bool Bf16(const KernelTable& k) const { return k.attention_bf16 && hd % 32 == 0 && hd <= 256; }
  struct Expected {
    double value;  // the result in double
    double tol;    // how far the kernel's FP32 arithmetic may be from it
  };
  // What kernel table k should compute for row r, head h, output element i. FP32 kernels: exact
  // softmax attention. BF16 kernels: the same arithmetic on the query rounded to BF16 and on each
  // probability rounded to BF16 where the kernel rounds it (exp(s - m) against the running max m
  // after its block of kBf16Block positions aligned to multiples of it), the softmax divided by
  // the sum of the rounded probabilities; a probability within 1e-5 (relative) of a rounding
  // midpoint may round the other way in FP32, so a one-ulp change of it is allowed for.
  Expected Expect(const KernelTable& k, int64_t r, int64_t h, int64_t i, int64_t lo, int64_t hi) const {
    const bool bf16 = Bf16(k);
    constexpr int64_t kBf16Block = 32;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    std::vector<double> s(hi - lo), w(hi - lo);
    // A sink is a position of value zero that every row sees, ahead of the others: kernels start
    // their running max at it.
    const double sink = sinks.empty() ? -1e30 : sinks[static_cast<size_t>(h)];
    double mx = sink;
    for (int64_t j = lo; j < hi; ++j) {
      double dot = 0;
      for (int64_t x = 0; x < hd; ++x) {
        float qx = q[r * q_stride() + h * hd + x];
        if (bf16) qx = Bf16ToF32(F32ToBf16(qx));
        dot += qx * Bf16ToF32(K[j * stride() + kHead * hd + x]);
      }
      s[j - lo] = softcap > 0 ? softcap * std::tanh(dot * scale / softcap) : dot * scale;
      mx = std::max(mx, s[j - lo]);
    }
    std::vector<bool> near(hi - lo, false);
    double run = sink, sum = sinks.empty() ? 0 : std::exp(sink - mx);
    for (int64_t j = lo; j < hi; ++j) {
      if (!bf16) {
        w[j - lo] = std::exp(s[j - lo] - mx);
      } else {
        if (j == lo || j % kBf16Block == 0) {  // a new block: the running max after it
          for (int64_t jj = j; jj < hi && (jj == j || jj % kBf16Block != 0); ++jj) run = std::max(run, s[jj - lo]);
        }
        const float p = static_cast<float>(std::exp(s[j - lo] - run));
        uint32_t bits;
        std::memcpy(&bits, &p, 4);
        const uint32_t mid_bits = (bits & 0xFFFF0000u) | 0x8000u;
        float mid;
        std::memcpy(&mid, &mid_bits, 4);
        near[j - lo] = std::fabs(p - mid) <= 1e-5 * p;
        w[j - lo] = Bf16ToF32(F32ToBf16(p)) * std::exp(run - mx);
      }
      sum += w[j - lo];
    }
    double acc = 0;
    for (int64_t j = lo; j < hi; ++j) acc += w[j - lo] / sum * Bf16ToF32(V[j * stride() + kHead * hd + i]);
    double tol = 1e-5 + 1e-4 * std::fabs(acc);
    for (int64_t j = lo; j < hi; ++j) {
      if (near[j - lo])
        tol += std::ldexp(w[j - lo] / sum, -6) * std::fabs(Bf16ToF32(V[j * stride() + kHead * hd + i]) - acc);
    }
    return {acc, tol};
  }
};

TEST_P(VariantTest, AttentionMatchesExactSoftmax) {
  const KernelTable& k = GetKernels(GetParam());
  // Head sizes 64, 96, 128 and 256 (vector paths), 40 (AVX2 only) and 12 (scalar fallback); one
  // row over spans shorter than, equal to and longer than a block, windows that do not start at 0.
  for (int64_t hd : {12, 40, 64, 96, 128, 256}) {
    for (int64_t n_q : {1, 3, 7}) {
      for (auto [j0, j1] : {std::pair<int64_t, int64_t>{0, 1}, {0, 16}, {0, 64}, {5, 150}, {3, 20}, {0, 200}}) {
        const AttnCase c(hd, n_q, 1, j1, 11);
        std::vector<float> out(static_cast<size_t>(c.q_stride()), -7.0f);
        c.Run(k, 0, 1, &j0, &j1, out.data());
        for (int64_t h = 0; h < n_q; ++h) {
          for (int64_t i = 0; i < hd; ++i) {
            const auto e = c.Expect(k, 0, h, i, j0, j1);
            ASSERT_NEAR(out[h * hd + i], e.value, e.tol) << "hd " << hd << " j " << j0 << ".." << j1;
          }
        }
        for (int64_t i = n_q * hd; i < c.q_stride(); ++i) ASSERT_EQ(out[i], -7.0f) << "padding written";
      }
    }
  }
}

// Soft-capped scores (gemma2): cap * tanh(s / cap) before the softmax, on every path and head
// size, rows alone and in a chunk; a cap of 0.5 changes every output, so ignoring it fails.
TEST_P(VariantTest, AttentionSoftcapMatchesExact) {
  const KernelTable& k = GetKernels(GetParam());
  for (int64_t hd : {12, 40, 64, 256}) {
    const int64_t n_rows = 6, p0 = 30, n_q = 2;
    AttnCase c(hd, n_q, n_rows, p0 + n_rows, 31);
    std::vector<int64_t> lo(n_rows, 0), hi(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) hi[r] = p0 + r + 1;
    std::vector<float> plain(static_cast<size_t>(n_rows * c.q_stride()));
    c.Run(k, 0, n_rows, lo.data(), hi.data(), plain.data());
    c.softcap = 0.5f;
    std::vector<float> capped(plain.size()), alone(plain.size());
    c.Run(k, 0, n_rows, lo.data(), hi.data(), capped.data());
    for (int64_t r = 0; r < n_rows; ++r) c.Run(k, r, 1, lo.data(), hi.data(), alone.data());
    double moved = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t h = 0; h < n_q; ++h) {
        for (int64_t i = 0; i < hd; ++i) {
          const size_t at = static_cast<size_t>(r * c.q_stride() + h * hd + i);
          const auto e = c.Expect(k, r, h, i, lo[r], hi[r]);
          ASSERT_NEAR(capped[at], e.value, e.tol) << "hd " << hd << " row " << r;
          ASSERT_EQ(capped[at], alone[at]) << "hd " << hd << " row " << r;
          moved = std::max(moved, static_cast<double>(std::fabs(capped[at] - plain[at])));
        }
      }
    }
    EXPECT_GT(moved, 1e-2) << "hd " << hd << ": the cap must change the result";
  }
}

// Attention sinks (gpt-oss): a logit per query head in every softmax's denominator, on every path
// and head size, rows alone and in a chunk; sinks near the scores' scale change every output, so
// ignoring them fails, and a sink far above the scores leaves almost nothing of the values.
TEST_P(VariantTest, AttentionSinksMatchExact) {
  const KernelTable& k = GetKernels(GetParam());
  for (int64_t hd : {12, 40, 64, 128}) {
    const int64_t n_rows = 5, p0 = 40, n_q = 3;
    AttnCase c(hd, n_q, n_rows, p0 + n_rows, 37);
    std::vector<int64_t> lo(n_rows, 3), hi(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) hi[r] = p0 + r + 1;
    std::vector<float> plain(static_cast<size_t>(n_rows * c.q_stride()));
    c.Run(k, 0, n_rows, lo.data(), hi.data(), plain.data());
    c.sinks = {2.5f, -1.0f, 40.0f};
    std::vector<float> sunk(plain.size()), alone(plain.size());
    c.Run(k, 0, n_rows, lo.data(), hi.data(), sunk.data());
    for (int64_t r = 0; r < n_rows; ++r) c.Run(k, r, 1, lo.data(), hi.data(), alone.data());
    double moved = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t h = 0; h < n_q; ++h) {
        for (int64_t i = 0; i < hd; ++i) {
          const size_t at = static_cast<size_t>(r * c.q_stride() + h * hd + i);
          const auto e = c.Expect(k, r, h, i, lo[r], hi[r]);
          ASSERT_NEAR(sunk[at], e.value, e.tol) << "hd " << hd << " row " << r << " head " << h;
          ASSERT_EQ(sunk[at], alone[at]) << "hd " << hd << " row " << r;
          if (h < 2) moved = std::max(moved, static_cast<double>(std::fabs(sunk[at] - plain[at])));
          if (h == 2) {
            ASSERT_LT(std::fabs(sunk[at]), 1e-6) << "hd " << hd << ": a sink of 40 takes all the weight";
          }
        }
      }
    }
    EXPECT_GT(moved, 1e-2) << "hd " << hd << ": the sinks must change the result";
  }
}

// A chunk of rows as prefill and verification make them (causal: row r attends up to its own
// position) and as a sliding window makes them (each row's own start), on spans that begin and
// end inside blocks: every row matches exact softmax, and is bit-identical to the same row run
// alone, so a row's result does not depend on the chunk it is in.
TEST_P(VariantTest, AttentionChunkRowsMatchAloneAndExact) {
  const KernelTable& k = GetKernels(GetParam());
  for (int64_t hd : {12, 40, 64, 128}) {
    for (auto [n_rows, p0, n_q] : {std::tuple<int64_t, int64_t, int64_t>{2, 37, 3},
                                   {5, 37, 3},
                                   {16, 37, 3},
                                   {23, 37, 3},
                                   {8, 7, 2},
                                   {7, 0, 2},
                                   {16, 0, 1},
                                   {9, 100, 5}}) {
      for (bool window : {false, true}) {
        const int64_t n_pos = p0 + n_rows;
        const AttnCase c(hd, n_q, n_rows, n_pos, 21);
        std::vector<int64_t> lo(n_rows), hi(n_rows);
        for (int64_t r = 0; r < n_rows; ++r) {
          hi[r] = p0 + r + 1;
          lo[r] = window ? std::max<int64_t>(0, hi[r] - 19) : 0;
        }
        std::vector<float> together(static_cast<size_t>(n_rows * c.q_stride())), alone(together.size());
        c.Run(k, 0, n_rows, lo.data(), hi.data(), together.data());
        for (int64_t r = 0; r < n_rows; ++r) c.Run(k, r, 1, lo.data(), hi.data(), alone.data());
        for (int64_t r = 0; r < n_rows; ++r) {
          for (int64_t h = 0; h < n_q; ++h) {
            for (int64_t i = 0; i < hd; ++i) {
              const size_t at = static_cast<size_t>(r * c.q_stride() + h * hd + i);
              ASSERT_EQ(together[at], alone[at]) << "hd " << hd << " rows " << n_rows << " row " << r;
              const auto e = c.Expect(k, r, h, i, lo[r], hi[r]);
              ASSERT_NEAR(together[at], e.value, e.tol) << "hd " << hd << " row " << r;
            }
          }
        }
      }
    }
  }
}

// The variants that keep pair-word copies of full cache blocks (KernelTable::kv_block_pairs):
// rows read through the copies are bit-identical to rows that convert the blocks themselves, for
// decode rows, chunks and windows that start and end inside blocks; copies of other K and V change
// the result, so the kernel does read them.
TEST_P(VariantTest, AttentionPairCopiesMatchConversion) {
  const KernelTable& k = GetKernels(GetParam());
  if (k.kv_block_pairs == nullptr) GTEST_SKIP() << CpuVariantName(GetParam()) << " keeps no pair copies";
  for (int64_t hd : {32, 64, 128, 256}) {
    for (auto [n_rows, p0, n_q, window] : {std::tuple<int64_t, int64_t, int64_t, bool>{1, 200, 7, false},
                                           {1, 95, 6, false},
                                           {8, 120, 3, false},
                                           {33, 40, 2, false},
                                           {5, 150, 3, true}}) {
      const int64_t n_pos = p0 + n_rows;
      const AttnCase c(hd, n_q, n_rows, n_pos, 41), other(hd, n_q, n_rows, n_pos, 43);
      std::vector<int64_t> lo(n_rows), hi(n_rows);
      for (int64_t r = 0; r < n_rows; ++r) {
        hi[r] = p0 + r + 1;
        lo[r] = window ? hi[r] - 70 : 0;
      }
      const auto own = c.PairCopies(k), wrong = c.PairCopies(k, &other);
      ASSERT_GE(own.blocks, 1);
      std::vector<float> plain(static_cast<size_t>(n_rows * c.q_stride())), copies(plain.size()), bad(plain.size());
      c.Run(k, 0, n_rows, lo.data(), hi.data(), plain.data());
      c.Run(k, 0, n_rows, lo.data(), hi.data(), copies.data(), own.k, own.v, own.blocks);
      c.Run(k, 0, n_rows, lo.data(), hi.data(), bad.data(), wrong.k, wrong.v, wrong.blocks);
      ASSERT_EQ(plain, copies) << "hd " << hd << " rows " << n_rows << " at " << p0;
      ASSERT_NE(plain, bad) << "hd " << hd << " rows " << n_rows << " at " << p0 << ": the copies are not read";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, VariantTest, ::testing::ValuesIn(kAllCpuVariants),
                         [](const auto& info) { return std::string(CpuVariantName(info.param)); });

TEST(Ref, RopeRotatesPairsAndKeepsNorm) {
  std::vector<float> v = {1, 0, 0, 1, 1, 0, 0, 1};
  std::vector<float> neox = v, norm = v;
  ref::Rope(neox.data(), 8, 3, 10000.0f, true);
  ref::Rope(norm.data(), 8, 3, 10000.0f, false);
  // Pair 0 has theta = pos: adjacent layout rotates (v0, v1) = (1, 0) by 3 rad.
  EXPECT_NEAR(norm[0], std::cos(3.0f), 1e-6);
  EXPECT_NEAR(norm[1], std::sin(3.0f), 1e-6);
  // NeoX layout rotates (v0, v4) = (1, 1) by 3 rad.
  EXPECT_NEAR(neox[0], std::cos(3.0f) - std::sin(3.0f), 1e-6);
  EXPECT_NEAR(neox[4], std::sin(3.0f) + std::cos(3.0f), 1e-6);
  double n0 = 0, n1 = 0, n2 = 0;
  for (int i = 0; i < 8; ++i) {
    n0 += v[i] * v[i];
    n1 += neox[i] * neox[i];
    n2 += norm[i] * norm[i];
  }
  EXPECT_NEAR(n0, n1, 1e-5);
  EXPECT_NEAR(n0, n2, 1e-5);
}

// Llama 3.x frequency factors divide each pair's angle: pair i of a head of 8 at position 5 with
// base 100 turns by 5 * 100^(-2i/8) / f_i.
TEST(Ref, RopeFrequencyFactorsDivideTheAngle) {
  const float f[4] = {1.0f, 2.0f, 4.0f, 8.0f};
  std::vector<float> v = {1, 0, 1, 0, 1, 0, 1, 0};
  ref::Rope(v.data(), 8, 5, 100.0f, false, f);
  for (int i = 0; i < 4; ++i) {
    const double theta = 5.0 * std::pow(100.0, -2.0 * i / 8.0) / f[i];
    EXPECT_NEAR(v[2 * i], std::cos(theta), 1e-5) << i;
    EXPECT_NEAR(v[2 * i + 1], std::sin(theta), 1e-5) << i;
  }
}

TEST(Ref, RmsNormAndActivations) {
  std::vector<float> x = {3, 4}, w = {1, 2}, out(2);
  ref::RmsNorm(x.data(), w.data(), 2, 0.0f, out.data());
  const float rms = std::sqrt(12.5f);
  EXPECT_NEAR(out[0], 3 / rms, 1e-6);
  EXPECT_NEAR(out[1], 8 / rms, 1e-6);
  EXPECT_NEAR(ref::Silu(1.0f), 1.0f / (1.0f + std::exp(-1.0f)), 1e-7);
  EXPECT_NEAR(ref::GeluTanh(1.0f), 0.841192f, 1e-5);  // tanh-approximated GELU(1)
  std::vector<float> s = {1, 2, 3};
  ref::Softmax(s.data(), 3);
  EXPECT_NEAR(s[0] + s[1] + s[2], 1.0f, 1e-6);
  EXPECT_NEAR(s[2] / s[1], std::exp(1.0f), 1e-5);
}

}  // namespace
}  // namespace mr
