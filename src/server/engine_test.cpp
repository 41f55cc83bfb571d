// The batched engine on a real model (SmolLM2, skipped when not pulled): sequences decoded
// together produce what they produce alone, admission refuses beyond capacity, cancellation frees
// slots at every stage, and prefix reuse (own slot or prefix cache) does not change the output.
#include "server/engine.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "model/test_models.h"

namespace mr::server {
namespace {

struct Outcome {
  std::vector<TokenId> tokens;
  Result<JobResult> result = Result<JobResult>(mr::Status(ErrorCode::kInternal, "not done"));
};

// A job whose tokens and outcome land in a future.
struct TestJob {
  std::shared_ptr<EngineJob> job = std::make_shared<EngineJob>();
  std::shared_ptr<Outcome> out = std::make_shared<Outcome>();
  std::shared_ptr<std::promise<void>> done = std::make_shared<std::promise<void>>();
  std::future<void> fut = done->get_future();
  std::shared_ptr<std::atomic<int>> seen = std::make_shared<std::atomic<int>>(0);

  TestJob(std::vector<TokenId> prompt, int64_t max_tokens) {
    job->prompt = std::move(prompt);
    job->params.sampling = SamplingParams{0.0f, 0, 1.0f, 0.0f};  // greedy
    job->params.max_tokens = max_tokens;
    auto out_ = out;
    auto seen_ = seen;
    job->on_token = [out_, seen_](TokenId t) {
      out_->tokens.push_back(t);
      ++*seen_;
      return true;
    };
    auto done_ = done;
    job->on_done = [out_, done_](const Result<JobResult>& r) {
      out_->result = r;
      done_->set_value();
    };
  }
  bool Wait(int seconds = 120) { return fut.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready; }
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadPulledModel(kSmolLM2File);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m);
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "SmolLM2 is not pulled";
  }
  std::vector<TokenId> Prompt(const std::string& text) { return model_->tokenizer().Encode(text, true, false); }
  static EngineOptions Options(int max_active, int max_queued) {
    EngineOptions o;
    o.n_ctx = 2048;
    o.max_active = max_active;
    o.max_queued = max_queued;
    o.warm_up = false;
    return o;
  }
  static void WaitIdle(Engine& e) {
    for (int i = 0; i < 500; ++i) {
      const EngineStatus s = e.Status();
      if (s.active == 0 && s.queued == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "engine did not return to idle";
  }
  static std::unique_ptr<Model> model_;
};
std::unique_ptr<Model> EngineTest::model_;

TEST_F(EngineTest, ConcurrentSequencesMatchTheirSoloRuns) {
  const std::vector<std::string> texts = {"The capital of France is", "def add(a, b):", "Once upon a time there was a",
                                          "List three colours:"};
  std::vector<std::vector<TokenId>> solo;
  {
    Engine e(*model_, Options(4, 4));
    for (const auto& t : texts) {
      TestJob j(Prompt(t), 24);
      ASSERT_EQ(e.Submit(j.job).admit, sched::Admit::kQueued);
      ASSERT_TRUE(j.Wait());
      ASSERT_TRUE(j.out->result.ok());
      solo.push_back(j.out->tokens);
    }
  }
  Engine e(*model_, Options(4, 4));
  std::vector<std::unique_ptr<TestJob>> jobs;
  for (const auto& t : texts) {
    jobs.push_back(std::make_unique<TestJob>(Prompt(t), 24));
    ASSERT_EQ(e.Submit(jobs.back()->job).admit, sched::Admit::kQueued);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i]->Wait());
    ASSERT_TRUE(jobs[i]->out->result.ok());
    EXPECT_EQ(jobs[i]->out->tokens, solo[i]) << texts[i];
    EXPECT_FALSE(solo[i].empty());
  }
  WaitIdle(e);
}

