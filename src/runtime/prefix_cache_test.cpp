// PrefixCache on synthetic KV caches (block matching, partial restores, eviction order, budget,
// configuration keys) and on the real SmolLM2 model (restored KV continues exactly like a cold
// prefill).
#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "model/test_models.h"
#include "runtime/kv_disk_cache.h"

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

PrefixCache::Options Opts(int max_blocks, KvDiskCache* disk = nullptr) {
  PrefixCache::Options o;
  o.disk = disk;
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

// A test clock (seconds) for lifetimes.
struct FakeClock {
  double t = 1000.0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

// Options with lifetimes of 300 s ("5m") and 3600 s ("1h") on `clock`.
PrefixCache::Options TimedOpts(FakeClock& clock, int max_blocks) {
  auto o = Opts(max_blocks);
  o.ttl_s = 300;
  o.long_ttl_s = 3600;
  o.clock = clock.fn();
  return o;
}

TEST(PrefixCache, BlocksExpireAfterTheirLifetimeAndHitsRefreshIt) {
  FakeClock clock;
  PrefixCache pc(1, kLayers, kDim, TimedOpts(clock, 100));
  const auto a = Seq(0, 24);
  pc.Store(a, 24, Fill(a));
  clock.t += 299;
  EXPECT_EQ(pc.Match(a, 100), 24);
  KvCache kv = Fill({});
  EXPECT_EQ(pc.Restore(a, 100, 0, kv), 24);  // refreshed: lives until t0 + 299 + 300
  clock.t += 299;
  EXPECT_EQ(pc.Match(a, 100), 24);
  EXPECT_EQ(pc.Expire(), 0);
  clock.t += 2;  // 301 s after the last use
  EXPECT_EQ(pc.Match(a, 100), 0);
  KvCache kv2 = Fill({});
  EXPECT_EQ(pc.Restore(a, 100, 0, kv2), 0);
  EXPECT_EQ(kv2.n_past, 0);
  EXPECT_EQ(pc.blocks(), 0);  // dropped, memory returned
  EXPECT_EQ(pc.bytes(), 0u);
  EXPECT_EQ(pc.stats().expired_blocks, 3);
}

TEST(PrefixCache, KeepLongGivesAPrefixTheLongLifetime) {
  FakeClock clock;
  PrefixCache pc(1, kLayers, kDim, TimedOpts(clock, 100));
  const auto a = Seq(0, 32);
  pc.Store(a, 32, Fill(a));
  pc.KeepLong(a, 16);  // the first two blocks (e.g. up to a 1h breakpoint)
  clock.t += 1000;
  EXPECT_EQ(pc.Match(a, 100), 16);  // the short-lived rest is gone
  clock.t += 2599;
  EXPECT_EQ(pc.Match(a, 100), 16);
  clock.t += 2;
  EXPECT_EQ(pc.Match(a, 100), 0);
}

TEST(PrefixCache, UnderPressureShortLivedBlocksGoBeforeLongLivedOnes) {
  FakeClock clock;
  PrefixCache pc(1, kLayers, kDim, TimedOpts(clock, 4));
  const auto a = Seq(0, 16), b = Seq(1000, 16), c = Seq(2000, 16);
  pc.Store(a, 16, Fill(a));
  pc.KeepLong(a, 16);
  clock.t += 1;
  pc.Store(b, 16, Fill(b));  // more recent than a, but short-lived
  clock.t += 1;
  pc.Store(c, 16, Fill(c));
  EXPECT_EQ(pc.Match(a, 100), 16);
  EXPECT_EQ(pc.Match(c, 100), 16);
  EXPECT_EQ(pc.Match(b, 100), 0);
  // Expired blocks go before anything live, whatever their class.
  clock.t += 301;  // b and c expired; a (1h) lives
  const auto d = Seq(3000, 8);
  pc.Store(d, 8, Fill(d));
  EXPECT_EQ(pc.Match(a, 100), 16);
  EXPECT_EQ(pc.Match(d, 100), 8);
}

// A fresh directory under the test's temporary directory, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("mererun-kvdisk-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  static inline int counter = 0;
};

std::unique_ptr<KvDiskCache> OpenDisk(const TempDir& dir, uint64_t key, size_t budget = size_t{1} << 30) {
  KvDiskCache::Options o;
  o.dir = dir.path.string();
  o.byte_budget = budget;
  auto d = KvDiskCache::Open(o, {key, kLayers, kDim, kBlock});
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? std::move(d).value() : nullptr;
}

std::vector<std::filesystem::path> BlockFiles(const TempDir& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path))
    if (e.is_regular_file() && e.path().extension() == ".kvb") out.push_back(e.path());
  return out;
}

