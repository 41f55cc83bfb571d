// Sampler: the final distribution against values worked out by hand / independently, seeded
// determinism, and draw frequencies. Generator: greedy generation on the real SmolLM2 model
// against a plain Forward + argmax loop, prefix reuse, cancellation, limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "model/dequant.h"
#include "model/gguf.h"
#include "model/test_models.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"

namespace mr {
namespace {

// Softmax of logits/T in double precision, independent of the sampler's code.
std::vector<double> SoftmaxT(const std::vector<float>& l, double t) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= z;
  return p;
}

std::map<TokenId, float> AsMap(const std::vector<Candidate>& d) {
  std::map<TokenId, float> m;
  for (const Candidate& c : d) m[c.id] = c.p;
  return m;
}

TEST(Rng, SeededSequencesRepeatAndDiffer) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    EXPECT_NE(x, c.Next());
  }
  Rng u(7);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double v = u.Uniform();
    ASSERT_GE(v, 0.0);
    ASSERT_LT(v, 1.0);
    sum += v;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s({0.0f, 0, 1.0f, 0.0f});
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f};
  std::vector<Candidate> d;
  s.Distribution(l.data(), 4, &d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, 1);
  EXPECT_FLOAT_EQ(d[0].p, 1.0f);
}

TEST(Sampler, TemperatureOnlyKeepsEveryTokenWithSoftmaxProbabilities) {
  std::vector<float> l = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s({t, 0, 1.0f, 0.0f});
    std::vector<Candidate> d;
    s.Distribution(l.data(), 5, &d);
    ASSERT_EQ(d.size(), 5u);
    const auto want = SoftmaxT(l, t);
    for (const Candidate& c : d) EXPECT_NEAR(c.p, want[c.id], 1e-6) << "T=" << t << " id " << c.id;
  }
}

TEST(Sampler, TopKTopPMinPCutsAndRenormalize) {
  // Probabilities at T=1 of these logits, sorted: ids 2 (0.4223), 4 (0.2562), 0 (0.1554),
  // 3 (0.0942), 1 (0.0347), 5 (0.0372)... computed by SoftmaxT below, not by the sampler.
  std::vector<float> l = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.93f};
  const auto p = SoftmaxT(l, 1.0);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  ASSERT_EQ(order[0], 2);
  ASSERT_EQ(order[1], 4);
  ASSERT_EQ(order[2], 0);

  std::vector<Candidate> d;
  {  // top-k 2: ids 2 and 4, renormalized.
    Sampler s({1.0f, 2, 1.0f, 0.0f});
    s.Distribution(l.data(), 6, &d);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].id, 2);
    EXPECT_EQ(d[1].id, 4);
    EXPECT_NEAR(d[0].p, p[2] / (p[2] + p[4]), 1e-6);
  }
  {  // top-p just above p2+p4: the smallest prefix reaching it has three tokens.
    const float top_p = static_cast<float>(p[2] + p[4] + 0.01);
    Sampler s({1.0f, 0, top_p, 0.0f});
    s.Distribution(l.data(), 6, &d);
    ASSERT_EQ(d.size(), 3u);
    auto m = AsMap(d);
    EXPECT_NEAR(m[0], p[0] / (p[2] + p[4] + p[0]), 1e-6);
  }
  {  // min-p 0.3: keeps tokens with p >= 0.3 * p_max.
    Sampler s({1.0f, 0, 1.0f, 0.3f});
    s.Distribution(l.data(), 6, &d);
    size_t want = 0;
    for (double x : p) want += x >= 0.3 * p[2];
    EXPECT_EQ(d.size(), want);
    for (const Candidate& c : d) EXPECT_GE(p[c.id], 0.3 * p[2]);
  }
  {  // Temperature applies before the cuts: at T=0.25 id 2 alone holds > 0.85 of the mass.
    const auto p4 = SoftmaxT(l, 0.25);
    ASSERT_GT(p4[2], 0.85);
    Sampler s({0.25f, 0, 0.85f, 0.0f});
    s.Distribution(l.data(), 6, &d);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].id, 2);
  }
}

