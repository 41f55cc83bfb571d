#include "server/engine.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <unordered_map>

#include "base/hash.h"
#include "base/log.h"
#include "model/gguf.h"
#include "runtime/generator.h"
#include "runtime/kv_disk_cache.h"
#include "runtime/prefix_cache.h"

namespace mr::server {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The prefix cache's configuration key: the model file and everything that changes arithmetic.
uint64_t CacheConfigKey(const Model& m) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  mix(m.file().path());
  mix(std::to_string(m.file().file_size()));
  mix(m.ref_path() ? "ref" : "fast");
  mix(WeightModeName(m.weight_mode()));
  mix(FineActsName(m.fine_acts()));
  mix(std::to_string(static_cast<int>(m.cpu_variant())));
  mix(std::to_string(kActGroup));
  return h;
}

// The contents of this executable: another build may compute other KV for the same file and
// settings (a kernel change), so blocks on disk never cross builds.
uint64_t ExecutableHash() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  std::vector<char> buf(size_t{1} << 20);
  uint64_t h = 0;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (f.gcount() > 0) h = Hash64(buf.data(), static_cast<size_t>(f.gcount()), h);
  }
  return h;
}

// The disk tier's key adds what tells this file from another that has the same path and size
// later (the modification time), and this build from others, since its blocks outlive the
// process.
uint64_t DiskConfigKey(const Model& m) {
  uint64_t h = CacheConfigKey(m) ^ ExecutableHash();
  struct stat st {};
  if (::stat(m.file().path().c_str(), &st) == 0) {
    h ^= static_cast<uint64_t>(st.st_mtim.tv_sec) * 0x9e3779b97f4a7c15ull;
    h = (h ^ static_cast<uint64_t>(st.st_mtim.tv_nsec)) * 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace

const char* EngineStateName(EngineState s) {
  switch (s) {
    case EngineState::kLoading:
      return "loading";
    case EngineState::kReady:
      return "ready";
    case EngineState::kDraining:
      return "draining";
    case EngineState::kStopping:
      return "stopping";
  }
  return "?";
}

struct Engine::Impl {
  struct Slot {
    Slot(Model& m, int64_t n_ctx) : seq(m, n_ctx) {}
    Sequence seq;
    std::unique_ptr<Drafter> drafter;  // null: plain decoding
    std::shared_ptr<EngineJob> job;    // null: free
    sched::SeqId id = 0;
    Clock::time_point idle_until;  // free: its KV counts as cached until then (a lifetime)
    Clock::time_point submitted, last_token;
    uint64_t peak_rss = 0, peak_kv = 0;  // of the current job (JobResult)
    bool got_token = false;
    // The job holds the slot but its sequence has not started: another slot is prefilling a
    // long prefix of the same prompt, whose KV the prefix cache will hold when that prefill
    // ends (SharedPrefillLeader); the sequence starts then, reading it from the cache.
    bool deferred = false;
  };
  struct Entry {  // one sequence's rows in the current step
    Slot* slot;
    int64_t rows;
    int64_t out_rows;
    bool prefill;  // rows the scheduler counts as prompt prefill
  };

  Impl(Model& m, const EngineOptions& o, ServerMetrics* mt)
      : model(m),
        opts(o),
        metrics(mt),
        sched(sched::Limits{o.max_active, o.max_queued, o.max_queued_tokens, o.step_rows, o.prefill_chunk,
                            std::min<int64_t>(16, o.step_rows)}) {
    // Without a warm-up the engine takes requests at once (they wait in the queue for the thread).
    // A first prefill-rate guess from the model's size (~24 G int8 multiply-adds/s here);
    // measured from then on.
    prefill_tps = std::max(1.0, 24e9 / static_cast<double>(std::max<size_t>(m.weight_bytes(), 1)));
    sched.set_prefill_chunk(ChunkFor(prefill_tps));
    sched.set_ready(!o.warm_up);
    if (!o.warm_up) state = EngineState::kReady;
    if (o.prefix_cache_bytes > 0) {
      PrefixCache::Options po;
      po.byte_budget = o.prefix_cache_bytes;
      po.ttl_s = o.cache_ttl_s;
      po.long_ttl_s = o.cache_long_ttl_s;
      const ModelConfig& c = m.config();
      const int64_t kv_dim = c.n_head_kv * c.head_dim;
      if (!o.cache_dir.empty() && o.cache_disk_bytes > 0) {
        KvDiskCache::Options dopts;
        dopts.dir = o.cache_dir;
        dopts.byte_budget = o.cache_disk_bytes;
        auto d = KvDiskCache::Open(dopts, {DiskConfigKey(m), c.n_layer, kv_dim, po.block_tokens});
        if (d.ok()) {
          disk = std::move(d).value();
          const KvDiskCache::Stats ds = disk->stats();
          MR_LOGI("engine", "KV disk cache %s: %lld files, %.1f MiB (bound %.0f MiB)", disk->dir().c_str(),
                  (long long)ds.files, ds.bytes / 1048576.0, o.cache_disk_bytes / 1048576.0);
        } else {
          MR_LOGE("engine", "no KV disk cache (prefixes are not kept across restarts): %s",
                  d.status().message().c_str());
        }
      }
      po.disk = disk.get();
      cache = std::make_unique<PrefixCache>(CacheConfigKey(m), c.n_layer, kv_dim, po);
    }
  }

  void Loop();
  void WarmUp();
  Slot* TakeSlot(const std::vector<TokenId>& prompt);
  Slot* SlotOf(sched::SeqId id);
  void StartJob(sched::SeqId id, std::shared_ptr<EngineJob> job, Clock::time_point submitted);
  void Step(const sched::Plan& plan);
  // The sequence start of StartJob (Sequence::Start, the prompt's cache counts, on_start).
  void BeginSequence(Slot& s);
  // Prompt tokens a prefill must share with another to wait for it: two cache blocks.
  static constexpr int64_t kSharedPrefillTokens = 256;
  // An active, prefilling slot (not `self`) that will compute at least kSharedPrefillTokens of
  // `prompt`'s prefix beyond what it read from the cache itself; null when none.
  Slot* SharedPrefillLeader(const Slot* self, const std::vector<TokenId>& prompt);
  // Starts the deferred sequences whose leader's prefill has ended (or whose leader is gone).
  void ResumeDeferred();
  // Step's second half for one entry: sample or verify its rows' logits `lg`, emit, continue or
  // finish its job. Adds to the step's generated and prefilled counts.
  void ConsumeRows(const Entry& e, const float* lg, int64_t* generated, int64_t* prefilled, int64_t generated_before);
  // Step's bookkeeping once every entry is consumed (rates, the chunk size, the token window).
  void FinishStep(double step_s, int64_t generated, int64_t prefilled);
  // Ends the slot's job: reports the outcome, frees the slot (and its KV memory when `release`).
  // cancel_counted: the cancellation was counted in /metrics already (when the scheduler
  // dropped the sequence, before /health could show its slot free).
  void Finish(Slot& s, const mr::Status& error, bool release, bool cancel_counted = false);
  bool OnToken(Slot& s, TokenId t);
  // The prompt and prompt-caching counts of a job whose prompt has `reused_tokens` cached.
  static JobResult CacheUsage(const EngineJob& job, int64_t prompt_tokens, int64_t reused_tokens);
  // The end of the job's prompt prefix under a 1h cache breakpoint (0: none).
  static int64_t LongUntil(const EngineJob& job);
  void Publish();  // refresh the gauges Status() reads
  // Prefill rows per step that take about kPrefillStepS at `tps` rows/s, within
  // [64, --prefill-chunk]: a step ends (and a cancelled sequence is released) well under 1 s on
  // models up to ~0.5B here. The floor of 64: 16-row chunks flipped a near-tie in the Claude
  // Code smoke test's greedy answer on Qwen 1.5B (chunking changes accumulation order).
  static constexpr double kPrefillStepS = 0.25;
  int64_t ChunkFor(double tps) const {
    return std::clamp<int64_t>(static_cast<int64_t>(tps * kPrefillStepS), std::min<int64_t>(64, opts.prefill_chunk),
                               opts.prefill_chunk);
  }

  Model& model;
  const EngineOptions opts;
  ServerMetrics* metrics;
  std::unique_ptr<KvDiskCache> disk;    // the cache's disk tier (outlives it)
  std::unique_ptr<PrefixCache> cache;   // engine thread
  Clock::time_point next_expiry_check;  // engine thread
  // Drops what outlived its lifetime: expired prefix-cache blocks and the KV of slots idle past
  // their job's lifetime. Engine thread; at most once a second unless `force`.
  void ExpireCached(bool force);
  std::vector<std::unique_ptr<Slot>> slots;  // engine thread; created on demand, up to max_active
  std::vector<Model::BatchSeq> batch;
  std::vector<Entry> entries;
  std::vector<float> logits;
  double prefill_tps = 500.0;  // prompt tokens/s estimate (retry-after, chunk size); under mu

  mutable std::mutex mu;  // guards everything below
  std::condition_variable cv;
  sched::Scheduler sched;
  struct Waiting {
    std::shared_ptr<EngineJob> job;
    Clock::time_point submitted;
  };
  std::unordered_map<sched::SeqId, Waiting> queued;
  std::unordered_map<sched::SeqId, std::shared_ptr<EngineJob>> running;
  sched::SeqId next_id = 1;
  EngineState state = EngineState::kLoading;
  std::deque<std::pair<Clock::time_point, int64_t>> token_window;  // (step end, tokens generated)
  size_t cache_bytes = 0, kv_bytes = 0, disk_bytes = 0;
  int64_t cache_blocks = 0, disk_files = 0;
  std::thread thread;
  // AbortAll's request to the engine thread (under mu), and its answer.
  bool abort = false;
  std::string abort_reason;
  std::condition_variable aborted_cv;
  void AbortJobs();
  // Fails one slot's request after an exception escaped its step.
  void FailSlot(Slot& s, const char* where, const std::exception& e);
};

void Engine::Impl::FailSlot(Slot& s, const char* where, const std::exception& e) {
  if (!s.job) return;  // already finished before the exception
  MR_LOGE("engine", "%s failed for one request: %s", where, e.what());
  try {
    Finish(s, mr::Status(ErrorCode::kInternal, std::string("internal error: ") + e.what()), true);
  } catch (const std::exception& e2) {  // its callbacks failed too: drop it without them
    MR_LOGE("engine", "could not report the failure: %s", e2.what());
  }
}

void Engine::Impl::AbortJobs() {
  const mr::Status why(ErrorCode::kUnavailable, abort_reason);
  for (auto& s : slots) {
    if (!s->job) continue;
    s->seq.Cancel();
    Finish(*s, why, true);
  }
  std::unordered_map<sched::SeqId, Waiting> rest;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [id, w] : queued) sched.Cancel(id);
    rest.swap(queued);
  }
  for (auto& [id, w] : rest) w.job->on_done(why);
}