TEST_F(EngineTest, AdmissionAndCancellationAtEveryStage) {
  Engine e(*model_, Options(1, 1));
  std::string count;
  for (int i = 1; i <= 30; ++i) count += std::to_string(i) + ", ";
  TestJob a(Prompt(count), 100000);  // counting on: no end in sight before the context fills
  TestJob b(Prompt("Hello"), 16);
  TestJob c(Prompt("Hi"), 16);
  ASSERT_EQ(e.Submit(a.job).admit, sched::Admit::kQueued);
  while (*a.seen < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a decodes
  ASSERT_EQ(e.Submit(b.job).admit, sched::Admit::kQueued);                        // b waits
  const SubmitResult full = e.Submit(c.job);                                      // no room
  EXPECT_EQ(full.admit, sched::Admit::kQueueFull);
  EXPECT_GE(full.retry_after_s, 1);
  EXPECT_EQ(e.Status().active, 1);
  EXPECT_EQ(e.Status().queued, 1);

  b.job->Cancel();  // cancelled while queued: ends without a token
  ASSERT_TRUE(b.Wait(10));
  ASSERT_TRUE(b.out->result.ok());
  EXPECT_EQ(b.out->result->stop, StopCause::kCancelled);
  EXPECT_TRUE(b.out->tokens.empty());

  a.job->Cancel();  // cancelled while decoding
  ASSERT_TRUE(a.Wait(10));
  ASSERT_TRUE(a.out->result.ok());
  EXPECT_EQ(a.out->result->stop, StopCause::kCancelled);
  WaitIdle(e);

  // Cancelled during prefill: a long prompt, small chunks.
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "The river flows past the old mill and the quiet town. ";
  EngineOptions o = Options(1, 1);
  o.prefill_chunk = 32;
  o.step_rows = 32;
  Engine e2(*model_, o);
  TestJob p(Prompt(long_text), 16);
  ASSERT_EQ(e2.Submit(p.job).admit, sched::Admit::kQueued);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  p.job->Cancel();
  ASSERT_TRUE(p.Wait(10));
  ASSERT_TRUE(p.out->result.ok());
  EXPECT_EQ(p.out->result->stop, StopCause::kCancelled);
  EXPECT_TRUE(p.out->tokens.empty());
  WaitIdle(e2);

  // The engine serves normally afterwards.
  TestJob d(Prompt("The capital of France is"), 8);
  ASSERT_EQ(e2.Submit(d.job).admit, sched::Admit::kQueued);
  ASSERT_TRUE(d.Wait());
  ASSERT_TRUE(d.out->result.ok());
  EXPECT_NE(d.out->result->stop, StopCause::kCancelled);
  EXPECT_FALSE(d.out->tokens.empty());
}

TEST_F(EngineTest, PrefixReuseGivesTheColdOutput) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Line " + std::to_string(i) + ": the committee reviews the budget. ";
  const std::vector<TokenId> shared = Prompt(text + "Question: what does the committee review?");
  const std::vector<TokenId> other = Prompt("An unrelated short prompt about cats");
  auto run = [&](Engine& e, const std::vector<TokenId>& prompt, std::vector<CacheBreakpoint> bps = {}) {
    TestJob j(prompt, 16);
    j.job->cache_breakpoints = std::move(bps);
    EXPECT_EQ(e.Submit(j.job).admit, sched::Admit::kQueued);
    EXPECT_TRUE(j.Wait());
    EXPECT_TRUE(j.out->result.ok());
    return std::make_pair(j.out->tokens, *j.out->result);
  };
  EngineOptions cold_opts = Options(1, 1);
  cold_opts.prefix_cache_bytes = 0;
  std::vector<TokenId> cold;
  {
    Engine cold_engine(*model_, cold_opts);
    cold = run(cold_engine, shared).first;
  }
  Engine e(*model_, Options(1, 1));
  const int64_t n = static_cast<int64_t>(shared.size());
  auto [t1, r1] = run(e, shared, {CacheBreakpoint{n / 2, true}, CacheBreakpoint{n - 4, false}});
  EXPECT_EQ(t1, cold);
  EXPECT_EQ(r1.cache_read_tokens, 0);
  EXPECT_EQ(r1.cache_creation_1h_tokens, n / 2);
  EXPECT_EQ(r1.cache_creation_5m_tokens, n - 4 - n / 2);
  // The slot now holds another prompt: the shared prefix comes back from the prefix cache.
  run(e, other);
  auto [t2, r2] = run(e, shared);
  EXPECT_EQ(t2, cold);
  EXPECT_GE(r2.cache_read_tokens, 128);  // at least one whole cache block
  EXPECT_LT(r2.cache_read_tokens, n);
  EXPECT_EQ(r2.cache_creation_5m_tokens + r2.cache_creation_1h_tokens, 0);
}