TEST(Sampler, TopPOverALargeVocabularyMatchesAFullSort) {
  // 50,000 logits: the growing partial sort must find the same cut as a full sort.
  Rng rng(1);
  std::vector<float> l(50000);
  for (float& x : l) x = static_cast<float>(rng.Uniform() * 12.0);
  const auto p = SoftmaxT(l, 0.8);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  double cum = 0;
  size_t want = 0;
  while (cum < 0.95) cum += p[order[want++]];
  Sampler s({0.8f, 0, 0.95f, 0.0f});
  std::vector<Candidate> d;
  s.Distribution(l.data(), static_cast<int64_t>(l.size()), &d);
  ASSERT_GT(want, 1000u);  // the cut needs several growth rounds
  // float accumulation may move the boundary by a token.
  EXPECT_NEAR(static_cast<double>(d.size()), static_cast<double>(want), 2.0);
  for (size_t i = 0; i + 2 < std::min(d.size(), want); ++i) ASSERT_EQ(d[i].id, order[i]);
}

TEST(Sampler, DrawFrequenciesFollowTheDistribution) {
  std::vector<float> l = {1.0f, 0.0f, 2.0f, -1.0f};
  Sampler s({1.0f, 3, 1.0f, 0.0f});
  std::vector<Candidate> d;
  s.Distribution(l.data(), 4, &d);
  Rng rng(123);
  std::map<TokenId, int> count;
  const int n = 200000;
  for (int i = 0; i < n; ++i) ++count[s.Sample(l.data(), 4, rng)];
  EXPECT_EQ(count.count(3), 0u);  // cut by top-k
  // Chi-square with 2 degrees of freedom; 13.8 is the 0.999 quantile.
  double chi2 = 0;
  for (const Candidate& c : d) {
    const double e = c.p * n;
    chi2 += (count[c.id] - e) * (count[c.id] - e) / e;
  }
  EXPECT_LT(chi2, 13.8);
}

class GeneratorTest : public ::testing::Test {
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
  static std::vector<TokenId> Greedy(const std::vector<TokenId>& prompt, int n) {
    KvCache kv = model_->NewKvCache(512);
    std::vector<float> logits(model_->config().n_vocab);
    EXPECT_TRUE(model_->Forward(kv, prompt.data(), static_cast<int64_t>(prompt.size()), false, logits.data()).ok());
    std::vector<TokenId> out;
    while (static_cast<int>(out.size()) < n) {
      const TokenId t = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (model_->tokenizer().IsEndOfGeneration(t)) break;
      out.push_back(t);
      EXPECT_TRUE(model_->Forward(kv, &t, 1, false, logits.data()).ok());
    }
    return out;
  }
  static Model* model_;
};
Model* GeneratorTest::model_ = nullptr;

GenerateParams GreedyParams(int64_t max_tokens) {
  GenerateParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.prefill_chunk = 7;  // several chunks, odd size
  return p;
}