Engine::Engine(Model& model, const EngineOptions& opts, ServerMetrics* metrics)
    : model_(model), opts_(opts), impl_(std::make_unique<Impl>(model, opts, metrics)) {
  impl_->thread = std::thread([this] { impl_->Loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->state = EngineState::kStopping;
    impl_->sched.set_ready(false);
  }
  CancelAll();
  impl_->cv.notify_all();
  impl_->thread.join();
}

bool Engine::Drain(std::chrono::milliseconds deadline) {
  Impl& im = *impl_;
  const auto until = Clock::now() + deadline;
  std::unique_lock<std::mutex> lock(im.mu);
  if (im.state == EngineState::kReady || im.state == EngineState::kLoading) im.state = EngineState::kDraining;
  im.sched.set_ready(false);
  for (;;) {
    if (im.sched.active() == 0 && im.sched.queued() == 0 && im.running.empty() && im.queued.empty()) return true;
    if (Clock::now() >= until) return false;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lock.lock();
  }
}

void Engine::AbortAll(const std::string& why) {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.mu);
  im.sched.set_ready(false);
  if (im.running.empty() && im.queued.empty()) return;
  im.abort_reason = why;
  im.abort = true;
  im.cv.notify_all();
  im.aborted_cv.wait(lock, [&] { return !im.abort; });
}

