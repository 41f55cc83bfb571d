#include "server/engine.h"

#include "base/log.h"

namespace mr::server {

Engine::Engine(Model& model, int64_t n_ctx, size_t max_queued)
    : model_(model), n_ctx_(n_ctx), max_queued_(max_queued), generator_(model, n_ctx) {
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  std::deque<std::shared_ptr<EngineJob>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : left) job->cancelled = true;
  CancelAll();
  thread_.join();
  for (auto& job : left)
    if (job->on_done) job->on_done(Result<JobResult>(Status(ErrorCode::kInternal, "server is shutting down")));
}

void Engine::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) running_->cancelled = true;
  for (auto& job : queue_) job->cancelled = true;
}

bool Engine::Submit(std::shared_ptr<EngineJob> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void Engine::Loop() {
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

Result<JobResult> Engine::Run(EngineJob& job) {
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
