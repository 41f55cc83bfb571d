#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

namespace mr {

namespace {
uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t Rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Probability descending, then id ascending: a strict weak order, so results do not depend on
// the sort algorithm.
bool Before(const Candidate& a, const Candidate& b) {
  return a.p > b.p || (a.p == b.p && a.id < b.id);
}

// Keeps the candidates `keep` accepts, renormalized; false (and `c` unchanged) when none would
// remain or they carry no mass.
template <typename Keep>
bool KeepNormalized(std::vector<Candidate>* c, Keep keep) {
  double mass = 0.0;
  size_t n = 0;
  for (const Candidate& x : *c) {
    if (!keep(x)) continue;
    mass += x.p;
    ++n;
  }
  if (n == 0 || mass <= 0.0) return false;
  std::erase_if(*c, [&](const Candidate& x) { return !keep(x); });
  const float inv = static_cast<float>(1.0 / mass);
  for (Candidate& x : *c) x.p *= inv;
  return true;
}
}  // namespace

void InfillFilter(const Tokenizer& tok, std::vector<Candidate>* dist) {
  std::vector<Candidate>& c = *dist;
  if (c.empty()) return;
  const size_t n = std::min(c.size(), kInfillMaxCandidates);
  std::partial_sort(c.begin(), c.begin() + n, c.end(), Before);
  c.resize(n);
  if (!KeepNormalized(&c, [](const Candidate&) { return true; })) return;
  double p_text = 0.0, p_end = 0.0;
  for (const Candidate& x : c) (tok.IsEndOfGeneration(x.id) ? p_end : p_text) += x.p;
  if (3.0 * p_end * static_cast<double>(c.size()) > p_text) {
    KeepNormalized(&c, [&](const Candidate& x) { return tok.IsEndOfGeneration(x.id); });
    return;
  }
  // A piece that is a prefix of another: the two are one choice of how to go on, so the less
  // likely spelling's probability joins the likelier one.
  std::vector<std::string> piece(n);
  for (size_t i = 0; i < n; ++i) piece[i] = tok.TokenToPiece(c[i].id, /*render_special=*/false);
  std::vector<char> alive(n, 1);
  for (size_t i0 = 0; i0 < n; ++i0) {
    for (size_t i1 = 0; i1 < n && alive[i0]; ++i1) {
      if (i0 == i1 || !alive[i1] || piece[i0].empty() || piece[i0].size() > piece[i1].size() ||
          piece[i1].compare(0, piece[i0].size(), piece[i0]) != 0)
        continue;
      const size_t dst = c[i1].p > c[i0].p ? i1 : i0;
      const size_t src = dst == i0 ? i1 : i0;
      c[dst].p += c[src].p;
      c[src].p = 0.0f;
      alive[src] = 0;
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (!alive[i]) c[i].p = -1.0f;  // marks the merged-away candidates for the filters below
  size_t n_text = 0;
  for (const Candidate& x : c) n_text += x.p >= 0.2f && !tok.IsEndOfGeneration(x.id);
  if (n_text == 0) {
    const TokenId eot = tok.eot_id();
    if (eot >= 0) {
      c.assign(1, {eot, 1.0f});
    } else {  // no end-of-turn token: the end-of-generation candidates, if any
      KeepNormalized(&c, [&](const Candidate& x) { return x.p >= 0.0f && tok.IsEndOfGeneration(x.id); });
    }
    return;
  }
  auto survives = [&](float thold) {
    return [&tok, thold](const Candidate& x) { return x.p >= 0.0f && (x.p >= thold || tok.IsEndOfGeneration(x.id)); };
  };
  KeepNormalized(&c, survives(0.2f));
  KeepNormalized(&c, survives(static_cast<float>(1.0 / static_cast<double>(n_text + 1))));
  std::sort(c.begin(), c.end(), Before);
}

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = SplitMix64(seed);
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() {
  return static_cast<double>(Next() >> 11) * 0x1.0p-53;
}

uint64_t Rng::RandomSeed() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (hi << 32 ^ lo) ^ (t * 0x9e3779b97f4a7c15ULL);
}

void ComputeLogprob(const float* logits, int64_t n_vocab, TokenId id, int top_n, TokenLogprob* out) {
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) max_l = std::max(max_l, logits[i]);
  double sum = 0.0;
  // Each term in float (exact to an ulp, 0.6 ms over Qwen's 152k vocabulary on Zen 4 against 0.9 ms in
  // double), the sum in double so that 152k small terms do not lose the tail.
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - max_l);
  const double log_z = max_l + std::log(sum);
  out->id = id;
  out->logprob = static_cast<float>(logits[id] - log_z);
  out->top.clear();
  top_n = static_cast<int>(std::min<int64_t>(std::max(top_n, 0), n_vocab));
  if (top_n == 0) return;
  // A min-heap of the best top_n (logit descending, id ascending): its front is the worst kept.
  const auto better = [](const std::pair<TokenId, float>& a, const std::pair<TokenId, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  std::vector<std::pair<TokenId, float>>& h = out->top;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const std::pair<TokenId, float> c{static_cast<TokenId>(i), logits[i]};
    if (static_cast<int>(h.size()) < top_n) {
      h.push_back(c);
      std::push_heap(h.begin(), h.end(), better);
    } else if (better(c, h.front())) {
      std::pop_heap(h.begin(), h.end(), better);
      h.back() = c;
      std::push_heap(h.begin(), h.end(), better);
    }
  }
  std::sort_heap(h.begin(), h.end(), better);
  for (auto& [t, l] : h) l = static_cast<float>(l - log_z);
}