void Engine::CancelAll() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& [id, w] : impl_->queued) w.job->Cancel();
  for (auto& [id, job] : impl_->running) job->Cancel();
}

SubmitResult Engine::Submit(std::shared_ptr<EngineJob> job) {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (im.state == EngineState::kStopping) return {sched::Admit::kOverloaded, 1};
    const sched::SeqId id = im.next_id++;
    const sched::Admit a = im.sched.Submit(id, static_cast<int64_t>(job->prompt.size()));
    if (a != sched::Admit::kQueued) return {a, im.sched.RetryAfterSeconds(im.prefill_tps)};
    im.queued.emplace(id, Impl::Waiting{std::move(job), Clock::now()});
  }
  im.cv.notify_one();
  return {};
}

SubmitResult Engine::Precheck() const {
  const Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  if (im.state == EngineState::kStopping) return {sched::Admit::kOverloaded, 1};
  const sched::Admit a = im.sched.Peek();
  if (a != sched::Admit::kQueued) return {a, im.sched.RetryAfterSeconds(im.prefill_tps)};
  return {};
}

EngineStatus Engine::Status() const {
  const Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  EngineStatus s;
  s.state = im.state;
  s.active = im.sched.active();
  s.queued = im.sched.queued();
  s.max_active = opts_.max_active;
  s.max_queued = opts_.max_queued;
  s.n_ctx = opts_.n_ctx;
  if (im.token_window.size() >= 2) {
    int64_t tokens = 0;
    for (size_t i = 1; i < im.token_window.size(); ++i) tokens += im.token_window[i].second;
    const double span =
        std::chrono::duration<double>(im.token_window.back().first - im.token_window.front().first).count();
    if (span > 0) s.decode_tokens_per_s = static_cast<double>(tokens) / span;
  }
  s.prefix_cache_bytes = im.cache_bytes;
  s.prefix_cache_blocks = im.cache_blocks;
  s.disk_cache_bytes = im.disk_bytes;
  s.disk_cache_files = im.disk_files;
  s.kv_bytes_in_use = im.kv_bytes;
  return s;
}