TEST(KvDiskCache, BlocksSurviveARestartOfTheMemoryTier) {
  TempDir dir;
  const auto a = Seq(100, 28);
  {
    auto disk = OpenDisk(dir, 42);
    PrefixCache pc(42, kLayers, kDim, Opts(100, disk.get()));
    pc.Store(a, 28, Fill(a));
    disk->Flush();
    EXPECT_EQ(disk->stats().written, 3);
    EXPECT_EQ(disk->stats().files, 3);
  }
  EXPECT_EQ(BlockFiles(dir).size(), 3u);
  // A new process: empty memory, the same directory.
  auto disk = OpenDisk(dir, 42);
  EXPECT_EQ(disk->stats().files, 3);
  PrefixCache pc(42, kLayers, kDim, Opts(100, disk.get()));
  EXPECT_EQ(pc.Match(a, 100), 24);
  KvCache kv = Fill({});
  EXPECT_EQ(pc.Restore(a, 100, 0, kv), 24);
  EXPECT_TRUE(RowsEqual(kv, Fill(a), 0, 24));
  EXPECT_EQ(pc.stats().disk_tokens, 24);
  EXPECT_EQ(disk->stats().loaded, 3);
  EXPECT_EQ(pc.blocks(), 3);  // now in memory too
  // Another configuration in the same directory sees none of it.
  auto other_disk = OpenDisk(dir, 43);
  PrefixCache other(43, kLayers, kDim, Opts(100, other_disk.get()));
  KvCache kv2 = Fill({});
  EXPECT_EQ(other.Restore(a, 100, 0, kv2), 0);
}

TEST(KvDiskCache, ACorruptedOrTruncatedFileIsRejectedRemovedAndRecomputed) {
  TempDir dir;
  const auto a = Seq(7, 24);
  {
    auto disk = OpenDisk(dir, 5);
    PrefixCache pc(5, kLayers, kDim, Opts(100, disk.get()));
    pc.Store(a, 24, Fill(a));
  }  // the destructor writes what is queued
  auto files = BlockFiles(dir);
  ASSERT_EQ(files.size(), 3u);
  std::sort(files.begin(), files.end());
  // Flip one KV byte in one file, truncate another.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    char c;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  std::filesystem::resize_file(files[1], std::filesystem::file_size(files[1]) - 1);
  auto disk = OpenDisk(dir, 5);
  PrefixCache pc(5, kLayers, kDim, Opts(100, disk.get()));
  KvCache kv = Fill({});
  const int64_t got = pc.Restore(a, 100, 0, kv);
  EXPECT_LT(got, 24);
  EXPECT_TRUE(RowsEqual(kv, Fill(a), 0, got));  // what was restored is right
  EXPECT_GE(disk->stats().rejected, 1);
  EXPECT_FALSE(std::filesystem::exists(files[0]) && std::filesystem::exists(files[1]));
  // Stored again after recomputation, the chain is whole on disk.
  pc.Store(a, 24, Fill(a));
  disk->Flush();
  EXPECT_EQ(BlockFiles(dir).size(), 3u);
  // A temporary file left by a crash is not a block; an old one is removed at open.
  std::ofstream(disk->dir() + "/.0000000000000001.1.1.tmp") << "partial";
  std::filesystem::last_write_time(disk->dir() + "/.0000000000000001.1.1.tmp",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  auto disk2 = OpenDisk(dir, 5);
  EXPECT_EQ(disk2->stats().files, 3);
  EXPECT_FALSE(std::filesystem::exists(disk->dir() + "/.0000000000000001.1.1.tmp"));
}

TEST(KvDiskCache, StaysWithinItsByteBudgetDroppingTheLeastRecentlyUsedFiles) {
  TempDir dir;
  const size_t file_bytes = 64 + kBlock * sizeof(TokenId) + kLayers * 2 * kBlock * kDim * sizeof(uint16_t);
  auto disk = OpenDisk(dir, 9, 3 * file_bytes);
  PrefixCache pc(9, kLayers, kDim, Opts(100, disk.get()));
  const auto a = Seq(0, 16), b = Seq(500, 16);
  pc.Store(a, 16, Fill(a));
  disk->Flush();
  pc.Store(b, 16, Fill(b));
  disk->Flush();
  const auto st = disk->stats();
  EXPECT_EQ(st.files, 3);
  EXPECT_LE(st.bytes, 3 * file_bytes);
  EXPECT_EQ(st.evicted, 1);
  EXPECT_EQ(BlockFiles(dir).size(), 3u);
  // Reopened with a smaller budget: trimmed at once.
  disk.reset();
  auto small = OpenDisk(dir, 9, file_bytes);
  EXPECT_EQ(small->stats().files, 1);
  EXPECT_EQ(BlockFiles(dir).size(), 1u);
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

  // Through the disk tier: stored by one cache, restored by a fresh one reading the files.
  TempDir dir;
  KvDiskCache::Options dopts;
  dopts.dir = dir.path.string();
  const KvDiskCache::Layout layout{7, model.config().n_layer, kv.kv_dim, 16};
  PrefixCache::Options o;
  o.block_tokens = 16;
  {
    auto disk = KvDiskCache::Open(dopts, layout);
    ASSERT_TRUE(disk.ok()) << disk.status().message();
    o.disk = disk->get();
    PrefixCache pc(7, model.config().n_layer, kv.kv_dim, o);
    pc.Store(prompt, n, kv);
  }
  auto disk = KvDiskCache::Open(dopts, layout);
  ASSERT_TRUE(disk.ok()) << disk.status().message();
  o.disk = disk->get();
  PrefixCache pc(7, model.config().n_layer, kv.kv_dim, o);
  KvCache kv2 = model.NewKvCache(256);
  const int64_t got = pc.Restore(prompt, n - 1, 0, kv2);
  EXPECT_EQ(pc.stats().disk_tokens, got);
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