void Sampler::Distribution(const float* logits, int64_t n_vocab, std::vector<Candidate>* out) {
  out->clear();
  if (n_vocab <= 0) return;
  if (params_.greedy()) {
    int64_t best = 0;
    for (int64_t i = 1; i < n_vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    out->push_back({static_cast<TokenId>(best), 1.0f});
    return;
  }
  const float inv_t = 1.0f / params_.temperature;
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) max_l = std::max(max_l, logits[i]);
  // Unnormalized weights w = exp((l - max) / T) and their total mass over the whole vocabulary.
  // Tokens of weight 0 (masked to -inf by a grammar constraint, or underflowing) are left out,
  // so no draw can land on them.
  std::vector<Candidate>& c = scratch_;
  c.resize(static_cast<size_t>(n_vocab));
  double total = 0.0;
  size_t n_pos = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    const float w = std::exp((logits[i] - max_l) * inv_t);
    c[n_pos] = {static_cast<TokenId>(i), w};
    n_pos += w > 0.0f ? 1 : 0;
    total += w;
  }
  c.resize(n_pos);
  const bool use_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < c.size();
  const bool use_p = params_.top_p < 1.0f;
  const bool use_min_p = params_.min_p > 0.0f;
  size_t n = c.size();
  if (use_min_p) {
    // min-p keeps w >= min_p * w_max (w_max = 1). Dropping those candidates first changes
    // neither the top-k set nor the top-p prefix of the survivors (they are the sorted tail).
    const float thr = params_.min_p;
    n = static_cast<size_t>(std::partition(c.begin(), c.end(), [thr](const Candidate& x) { return x.p >= thr; }) -
                            c.begin());
  }
  if (!use_k && !use_p) {
    // No cut that needs an order: keep id order (sorting a whole vocabulary costs ~10 ms).
    if (use_min_p)
      std::sort(c.begin(), c.begin() + n, [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    out->assign(c.begin(), c.begin() + n);
  } else {
    // Sort a growing prefix until it holds the top-k cut or the top-p cut.
    const size_t k_limit = use_k ? std::min<size_t>(params_.top_k, n) : n;
    const double p_mass = static_cast<double>(params_.top_p) * total;
    size_t k = std::min<size_t>(use_k ? k_limit : 64, n);
    size_t keep = 0;
    for (;;) {
      std::partial_sort(c.begin(), c.begin() + k, c.begin() + n, Before);
      double cum = 0.0;
      keep = 0;
      bool reached = false;
      for (size_t i = 0; i < k; ++i) {
        cum += c[i].p;
        keep = i + 1;
        if (use_p && cum >= p_mass) {
          reached = true;
          break;
        }
      }
      if (reached || k >= k_limit) break;
      k = std::min(k * 4, k_limit);
    }
    out->assign(c.begin(), c.begin() + keep);
  }
  double kept = 0.0;
  for (const Candidate& x : *out) kept += x.p;
  const float inv = kept > 0.0 ? static_cast<float>(1.0 / kept) : 0.0f;
  for (Candidate& x : *out) x.p *= inv;
  if (params_.infill != nullptr) InfillFilter(*params_.infill, out);
}

TokenId Sampler::Draw(const std::vector<Candidate>& dist, Rng& rng) {
  if (dist.empty()) return -1;
  double u = rng.Uniform();
  double total = 0.0;
  for (const Candidate& x : dist) total += x.p;
  u *= total;
  double cum = 0.0;
  for (const Candidate& x : dist) {
    cum += x.p;
    if (u < cum) return x.id;
  }
  return dist.back().id;
}

TokenId Sampler::Sample(const float* logits, int64_t n_vocab, Rng& rng) {
  std::vector<Candidate> dist;
  dist.swap(dist_);
  Distribution(logits, n_vocab, &dist);
  const TokenId t = Draw(dist, rng);
  dist.swap(dist_);
  return t;
}

}  // namespace mr