void Engine::Impl::WarmUp() {
  // One short generation, so the first request does not pay first-use costs (page faults of the
  // weights, workspace growth). Its cache is thrown away.
  // With speculation, the warm-up drafts too (1-row and multi-row verify steps).
  Generator g(model, 256);
  SpecParams spec;
  std::unique_ptr<Drafter> drafter;
  if (opts.make_drafter) {
    auto d = opts.make_drafter();
    if (d.ok()) drafter = std::move(d).value();
  }
  spec.drafter = drafter.get();
  spec.draft_tokens = opts.draft_tokens;
  spec.adaptive = opts.draft_adaptive;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.warm_up_s));
  const auto t0 = Clock::now();
  auto r = g.WarmUp(spec, drafter != nullptr ? 32 : 8, [this, deadline] {
    if (Clock::now() >= deadline) return true;
    std::lock_guard<std::mutex> lock(mu);
    return state != EngineState::kLoading;
  });
  if (!r.ok()) {
    MR_LOGW("engine", "warm-up failed: %s", r.status().message().c_str());
  } else {
    MR_LOGI("engine", "warm-up: %lld tokens in %.2f s (%lld drafted, %lld accepted)%s", (long long)r->generated,
            Since(t0), (long long)r->drafted, (long long)r->accepted,
            r->stop == StopCause::kCancelled ? ", cut short" : "");
  }
}

Engine::Impl::Slot* Engine::Impl::SlotOf(sched::SeqId id) {
  for (auto& s : slots)
    if (s->job && s->id == id) return s.get();
  return nullptr;
}

Engine::Impl::Slot* Engine::Impl::TakeSlot(const std::vector<TokenId>& prompt) {
  // The free slot whose cache shares the longest prefix with the prompt; a new slot only when
  // no free one shares anything and there is room.
  ExpireCached(true);
  Slot* best = nullptr;
  size_t best_len = 0;
  for (auto& s : slots) {
    if (s->job) continue;
    const auto& c = s->seq.cached_tokens();
    size_t n = 0;
    while (n < c.size() && n < prompt.size() && c[n] == prompt[n]) ++n;
    if (best == nullptr || n > best_len) {
      best = s.get();
      best_len = n;
    }
  }
  if ((best == nullptr || best_len == 0) && static_cast<int>(slots.size()) < opts.max_active) {
    slots.push_back(std::make_unique<Slot>(model, opts.n_ctx));
    if (opts.make_drafter) {
      auto d = opts.make_drafter();
      if (d.ok()) {
        slots.back()->drafter = std::move(d).value();
      } else {
        MR_LOGE("engine", "no drafter for a new slot (plain decoding there): %s", d.status().message().c_str());
      }
    }
    return slots.back().get();
  }
  return best;
}

void Engine::Impl::StartJob(sched::SeqId id, std::shared_ptr<EngineJob> job, Clock::time_point submitted) {
  Slot* s = TakeSlot(job->prompt);
  if (s == nullptr) {  // cannot happen: the scheduler admits at most max_active
    job->on_done(mr::Status(ErrorCode::kInternal, "no free sequence slot"));
    std::lock_guard<std::mutex> lock(mu);
    sched.Finish(id);
    running.erase(id);
    return;
  }
  if (metrics) metrics->queue_wait_s.Observe(Since(submitted));
  s->job = std::move(job);
  s->peak_rss = s->peak_kv = 0;
  s->id = id;
  s->submitted = submitted;
  s->got_token = false;
  s->deferred = cache != nullptr && SharedPrefillLeader(s, s->job->prompt) != nullptr;
  if (s->deferred) {
    MR_LOGD("engine", "seq %llu waits for another prefill of the same prefix", (unsigned long long)id);
    return;
  }
  BeginSequence(*s);
}

