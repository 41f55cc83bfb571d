#include "app/likelihood.h"

#include <algorithm>
#include <cmath>

#include "model/unicode.h"

namespace mr::app {
namespace {

// max + log(sum exp(x - max)): the log of the softmax denominator, in double.
double LogSumExp(const float* x, int64_t n, int64_t* argmax) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  const double m = x[best];
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  *argmax = best;
  return m + std::log(s);
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

}  // namespace

void ScorePosition(const float* ref_logits, const float* cand_logits, int64_t n_vocab, int32_t target, WindowStats* w) {
  int64_t arg_r = 0, arg_c = 0;
  const double lse_r = LogSumExp(ref_logits, n_vocab, &arg_r);
  const double lse_c = LogSumExp(cand_logits, n_vocab, &arg_c);
  double kl = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const double lp = ref_logits[i] - lse_r;
    const double lq = cand_logits[i] - lse_c;
    kl += std::exp(lp) * (lp - lq);
  }
  kl = std::max(kl, 0.0);  // rounding can leave a tiny negative for identical rows
  w->n_positions += 1;
  w->nll_reference += lse_r - ref_logits[target];
  w->nll_candidate += lse_c - cand_logits[target];
  w->top1_agree += arg_r == arg_c ? 1 : 0;
  w->kl_sum += kl;
  w->max_kl = std::max(w->max_kl, kl);
}

LikelihoodSummary Summarize(const std::vector<WindowStats>& windows, int n_resamples, uint64_t seed) {
  LikelihoodSummary s;
  double nll_r = 0, nll_c = 0, kl = 0;
  int64_t agree = 0;
  for (const WindowStats& w : windows) {
    s.n_positions += w.n_positions;
    nll_r += w.nll_reference;
    nll_c += w.nll_candidate;
    agree += w.top1_agree;
    kl += w.kl_sum;
    s.max_kl = std::max(s.max_kl, w.max_kl);
  }
  if (s.n_positions == 0) return s;
  const double n = static_cast<double>(s.n_positions);
  s.ppl_reference = std::exp(nll_r / n);
  s.ppl_candidate = std::exp(nll_c / n);
  s.ppl_ratio = std::exp((nll_c - nll_r) / n);
  s.top1_agreement = static_cast<double>(agree) / n;
  s.mean_kl = kl / n;
  std::vector<double> ratios;
  ratios.reserve(static_cast<size_t>(n_resamples));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  const uint64_t n_w = windows.size();
  for (int b = 0; b < n_resamples; ++b) {
    double dr = 0, dc = 0, dn = 0;
    for (uint64_t k = 0; k < n_w; ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const WindowStats& w = windows[static_cast<size_t>(x % n_w)];
      dr += w.nll_reference;
      dc += w.nll_candidate;
      dn += static_cast<double>(w.n_positions);
    }
    ratios.push_back(dn > 0 ? std::exp((dc - dr) / dn) : 1.0);
  }
  if (ratios.empty()) ratios.push_back(s.ppl_ratio);
  s.ratio_upper95 = Percentile(ratios, 0.95);
  s.ratio_ci95_lo = Percentile(ratios, 0.025);
  s.ratio_ci95_hi = Percentile(ratios, 0.975);
  return s;
}

size_t FirstNonTextByte(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = s[i] == '\0' ? 0 : unicode::WellFormedUtf8Length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace mr::app
