// The engine thread: the only owner of the Model's forward pass, the sequence slots (each with
// its KV cache) and the prefix cache. HTTP handler threads submit EngineJobs; admission is
// decided at once by the scheduling policy (sched/scheduler.h): queued, or refused with 429
// (queue full) or 529 (overloaded / not ready) plus a retry-after estimate, at no model cost.
// Each engine step runs the rows the policy planned — one decode row per active sequence plus
// prefill chunks — as one batched forward pass, then samples each sequence's next token. The
// engine talks back only through the job's callbacks (which run on the engine thread and must
// be quick: they decode and hand events to the request's channel).
//
// Failures are contained: an exception thrown while one sequence is stepped (its callbacks, its
// sampling) fails that request only; one thrown by the batched forward pass fails the requests
// of that step; the engine thread carries on.
//
// Thread-safety: Submit, Status, CancelAll, Drain and AbortAll may be called from any thread; a job's
// `cancelled` flag may be set from any thread (the engine drops the sequence at its next step).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/sequence.h"
#include "sched/scheduler.h"
#include "server/metrics.h"

namespace mr::server {

// An Anthropic cache_control breakpoint: the prompt prefix [0, end) is to be cached.
struct CacheBreakpoint {
  int64_t end = 0;        // tokens
  bool one_hour = false;  // ttl "1h" (else "5m")
};

struct JobResult {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // prompt tokens whose KV was reused (prefix cache or slot)
  // Anthropic prompt-caching usage, from what happened in the cache; with input_tokens =
  // prompt_tokens - cache_read - cache_creation_5m - cache_creation_1h they sum to the prompt.
  int64_t cache_read_tokens = 0;         // = reused_tokens
  int64_t cache_creation_5m_tokens = 0;  // evaluated and stored under a 5m breakpoint
  int64_t cache_creation_1h_tokens = 0;  // evaluated and stored under a 1h breakpoint
  int64_t output_tokens = 0;             // generated + injected by continuations
  StopCause stop = StopCause::kMaxTokens;
  double queue_s = 0.0;    // submit -> slot
  double prefill_s = 0.0;  // slot -> first generated token
  double decode_s = 0.0;
  int64_t generated = 0;                          // tokens the decode loop produced (output_tokens less injected)
  int64_t drafted = 0;                            // speculative drafts verified
  int64_t accepted = 0;                           // of them accepted
  std::vector<int64_t> proposed_at, accepted_at;  // per draft position (GenerateStats)
  // Resources: the process's resident set size at its highest among the engine steps this
  // request took part in (shared by the requests running together), the most KV bytes its
  // sequence held (the target model's cache, rows filled), and the process's high-water mark
  // (VmHWM) when it finished.
  uint64_t peak_rss_bytes = 0;
  uint64_t kv_peak_bytes = 0;
  uint64_t process_peak_rss_bytes = 0;
  std::vector<TokenLogprob> prompt_logprobs;  // with params.prompt_logprobs >= 0 (Sequence's)
  std::vector<float> embedding;               // with params.embed set (Sequence's, not normalized)
};

struct EngineJob {
  std::vector<TokenId> prompt;
  GenerateParams params;                           // params.max_tokens bounds generated + injected tokens
  std::vector<CacheBreakpoint> cache_breakpoints;  // sorted by end; may be empty
  // Engine thread: each generated token; false stops this generation.
  std::function<bool(TokenId)> on_token;
  // Engine thread, right before on_token, when params.logprobs >= 0: that token's
  // log-probability (runtime/sampler.h). Optional.
  std::function<void(const TokenLogprob&)> on_logprob;
  // Engine thread, after on_token stopped a generation: tokens to append to the sequence
  // (prompt + generated) before generating on, e.g. "</think>" when a reasoning budget is
  // spent. Empty (or no function): the job ends.
  std::function<std::vector<TokenId>()> continuation;
  // Engine thread, at most once, when the job gets its slot (before its prefill): the prompt
  // and cache counts of JobResult are final from here on (the rest is not filled yet).
  // Optional.
  std::function<void(const JobResult&)> on_start;
  // Engine thread, exactly once: the outcome (also when cancelled while queued).
  std::function<void(const Result<JobResult>&)> on_done;
  std::atomic<bool> cancelled{false};
  // Any thread: cancels the job (the engine drops it at its next step) and records when, so
  // the time from cancellation to release can be measured.
  void Cancel() {
    if (!cancelled.exchange(true)) cancelled_at_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  }
  std::atomic<int64_t> cancelled_at_ns{0};
};

struct EngineOptions {
  int64_t n_ctx = 4096;                         // per sequence
  int max_active = 8;                           // sequences decoding together (KV slots)
  int max_queued = 16;                          // waiting for a slot; beyond: 429
  int64_t max_queued_tokens = 1 << 20;          // prompt tokens waiting; beyond: 529
  int64_t step_rows = 64;                       // rows per engine step, all sequences together
  int64_t prefill_chunk = 256;                  // rows one sequence prefills per step (cancellation point)
  size_t prefix_cache_bytes = size_t{1} << 30;  // 0: no prefix cache
  // Lifetimes of cached prefixes (memory tier and the KV an idle slot keeps): "5m" and "1h"
  // (Anthropic's cache_control ttl), refreshed on each use.
  double cache_ttl_s = 300.0;
  double cache_long_ttl_s = 3600.0;
  // The prefix cache's disk tier (runtime/kv_disk_cache.h): empty dir or 0 bytes: none. If the
  // directory cannot be used the engine logs why and runs without it.
  std::string cache_dir;
  size_t cache_disk_bytes = 0;
  // One short sampled generation (drafting when speculation is on) before accepting requests;
  // until it ends the engine is `loading` (/health 503, requests 529). At most warm_up_s, and it
  // ends early when a drain starts (SIGTERM during start-up).
  bool warm_up = true;
  double warm_up_s = 60.0;
  // Speculative decoding: each sequence slot gets a drafter from make_drafter (null function or
  // null result: plain decoding), with at most draft_tokens drafts per step, the cost controller
  // choosing 0..draft_tokens per step when draft_adaptive. Draft rows are granted by the
  // scheduler after every decoding sequence's next row, so drafting never takes another
  // sequence's token out of a step.
  std::function<Result<std::unique_ptr<Drafter>>()> make_drafter;
  int draft_tokens = kDefaultDraftTokens;
  bool draft_adaptive = true;
};

// kDraining: shutting down, new requests are refused (529), admitted ones finish.
enum class EngineState { kLoading, kReady, kDraining, kStopping };

// A consistent snapshot for /health and /metrics.
struct EngineStatus {
  EngineState state = EngineState::kLoading;
  int active = 0;
  int queued = 0;
  int max_active = 0;
  int max_queued = 0;
  int64_t n_ctx = 0;
  double decode_tokens_per_s = 0.0;  // over the last ~10 s
  size_t prefix_cache_bytes = 0;
  int64_t prefix_cache_blocks = 0;
  size_t disk_cache_bytes = 0;  // block files of the disk tier (0: none)
  int64_t disk_cache_files = 0;
  size_t kv_bytes_in_use = 0;  // KV rows held by active sequences
};
const char* EngineStateName(EngineState s);

struct SubmitResult {
  sched::Admit admit = sched::Admit::kQueued;
  int retry_after_s = 0;  // when refused
};

class Engine {
 public:
  // `metrics` (optional, not owned) receives the engine's observations.
  Engine(Model& model, const EngineOptions& opts, ServerMetrics* metrics = nullptr);
  ~Engine();  // cancels everything, finishes the current step, joins
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  SubmitResult Submit(std::shared_ptr<EngineJob> job);
  // What Submit would answer now, without submitting: an early 429/529 before a request is parsed.
  SubmitResult Precheck() const;
  void CancelAll();  // cancels running and queued jobs (they end as cancelled)
  // Shutdown, first half: refuse new requests (529) and wait until the admitted ones are done or
  // `deadline` passes. True when everything finished in time.
  bool Drain(std::chrono::milliseconds deadline);
  // Shutdown, second half: every job still queued or running ends with an error (Status
  // kUnavailable, `why`), so a client sees the response was cut off rather than a normal end.
  // Returns when the engine thread has ended them.
  void AbortAll(const std::string& why);
  EngineStatus Status() const;

  Model& model() { return model_; }
  int64_t n_ctx() const { return opts_.n_ctx; }

 private:
  struct Impl;
  Model& model_;
  EngineOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mr::server