void Engine::Impl::BeginSequence(Slot& slot) {
  Slot* s = &slot;
  GenerateParams params = s->job->params;
  // A seeded sampled request decodes without drafts, so its seed gives the same text under any
  // load: the draft length of each step follows measured timings, and a verify step draws other
  // random numbers than a plain one (the same law, another realization).
  const bool reproducible = params.seeded && !params.sampling.greedy();
  if (s->drafter != nullptr && params.spec.drafter == nullptr && !reproducible) {
    params.spec.drafter = s->drafter.get();
    params.spec.draft_tokens = opts.draft_tokens;
    params.spec.adaptive = opts.draft_adaptive;
  }
  mr::Status st = s->seq.Start(s->job->prompt, params, cache.get());
  if (!st.ok()) return Finish(*s, st, false);
  if (cache) cache->KeepLong(s->job->prompt, LongUntil(*s->job));  // a hit under a 1h breakpoint
  {
    std::lock_guard<std::mutex> lock(mu);
    sched.Prefilled(s->id, s->seq.stats().reused_tokens);
    sched.SetSpecRows(s->id, s->seq.wanted_draft_rows());
  }
  if (s->job->on_start)
    s->job->on_start(CacheUsage(*s->job, s->seq.stats().prompt_tokens, s->seq.stats().reused_tokens));
}

Engine::Impl::Slot* Engine::Impl::SharedPrefillLeader(const Slot* self, const std::vector<TokenId>& prompt) {
  // Requests that do not go through the cache (prompt log-probabilities, embeddings) neither
  // lead nor follow.
  if (self->job->params.prompt_logprobs >= 0 || self->job->params.embed != Pooling::kNone) return nullptr;
  for (auto& o : slots) {
    // The leader is prefilling its prompt (not tokens injected after it has generated).
    if (o.get() == self || !o->job || o->deferred || !o->seq.prefilling() || o->seq.stats().generated > 0) continue;
    if (o->job->params.prompt_logprobs >= 0 || o->job->params.embed != Pooling::kNone) continue;
    const std::vector<TokenId>& p = o->job->prompt;
    int64_t n = 0;
    const auto limit = static_cast<int64_t>(std::min(p.size(), prompt.size()));
    while (n < limit && p[static_cast<size_t>(n)] == prompt[static_cast<size_t>(n)]) ++n;
    if (n - o->seq.stats().reused_tokens >= kSharedPrefillTokens) return o.get();
  }
  return nullptr;
}

void Engine::Impl::ResumeDeferred() {
  for (auto& s : slots) {
    if (!s->job || !s->deferred || SharedPrefillLeader(s.get(), s->job->prompt) != nullptr) continue;
    s->deferred = false;
    try {
      BeginSequence(*s);
    } catch (const std::exception& e) {
      FailSlot(*s, "starting", e);
    }
  }
}

int64_t Engine::Impl::LongUntil(const EngineJob& job) {
  int64_t end = 0;
  for (const CacheBreakpoint& b : job.cache_breakpoints)
    if (b.one_hour) end = std::max(end, std::min<int64_t>(b.end, static_cast<int64_t>(job.prompt.size())));
  return end;
}

JobResult Engine::Impl::CacheUsage(const EngineJob& job, int64_t prompt_tokens, int64_t reused_tokens) {
  JobResult r;
  r.prompt_tokens = prompt_tokens;
  r.reused_tokens = reused_tokens;
  // Prompt caching usage: what was read, and what this request computes and stores up to its
  // last breakpoint (the part up to the last 1h breakpoint under 1h); the rest is plain input.
  r.cache_read_tokens = reused_tokens;
  int64_t last = 0, last_1h = 0;
  for (const CacheBreakpoint& b : job.cache_breakpoints) {
    const int64_t end = std::clamp<int64_t>(b.end, 0, prompt_tokens);
    last = std::max(last, end);
    if (b.one_hour) last_1h = std::max(last_1h, end);
  }
  const int64_t created = std::max<int64_t>(0, last - r.cache_read_tokens);
  r.cache_creation_1h_tokens = std::max<int64_t>(0, last_1h - r.cache_read_tokens);
  r.cache_creation_5m_tokens = created - r.cache_creation_1h_tokens;
  return r;
}

