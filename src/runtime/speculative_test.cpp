// Speculative decoding: the acceptance rule against exact joint distributions recorded from the
// real SmolLM2 model (chi-square over 200,000 draws, and the same test failing for deliberately
// wrong rules), drafters, the cost controller, and greedy bit-identity of the Generator with
// every drafter and k on real models (the Qwen draft-model pair when pulled).
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "model/test_models.h"
#include "runtime/generator.h"

namespace mr {
namespace {

// ---- The rule on hand-made distributions ----

std::vector<Candidate> Dist(std::initializer_list<Candidate> c) {
  return c;
}

TEST(VerifyDraft, GreedyAcceptsWhileDraftIsTheArgmax) {
  // p one-hot per position (greedy): 5, 7, 9, then bonus 11.
  std::vector<std::vector<Candidate>> p = {Dist({{5, 1}}), Dist({{7, 1}}), Dist({{9, 1}}), Dist({{11, 1}})};
  auto fn = [&](int i) -> const std::vector<Candidate>& { return p[i]; };
  Rng rng(1);
  VerifyScratch s;
  std::vector<TokenId> d = {5, 7, 8};
  VerifyOutcome v = VerifyDraft(d, {}, fn, rng, &s);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 9);  // the correction is the argmax
  d = {5, 7, 9};
  v = VerifyDraft(d, {}, fn, rng, &s);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 11);  // bonus
  d = {4};
  v = VerifyDraft(d, {}, fn, rng, &s);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 5);
}

TEST(VerifyDraft, RejectedDeterministicDraftIsNeverResampled) {
  std::vector<std::vector<Candidate>> p = {Dist({{1, 0.5f}, {2, 0.3f}, {3, 0.2f}}), Dist({{4, 1}})};
  auto fn = [&](int i) -> const std::vector<Candidate>& { return p[i]; };
  Rng rng(3);
  VerifyScratch s;
  std::vector<TokenId> d = {1};
  int accepted = 0, n = 20000;
  for (int i = 0; i < n; ++i) {
    VerifyOutcome v = VerifyDraft(d, {}, fn, rng, &s);
    if (v.accepted == 1) {
      ++accepted;
      EXPECT_EQ(v.next, 4);
    } else
      EXPECT_NE(v.next, 1);
  }
  EXPECT_NEAR(accepted / double(n), 0.5, 0.02);
}

// ---- Distribution test on recorded real-model distributions ----

// Chi-square critical value at upper tail z (3.09 ~ 0.001) by Wilson–Hilferty.
double ChiSquareCritical(int df, double z = 3.09) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

class RecordedDists : public ::testing::Test {
 protected:
  // p: T 0.8, top-k 10, top-p 0.95. q (the "draft"): T 1.5, top-k 6 — flatter, and missing
  // p's tokens 7..10 while possibly holding tokens p cut: every branch of the rule runs.
  static constexpr SamplingParams kP = {0.8f, 10, 0.95f, 0.0f};
  static constexpr SamplingParams kQ = {1.5f, 6, 1.0f, 0.0f};

  static void SetUpTestSuite() {
    auto m = LoadPulledModel(kSmolLM2File);
    ASSERT_TRUE(m.ok()) << m.status().message();
    if (*m == nullptr) return;
    Model& model = **m;
    const int64_t nv = model.config().n_vocab;
    const auto ctx = model.tokenizer().Encode("My favourite animal is the", true, false);
    KvCache kv = model.NewKvCache(64);
    std::vector<float> logits(nv);
    ASSERT_TRUE(model.Forward(kv, ctx.data(), static_cast<int64_t>(ctx.size()), false, logits.data()).ok());
    Sampler sp(kP), sq(kQ);
    sp.Distribution(logits.data(), nv, &p0_);
    sq.Distribution(logits.data(), nv, &q0_);
    // Second-position distributions for every first token either side can produce.
    std::vector<TokenId> firsts;
    for (const Candidate& c : p0_) firsts.push_back(c.id);
    for (const Candidate& c : q0_) firsts.push_back(c.id);
    const int64_t base = kv.n_past;
    for (TokenId x : firsts) {
      if (p1_.count(x)) continue;
      kv.n_past = base;
      ASSERT_TRUE(model.Forward(kv, &x, 1, false, logits.data()).ok());
      sp.Distribution(logits.data(), nv, &p1_[x]);
      sq.Distribution(logits.data(), nv, &q1_[x]);
    }
    ready_ = true;
  }
  void SetUp() override {
    if (!ready_) GTEST_SKIP() << "smollm2-135m-instruct not pulled";
  }

