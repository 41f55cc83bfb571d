#include "app/bench_micro.h"

#include <emmintrin.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "app/bench_env.h"
#include "base/half.h"
#include "base/thread_pool.h"
#include "kernels/q8.h"
#include "kernels/weight_matrix.h"

namespace mr::app {
namespace {

// Sums 16-byte lanes with four independent accumulators (SSE2 is baseline x86-64), so the loop
// is bound by loads, not by the add chain.
uint64_t ReadSum(const uint8_t* p, int64_t n_bytes) {
  __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
  const __m128i* v = reinterpret_cast<const __m128i*>(p);
  const int64_t n = n_bytes / 64;
  for (int64_t i = 0; i < n; ++i) {
    a0 = _mm_add_epi64(a0, _mm_load_si128(v + 4 * i));
    a1 = _mm_add_epi64(a1, _mm_load_si128(v + 4 * i + 1));
    a2 = _mm_add_epi64(a2, _mm_load_si128(v + 4 * i + 2));
    a3 = _mm_add_epi64(a3, _mm_load_si128(v + 4 * i + 3));
  }
  const __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
  uint64_t out[2];
  std::memcpy(out, &s, sizeof out);
  return out[0] + out[1];
}

// Deterministic xorshift for test data (no <random> distribution differences across libcs).
struct XorShift {
  uint64_t s;
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float Uniform() { return static_cast<float>(Next() >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f; }
};

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

MemBandwidth MeasureMemBandwidth(int n_threads, int64_t buffer_bytes, int reps) {
  MemBandwidth r;
  r.n_threads = n_threads;
  r.reps = reps;
  buffer_bytes = buffer_bytes / (64 * n_threads) * (64 * n_threads);
  r.buffer_bytes = buffer_bytes;
  std::unique_ptr<uint8_t[], decltype(&std::free)> buf(
      static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(buffer_bytes))), &std::free);
  ThreadPool pool(n_threads);
  const int64_t part = buffer_bytes / n_threads;
  // Fill from the threads that will read it (first touch places pages; one NUMA node here anyway).
  pool.ParallelFor(n_threads, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t)
      std::memset(buf.get() + t * part, static_cast<int>(t + 1), static_cast<size_t>(part));
  });
  std::vector<uint64_t> sink(n_threads);
  std::vector<double> gbps, gbps_cpu, cpu_s(n_threads);
  for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n_threads, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        const double c0 = ThreadCpuSeconds();
        sink[t] += ReadSum(buf.get() + t * part, part);
        cpu_s[t] = ThreadCpuSeconds() - c0;
      }
    });
    const double s = SecondsSince(t0);
    if (rep > 0) {
      gbps.push_back(static_cast<double>(buffer_bytes) / s / 1e9);
      gbps_cpu.push_back(static_cast<double>(buffer_bytes) / *std::max_element(cpu_s.begin(), cpu_s.end()) / 1e9);
    }
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  r.gbps_median = Median(gbps);
  r.gbps_max = *std::max_element(gbps.begin(), gbps.end());
  r.gbps_cpu_median = Median(gbps_cpu);
  return r;
}

namespace {

// A random (rows, cols) matrix in format f: random quant words, small positive scales.
WeightMatrix RandomWeights(WeightFormat f, int64_t rows, int64_t cols, XorShift& rng) {
  WeightMatrix w;
  w.format = f;
  if (f == WeightFormat::kQ8G64) {
    QMatrix base;
    base.rows = rows;
    base.cols = cols;
    base.q.resize(static_cast<size_t>(rows * cols));
    base.scales.resize(static_cast<size_t>(rows * (cols / kQ8Group)));
    for (int8_t& q : base.q) q = static_cast<int8_t>(static_cast<int>(rng.Next() % 255) - 127);
    for (uint16_t& s : base.scales) s = F32ToBf16(0.001f + 0.01f * std::abs(rng.Uniform()));
    w.q8 = PackQ8(base);  // the kernels read the tile-interleaved layout
    return w;
  }
  const KFormat kf = KFormatOf(f);
  w.k = NewKMatrix(kf, rows, cols);
  if (KFormatIsFloat(kf)) {  // small finite values (random bytes would hold NaNs)
    for (size_t i = 0; i + 1 < w.k.data.size(); i += 2) {
      const float v = 0.01f * rng.Uniform();
      const uint16_t h = kf == KFormat::kF16 ? F32ToF16(v) : F32ToBf16(v);
      std::memcpy(w.k.data.data() + i, &h, 2);
    }
    return w;
  }
  for (uint8_t& b : w.k.data) b = static_cast<uint8_t>(rng.Next());
  if (kf == KFormat::kMXFP4) {  // e of the 16 rows at o: 2^(120 - 128), values up to 12 / 256
    for (int64_t i = 0; i < w.k.tiles() * w.k.supers(); ++i)
      std::memset(w.k.data.data() + i * KBlockBytes(kf), 120, kKTile);
    return w;
  }
  // Finite f16 d (and dmin / m) for the 16 rows of every block (kquant.h layouts: d at 2o, dmin or
  // m at 32 + 2o).
  const uint16_t d = F32ToF16(0.001f);
  for (int64_t t = 0; t < w.k.tiles(); ++t) {
    for (int64_t sb = 0; sb < w.k.supers(); ++sb) {
      uint8_t* blk = w.k.data.data() + (t * w.k.supers() + sb) * KBlockBytes(kf);
      for (int o = 0; o < kKTile; ++o) {
        std::memcpy(blk + 2 * o, &d, 2);
        if (kf == KFormat::kQ4K || kf == KFormat::kQ5K || kf == KFormat::kQ4_1)
          std::memcpy(blk + 32 + 2 * o, &d, 2);  // dmin / m
      }
    }
  }
  return w;
}

}  // namespace