bool Engine::Impl::OnToken(Slot& s, TokenId t) {
  const auto now = Clock::now();
  if (metrics) {
    if (!s.got_token)
      metrics->ttft_s.Observe(std::chrono::duration<double>(now - s.submitted).count());
    else
      metrics->itl_s.Observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.got_token = true;
  s.last_token = now;
  if (s.job->on_logprob)
    if (const TokenLogprob* lp = s.seq.token_logprob()) s.job->on_logprob(*lp);
  return s.job->on_token(t);
}

void Engine::Impl::Finish(Slot& s, const mr::Status& error, bool release, bool cancel_counted) {
  std::shared_ptr<EngineJob> job = std::move(s.job);
  s.job = nullptr;
  if (s.deferred) {  // its sequence never started: nothing was computed or reused
    s.deferred = false;
    if (metrics && !cancel_counted && job->cancelled.load()) ++metrics->cancellations;
    {
      std::lock_guard<std::mutex> lock(mu);
      sched.Finish(s.id);
      running.erase(s.id);
    }
    if (!error.ok()) return job->on_done(error);
    JobResult r;
    r.prompt_tokens = static_cast<int64_t>(job->prompt.size());
    r.stop = StopCause::kCancelled;
    return job->on_done(r);
  }
  const GenerateStats& st = s.seq.stats();
  const bool cancelled = job->cancelled.load() || st.stop == StopCause::kCancelled;
  if (error.ok() && !cancelled) s.seq.StoreInCache();
  if (release || !error.ok()) s.seq.ReleaseCache();
  const int64_t long_until = LongUntil(*job);
  if (cache) cache->KeepLong(job->prompt, long_until);
  s.idle_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                    long_until > 0 ? opts.cache_long_ttl_s : opts.cache_ttl_s));
  // The counters first: once the scheduler lets the slot go, /health shows it free, and a client
  // that waits for that (the disconnect tests) must then read this request in /metrics.
  if (metrics) {
    metrics->prompt_tokens += static_cast<uint64_t>(st.prompt_tokens);
    metrics->prefill_tokens += static_cast<uint64_t>(std::max<int64_t>(0, st.prompt_tokens - st.reused_tokens));
    metrics->cache_hit_tokens += static_cast<uint64_t>(st.reused_tokens);
    metrics->spec_drafted += static_cast<uint64_t>(st.drafted);
    metrics->spec_accepted += static_cast<uint64_t>(st.accepted);
    if (cancelled) {
      if (!cancel_counted) ++metrics->cancellations;
      const int64_t at = job->cancelled_at_ns.load();
      if (at > 0)
        metrics->cancel_release_s.Observe(static_cast<double>(Clock::now().time_since_epoch().count() - at) * 1e-9);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    sched.Finish(s.id);
    running.erase(s.id);
  }
  if (!error.ok()) {
    job->on_done(error);
    return;
  }
  JobResult r = CacheUsage(*job, st.prompt_tokens, st.reused_tokens);
  r.output_tokens = st.generated + st.injected;
  r.stop = cancelled ? StopCause::kCancelled : st.stop;
  r.prefill_s = st.prefill_s;
  r.decode_s = st.decode_s;
  r.generated = st.generated;
  r.drafted = st.drafted;
  r.accepted = st.accepted;
  r.proposed_at = st.proposed_at;
  r.accepted_at = st.accepted_at;
  r.peak_rss_bytes = s.peak_rss;
  r.kv_peak_bytes = s.peak_kv;
  if (job->params.prompt_logprobs >= 0) r.prompt_logprobs = s.seq.prompt_logprobs();
  if (job->params.embed != Pooling::kNone) r.embedding = s.seq.embedding();
  // VmHWM is updated lazily by the kernel and can trail a sample of the resident size by a
  // few hundred KB: the high-water mark reported is never below what was sampled.
  r.process_peak_rss_bytes = std::max(ResidentPeakBytes(), s.peak_rss);
  if (metrics) {
    AtomicMax(metrics->request_rss_peak_max, r.peak_rss_bytes);
    AtomicMax(metrics->request_kv_peak_max, r.kv_peak_bytes);
  }
  MR_LOGD("engine", "seq %llu: prompt %lld (reused %lld, %lld from the prefix cache), output %lld, stop %s",
          (unsigned long long)s.id, (long long)st.prompt_tokens, (long long)st.reused_tokens,
          (long long)st.cache_restored, (long long)r.output_tokens, StopCauseName(r.stop));
  job->on_done(r);
}

