#include "app/likelihood.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace mr::app {
namespace {

TEST(Likelihood, IdenticalDistributionsScoreEqually) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 0.5f};
  WindowStats w;
  ScorePosition(logits.data(), logits.data(), 4, 1, &w);
  EXPECT_EQ(w.n_positions, 1);
  EXPECT_EQ(w.top1_agree, 1);
  EXPECT_EQ(w.kl_sum, 0.0);
  // -log softmax(logits)[1]
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  EXPECT_NEAR(w.nll_reference, std::log(z) - 3.0, 1e-12);
  EXPECT_EQ(w.nll_reference, w.nll_candidate);
}

TEST(Likelihood, KlAndArgmaxOfDifferentRows) {
  // P = softmax(0, log 3) = (1/4, 3/4); Q = uniform: KL = 1/4 log(1/2) + 3/4 log(3/2).
  const std::vector<float> p = {0.0f, static_cast<float>(std::log(3.0))};
  const std::vector<float> q = {0.0f, 0.0f};
  WindowStats w;
  ScorePosition(p.data(), q.data(), 2, 0, &w);
  EXPECT_NEAR(w.kl_sum, 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_EQ(w.top1_agree, 0);  // argmax 1 vs 0 (first of a tie)
  EXPECT_NEAR(w.nll_reference, std::log(4.0), 1e-6);
  EXPECT_NEAR(w.nll_candidate, std::log(2.0), 1e-12);
}

TEST(Likelihood, SummaryRatioAndBootstrap) {
  std::vector<WindowStats> windows(4);
  for (int i = 0; i < 4; ++i) {
    windows[i].n_positions = 100;
    windows[i].nll_reference = 200 + 10 * i;
    windows[i].nll_candidate = windows[i].nll_reference + (i == 3 ? 4.0 : 0.0);
    windows[i].top1_agree = 90;
  }
  const LikelihoodSummary s = Summarize(windows, 2000, 7);
  EXPECT_EQ(s.n_positions, 400);
  EXPECT_NEAR(s.ppl_ratio, std::exp(4.0 / 400), 1e-12);
  EXPECT_NEAR(s.ppl_ratio, s.ppl_candidate / s.ppl_reference, 1e-12);
  EXPECT_DOUBLE_EQ(s.top1_agreement, 0.9);
  // Resamples range from no copy of window 3 (ratio 1) to four (ratio e^0.04).
  EXPECT_GE(s.ratio_ci95_lo, 1.0);
  EXPECT_LE(s.ratio_ci95_hi, std::exp(0.04) + 1e-12);
  EXPECT_GT(s.ratio_upper95, s.ppl_ratio);
  EXPECT_LE(s.ratio_upper95, s.ratio_ci95_hi);
  // Same seed, same bound.
  EXPECT_EQ(Summarize(windows, 2000, 7).ratio_upper95, s.ratio_upper95);
}

TEST(Likelihood, EmptyInputIsZero) {
  const LikelihoodSummary s = Summarize({}, 100, 1);
  EXPECT_EQ(s.n_positions, 0);
  EXPECT_EQ(s.ppl_ratio, 0.0);
}

}  // namespace
}  // namespace mr::app

namespace mr::app {
namespace {

TEST(Likelihood, FirstNonTextByte) {
  constexpr size_t kOk = std::string_view::npos;
  EXPECT_EQ(FirstNonTextByte(""), kOk);
  EXPECT_EQ(FirstNonTextByte("plain ascii\n\ttabs"), kOk);
  EXPECT_EQ(FirstNonTextByte("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF"), kOk);  // é € 😀 U+10FFFF
  EXPECT_EQ(FirstNonTextByte(std::string_view("ab\0c", 4)), 2u);
  EXPECT_EQ(FirstNonTextByte("ab\xFF"), 2u);
  EXPECT_EQ(FirstNonTextByte("a\xC0\xAF"), 1u);          // overlong '/'
  EXPECT_EQ(FirstNonTextByte("a\xE0\x80\xAF"), 1u);      // overlong, 3 bytes
  EXPECT_EQ(FirstNonTextByte("a\xED\xA0\x80"), 1u);      // a surrogate
  EXPECT_EQ(FirstNonTextByte("a\xF4\x90\x80\x80"), 1u);  // above U+10FFFF
  EXPECT_EQ(FirstNonTextByte("abc\xE2\x82"), 3u);        // cut short
  EXPECT_EQ(FirstNonTextByte("\x80"), 0u);               // a lone continuation byte
}

}  // namespace
}  // namespace mr::app
