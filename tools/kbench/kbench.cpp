// Kernel-level timing of the forward pass, for before/after comparisons (not a test, asserts
// nothing): loads a GGUF once, then times
//   decode : 1-row Forward steps after a prompt (tok/s),
//   verify : n-row Forward steps (n = 1, 2, 4, 8) with all_logits, rolled back after each so
//            every step runs at the same position; reported as cost relative to n = 1,
//   batch  : ForwardBatch of b single-row sequences (b = 1, 2, 4, 8), each with its own cache
//            (contexts of 64..92 tokens), rolled back after each step; reported as ms and as
//            cost relative to b = 1 (batched decode: weights streamed once for all b),
//   prefill: one Forward over `prefill` tokens (tok/s).
// Each measurement is the median of `reps` repetitions, interleaved across kinds.
// Usage: mererun_kbench MODEL.gguf [threads=2] [reps=5] [prefill=512] [weights=native|q8g64]
// MERERUN_CPU=scalar|avx2|avx512|avx512bf16|amx picks the kernel variant (default: the best the CPU has).
// Prints a table to stderr and one JSON object to stdout.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/model.h"

using Clock = std::chrono::steady_clock;

// CPU seconds used by this process (all threads): on a shared machine this tracks the work
// done, where wall time also counts the time other processes held the cores.
static double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [threads=2] [reps=5] [prefill=512] [weights=native|q8g64]\n", argv[0]);
    return 2;
  }
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const int prefill = argc > 4 ? std::atoi(argv[4]) : 512;
  mr::LoadOptions o;
  o.n_threads = threads;
  if (argc > 5 && !mr::ParseWeightMode(argv[5], &o.weights)) {
    std::fprintf(stderr, "weights: native or q8g64, not '%s'\n", argv[5]);
    return 2;
  }
  if (const char* cpu = std::getenv("MERERUN_CPU"); cpu && !mr::ParseCpuVariant(cpu, &o.cpu)) {
    std::fprintf(stderr, "MERERUN_CPU: scalar, avx2, avx512 or amx, not '%s'\n", cpu);
    return 2;
  }
  auto loaded = mr::Model::Load(argv[1], o);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load failed: %s\n", loaded.status().message().c_str());
    return 1;
  }
  mr::Model& m = *loaded.value();
  const int64_t V = m.config().n_vocab;
  const int64_t n_ctx = std::max(prefill, 256) + 16;
  mr::KvCache kv = m.NewKvCache(n_ctx);
  std::vector<mr::TokenId> toks(n_ctx);
  for (int64_t i = 0; i < n_ctx; ++i) toks[i] = static_cast<mr::TokenId>((i * 7919 + 13) % std::min<int64_t>(V, 20000));
  std::vector<float> logits(8 * V);
  // Prompt of 64 tokens, then the steps.
  const int64_t prompt = 64;
  if (!m.Forward(kv, toks.data(), prompt, false, logits.data()).ok()) return 1;
  double cpu_acc = 0;  // CPU seconds of the decode steps
  auto step = [&](int64_t n, bool all) {
    const auto t0 = Clock::now();
    const double c0 = CpuSeconds();
    if (!m.Forward(kv, toks.data() + kv.n_past, n, all, logits.data()).ok()) std::abort();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    cpu_acc = CpuSeconds() - c0;
    kv.n_past -= n;  // roll back: same position every time
    return s;
  };
  // Batched decode: 8 more caches at slightly different positions.
  std::vector<mr::KvCache> caches;
  for (int i = 0; i < 8; ++i) {
    caches.push_back(m.NewKvCache(n_ctx));
    if (!m.Forward(caches.back(), toks.data() + i, prompt + 4 * i, false, logits.data()).ok()) return 1;
  }
  std::vector<mr::Model::BatchSeq> seqs(8);
  auto batch_step = [&](int b) {
    for (int i = 0; i < b; ++i) seqs[i] = {&caches[i], toks.data() + caches[i].n_past, 1, false};
    const auto t0 = Clock::now();
    if (!m.ForwardBatch(std::span<const mr::Model::BatchSeq>(seqs.data(), b), logits.data()).ok()) std::abort();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (int i = 0; i < b; ++i) caches[i].n_past -= 1;
    return s;
  };
  auto loop_step = [&](int b) {  // the same work as b separate Forward calls (the unbatched peer)
    const auto t0 = Clock::now();
    for (int i = 0; i < b; ++i) {
      if (!m.Forward(caches[i], toks.data() + caches[i].n_past, 1, false, logits.data()).ok()) std::abort();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (int i = 0; i < b; ++i) caches[i].n_past -= 1;
    return s;
  };
  step(1, false);  // warm-up
  batch_step(8);
  const int kDecodePerRep = 8;
  std::vector<double> dec, dec_cpu, v1, v2, v4, v8, b1, b2, b4, b8, l2, l4, l8;
  for (int r = 0; r < reps; ++r) {
    double t = 0, c = 0;
    for (int i = 0; i < kDecodePerRep; ++i) {
      t += step(1, false);
      c += cpu_acc;
    }
    dec.push_back(t / kDecodePerRep);
    dec_cpu.push_back(c / kDecodePerRep);
    v1.push_back(step(1, true));
    v2.push_back(step(2, true));
    v4.push_back(step(4, true));
    v8.push_back(step(8, true));
    b1.push_back(batch_step(1));
    b2.push_back(batch_step(2));
    b4.push_back(batch_step(4));
    b8.push_back(batch_step(8));
    l2.push_back(loop_step(2));
    l4.push_back(loop_step(4));
    l8.push_back(loop_step(8));
  }
  std::vector<double> pf;
  if (prefill > 0) {
    for (int r = 0; r < std::max(1, reps / 2); ++r) {
      mr::KvCache kv2 = m.NewKvCache(n_ctx);
      const auto t0 = Clock::now();
      if (!m.Forward(kv2, toks.data(), prefill, false, logits.data()).ok()) return 1;
      pf.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  const double d = Median(dec), r1 = Median(v1);
  const double pft = pf.empty() ? 0 : Median(pf);
  const double gb = m.weight_bytes() / 1e9;
  std::fprintf(stderr, "%-10s %10s\n", "decode", "tok/s");
  std::fprintf(stderr, "%-10s %10.2f  (%.1f ms/token, %.1f GB/s of weights; %.1f ms CPU/token)\n", "", 1.0 / d, d * 1e3,
               gb / d, Median(dec_cpu) * 1e3);
  std::fprintf(stderr, "verify cost vs 1 row: 1=%.2f ms, 2=%.2fx, 4=%.2fx, 8=%.2fx\n", r1 * 1e3, Median(v2) / r1,
               Median(v4) / r1, Median(v8) / r1);
  const double bb1 = Median(b1);
  std::fprintf(stderr, "batch of b 1-row sequences: 1=%.2f ms, 2=%.2f ms (%.2fx), 4=%.2f ms (%.2fx), 8=%.2f ms (%.2fx)\n",
               bb1 * 1e3, Median(b2) * 1e3, Median(b2) / bb1, Median(b4) * 1e3, Median(b4) / bb1, Median(b8) * 1e3,
               Median(b8) / bb1);
  std::fprintf(stderr, "the same as separate Forward calls:   2=%.2f ms, 4=%.2f ms, 8=%.2f ms\n", Median(l2) * 1e3,
               Median(l4) * 1e3, Median(l8) * 1e3);
  if (prefill > 0) std::fprintf(stderr, "prefill %d tokens: %.2f s, %.1f tok/s\n", prefill, pft, prefill / pft);
  std::printf(
      "{\"model\":\"%s\",\"threads\":%d,\"decode_tok_s\":%.3f,\"decode_cpu_ms\":%.3f,\"weight_gb\":%.4f,\"verify_ms\":{\"1\":%.3f,\"2\":%.3f,\"4\":%.3f,"
      "\"8\":%.3f},\"batch_ms\":{\"1\":%.3f,\"2\":%.3f,\"4\":%.3f,\"8\":%.3f},\"loop_ms\":{\"2\":%.3f,\"4\":%.3f,\"8\":%.3f},\"prefill_tokens\":%d,\"prefill_tok_s\":%.3f}\n",
      argv[1], threads, 1.0 / d, Median(dec_cpu) * 1e3, gb, r1 * 1e3, Median(v2) * 1e3, Median(v4) * 1e3, Median(v8) * 1e3, bb1 * 1e3,
      Median(b2) * 1e3, Median(b4) * 1e3, Median(b8) * 1e3, Median(l2) * 1e3,
      Median(l4) * 1e3, Median(l8) * 1e3, prefill,
      pft > 0 ? prefill / pft : 0.0);
  return 0;
}