void Engine::Impl::Step(const sched::Plan& plan) {
  const int64_t n_vocab = model.config().n_vocab;
  batch.clear();
  entries.clear();
  // The planned step, so each decoder's cost controller prices its drafts against the rest of
  // the batch (Sequence::SetBatch); again with the actual rows before the logits are consumed.
  int64_t planned_rows = 0, planned_decoders = 0;
  for (const sched::Work& w : plan.work) {
    planned_rows += w.rows;
    planned_decoders += w.prefill ? 0 : 1;
  }
  for (const sched::Work& w : plan.work) {
    Slot* s = SlotOf(w.id);
    if (s == nullptr || s->deferred || s->seq.done()) continue;
    s->seq.SetBatch(planned_rows - w.rows, planned_decoders - (w.prefill ? 0 : 1));
    // Tokens injected by a continuation are prefilled in the sequence's decode turn.
    int64_t max_rows = w.rows;
    if (!w.prefill && s->seq.prefilling())
      max_rows = std::max<int64_t>(w.rows, std::min<int64_t>(s->seq.prefill_left(), 32));
    const bool prefill = w.prefill && s->seq.prefilling();
    Result<Sequence::StepRows> r = mr::Status::Ok();
    try {
      r = s->seq.NextRows(max_rows);
    } catch (const std::exception& e) {
      FailSlot(*s, "planning a step", e);
      continue;
    }
    if (!r.ok()) {
      Finish(*s, r.status(), true);
      continue;
    }
    if (s->seq.done()) {
      Finish(*s, mr::Status::Ok(), false);
      continue;
    }
    batch.push_back(Model::BatchSeq{&s->seq.kv(), r->tokens, r->n, r->all_logits, r->hidden});
    entries.push_back(Entry{s, r->n, r->all_logits ? r->n : 1, prefill});
  }
  if (batch.empty()) return;
  int64_t out_rows = 0;
  for (const Entry& e : entries) out_rows += e.out_rows;
  if (static_cast<int64_t>(logits.size()) < out_rows * n_vocab) logits.resize(static_cast<size_t>(out_rows * n_vocab));
  const auto t0 = Clock::now();
  mr::Status st;
  try {
    st = model.ForwardBatch(std::span<const Model::BatchSeq>(batch), logits.data());
  } catch (const std::exception& e) {
    st = mr::Status(ErrorCode::kInternal, std::string("internal error in the forward pass: ") + e.what());
  }
  const double step_s = Since(t0);
  if (metrics) metrics->step_s.Observe(step_s);
  if (!st.ok()) {
    MR_LOGE("engine", "forward pass failed: %s", st.message().c_str());
    for (const Entry& e : entries) Finish(*e.slot, st, true);
    return;
  }
  int64_t generated = 0, prefilled = 0, step_rows = 0, step_decoders = 0;
  for (const Entry& e : entries) {
    step_rows += e.rows;
    step_decoders += e.prefill ? 0 : 1;
  }
  const float* lg = logits.data();
  const uint64_t rss = ResidentBytes();  // after the step: its activations and new KV are in
  for (const Entry& e : entries) {
    Slot& s = *e.slot;
    s.peak_rss = std::max(s.peak_rss, rss);
    s.peak_kv = std::max<uint64_t>(s.peak_kv, s.seq.kv().bytes_in_use());
    const int64_t before = s.seq.stats().generated;
    const float* row_logits = lg;
    lg += e.out_rows * n_vocab;
    s.seq.SetBatch(step_rows - e.rows, step_decoders - (e.prefill ? 0 : 1));
    try {
      ConsumeRows(e, row_logits, &generated, &prefilled, before);
    } catch (const std::exception& ex) {
      if (s.job) FailSlot(s, "sampling", ex);
    }
  }
  FinishStep(step_s, generated, prefilled);
}

void Engine::Impl::ConsumeRows(const Entry& e, const float* lg, int64_t* generated, int64_t* prefilled,
                               int64_t generated_before) {
  Slot& s = *e.slot;
  const mr::Status c = s.seq.Consume(lg, [this, &s](TokenId t) { return OnToken(s, t); });
  *generated += s.seq.stats().generated - generated_before;
  if (e.prefill) {
    *prefilled += e.rows;
    std::lock_guard<std::mutex> lock(mu);
    sched.Prefilled(s.id, e.rows);
  }
  if (!c.ok()) {
    Finish(s, c, true);
    return;
  }
  if (!s.seq.done()) {
    if (s.drafter != nullptr) {
      std::lock_guard<std::mutex> lock(mu);
      sched.SetSpecRows(s.id, s.seq.wanted_draft_rows());
    }
    return;
  }
  if (s.seq.stats().stop == StopCause::kCallback && s.job->continuation && !s.job->cancelled) {
    const std::vector<TokenId> more = s.job->continuation();
    if (!more.empty() && s.seq.stats().generated + s.seq.stats().injected + static_cast<int64_t>(more.size()) <=
                             s.job->params.max_tokens) {
      s.seq.Inject(more);
      return;
    }
  }
  Finish(s, mr::Status::Ok(), false);
}

void Engine::Impl::FinishStep(double step_s, int64_t generated, int64_t prefilled) {
  if (metrics) metrics->generated_tokens += static_cast<uint64_t>(generated);
  std::lock_guard<std::mutex> lock(mu);
  if (prefilled > 0 && step_s > 0) {
    prefill_tps = 0.7 * prefill_tps + 0.3 * (static_cast<double>(prefilled) / step_s);
    sched.set_prefill_chunk(ChunkFor(prefill_tps));
  }
  const auto now = Clock::now();
  token_window.emplace_back(now, generated);
  while (token_window.size() > 2 && now - token_window.front().first > std::chrono::seconds(10))
    token_window.pop_front();
}