  enum class Rule { kExact, kResampleFromP, kUntruncatedTarget };

  // Chi-square of the joint of the next two tokens, speculative (k = 2 drafts from q, or the
  // deterministic drafts `fixed`) against the exact p0(x1)·p1(x2|x1). Returns (statistic, df).
  std::pair<double, int> JointChiSquare(int n_draws, Rule rule, const std::vector<TokenId>& fixed, uint64_t seed) {
    Rng rng(seed);
    VerifyScratch s;
    std::map<std::pair<TokenId, TokenId>, int64_t> count;
    std::vector<std::vector<Candidate>> q(2);
    std::vector<TokenId> d(2);
    std::vector<Candidate> resample_p;
    for (int n = 0; n < n_draws; ++n) {
      const bool sampled = fixed.empty();
      if (sampled) {
        q[0] = q0_;
        d[0] = Sampler::Draw(q[0], rng);
        q[1] = q1_.at(d[0]);
        d[1] = Sampler::Draw(q[1], rng);
      } else {
        d = fixed;
      }
      auto p = [&](int i) -> const std::vector<Candidate>& {
        const std::vector<Candidate>& t = i == 0 ? p0_ : i == 1 ? p1_.at(d[0]) : p0_;  // i == 2: bonus, unscored
        if (rule != Rule::kUntruncatedTarget) return t;
        // Wrong: ignore truncation — p is the tempered softmax over what q holds plus p's set.
        resample_p = t;
        for (const Candidate& c : (i == 0 ? q0_ : q1_.count(d[0]) ? q1_.at(d[0]) : q0_))
          if (ProbOf(resample_p, c.id) == 0.0f) resample_p.push_back({c.id, 0.05f});
        return resample_p;
      };
      VerifyOutcome v = VerifyDraft(
          d, sampled ? std::span<const std::vector<Candidate>>(q) : std::span<const std::vector<Candidate>>(), p, rng,
          &s);
      if (rule == Rule::kResampleFromP && v.accepted < 2) v.next = Sampler::Draw(p(v.accepted), rng);  // wrong residual
      TokenId x1, x2;
      if (v.accepted == 0) {
        x1 = v.next;
        x2 = Sampler::Draw(p1_.at(x1), rng);  // the following plain step
      } else {
        x1 = d[0];
        x2 = v.accepted == 1 ? v.next : d[1];
      }
      ++count[{x1, x2}];
    }
    // Expected counts; cells under 5 expected pooled into one.
    double chi2 = 0, pooled_e = 0;
    int64_t pooled_o = 0, seen = 0;
    int cells = 0;
    for (const Candidate& a : p0_) {
      for (const Candidate& b : p1_.at(a.id)) {
        const double e = static_cast<double>(a.p) * b.p * n_draws;
        auto it = count.find({a.id, b.id});
        const int64_t o = it == count.end() ? 0 : it->second;
        seen += o;
        if (e < 5) {
          pooled_e += e;
          pooled_o += o;
          continue;
        }
        chi2 += (o - e) * (o - e) / e;
        ++cells;
      }
    }
    pooled_o += n_draws - seen;  // pairs the target cannot produce count against the pool
    if (pooled_e > 0) {
      chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1.0);
      ++cells;
    }
    return {chi2, cells - 1};
  }

  static std::vector<Candidate> p0_, q0_;
  static std::map<TokenId, std::vector<Candidate>> p1_, q1_;
  static bool ready_;
};
std::vector<Candidate> RecordedDists::p0_, RecordedDists::q0_;
std::map<TokenId, std::vector<Candidate>> RecordedDists::p1_, RecordedDists::q1_;
bool RecordedDists::ready_ = false;