// max_tokens 0 (Anthropic's cache warming): the prompt is evaluated and kept, nothing is
// sampled or emitted, and a follow-up with the same prompt reuses all of it but the last token.
// The infill filter (sampler.h), each case's outcome worked out by hand from the rule.
TEST_F(GeneratorTest, InfillFilterFollowsLlamaCppsRule) {
  const Tokenizer& tok = model_->tokenizer();
  auto id = [&](const char* piece) {
    const TokenId t = tok.Find(piece);
    EXPECT_GE(t, 0) << piece;
    EXPECT_EQ(tok.TokenToPiece(t, false), piece);
    return t;
  };
  const TokenId eos = tok.eos_id(), ret = id("ret"), retn = id("return"), x = id("x"), y = id("y");
  const TokenId cat = id("cat"), dog = id("dog"), fish = id("fish");
  ASSERT_GE(eos, 0);
  ASSERT_TRUE(tok.IsEndOfGeneration(eos));
  auto run = [&](std::vector<Candidate> c) {
    InfillFilter(tok, &c);
    std::map<TokenId, float> m;
    for (const Candidate& k : c) m[k.id] = k.p;
    return m;
  };
  using M = std::map<TokenId, float>;
  auto near = [](const M& got, const M& want) {
    if (got.size() != want.size()) return false;
    for (const auto& [t, p] : want)
      if (!got.count(t) || std::abs(got.at(t) - p) > 1e-5f) return false;
    return true;
  };
  // 3 x 0.2 x 3 = 1.8 > 0.8 of text: the end alone.
  EXPECT_TRUE(near(run({{eos, 0.2f}, {cat, 0.4f}, {dog, 0.4f}}), M{{eos, 1.0f}}));
  // "ret" is a prefix of "return": 0.3 joins 0.5; x and y (0.1) fall under 0.2.
  EXPECT_TRUE(near(run({{ret, 0.3f}, {retn, 0.5f}, {x, 0.1f}, {y, 0.1f}}), M{{retn, 1.0f}}));
  // The merge goes to the likelier spelling, whichever is the prefix; then 0.25 < 1/3 drops.
  EXPECT_TRUE(near(run({{ret, 0.6f}, {retn, 0.15f}, {cat, 0.25f}}), M{{ret, 1.0f}}));
  // Three text tokens over 0.2: the second cut is 1/4, so 0.22 drops and 0.5 : 0.28 remain.
  const M three = run({{cat, 0.5f}, {dog, 0.28f}, {fish, 0.22f}});
  ASSERT_EQ(three.size(), 2u);
  EXPECT_NEAR(three.at(cat), 0.5 / 0.78, 1e-6);
  EXPECT_NEAR(three.at(dog), 0.28 / 0.78, 1e-6);
  // No text token reaches 0.2: the end of turn alone.
  std::vector<Candidate> flat;
  for (const char* p : {"a", "b", "c", "d", "e", "f", "g"}) flat.push_back({id(p), 1.0f / 7});
  EXPECT_TRUE(near(run(flat), M{{tok.eot_id(), 1.0f}}));
  // Through the sampler: the filter runs after top-k, and greedy decoding skips it.
  std::vector<float> logits(static_cast<size_t>(tok.vocab_size()), -30.0f);
  logits[static_cast<size_t>(retn)] = std::log(0.45f);
  logits[static_cast<size_t>(ret)] = std::log(0.05f);
  logits[static_cast<size_t>(cat)] = std::log(0.3f);
  logits[static_cast<size_t>(dog)] = std::log(0.2f);
  SamplingParams sp;
  sp.top_k = 3;  // "ret" goes first (no merge), then dog (0.2 / 0.95 < 1/4): 0.45 : 0.3
  sp.infill = &tok;
  std::vector<Candidate> d;
  Sampler(sp).Distribution(logits.data(), tok.vocab_size(), &d);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].id, retn);
  EXPECT_NEAR(d[0].p, 0.6, 1e-5);
  EXPECT_EQ(d[1].id, cat);
  EXPECT_NEAR(d[1].p, 0.4, 1e-5);
  sp.temperature = 0.0f;
  Sampler(sp).Distribution(logits.data(), tok.vocab_size(), &d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, retn);
}

