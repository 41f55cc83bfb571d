// PrefixCache on synthetic KV caches (block matching, partial restores, eviction order, budget,
// configuration keys) and on the real SmolLM2 model (restored KV continues exactly like a cold
// prefill).
#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "model/test_models.h"

namespace mr {
namespace {

constexpr int64_t kLayers = 3, kDim = 4, kBlock = 8;

// The KV row a token at `pos` would have: a function of every token up to pos, as in a model.
KvCache Fill(const std::vector<TokenId>& toks, int64_t n_ctx = 128) {
  KvCache kv = KvCache::Allocate(kLayers, n_ctx, kDim);
  for (int64_t l = 0; l < kLayers; ++l) {
    std::fill(kv.k[l].begin(), kv.k[l].end(), 0xFFFF);
    std::fill(kv.v[l].begin(), kv.v[l].end(), 0xFFFF);
  }
  uint32_t h = 17;
  for (size_t p = 0; p < toks.size(); ++p) {
    h = h * 31 + static_cast<uint32_t>(toks[p]);
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t d = 0; d < kDim; ++d) {
        kv.k[l][p * kDim + d] = static_cast<uint16_t>(h + l * 7 + d);
        kv.v[l][p * kDim + d] = static_cast<uint16_t>(h * 3 + l + d);
      }
  }
  kv.n_past = static_cast<int64_t>(toks.size());
  return kv;
}

bool RowsEqual(const KvCache& a, const KvCache& b, int64_t from, int64_t to) {
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t i = from * kDim; i < to * kDim; ++i)
      if (a.k[l][i] != b.k[l][i] || a.v[l][i] != b.v[l][i]) return false;
  return true;
}

