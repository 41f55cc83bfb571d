#include "server/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "server/engine.h"

namespace mr::server {

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kCancelled:
      return "cancelled";
    case Outcome::kInvalid:
      return "invalid";
    case Outcome::kRateLimited:
      return "rate_limited";
    case Outcome::kOverloaded:
      return "overloaded";
    case Outcome::kError:
      return "error";
  }
  return "?";
}

namespace {

// Prometheus float text: the shortest of %.15g / %.17g that reads back as the same double
// (so bucket bounds print as 0.1, not 0.10000000000000001).
std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

class Writer {
 public:
  void Header(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void Sample(const std::string& name, const std::string& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void Counter(const char* name, const char* help, uint64_t v) {
    Header(name, "counter", help);
    Sample(name, "", std::to_string(v));
  }
  void Gauge(const char* name, const char* help, double v) {
    Header(name, "gauge", help);
    Sample(name, "", Num(v));
  }
  void Hist(const char* name, const char* help, const Histogram& h) {
    const Histogram::Snapshot s = h.Get();
    Header(name, "histogram", help);
    const std::string base = name;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
      cumulative += s.buckets[i];
      Sample(base + "_bucket", "le=\"" + Num(Histogram::kBounds[i]) + "\"", std::to_string(cumulative));
    }
    cumulative += s.buckets[Histogram::kBounds.size()];
    // The snapshot is taken under one lock, so the +Inf bucket equals the count.
    Sample(base + "_bucket", "le=\"+Inf\"", std::to_string(cumulative));
    Sample(base + "_sum", "", Num(s.sum));
    Sample(base + "_count", "", std::to_string(s.count));
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

}  // namespace

uint64_t ResidentBytes() {
  // Read after every engine step: one descriptor for the process's life, one pread per call
  // (thread-safe: no shared file offset).
  static const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  static const long page = sysconf(_SC_PAGESIZE);
  char buf[128];
  const ssize_t n = fd >= 0 ? ::pread(fd, buf, sizeof(buf) - 1, 0) : -1;
  if (n <= 0 || page <= 0) return 0;
  buf[n] = '\0';
  unsigned long long size = 0, resident = 0;
  if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(page);
}

uint64_t ResidentPeakBytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kb = 0;
  bool found = false;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
      found = true;
      break;
    }
  std::fclose(f);
  return found ? static_cast<uint64_t>(kb) * 1024 : 0;
}

std::string RenderPrometheus(const ServerMetrics& m, const EngineStatus& e) {
  Writer w;
  static const char* const kApis[2] = {"anthropic", "openai"};
  w.Header("mererun_requests_total", "counter",
           "Finished /v1/messages and /v1/chat/completions requests by API and outcome.");
  for (int a = 0; a < 2; ++a)
    for (int o = 0; o < kOutcomes; ++o)
      w.Sample("mererun_requests_total",
               std::string("api=\"") + kApis[a] + "\",outcome=\"" + OutcomeName(static_cast<Outcome>(o)) + "\"",
               std::to_string(m.requests[a][o].load(std::memory_order_relaxed)));
  auto c = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  w.Counter("mererun_prompt_tokens_total", "Prompt tokens of started generations.", c(m.prompt_tokens));
  w.Counter("mererun_prefill_tokens_total", "Prompt tokens actually evaluated (not reused).", c(m.prefill_tokens));
  w.Counter("mererun_prefix_cache_hit_tokens_total", "Prompt tokens whose KV was reused.", c(m.cache_hit_tokens));
  w.Counter("mererun_generated_tokens_total", "Generated tokens.", c(m.generated_tokens));
  w.Counter("mererun_spec_draft_tokens_total", "Speculative draft tokens verified.", c(m.spec_drafted));
  w.Counter("mererun_spec_accepted_tokens_total", "Speculative draft tokens accepted.", c(m.spec_accepted));
  w.Counter("mererun_cancellations_total", "Sequences released because the client went away.", c(m.cancellations));
  w.Hist("mererun_time_to_first_token_seconds", "Submit to first generated token.", m.ttft_s);
  w.Hist("mererun_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.", m.itl_s);
  w.Hist("mererun_queue_wait_seconds", "Submit to sequence slot.", m.queue_wait_s);
  w.Hist("mererun_cancel_release_seconds", "Cancel flag set to KV and slot released.", m.cancel_release_s);
  w.Hist("mererun_engine_step_seconds", "One engine step (all sequences).", m.step_s);
  w.Gauge("mererun_active_sequences", "Sequences holding a slot.", e.active);
  w.Gauge("mererun_queued_requests", "Requests waiting for a slot.", e.queued);
  w.Gauge("mererun_decode_tokens_per_second", "Decode throughput over the last seconds.", e.decode_tokens_per_s);
  w.Gauge("mererun_prefix_cache_bytes", "Bytes held by the prefix cache.", static_cast<double>(e.prefix_cache_bytes));
  w.Gauge("mererun_prefix_cache_blocks", "Blocks held by the prefix cache.",
          static_cast<double>(e.prefix_cache_blocks));
  w.Gauge("mererun_disk_cache_bytes", "Bytes of KV block files in the prefix cache's disk tier.",
          static_cast<double>(e.disk_cache_bytes));
  w.Gauge("mererun_disk_cache_files", "KV block files in the prefix cache's disk tier.",
          static_cast<double>(e.disk_cache_files));
  w.Gauge("mererun_kv_bytes_in_use", "KV bytes held by active sequences.", static_cast<double>(e.kv_bytes_in_use));
  w.Gauge("mererun_ready", "1 when the engine accepts requests.", e.state == EngineState::kReady ? 1 : 0);
  w.Gauge("mererun_resident_memory_bytes", "Resident set size of the process.", static_cast<double>(ResidentBytes()));
  w.Gauge("mererun_resident_memory_peak_bytes",
          "High-water mark of the process's resident set size (VmHWM, or a larger sampled size).",
          static_cast<double>(std::max(ResidentPeakBytes(), c(m.request_rss_peak_max))));
  w.Gauge("mererun_request_resident_peak_bytes_max",
          "The largest resident set size seen while one request was active, over all requests.",
          static_cast<double>(c(m.request_rss_peak_max)));
  w.Gauge("mererun_request_kv_peak_bytes_max", "The largest KV bytes one request's sequence held, over all requests.",
          static_cast<double>(c(m.request_kv_peak_max)));
  return std::move(w.out());
}

}  // namespace mr::server