// Requests that arrive together with a long common prefix: the first prefills it, the others
// wait for that prefill to end and read its KV from the prefix cache instead of computing it
// again, and every output is what the request gives alone on a cold engine. A waiting request
// that is cancelled ends as cancelled; without a prefix cache nobody waits.
TEST_F(EngineTest, ConcurrentRequestsPrefillASharedPrefixOnce) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Line " + std::to_string(i) + ": the committee reviews the budget. ";
  const std::vector<std::vector<TokenId>> prompts = {Prompt(text + "Question: what does the committee review?"),
                                                     Prompt(text + "Question: how many lines are there?"),
                                                     Prompt(text + "Question: what does the committee review?")};
  const int64_t n = static_cast<int64_t>(prompts[0].size());
  ASSERT_GT(n, 400);
  EngineOptions cold_opts = Options(1, 1);
  cold_opts.prefix_cache_bytes = 0;
  std::vector<std::vector<TokenId>> cold;
  {
    Engine e(*model_, cold_opts);
    for (const auto& p : prompts) {
      TestJob j(p, 12);
      ASSERT_EQ(e.Submit(j.job).admit, sched::Admit::kQueued);
      ASSERT_TRUE(j.Wait());
      cold.push_back(j.out->tokens);
    }
  }
  for (bool with_cache : {true, false}) {
    SCOPED_TRACE(with_cache ? "prefix cache" : "no prefix cache");
    EngineOptions o = Options(4, 4);
    if (!with_cache) o.prefix_cache_bytes = 0;
    ServerMetrics metrics;
    Engine e(*model_, o, &metrics);
    std::vector<std::unique_ptr<TestJob>> jobs;
    for (const auto& p : prompts) {
      jobs.push_back(std::make_unique<TestJob>(p, 12));
      ASSERT_EQ(e.Submit(jobs.back()->job).admit, sched::Admit::kQueued);
    }
    // A fourth request with the prefix, cancelled once it holds a slot (while it waits, with
    // the cache: the first request's prefill takes longer than this poll).
    TestJob gone(prompts[0], 12);
    ASSERT_EQ(e.Submit(gone.job).admit, sched::Admit::kQueued);
    for (int i = 0; i < 2000 && e.Status().active < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gone.job->Cancel();
    int64_t computed = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(jobs[i]->Wait());
      ASSERT_TRUE(jobs[i]->out->result.ok()) << jobs[i]->out->result.status().message();
      EXPECT_EQ(jobs[i]->out->tokens, cold[i]) << i;
      const JobResult& r = *jobs[i]->out->result;
      computed += r.prompt_tokens - r.cache_read_tokens;
      if (i == 0 || !with_cache) {
        EXPECT_EQ(r.cache_read_tokens, 0) << i;
      } else {
        EXPECT_GE(r.cache_read_tokens, 384) << i;  // the shared text's whole 128-token blocks
      }
    }
    ASSERT_TRUE(gone.Wait());
    ASSERT_TRUE(gone.out->result.ok());
    EXPECT_EQ(gone.out->result->stop, StopCause::kCancelled);
    EXPECT_TRUE(gone.out->tokens.empty());
    if (with_cache) {
      EXPECT_LT(computed, 2 * n);
    }
    WaitIdle(e);
  }
}

// An exception inside one request's callbacks fails that request only: the others running with
// it finish with their normal output, the engine serves the next request, and no slot leaks.
TEST_F(EngineTest, ExceptionInOneRequestFailsOnlyThatRequest) {
  Engine engine(*model_, Options(4, 4));
  TestJob alone(Prompt("The capital of France is"), 12);
  ASSERT_EQ(engine.Submit(alone.job).admit, sched::Admit::kQueued);
  ASSERT_TRUE(alone.Wait());
  ASSERT_TRUE(alone.out->result.ok());

  TestJob bad(Prompt("Tell me about the sea."), 40);
  auto inner = bad.job->on_token;
  bad.job->on_token = [inner, seen = bad.seen](TokenId t) -> bool {
    if (seen->load() == 3) throw std::runtime_error("callback failed");
    return inner(t);
  };
  TestJob good(Prompt("The capital of France is"), 12);
  ASSERT_EQ(engine.Submit(bad.job).admit, sched::Admit::kQueued);
  ASSERT_EQ(engine.Submit(good.job).admit, sched::Admit::kQueued);
  ASSERT_TRUE(bad.Wait());
  ASSERT_TRUE(good.Wait());
  ASSERT_FALSE(bad.out->result.ok());
  EXPECT_NE(bad.out->result.status().message().find("callback failed"), std::string::npos)
      << bad.out->result.status().message();
  ASSERT_TRUE(good.out->result.ok()) << good.out->result.status().message();
  EXPECT_EQ(good.out->tokens, alone.out->tokens);  // unaffected by its failing neighbour
  WaitIdle(engine);
  TestJob after(Prompt("The capital of France is"), 12);
  ASSERT_EQ(engine.Submit(after.job).admit, sched::Admit::kQueued);
  ASSERT_TRUE(after.Wait());
  ASSERT_TRUE(after.out->result.ok());
  EXPECT_EQ(after.out->tokens, alone.out->tokens);
}

// Shutdown: Drain refuses new requests and waits; AbortAll ends what is left with kUnavailable.
TEST_F(EngineTest, DrainThenAbortEndsRemainingJobsWithAnError) {
  Engine engine(*model_, Options(1, 4));
  TestJob running(Prompt("Count from 1 to 500."), 400);
  TestJob queued(Prompt("Count from 1 to 500."), 400);
  ASSERT_EQ(engine.Submit(running.job).admit, sched::Admit::kQueued);
  ASSERT_EQ(engine.Submit(queued.job).admit, sched::Admit::kQueued);
  while (running.seen->load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(engine.Drain(std::chrono::milliseconds(50)));  // 400 tokens do not fit in 50 ms
  EXPECT_EQ(engine.Status().state, EngineState::kDraining);
  TestJob late(Prompt("hi"), 4);
  EXPECT_EQ(engine.Submit(late.job).admit, sched::Admit::kOverloaded);
  engine.AbortAll("shutting down");
  ASSERT_TRUE(running.Wait());
  ASSERT_TRUE(queued.Wait());
  for (TestJob* j : {&running, &queued}) {
    ASSERT_FALSE(j->out->result.ok());
    EXPECT_EQ(j->out->result.status().code(), ErrorCode::kUnavailable);
  }
  EXPECT_TRUE(engine.Drain(std::chrono::milliseconds(1000)));
}

}  // namespace
}  // namespace mr::server