TEST_F(RecordedDists, SampledDraftsKeepTheJointOfTheNextTwoTokens) {
  // The recorded distributions really differ, so every branch runs.
  ASSERT_GE(p0_.size(), 3u);
  bool q_lacks_p = false, p_lacks_q = false;
  for (const Candidate& c : p0_) q_lacks_p |= ProbOf(q0_, c.id) == 0.0f;
  for (const Candidate& c : q0_) p_lacks_q |= ProbOf(p0_, c.id) == 0.0f;
  EXPECT_TRUE(q_lacks_p || p_lacks_q);
  const auto [chi2, df] = JointChiSquare(200000, Rule::kExact, {}, 11);
  EXPECT_LT(chi2, ChiSquareCritical(df)) << "df " << df;
  std::printf("[spec] sampled drafts: chi2 %.1f, df %d, critical %.1f\n", chi2, df, ChiSquareCritical(df));
}

TEST_F(RecordedDists, DeterministicDraftsKeepTheJointOfTheNextTwoTokens) {
  // Drafts: p's second-ranked token, then the most likely follower of it (n-gram-like guesses).
  const TokenId a = p0_[1].id;
  const TokenId b = p1_.at(a)[0].id;
  const auto [chi2, df] = JointChiSquare(200000, Rule::kExact, {a, b}, 12);
  EXPECT_LT(chi2, ChiSquareCritical(df)) << "df " << df;
}

TEST_F(RecordedDists, WrongRulesFailTheSameTest) {
  // Test of the test: resampling from p instead of the residual, or verifying against the
  // untruncated distribution, must be detected by the statistic above.
  auto [c1, df1] = JointChiSquare(200000, Rule::kResampleFromP, {}, 11);
  EXPECT_GT(c1, ChiSquareCritical(df1)) << "resample-from-p not detected";
  auto [c2, df2] = JointChiSquare(200000, Rule::kUntruncatedTarget, {}, 11);
  EXPECT_GT(c2, ChiSquareCritical(df2)) << "missing truncation not detected";
  const TokenId a = p0_[1].id;
  auto [c3, df3] = JointChiSquare(200000, Rule::kResampleFromP, {a, p1_.at(a)[0].id}, 12);
  EXPECT_GT(c3, ChiSquareCritical(df3)) << "resample-from-p with deterministic drafts not detected";
  std::printf("[spec] wrong rules: chi2 %.0f (df %d), %.0f (df %d), %.0f (df %d)\n", c1, df1, c2, df2, c3, df3);
}

// ---- Drafters and the controller ----

TEST(NgramDrafter, ProposesWhatFollowedTheLatestMatchOfTheLongestSuffix) {
  NgramDrafter ng(2, 4);
  Rng rng(1);
  Draft d;
  std::vector<TokenId> ctx = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3};
  // Suffix "1 2 3": the latest earlier match is followed by 7 8 1 ...
  ASSERT_TRUE(ng.Propose(ctx, 3, {}, rng, &d).ok());
  EXPECT_EQ(d.tokens, (std::vector<TokenId>{7, 8, 1}));
  EXPECT_FALSE(d.sampled);
  ctx = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(ng.Propose(ctx, 3, {}, rng, &d).ok());
  EXPECT_TRUE(d.tokens.empty());
  ctx = {5, 6, 7, 5, 6};  // continuation clipped by the context end
  ASSERT_TRUE(ng.Propose(ctx, 7, {}, rng, &d).ok());
  EXPECT_EQ(d.tokens, (std::vector<TokenId>{7, 5, 6}));
}