std::vector<MatmulPoint> MeasureMatmul(const KernelTable& kernels, WeightFormat format, int64_t rows, int64_t cols,
                                       const std::vector<int>& act_rows, int n_threads, int iters,
                                       int64_t rotate_bytes) {
  XorShift rng{0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(rows * 31 + cols)};
  const WeightMatrix base = RandomWeights(format, rows, cols, rng);
  const int64_t n_copies = std::max<int64_t>(
      2, (rotate_bytes + static_cast<int64_t>(base.bytes()) - 1) / static_cast<int64_t>(base.bytes()));
  std::vector<WeightMatrix> copies(static_cast<size_t>(n_copies), base);

  const int max_rows = *std::max_element(act_rows.begin(), act_rows.end());
  std::vector<float> x(static_cast<size_t>(max_rows * cols));
  for (float& v : x) v = rng.Uniform();
  QActs xa;
  xa.Resize(max_rows, cols);
  kernels.quantize_acts(x.data(), max_rows, cols, xa.q.data(), xa.scales.data());
  xa.ComputeSums(0, max_rows);
  xa.x = x.data();
  std::vector<float> y(static_cast<size_t>(max_rows * rows));

  ThreadPool pool(n_threads);
  std::vector<MatmulPoint> out;
  for (int n : act_rows) {
    std::vector<double> ms, ms_cpu, cpu_s(static_cast<size_t>(n_threads));
    for (int it = 0; it < iters + static_cast<int>(n_copies); ++it) {  // first pass over the copies warms up
      const WeightMatrix& w = copies[static_cast<size_t>(it % n_copies)];
      const auto t0 = std::chrono::steady_clock::now();
      std::fill(cpu_s.begin(), cpu_s.end(), 0.0);
      // Split as the model splits a matmul (Model::TileChunk): chunks claimed dynamically.
      pool.ParallelForDynamic(w.tiles(), std::max<int64_t>(1, w.tiles() / (8 * n_threads)),
                              [&](int64_t b, int64_t e, int thread) {
                                const double c0 = ThreadCpuSeconds();
                                MatmulTiles(kernels, w, xa, n, y.data(), rows, b, e);
                                cpu_s[static_cast<size_t>(thread)] += ThreadCpuSeconds() - c0;
                              });
      const double s = SecondsSince(t0);
      if (it >= n_copies) {
        ms.push_back(s * 1e3);
        ms_cpu.push_back(*std::max_element(cpu_s.begin(), cpu_s.end()) * 1e3);
      }
    }
    MatmulPoint p;
    p.format = WeightFormatName(format);
    p.rows = rows;
    p.cols = cols;
    p.n_act_rows = n;
    p.n_threads = n_threads;
    p.iters = iters;
    p.ms_median = Median(ms);
    p.gbps_median = static_cast<double>(base.bytes()) / (p.ms_median * 1e-3) / 1e9;
    p.gbps_cpu_median = static_cast<double>(base.bytes()) / (Median(ms_cpu) * 1e-3) / 1e9;
    p.gops_median = 2.0 * static_cast<double>(rows * cols * n) / (p.ms_median * 1e-3) / 1e9;
    out.push_back(p);
  }
  return out;
}

}  // namespace mr::app