std::vector<TokenId> Seq(TokenId start, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

PrefixCache::Options Opts(int max_blocks) {
  PrefixCache::Options o;
  o.block_tokens = kBlock;
  o.byte_budget = static_cast<size_t>(max_blocks) * kLayers * 2 * kBlock * kDim * sizeof(uint16_t);
  return o;
}

TEST(PrefixCache, StoresWholeBlocksAndRestoresTheLongestPrefix) {
  PrefixCache pc(42, kLayers, kDim, Opts(100));
  const auto a = Seq(100, 28);  // 3 whole blocks + 4 tokens
  pc.Store(a, 28, Fill(a));
  EXPECT_EQ(pc.blocks(), 3);
  EXPECT_EQ(pc.stats().stored_tokens, 24);

  auto longer = a;
  longer.push_back(7);
  EXPECT_EQ(pc.Match(longer, 1000), 24);
  EXPECT_EQ(pc.Match(longer, 23), 16);  // max_len cuts to whole blocks
  KvCache fresh = Fill({});
  EXPECT_EQ(pc.Restore(longer, 1000, 0, fresh), 24);
  EXPECT_EQ(fresh.n_past, 24);
  EXPECT_TRUE(RowsEqual(fresh, Fill(a), 0, 24));

  // A prompt that diverges inside block 2 matches one block only.
  auto b = a;
  b[12] = 9999;
  EXPECT_EQ(pc.Match(b, 1000), 8);
  // Same tokens under another configuration key: nothing.
  PrefixCache other(43, kLayers, kDim, Opts(100));
  other.Store(a, 28, Fill(a));
  EXPECT_EQ(other.Match(b, 1000), 8);
  PrefixCache pc2(44, kLayers, kDim, Opts(100));
  EXPECT_EQ(pc2.Match(a, 1000), 0);
}

TEST(PrefixCache, RestoreCopiesOnlyRowsTheCallerLacks) {
  PrefixCache pc(1, kLayers, kDim, Opts(100));
  const auto a = Seq(5, 32);
  pc.Store(a, 32, Fill(a));
  KvCache kv = Fill({});
  // The caller already holds 10 rows of its own (poisoned here): they must stay untouched.
  for (int64_t l = 0; l < kLayers; ++l) std::fill(kv.k[l].begin(), kv.k[l].begin() + 10 * kDim, 0x1234);
  EXPECT_EQ(pc.Restore(a, 31, 10, kv), 24);
  EXPECT_EQ(kv.k[0][9 * kDim], 0x1234);
  EXPECT_TRUE(RowsEqual(kv, Fill(a), 10, 24));
  // Nothing longer than what the caller has: unchanged.
  KvCache kv2 = Fill(a);
  kv2.n_past = 30;
  EXPECT_EQ(pc.Restore(a, 31, 30, kv2), 30);  // the cache has 24 of the first 31
  EXPECT_EQ(kv2.n_past, 30);
  EXPECT_EQ(pc.Restore(a, 32, 30, kv2), 32);  // a whole 4th block extends it
  EXPECT_TRUE(RowsEqual(kv2, Fill(a), 0, 32));
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesWithinTheBudget) {
  PrefixCache pc(1, kLayers, kDim, Opts(4));
  const auto a = Seq(0, 24);     // 3 blocks
  const auto c = Seq(1000, 16);  // 2 blocks, different from the first token
  pc.Store(a, 24, Fill(a));
  pc.Store(c, 16, Fill(c));
  EXPECT_LE(pc.bytes(), Opts(4).byte_budget);
  EXPECT_EQ(pc.blocks(), 4);
  // a's last block was the least recently used leaf: a keeps its first two blocks.
  EXPECT_EQ(pc.Match(a, 100), 16);
  EXPECT_EQ(pc.Match(c, 100), 16);
  EXPECT_EQ(pc.stats().evicted_blocks, 1);
  // Touch a, then store a new 2-block prompt: c (now least recent) goes, leaf first.
  KvCache tmp = Fill({});
  pc.Restore(a, 100, 0, tmp);
  const auto d = Seq(5000, 16);
  pc.Store(d, 16, Fill(d));
  EXPECT_EQ(pc.Match(a, 100), 16);
  EXPECT_EQ(pc.Match(d, 100), 16);
  EXPECT_EQ(pc.Match(c, 100), 0);
  // A budget smaller than one block stores nothing.
  PrefixCache tiny(1, kLayers, kDim, Opts(0));
  tiny.Store(a, 24, Fill(a));
  EXPECT_EQ(tiny.blocks(), 0);
  EXPECT_EQ(tiny.bytes(), 0u);
}

TEST(PrefixCache, RestoredKvContinuesLikeAColdPrefillOnARealModel) {
  auto m = LoadPulledModel(kSmolLM2File);
  ASSERT_TRUE(m.ok()) << m.status().message();
  if (*m == nullptr) GTEST_SKIP() << "smollm2-135m-instruct not pulled";
  Model& model = **m;
  std::vector<TokenId> prompt = model.tokenizer().Encode(
      "You are a helpful assistant. The user asks about the history of the printing press, "
      "its inventor, and how it changed Europe in the fifteenth and sixteenth centuries. Answer:",
      true, false);
  ASSERT_GT(prompt.size(), 32u);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t nv = model.config().n_vocab;
  std::vector<float> cold(nv), warm(nv);
  KvCache kv = model.NewKvCache(256);
  ASSERT_TRUE(model.Forward(kv, prompt.data(), n, false, cold.data()).ok());

  PrefixCache::Options o;
  o.block_tokens = 16;
  PrefixCache pc(7, model.config().n_layer, kv.kv_dim, o);
  pc.Store(prompt, n, kv);
  KvCache kv2 = model.NewKvCache(256);
  const int64_t got = pc.Restore(prompt, n - 1, 0, kv2);
  EXPECT_EQ(got, (n - 1) / 16 * 16);
  ASSERT_TRUE(model.Forward(kv2, prompt.data() + got, n - got, false, warm.data()).ok());
  float max_diff = 0;
  for (int64_t i = 0; i < nv; ++i) max_diff = std::max(max_diff, std::abs(cold[i] - warm[i]));
  EXPECT_LT(max_diff, 1e-3f);
  EXPECT_EQ(std::max_element(cold.begin(), cold.end()) - cold.begin(),
            std::max_element(warm.begin(), warm.end()) - warm.begin());
}

}  // namespace
}  // namespace mr