TEST(CostController, PicksKFromMeasuredCostsFallsBackAndProbes) {
  CostController c(7, true);
  EXPECT_EQ(c.Choose(), 7);  // calibrating
  // Verify of r rows costs 10 + 2(r-1) ms, a plain step 10 ms, drafting free.
  for (int r = 1; r <= 8; ++r) c.RecordForwardCost(r, 0.010 + 0.002 * (r - 1));
  for (int i = 0; i < 50; ++i) c.RecordAcceptance(7, 7);  // everything accepted
  EXPECT_EQ(c.Choose(), 7);
  // Nothing accepted: plain decoding, with a probe at k_max now and then.
  for (int i = 0; i < 100; ++i) c.RecordAcceptance(7, 0);
  int plain = 0, probes = 0;
  for (int i = 0; i < 64; ++i) (c.Choose() == 0 ? plain : probes)++;
  EXPECT_GE(plain, 60);
  EXPECT_GE(probes, 1);
  // Half accepted per position with expensive rows: a short draft is best.
  CostController m(7, true);
  // Position 1 accepted half the time, later ones always. Rows cost 10 + 1(r-1) ms: drafting
  // pays; at 10 + 6(r-1) ms it does not (1 + k/2 tokens for 10 + 6k ms < 1 token per 10 ms).
  for (int r = 1; r <= 8; ++r) m.RecordForwardCost(r, 0.010 + 0.001 * (r - 1));
  for (int i = 0; i < 200; ++i) m.RecordAcceptance(7, i % 2 == 0 ? 0 : 7);
  EXPECT_NEAR(m.acceptance(1), 0.5, 0.06);
  const int k = m.Choose();
  EXPECT_GT(k, 0);
  EXPECT_GT(m.expected_rate(k), m.expected_rate(0));
  for (int i = 0; i < 50; ++i)
    for (int r = 1; r <= 8; ++r) m.RecordForwardCost(r, 0.010 + 0.006 * (r - 1));
  EXPECT_EQ(m.Choose(), 0);
  EXPECT_EQ(CostController(3, false).Choose(), 3);  // fixed k
}

// In a batch a draft row lengthens every sequence's step: drafting that pays for one sequence
// alone is declined when the other sequences' tokens are counted at the batch's margin, and
// taken when acceptance is high enough to pay for the whole batch's longer step.
TEST(CostController, PricesDraftsAtTheBatchMargin) {
  auto make = [](double accept) {
    CostController c(7, true);
    // A step of r rows (all sequences together) costs 10 + 1.5 r ms; drafting is free.
    for (int r = 1; r <= 16; ++r) c.RecordForwardCost(r, 0.010 + 0.0015 * r);
    // Accepted at an even spread of steps (the figures are moving averages).
    for (int i = 0; i < 400; ++i) c.RecordAcceptance(1, (i * 9) % 20 < 20 * accept ? 1 : 0);
    return c;
  };
  // 25 % acceptance. Alone: k = 1 gives 1.25 tokens per 13 ms against 1 per 11.5 ms.
  CostController alone = make(0.25);
  EXPECT_NEAR(alone.acceptance(1), 0.25, 0.1);
  EXPECT_GT(alone.Choose(), 0);
  // Beside 3 decoding sequences (3 rows, 3 tokens): 4.25 tokens per 17.5 ms against 4 per 16.
  CostController batched = make(0.25);
  batched.SetBatch(3, 3.0);
  EXPECT_GT(batched.expected_rate(0), batched.expected_rate(1));
  EXPECT_EQ(batched.Choose(), 0);
  // Everything accepted: drafting pays for the batch too.
  CostController sure = make(1.0);
  sure.SetBatch(3, 3.0);
  EXPECT_GT(sure.Choose(), 0);
  // Back alone, the first figures apply again.
  batched.SetBatch(0, 0.0);
  EXPECT_GT(batched.expected_rate(1), batched.expected_rate(0));
}

// ---- Generator: greedy speculative output is the plain output ----

class SpecGeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadPulledModel(kSmolLM2File);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "smollm2-135m-instruct not pulled";
  }
  static Model* model_;
};
Model* SpecGeneratorTest::model_ = nullptr;