void Engine::Impl::Publish() {
  size_t kv = 0;
  for (auto& s : slots)
    if (s->job) kv += s->seq.kv().bytes_in_use();
  std::lock_guard<std::mutex> lock(mu);
  kv_bytes = kv;
  cache_bytes = cache ? cache->bytes() : 0;
  cache_blocks = cache ? cache->blocks() : 0;
  if (disk) {
    const KvDiskCache::Stats ds = disk->stats();
    disk_bytes = ds.bytes;
    disk_files = ds.files;
  }
}

void Engine::Impl::ExpireCached(bool force) {
  const auto now = Clock::now();
  if (!force && now < next_expiry_check) return;
  next_expiry_check = now + std::chrono::seconds(1);
  bool changed = cache && cache->Expire() > 0;
  for (auto& s : slots) {
    if (s->job || s->seq.cached_tokens().empty() || now < s->idle_until) continue;
    s->seq.ReleaseCache();
    changed = true;
  }
  if (changed) Publish();
}

void Engine::Impl::Loop() {
  if (opts.warm_up) WarmUp();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (state == EngineState::kLoading) {
      state = EngineState::kReady;
      sched.set_ready(true);
    }
  }
  MR_LOGI("engine", "ready: up to %d sequences, %d queued, %lld rows per step", opts.max_active, opts.max_queued,
          (long long)opts.step_rows);
  std::vector<std::shared_ptr<EngineJob>> left_queued;
  std::vector<std::pair<sched::SeqId, Waiting>> starting;
  for (;;) {
    sched::Plan plan;
    left_queued.clear();
    starting.clear();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(200),
                  [&] { return state == EngineState::kStopping || abort || sched.active() > 0 || sched.queued() > 0; });
      if (state == EngineState::kStopping) break;
      if (abort) {
        lock.unlock();
        AbortJobs();
        lock.lock();
        abort = false;
        aborted_cv.notify_all();
        continue;
      }
      if (sched.active() == 0 && sched.queued() == 0) {
        lock.unlock();
        ExpireCached(false);
        continue;
      }
      // Cancelled while queued: out of the queue at once. Active: dropped by this plan.
      for (auto it = queued.begin(); it != queued.end();) {
        if (it->second.job->cancelled && sched.Cancel(it->first)) {
          if (metrics) ++metrics->cancellations;  // counted before /health shows it gone
          left_queued.push_back(std::move(it->second.job));
          it = queued.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& [id, job] : running)
        if (job->cancelled) sched.Cancel(id);
      plan = sched.Next();
      // Dropped sequences have left the active count /health reports: counted now, not when
      // Finish runs after the lock.
      if (metrics) metrics->cancellations += plan.dropped.size();
      for (sched::SeqId id : plan.started) {
        auto it = queued.find(id);
        running.emplace(id, it->second.job);
        starting.emplace_back(id, std::move(it->second));
        queued.erase(it);
      }
    }
    for (auto& job : left_queued) {
      JobResult r;
      r.prompt_tokens = static_cast<int64_t>(job->prompt.size());
      r.stop = StopCause::kCancelled;
      job->on_done(r);
    }
    for (sched::SeqId id : plan.dropped) {
      if (Slot* s = SlotOf(id)) {
        s->seq.Cancel();
        Finish(*s, mr::Status::Ok(), /*release=*/true, /*cancel_counted=*/true);
      }
    }
    for (auto& [id, w] : starting) {
      try {
        StartJob(id, w.job, w.submitted);
      } catch (const std::exception& e) {
        MR_LOGE("engine", "starting a request failed: %s", e.what());
        if (Slot* s = SlotOf(id)) {
          FailSlot(*s, "starting", e);
        } else {
          {
            std::lock_guard<std::mutex> lock(mu);
            sched.Finish(id);
            running.erase(id);
          }
          w.job->on_done(mr::Status(ErrorCode::kInternal, std::string("internal error: ") + e.what()));
        }
      }
    }
    try {
      Step(plan);
    } catch (const std::exception& e) {  // outside any one sequence: fail every active one
      MR_LOGE("engine", "engine step failed: %s", e.what());
      for (auto& s : slots)
        if (s->job) FailSlot(*s, "the step", e);
    }
    ResumeDeferred();
    Publish();
  }
  // Shutting down: every job still here ends as cancelled.
  for (auto& s : slots) {
    if (!s->job) continue;
    s->seq.Cancel();
    Finish(*s, mr::Status::Ok(), false);
  }
  std::unordered_map<sched::SeqId, Waiting> rest;
  {
    std::lock_guard<std::mutex> lock(mu);
    rest.swap(queued);
  }
  for (auto& [id, w] : rest) w.job->on_done(mr::Status(ErrorCode::kInternal, "server is shutting down"));
}

}  // namespace mr::server