TEST_F(GeneratorTest, ZeroMaxTokensEvaluatesThePromptOnly) {
  const auto prompt = model_->tokenizer().Encode("The three primary colors are", true, false);
  Generator gen(*model_, 512);
  int emitted = 0;
  auto r = gen.Generate(prompt, GreedyParams(0), [&](TokenId) {
    ++emitted;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(emitted, 0);
  EXPECT_EQ(r->generated, 0);
  EXPECT_EQ(r->stop, StopCause::kMaxTokens);
  EXPECT_EQ(r->prompt_tokens, static_cast<int64_t>(prompt.size()));
  std::vector<TokenId> got;
  auto r2 = gen.Generate(prompt, GreedyParams(8), [&](TokenId t) {
    got.push_back(t);
    return true;
  });
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->reused_tokens, static_cast<int64_t>(prompt.size()) - 1);
  EXPECT_EQ(got, Greedy(prompt, 8));
}

// The hidden states Forward returns are the logits matmul's input: the output matrix's rows,
// dequantized from the file, times the last row's hidden state give its logits (up to the fast
// path's int8 activations). A Sequence embedding pools those rows over chunks of 7: the mean,
// the first or the last, as computed here from one Forward call; nothing is reused between two
// embeddings of one prompt, and nothing is sampled with max_tokens 0.
TEST_F(GeneratorTest, EmbeddingsPoolTheOutputNormedHiddenStates) {
  const ModelConfig& c = model_->config();
  const int64_t d = c.d_model;
  const auto prompt = model_->tokenizer().Encode(
      "The quick brown fox jumps over the lazy dog; then it sleeps in the sun for a while.", true, false);
  const auto n = static_cast<int64_t>(prompt.size());
  ASSERT_GT(n, 14);
  std::vector<float> hidden(static_cast<size_t>(n * d)), logits(static_cast<size_t>(c.n_vocab));
  {
    KvCache kv = model_->NewKvCache(256);
    ASSERT_TRUE(model_->Forward(kv, prompt.data(), n, false, logits.data(), hidden.data()).ok());
  }
  const gguf::TensorInfo* out = model_->file().FindTensor("output.weight");
  if (out == nullptr) out = model_->file().FindTensor("token_embd.weight");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->cols(), d);
  std::vector<float> row(static_cast<size_t>(d));
  double max_err = 0, max_logit = 0;
  for (int64_t v = 0; v < c.n_vocab; v += 97) {
    ASSERT_TRUE(DequantizeRow(out->type, out->data + v * out->row_bytes(), row.data(), d).ok());
    double dot = 0;
    for (int64_t i = 0; i < d; ++i)
      dot += static_cast<double>(row[static_cast<size_t>(i)]) * hidden[static_cast<size_t>((n - 1) * d + i)];
    max_err = std::max(max_err, std::abs(dot - logits[static_cast<size_t>(v)]));
    max_logit = std::max(max_logit, std::abs(dot));
  }
  EXPECT_GT(max_logit, 5.0);
  EXPECT_LT(max_err, 0.02 * max_logit) << "the hidden states are not the logits' input";

  for (Pooling pooling : {Pooling::kMean, Pooling::kCls, Pooling::kLast}) {
    std::vector<float> want(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      double sum = 0;
      for (int64_t t = 0; t < n; ++t) sum += hidden[static_cast<size_t>(t * d + i)];
      want[static_cast<size_t>(i)] = pooling == Pooling::kMean  ? static_cast<float>(sum / static_cast<double>(n))
                                     : pooling == Pooling::kCls ? hidden[static_cast<size_t>(i)]
                                                                : hidden[static_cast<size_t>((n - 1) * d + i)];
    }
    Sequence seq(*model_, 256);
    for (int rep = 0; rep < 2; ++rep) {
      GenerateParams p = GreedyParams(0);
      p.embed = pooling;
      ASSERT_TRUE(seq.Start(prompt, p).ok());
      int steps = 0;
      while (!seq.done()) {
        auto r = seq.NextRows(7);
        ASSERT_TRUE(r.ok());
        if (seq.done()) break;
        ASSERT_NE(r->hidden, nullptr);
        ASSERT_TRUE(model_->Forward(seq.kv(), r->tokens, r->n, r->all_logits, logits.data(), r->hidden).ok());
        ASSERT_TRUE(seq.Consume(logits.data(), [](TokenId) { return true; }).ok());
        ++steps;
      }
      EXPECT_EQ(steps, (n + 6) / 7);
      EXPECT_EQ(seq.stats().reused_tokens, 0);
      EXPECT_EQ(seq.stats().generated, 0);
      ASSERT_EQ(seq.embedding().size(), static_cast<size_t>(d)) << PoolingName(pooling);
      for (int64_t i = 0; i < d; ++i)
        ASSERT_NEAR(seq.embedding()[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 2e-3)
            << PoolingName(pooling) << " component " << i;
    }
  }
}

TEST_F(GeneratorTest, GreedyMatchesPlainLoopAndPrefixReuseChangesNothing) {
  const auto prompt = model_->tokenizer().Encode("The three primary colors are", true, false);
  const auto want = Greedy(prompt, 24);
  ASSERT_EQ(want.size(), 24u);
  Generator gen(*model_, 512);
  std::vector<TokenId> got;
  auto r = gen.Generate(prompt, GreedyParams(24), [&](TokenId t) {
    got.push_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(got, want);
  EXPECT_EQ(r->stop, StopCause::kMaxTokens);
  EXPECT_EQ(r->reused_tokens, 0);
  EXPECT_EQ(r->generated, 24);

  // A follow-up whose prompt extends the first one reuses its KV and matches a cold run.
  std::vector<TokenId> longer = prompt;
  longer.insert(longer.end(), want.begin(), want.begin() + 10);
  const auto want2 = Greedy(longer, 12);
  got.clear();
  r = gen.Generate(longer, GreedyParams(12), [&](TokenId t) {
    got.push_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reused_tokens, static_cast<int64_t>(longer.size()) - 1);
  EXPECT_EQ(got, want2);

  // A prompt sharing only a prefix: the cache is cut back to it.
  std::vector<TokenId> other(prompt.begin(), prompt.begin() + 3);
  const auto more = model_->tokenizer().Encode(" blue, green and", false, false);
  other.insert(other.end(), more.begin(), more.end());
  const auto want3 = Greedy(other, 12);
  got.clear();
  r = gen.Generate(other, GreedyParams(12), [&](TokenId t) {
    got.push_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reused_tokens, 3);
  EXPECT_EQ(got, want3);
}

TEST_F(GeneratorTest, CallbackStopCancellationAndBadPrompts) {
  const auto prompt = model_->tokenizer().Encode("Once upon a time", true, false);
  Generator gen(*model_, 256);
  int calls = 0;
  auto r = gen.Generate(prompt, GreedyParams(50), [&](TokenId) { return ++calls < 5; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, StopCause::kCallback);
  EXPECT_EQ(r->generated, 5);

  // Cancelled between prefill chunks: no token is produced.
  gen.ResetCache();
  int polls = 0;
  GenerateParams chunked = GreedyParams(50);
  chunked.prefill_chunk = 2;
  r = gen.Generate(
      prompt, chunked,
      [&](TokenId) {
        ADD_FAILURE();
        return true;
      },
      [&] { return ++polls > 1; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stop, StopCause::kCancelled);
  EXPECT_EQ(r->generated, 0);

  EXPECT_FALSE(gen.Generate({}, GreedyParams(5), [](TokenId) { return true; }).ok());
  std::vector<TokenId> bad = {1, 2, -5};
  EXPECT_FALSE(gen.Generate(bad, GreedyParams(5), [](TokenId) { return true; }).ok());
  std::vector<TokenId> too_long(300, prompt[1]);
  auto r2 = gen.Generate(too_long, GreedyParams(5), [](TokenId) { return true; });
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("prompt is too long"), std::string::npos);
}

TEST_F(GeneratorTest, SeededSamplingRepeats) {
  const auto prompt = model_->tokenizer().Encode("My favourite animal is", true, false);
  Generator gen(*model_, 256);
  GenerateParams p;
  p.sampling = {1.0f, 64, 0.95f, 0.0f};
  p.seed = 99;
  p.seeded = true;
  p.max_tokens = 16;
  std::vector<TokenId> a, b;
  ASSERT_TRUE(gen.Generate(prompt, p,
                           [&](TokenId t) {
                             a.push_back(t);
                             return true;
                           })
                  .ok());
  ASSERT_TRUE(gen.Generate(prompt, p,
                           [&](TokenId t) {
                             b.push_back(t);
                             return true;
                           })
                  .ok());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a.empty());
}

}  // namespace
}  // namespace mr
