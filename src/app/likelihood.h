// Likelihood comparison of two configurations of one model over the same token windows
// (`mererun qualify likelihood`): per-position scoring of next-token distributions, per-window
// sums, and the summary with a window bootstrap on the perplexity ratio.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace mr::app {

// Sums over the scored positions of one window.
struct WindowStats {
  int64_t n_positions = 0;
  double nll_reference = 0;  // sum of -log p_ref(target)
  double nll_candidate = 0;  // sum of -log p_cand(target)
  int64_t top1_agree = 0;    // positions where both argmaxes are the same token
  double kl_sum = 0;         // sum of KL(P_ref || P_cand), nats
  double max_kl = 0;
};

// Scores one position: logits rows of both configurations over n_vocab, and the token that
// follows. Log-softmax in double; ties in argmax go to the lowest id (as std::max_element).
void ScorePosition(const float* ref_logits, const float* cand_logits, int64_t n_vocab, int32_t target, WindowStats* w);

struct LikelihoodSummary {
  int64_t n_positions = 0;
  double ppl_reference = 0, ppl_candidate = 0;
  double ppl_ratio = 0;                         // candidate / reference
  double ratio_upper95 = 0;                     // one-sided 95% bootstrap upper bound (95th percentile)
  double ratio_ci95_lo = 0, ratio_ci95_hi = 0;  // two-sided 95% percentile interval
  double top1_agreement = 0;                    // fraction of positions
  double mean_kl = 0;                           // nats per position
  double max_kl = 0;
};

// Windows are resampled with replacement `n_resamples` times (xorshift seeded by `seed`, so
// the bound is reproducible); each resample's ratio is exp((sum nll_cand - sum nll_ref) / sum n).
LikelihoodSummary Summarize(const std::vector<WindowStats>& windows, int n_resamples, uint64_t seed);

// The byte offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF, no NUL, which no text file holds), or
// npos when all of `s` is.
size_t FirstNonTextByte(std::string_view s);

}  // namespace mr::app
