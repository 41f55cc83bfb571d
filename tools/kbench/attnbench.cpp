// Timing of the attention kernels alone (not a test, asserts nothing): one KV head's cache of
// `ctx` positions (BF16, random), `rows` query rows of `heads` query heads each (a causal chunk
// ending at the last position, as prefill makes them), every CPU variant this machine runs.
// Reports each variant's median time of `reps` calls and its multiply-add rate (two per
// position, head and dimension: scores and values).
// Usage: mererun_attnbench [hd=128] [heads=6] [rows=16] [ctx=4096] [reps=20]
// Prints a table to stderr and one JSON object to stdout. One thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "kernels/ops.h"

int main(int argc, char** argv) {
  const int64_t hd = argc > 1 ? std::atoll(argv[1]) : 128, n_q = argc > 2 ? std::atoll(argv[2]) : 6;
  const int64_t rows = argc > 3 ? std::atoll(argv[3]) : 16, ctx = argc > 4 ? std::atoll(argv[4]) : 4096;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 20;
  if (hd <= 0 || n_q <= 0 || rows <= 0 || ctx < rows || reps <= 0) {
    std::fprintf(stderr, "usage: %s [hd=128] [heads=6] [rows=16] [ctx=4096] [reps=20] (ctx >= rows)\n", argv[0]);
    return 2;
  }
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> k(static_cast<size_t>(ctx * hd)), v(k.size());
  for (auto& x : k) x = mr::F32ToBf16(2.0f * u(gen));
  for (auto& x : v) x = mr::F32ToBf16(u(gen));
  std::vector<float> q(static_cast<size_t>(rows * n_q * hd)), out(q.size());
  for (auto& x : q) x = u(gen);
  std::vector<int64_t> lo(static_cast<size_t>(rows), 0), hi(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) hi[static_cast<size_t>(r)] = ctx - rows + r + 1;
  double mads = 0;
  for (int64_t r = 0; r < rows; ++r) mads += 2.0 * static_cast<double>(hi[static_cast<size_t>(r)]) * n_q * hd;
  std::vector<float> scratch(static_cast<size_t>(mr::AttentionScratchFloats(rows, n_q, hd)));
  const mr::AttnChunk a{q.data(),  n_q * hd,  rows,          n_q,  hd, k.data(), v.data(), hd, lo.data(), hi.data(),
                        1.0f / std::sqrt(static_cast<float>(hd)), out.data(), n_q * hd};
  std::fprintf(stderr, "attention: hd %lld, %lld query heads, %lld rows, %lld positions, 1 thread\n",
               static_cast<long long>(hd), static_cast<long long>(n_q), static_cast<long long>(rows),
               static_cast<long long>(ctx));
  std::string json = "{\"hd\":" + std::to_string(hd) + ",\"heads\":" + std::to_string(n_q) +
                     ",\"rows\":" + std::to_string(rows) + ",\"ctx\":" + std::to_string(ctx) + ",\"variants\":[";
  bool first = true;
  for (mr::CpuVariant c : mr::kAllCpuVariants) {
    if (!mr::CpuSupports(c)) continue;
    const mr::KernelTable& kt = mr::GetKernels(c);
    std::vector<double> t;
    for (int i = 0; i < reps + 1; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      kt.attention(a, scratch.data());
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    t.erase(t.begin());  // the first call warms the caches
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    std::fprintf(stderr, "  %-10s %9.3f ms  %7.1f G multiply-adds/s\n", mr::CpuVariantName(c), med * 1e3,
                 mads / med / 1e9);
    json += std::string(first ? "" : ",") + "{\"variant\":\"" + mr::CpuVariantName(c) +
            "\",\"ms\":" + std::to_string(med * 1e3) + ",\"gmads\":" + std::to_string(mads / med / 1e9) + "}";
    first = false;
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
