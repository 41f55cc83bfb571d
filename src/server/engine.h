// The engine thread: the only owner of the Model's forward pass and of the Generator (its KV
// cache). HTTP handler threads submit EngineJobs to a bounded FIFO queue; the engine runs one
// job at a time and talks back only through the job's callbacks (which run on the engine
// thread and must be quick: they decode and hand events to the request's channel).
//
// Growth path (the scheduler issue): several Generators (sequence slots) and a batch step
// instead of one Generate call per job; admission limits turn Submit's refusal into 429/529.
//
// Thread-safety: Submit and Cancel may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/generator.h"

namespace mr::server {

struct JobResult {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // of the first prompt: KV kept from the previous request
  int64_t output_tokens = 0;  // generated + injected by continuations
  StopCause stop = StopCause::kMaxTokens;
  double prefill_s = 0.0;
  double decode_s = 0.0;
};

struct EngineJob {
  std::vector<TokenId> prompt;
  GenerateParams params;  // params.max_tokens bounds generated + injected tokens
  // Engine thread: each generated token; false stops this generation.
  std::function<bool(TokenId)> on_token;
  // Engine thread, after on_token stopped a generation: tokens to append to the sequence
  // (prompt + generated) before generating on, e.g. "</think>" when a reasoning budget is
  // spent. Empty (or no function): the job ends.
  std::function<std::vector<TokenId>()> continuation;
  // Engine thread, exactly once: the outcome (also when cancelled while queued).
  std::function<void(const Result<JobResult>&)> on_done;
  std::atomic<bool> cancelled{false};
};

class Engine {
 public:
  Engine(Model& model, int64_t n_ctx, size_t max_queued);
  ~Engine();  // finishes the running job's generation step, cancels queued ones, joins
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // False when the queue is full (the caller answers 529 overloaded).
  bool Submit(std::shared_ptr<EngineJob> job);

  // Cancels the running job and every queued one (shutdown).
  void CancelAll();

  Model& model() { return model_; }
  int64_t n_ctx() const { return n_ctx_; }

 private:
  void Loop();
  Result<JobResult> Run(EngineJob& job);

  Model& model_;
  const int64_t n_ctx_;
  const size_t max_queued_;
  Generator generator_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EngineJob>> queue_;
  std::shared_ptr<EngineJob> running_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace mr::server
