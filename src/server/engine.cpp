#include "server/engine.h"

#include "base/log.h"

namespace mr::server {

// Interim implementation (one job at a time through a Generator) behind the batched engine's
// interface; replaced by the slot-and-scheduler engine.
struct Engine::Impl {
  Impl(Model& model, const EngineOptions& o, ServerMetrics* m)
      : model_(model), n_ctx_(o.n_ctx), max_queued_(static_cast<size_t>(o.max_queued)), metrics(m), generator_(model, o.n_ctx) {}
  void Loop();
  Result<JobResult> Run(EngineJob& job);
  void CancelAll();
  Model& model_;
  const int64_t n_ctx_;
  const size_t max_queued_;
  ServerMetrics* metrics;
  Generator generator_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EngineJob>> queue_;
  std::shared_ptr<EngineJob> running_;
  bool stopping_ = false;
  std::thread thread_;
};

const char* EngineStateName(EngineState s) {
  switch (s) {
    case EngineState::kLoading: return "loading";
    case EngineState::kReady: return "ready";
    case EngineState::kStopping: return "stopping";
  }
  return "?";
}

Engine::Engine(Model& model, const EngineOptions& opts, ServerMetrics* metrics)
    : model_(model), opts_(opts), impl_(std::make_unique<Impl>(model, opts, metrics)) {
  impl_->thread_ = std::thread([this] { impl_->Loop(); });
}

EngineStatus Engine::Status() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  EngineStatus s;
  s.state = impl_->stopping_ ? EngineState::kStopping : EngineState::kReady;
  s.active = impl_->running_ ? 1 : 0;
  s.queued = static_cast<int>(impl_->queue_.size());
  s.max_active = 1;
  s.max_queued = static_cast<int>(impl_->max_queued_);
  s.n_ctx = impl_->n_ctx_;
  return s;
}

Engine::~Engine() {
  Impl* im = impl_.get();
  std::deque<std::shared_ptr<EngineJob>> left;
  {
    std::lock_guard<std::mutex> lock(im->mu_);
    im->stopping_ = true;
    left.swap(im->queue_);
  }
  im->cv_.notify_all();
  for (auto& job : left) job->cancelled = true;
  CancelAll();
  im->thread_.join();
  for (auto& job : left)
    if (job->on_done) job->on_done(Result<JobResult>(mr::Status(ErrorCode::kInternal, "server is shutting down")));
}

void Engine::CancelAll() { impl_->CancelAll(); }

void Engine::Impl::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) running_->cancelled = true;
  for (auto& job : queue_) job->cancelled = true;
}

SubmitResult Engine::Submit(std::shared_ptr<EngineJob> job) {
  Impl* im = impl_.get();
  {
    std::lock_guard<std::mutex> lock(im->mu_);
    if (im->stopping_) return {sched::Admit::kOverloaded, 1};
    if (im->queue_.size() >= im->max_queued_) return {sched::Admit::kQueueFull, 1};
    im->queue_.push_back(std::move(job));
  }
  im->cv_.notify_one();
  return {};
}

void Engine::Impl::Loop() {
  for (;;) {
    std::shared_ptr<EngineJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job;
    }
    Result<JobResult> r = Run(*job);
    if (job->on_done) job->on_done(r);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
  }
}

Result<JobResult> Engine::Impl::Run(EngineJob& job) {
  JobResult res;
  res.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  if (job.cancelled) {
    res.stop = StopCause::kCancelled;
    return res;
  }
  std::vector<TokenId> seq = job.prompt;  // prompt + everything produced so far
  const Generator::CancelFn cancelled = [&job] { return job.cancelled.load(std::memory_order_relaxed); };
  bool first = true;
  for (;;) {
    GenerateParams p = job.params;
    p.max_tokens = job.params.max_tokens - res.output_tokens;
    if (p.max_tokens <= 0) {
      res.stop = StopCause::kMaxTokens;
      break;
    }
    std::vector<TokenId> produced;
    auto on_token = [&](TokenId t) {
      produced.push_back(t);
      return job.on_token(t);
    };
    Result<GenerateStats> st = generator_.Generate(seq, p, on_token, cancelled);
    if (!st.ok()) return st.status();
    if (first) res.reused_tokens = st->reused_tokens;
    first = false;
    res.prefill_s += st->prefill_s;
    res.decode_s += st->decode_s;
    res.output_tokens += st->generated;
    res.stop = st->stop;
    MR_LOGD("engine", "generate: prompt %lld (reused %lld), generated %lld, stop %s, prefill %.2f s, decode %.2f s",
            (long long)st->prompt_tokens, (long long)st->reused_tokens, (long long)st->generated,
            StopCauseName(st->stop), st->prefill_s, st->decode_s);
    if (st->stop != StopCause::kCallback || !job.continuation) break;
    std::vector<TokenId> more = job.continuation();
    if (more.empty()) break;
    seq.insert(seq.end(), produced.begin(), produced.end());
    seq.insert(seq.end(), more.begin(), more.end());
    res.output_tokens += static_cast<int64_t>(more.size());
    if (static_cast<int64_t>(seq.size()) >= n_ctx_) {
      res.stop = StopCause::kContextFull;
      break;
    }
  }
  return res;
}

}  // namespace mr::server