std::vector<TokenId> Collect(Generator& gen, const std::vector<TokenId>& prompt, const GenerateParams& p,
                             GenerateStats* stats = nullptr) {
  std::vector<TokenId> out;
  auto r = gen.Generate(prompt, p, [&](TokenId t) {
    out.push_back(t);
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok() && stats) *stats = *r;
  return out;
}

GenerateParams Greedy(int64_t n, Drafter* d, int k, bool adaptive) {
  GenerateParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = n;
  p.spec.drafter = d;
  p.spec.draft_tokens = k;
  p.spec.adaptive = adaptive;
  return p;
}

const char* kPrompts[] = {
    "List the days of the week: Monday, Tuesday,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8,",
};

TEST_F(SpecGeneratorTest, GreedyNgramAndSelfDraftMatchPlainForEveryK) {
  Generator gen(*model_, 512);
  NgramDrafter ngram;
  auto self = ModelDrafter::Create(*model_, *model_, 512);  // same model as its own drafter
  ASSERT_TRUE(self.ok());
  ChainDrafter chain({&ngram, self.value().get()});
  int64_t accepted = 0;
  for (const char* text : kPrompts) {
    const auto prompt = model_->tokenizer().Encode(text, true, false);
    gen.ResetCache();
    const auto want = Collect(gen, prompt, Greedy(16, nullptr, 0, false));
    ASSERT_GE(want.size(), 8u) << text;  // may stop early at end-of-generation
    for (Drafter* d : std::initializer_list<Drafter*>{&ngram, self.value().get(), &chain}) {
      for (auto [k, adaptive] : {std::pair{3, false}, std::pair{7, false}, std::pair{7, true}}) {
        // Keep the test short: every k and the controller with n-gram, one k each for the others.
        if (d != &ngram && (adaptive || (k == 3) != (d == self.value().get()))) continue;
        gen.ResetCache();
        GenerateStats st;
        EXPECT_EQ(Collect(gen, prompt, Greedy(16, d, k, adaptive), &st), want)
            << d->name() << " k=" << k << (adaptive ? " auto" : "") << " prompt: " << text;
        accepted += st.accepted;
        if (d == self.value().get() && !adaptive) {
          EXPECT_EQ(st.accepted, st.drafted) << "a model agrees with itself";
        }
      }
    }
  }
  EXPECT_GT(accepted, 30);
}

TEST_F(SpecGeneratorTest, CallbackStopMidRunRollsBackTheCache) {
  const auto prompt = model_->tokenizer().Encode(kPrompts[3], true, false);
  Generator gen(*model_, 512);
  auto self = ModelDrafter::Create(*model_, *model_, 512);
  ASSERT_TRUE(self.ok());
  const auto want = Collect(gen, prompt, Greedy(30, nullptr, 0, false));
  ASSERT_GE(want.size(), 12u);
  gen.ResetCache();
  // Self-drafting accepts every draft: stopping after 6 tokens lands inside an accepted run.
  std::vector<TokenId> got;
  auto r = gen.Generate(prompt, Greedy(30, self.value().get(), 7, false), [&](TokenId t) {
    got.push_back(t);
    return got.size() < 6;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, StopCause::kCallback);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got, std::vector<TokenId>(want.begin(), want.begin() + 6));
  // The cache holds the prompt and the emitted tokens but the last one (as a plain step would).
  std::vector<TokenId> expect_cache = prompt;
  expect_cache.insert(expect_cache.end(), got.begin(), got.end() - 1);
  EXPECT_EQ(gen.cached_tokens(), expect_cache);
  // Continuing from there reuses the cache and still matches the plain output.
  std::vector<TokenId> longer = prompt;
  longer.insert(longer.end(), got.begin(), got.end());
  const auto rest = Collect(gen, longer, Greedy(10, self.value().get(), 3, false));
  EXPECT_EQ(rest, std::vector<TokenId>(want.begin() + 6, want.begin() + 16));
  // max_tokens inside an accepted run: exactly max_tokens tokens.
  gen.ResetCache();
  EXPECT_EQ(Collect(gen, prompt, Greedy(5, self.value().get(), 7, false)),
            std::vector<TokenId>(want.begin(), want.begin() + 5));
}

TEST_F(SpecGeneratorTest, SampledSpeculationRunsAndWarmUpCalibrates) {
  Generator gen(*model_, 512);
  NgramDrafter ngram;
  SpecParams spec;
  spec.drafter = &ngram;
  auto w = gen.WarmUp(spec, 24);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE(gen.cached_tokens().empty());
  GenerateParams p;
  p.sampling = {1.0f, 64, 0.95f, 0.0f};
  p.max_tokens = 40;
  p.spec = spec;
  GenerateStats st;
  const auto out = Collect(gen, model_->tokenizer().Encode(kPrompts[1], true, false), p, &st);
  EXPECT_EQ(static_cast<int64_t>(out.size()), st.generated);
  // Every emitted token comes from the first sample, a plain step, or a verify (accepted + 1);
  // k is clamped to the token budget, so without an early end-of-generation nothing is cut.
  EXPECT_GT(st.plain_steps + st.spec_steps, 0);
  if (st.stop == StopCause::kMaxTokens) {
    EXPECT_EQ(st.generated, 1 + st.plain_steps + st.spec_steps + st.accepted);
  }
  EXPECT_LE(st.accepted, st.drafted);
}

// OpenAI's logit bias and penalties (and vLLM's repetition_penalty), greedy: a plain loop that applies them by hand
// to the model's logits (an independent implementation) gives the tokens the Generator emits,
// without a drafter and with every drafter (a verify row counts the drafts before it).
std::vector<TokenId> GreedyAdjustedByHand(Model& m, const std::vector<TokenId>& prompt, int n, const LogitAdjust& a) {
  KvCache kv = m.NewKvCache(512);
  std::vector<float> logits(m.config().n_vocab);
  EXPECT_TRUE(m.Forward(kv, prompt.data(), static_cast<int64_t>(prompt.size()), false, logits.data()).ok());
  std::map<TokenId, int> seen;
  std::vector<TokenId> out;
  while (static_cast<int>(out.size()) < n) {
    std::vector<float> l = logits;
    for (const auto& [t, b] : a.bias) l[t] += b;
    std::vector<TokenId> context = prompt;
    context.insert(context.end(), out.begin(), out.end());
    std::sort(context.begin(), context.end());
    context.erase(std::unique(context.begin(), context.end()), context.end());
    for (const TokenId t : context) l[t] = l[t] > 0 ? l[t] / a.repetition_penalty : l[t] * a.repetition_penalty;
    for (const auto& [t, c] : seen) l[t] -= a.frequency_penalty * c + (c > 0 ? a.presence_penalty : 0.0f);
    const TokenId t = static_cast<TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
    if (m.tokenizer().IsEndOfGeneration(t)) break;
    out.push_back(t);
    ++seen[t];
    EXPECT_TRUE(m.Forward(kv, &t, 1, false, logits.data()).ok());
  }
  return out;
}

TEST_F(SpecGeneratorTest, LogitBiasAndPenaltiesMatchAPlainLoopWithEveryDrafter) {
  Generator gen(*model_, 512);
  NgramDrafter ngram;
  auto self = ModelDrafter::Create(*model_, *model_, 512);
  ASSERT_TRUE(self.ok());
  for (const char* text : {kPrompts[0], kPrompts[3]}) {
    const auto prompt = model_->tokenizer().Encode(text, true, false);
    gen.ResetCache();
    const auto plain = Collect(gen, prompt, Greedy(20, nullptr, 0, false));
    ASSERT_FALSE(plain.empty());
    LogitAdjust penalties;
    penalties.frequency_penalty = 1.5f;
    penalties.presence_penalty = 0.5f;
    penalties.bias = {{plain[0], -100.0f}};  // the unadjusted first choice is out
    LogitAdjust repetition;                  // prompt tokens count too
    repetition.repetition_penalty = 1.8f;
    for (const LogitAdjust& a : {penalties, repetition}) {
      const auto want = GreedyAdjustedByHand(*model_, prompt, 20, a);
      ASSERT_GE(want.size(), 10u) << text;
      if (!a.bias.empty()) {
        EXPECT_NE(want[0], plain[0]);
      }
      EXPECT_NE(std::vector<TokenId>(want.begin(), want.begin() + 10),
                std::vector<TokenId>(plain.begin(), plain.begin() + 10))
          << "the adjustments change the output";
      for (Drafter* d : std::initializer_list<Drafter*>{nullptr, &ngram, self.value().get()}) {
        for (int k : {3, 7}) {
          if (d == nullptr && k == 7) continue;
          gen.ResetCache();
          GenerateParams p = Greedy(20, d, d == nullptr ? 0 : k, false);
          p.adjust = a;
          GenerateStats st;
          EXPECT_EQ(Collect(gen, prompt, p, &st), want) << (d ? d->name() : "plain") << " k=" << k << ": " << text;
          if (d == self.value().get()) {
            EXPECT_GT(st.drafted, st.accepted) << "penalties reject the model's own drafts";
          }
        }
      }
    }
  }
}

// Prompt log-probabilities: every prompt token after the first gets the log-softmax of the row
// before it, across prefill chunks (more than kPromptLogprobRows tokens), and again when the
// same prompt comes back (its KV would otherwise be reused and its rows never computed).
TEST_F(SpecGeneratorTest, PromptLogprobsAreEveryPromptRowsLogSoftmax) {
  Generator gen(*model_, 512);
  std::string text;
  for (int i = 0; i < 4; ++i) text += std::string(kPrompts[i]) + " ";
  const auto prompt = model_->tokenizer().Encode(text, true, false);
  ASSERT_GT(static_cast<int64_t>(prompt.size()), kPromptLogprobRows + 8);
  const int64_t n_vocab = model_->config().n_vocab;
  KvCache kv = model_->NewKvCache(512);
  std::vector<float> logits(prompt.size() * static_cast<size_t>(n_vocab));
  ASSERT_TRUE(model_->Forward(kv, prompt.data(), static_cast<int64_t>(prompt.size()), true, logits.data()).ok());
  for (int round = 0; round < 2; ++round) {
    GenerateParams p = Greedy(2, nullptr, 0, false);
    p.prompt_logprobs = 3;
    GenerateStats st;
    Collect(gen, prompt, p, &st);
    EXPECT_EQ(st.reused_tokens, 0) << "round " << round;
    const std::vector<TokenLogprob>& lps = gen.prompt_logprobs();
    ASSERT_EQ(lps.size(), prompt.size()) << "round " << round;
    EXPECT_EQ(lps[0].id, prompt[0]);
    EXPECT_TRUE(std::isnan(lps[0].logprob) && lps[0].top.empty());
    for (size_t j = 1; j < prompt.size(); ++j) {
      const float* row = logits.data() + (j - 1) * static_cast<size_t>(n_vocab);
      double mx = row[0], z = 0.0;
      for (int64_t i = 1; i < n_vocab; ++i) mx = std::max<double>(mx, row[i]);
      for (int64_t i = 0; i < n_vocab; ++i) z += std::exp(row[i] - mx);
      EXPECT_EQ(lps[j].id, prompt[j]);
      EXPECT_NEAR(lps[j].logprob, row[prompt[j]] - mx - std::log(z), 0.05) << "prompt token " << j;
      ASSERT_EQ(lps[j].top.size(), 3u);
      EXPECT_GE(lps[j].top[0].second, lps[j].logprob);
    }
  }
}

// logprobs: each emitted token's value is the log-softmax of its row, the same as a separate
// all-rows pass over prompt + output computes (within the fast path's rounding between row
// counts), whether it came from a plain step or a verify; the alternatives are sorted and
// include the token when it is the row's most likely one.
TEST_F(SpecGeneratorTest, LogprobsAreTheRowsLogSoftmaxPlainAndSpeculative) {
  Generator gen(*model_, 512);
  NgramDrafter ngram;
  const auto prompt = model_->tokenizer().Encode(kPrompts[3], true, false);
  const int64_t n_vocab = model_->config().n_vocab;
  for (Drafter* d : std::initializer_list<Drafter*>{nullptr, &ngram}) {
    gen.ResetCache();
    GenerateParams p = Greedy(16, d, d == nullptr ? 0 : 7, false);
    p.sampling = {1.0f, 64, 0.95f, 0.0f};
    p.seeded = true;
    p.seed = 7;
    p.logprobs = 5;
    std::vector<TokenId> out;
    std::vector<TokenLogprob> lps;
    GenerateStats st;
    auto r = gen.Generate(prompt, p, [&](TokenId t) {
      out.push_back(t);
      const TokenLogprob* lp = gen.token_logprob();
      EXPECT_NE(lp, nullptr);
      if (lp != nullptr) lps.push_back(*lp);
      return true;
    });
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(lps.size(), out.size());
    ASSERT_GE(out.size(), 4u);
    if (d != nullptr) {
      EXPECT_GT(r->drafted, 0);
    }
    std::vector<TokenId> all = prompt;
    all.insert(all.end(), out.begin(), out.end() - 1);
    KvCache kv = model_->NewKvCache(512);
    std::vector<float> logits(static_cast<size_t>(all.size()) * n_vocab);
    ASSERT_TRUE(model_->Forward(kv, all.data(), static_cast<int64_t>(all.size()), true, logits.data()).ok());
    for (size_t j = 0; j < out.size(); ++j) {
      const float* row = logits.data() + (prompt.size() - 1 + j) * n_vocab;
      double mx = row[0], z = 0.0;
      for (int64_t i = 1; i < n_vocab; ++i) mx = std::max<double>(mx, row[i]);
      for (int64_t i = 0; i < n_vocab; ++i) z += std::exp(row[i] - mx);
      const double want = row[out[j]] - mx - std::log(z);
      EXPECT_EQ(lps[j].id, out[j]);
      EXPECT_NEAR(lps[j].logprob, want, 0.05) << "token " << j << (d ? " (n-gram)" : "");
      EXPECT_LE(lps[j].logprob, 0.0f);
      ASSERT_EQ(lps[j].top.size(), 5u);
      for (size_t i = 1; i < 5; ++i) EXPECT_GE(lps[j].top[i - 1].second, lps[j].top[i].second);
      EXPECT_GE(lps[j].top[0].second, lps[j].logprob);
      double mass = 0.0;
      for (const auto& [t, l] : lps[j].top) mass += std::exp(l);
      EXPECT_LE(mass, 1.0 + 1e-4);
    }
  }
}

TEST(Logprobs, ComputeLogprobIsTheLogSoftmaxWithSortedAlternatives) {
  const std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -100.0f};
  TokenLogprob lp;
  ComputeLogprob(l.data(), 6, 4, 3, &lp);
  double z = 0.0;
  for (float x : l) z += std::exp(static_cast<double>(x));
  EXPECT_NEAR(lp.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // ties by id
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  ComputeLogprob(l.data(), 6, 5, 0, &lp);
  EXPECT_TRUE(lp.top.empty());
  EXPECT_NEAR(lp.logprob, -100.0 - std::log(z), 1e-4);
  ComputeLogprob(l.data(), 6, 0, 50, &lp);  // more than the vocabulary: all of it
  EXPECT_EQ(lp.top.size(), 6u);
  EXPECT_EQ(lp.top.back().first, 5);
}

TEST(SpecQwen, DraftModelGreedyMatchesPlain) {
  const std::string tpath = FindModelFile("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
  const std::string dpath = FindModelFile("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  if (tpath.empty() || dpath.empty()) GTEST_SKIP() << "qwen2.5-coder 1.5b / 0.5b not pulled";
  LoadOptions opts;
  opts.n_threads = 2;
  auto target = Model::Load(tpath, opts);
  auto draft = Model::Load(dpath, opts);
  ASSERT_TRUE(target.ok() && draft.ok());
  auto drafter = ModelDrafter::Create(*target.value(), *draft.value(), 256);
  ASSERT_TRUE(drafter.ok()) << drafter.status().message();
  Generator gen(*target.value(), 256);
  const auto prompt = target.value()->tokenizer().Encode("def is_prime(n):\n", false, false);
  const auto want = Collect(gen, prompt, Greedy(10, nullptr, 0, false));
  for (int k : {3, 7}) {
    gen.ResetCache();
    GenerateStats st;
    EXPECT_EQ(Collect(gen, prompt, Greedy(10, drafter.value().get(), k, false), &st), want) << "k=" << k;
    EXPECT_GT(st.accepted, 0);
  }
}

}  // namespace
}  // namespace mr
