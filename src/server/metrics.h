// Server metrics: counters and latency histograms, updated from the engine and HTTP threads,
// rendered as Prometheus text by GET /metrics (RenderPrometheus, metrics.cpp).
//
// Thread-safety: every member may be updated from any thread (atomics; histograms take a lock).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace mr::server {

// A Prometheus histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25, 0.5,
                                                     1.0,   2.5,  5.0,   10.0, 30.0, 60.0, 120.0};
  void Observe(double v) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0;
    while (i < kBounds.size() && v > kBounds[i]) ++i;
    ++buckets_[i];
    sum_ += v;
    ++count_;
  }
  struct Snapshot {
    std::array<uint64_t, kBounds.size() + 1> buckets{};  // per bucket (not cumulative); last: +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {buckets_, sum_, count_};
  }

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> buckets_{};
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Request outcomes counted by mererun_requests_total{api,outcome}.
enum class Outcome { kOk, kCancelled, kInvalid, kRateLimited, kOverloaded, kError };
inline constexpr int kOutcomes = 6;
const char* OutcomeName(Outcome o);

struct ServerMetrics {
  // [api][outcome]; api 0 = anthropic, 1 = openai.
  std::atomic<uint64_t> requests[2][kOutcomes] = {};
  std::atomic<uint64_t> prompt_tokens{0};     // prompt tokens of started generations
  std::atomic<uint64_t> prefill_tokens{0};    // prompt tokens actually evaluated
  std::atomic<uint64_t> cache_hit_tokens{0};  // prompt tokens whose KV was reused
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> spec_drafted{0};  // speculative draft tokens verified
  std::atomic<uint64_t> spec_accepted{0};
  std::atomic<uint64_t> cancellations{0};  // sequences released because the client left
  Histogram ttft_s;                        // submit -> first generated token
  Histogram itl_s;                         // between consecutive generated tokens of one sequence
  Histogram queue_wait_s;                  // submit -> slot
  Histogram cancel_release_s;              // cancel flag set -> KV and slot released
  Histogram step_s;                        // one engine step (all sequences)
  std::atomic<uint64_t> started_unix{0};
  // The largest per-request figures seen (JobResult::peak_rss_bytes, kv_peak_bytes).
  std::atomic<uint64_t> request_rss_peak_max{0};
  std::atomic<uint64_t> request_kv_peak_max{0};
};

// Raises `a` to `v` if `v` is larger (lock-free).
inline void AtomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// The process's resident set size now (/proc/self/statm), and its high-water mark (VmHWM in
// /proc/self/status: the kernel's own peak, which no sampling misses); 0 when unreadable.
uint64_t ResidentBytes();
uint64_t ResidentPeakBytes();

struct EngineStatus;
// Prometheus text exposition (version 0.0.4) of `m` plus the engine's gauges (queue length,
// active sequences, decode tokens/s over the last seconds, prefix-cache bytes) and resident
// memory (/proc/self/statm).
std::string RenderPrometheus(const ServerMetrics& m, const EngineStatus& engine);

}  // namespace mr::server
