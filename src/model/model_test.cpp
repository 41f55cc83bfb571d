// Forward-pass tests on tiny random models that the test builds itself (GgufWriter), one per
// architecture, checking properties that fail when the plumbing is wrong: incremental decoding
// with the KV cache equals a batched forward, the fast path tracks the FP32 reference path, and
// gemma3's sliding window hides tokens beyond its receptive field.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <cstring>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "model/gguf_writer.h"
#include "model/model.h"

namespace mr {
namespace {

std::atomic<int64_t> g_allocs{0};
int64_t AllocCount() { return g_allocs.load(std::memory_order_relaxed); }

constexpr uint32_t kF32 = 0;

std::vector<uint8_t> RandomF32Bytes(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    float v = dist(rng);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

struct TinySpec {
  std::string arch;  // llama | qwen2 | gemma3
  int64_t n_layer = 2, d = 128, n_head = 4, n_head_kv = 2, head_dim = 32, ff = 192, vocab = 64;
  int64_t sliding_window = 0;
};

// Writes a random tiny model to a temp file and returns its path.
std::string WriteTinyModel(const TinySpec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  gguf::GgufWriter w;
  const std::string a = s.arch;
  w.SetString("general.architecture", a);
  w.SetU32(a + ".block_count", static_cast<uint32_t>(s.n_layer));
  w.SetU32(a + ".embedding_length", static_cast<uint32_t>(s.d));
  w.SetU32(a + ".feed_forward_length", static_cast<uint32_t>(s.ff));
  w.SetU32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  w.SetU32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.SetU32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  w.SetU32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  w.SetU32(a + ".context_length", 256);
  w.SetF32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.SetF32(a + ".rope.freq_base", 10000.0f);
  if (s.sliding_window) w.SetU32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < s.vocab; ++i) tokens.push_back(std::string(1, static_cast<char>('0' + i)));
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "qwen2");
  w.SetArrayStr("tokenizer.ggml.tokens", tokens);
  w.SetArrayI32("tokenizer.ggml.token_type", std::vector<int32_t>(s.vocab, 1));
  w.SetArrayStr("tokenizer.ggml.merges", {});
  const int64_t d = s.d, q_dim = s.n_head * s.head_dim, kv_dim = s.n_head_kv * s.head_dim;
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    ASSERT_TRUE(w.AddTensor(name, kF32, {cols, rows}, RandomF32Bytes(rows * cols, rng, 1.0f / std::sqrt(float(cols)))).ok());
  };
  auto vec = [&](const std::string& name, int64_t n, float around) {
    std::normal_distribution<float> dist(around, 0.1f);
    std::vector<uint8_t> b(n * 4);
    for (int64_t i = 0; i < n; ++i) { float v = dist(rng); std::memcpy(b.data() + i * 4, &v, 4); }
    ASSERT_TRUE(w.AddTensor(name, kF32, {n}, b).ok());
  };
  mat("token_embd.weight", s.vocab, d);
  vec("output_norm.weight", d, 1.0f);
  if (a != "qwen2") mat("output.weight", s.vocab, d);  // qwen2 ties embeddings here
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", d, 1.0f);
    vec(p + "ffn_norm.weight", d, 1.0f);
    mat(p + "attn_q.weight", q_dim, d);
    mat(p + "attn_k.weight", kv_dim, d);
    mat(p + "attn_v.weight", kv_dim, d);
    mat(p + "attn_output.weight", d, q_dim);
    mat(p + "ffn_gate.weight", s.ff, d);
    mat(p + "ffn_up.weight", s.ff, d);
    mat(p + "ffn_down.weight", d, s.ff);
    if (a == "qwen2") {
      vec(p + "attn_q.bias", q_dim, 0.0f);
      vec(p + "attn_k.bias", kv_dim, 0.0f);
      vec(p + "attn_v.bias", kv_dim, 0.0f);
    }
    if (a == "gemma3") {
      vec(p + "attn_q_norm.weight", s.head_dim, 1.0f);
      vec(p + "attn_k_norm.weight", s.head_dim, 1.0f);
      vec(p + "post_attention_norm.weight", d, 1.0f);
      vec(p + "post_ffw_norm.weight", d, 1.0f);
    }
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mererun_tiny_" + a + "_" + std::to_string(seed) + "_" + std::to_string(getpid()) + ".gguf")).string();
  EXPECT_TRUE(w.WriteFile(path).ok());
  return path;
}

std::unique_ptr<Model> LoadTiny(const std::string& path, bool ref_path) {
  LoadOptions o;
  o.n_threads = 2;
  o.ref_path = ref_path;
  auto m = Model::Load(path, o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

class TinyArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyArchTest, IncrementalDecodeEqualsBatchedForward) {
  TinySpec s;
  s.arch = GetParam();
  if (s.arch == "gemma3") s.sliding_window = 5;
  const std::string path = WriteTinyModel(s, 7);
  for (bool ref : {false, true}) {
    auto m = LoadTiny(path, ref);
    ASSERT_TRUE(m);
    const std::vector<TokenId> toks = {1, 5, 9, 2, 33, 17, 4, 60, 8, 8, 3, 12};
    const int64_t n = static_cast<int64_t>(toks.size()), V = s.vocab;
    KvCache kv1 = m->NewKvCache(32);
    std::vector<float> all(n * V);
    ASSERT_TRUE(m->Forward(kv1, toks.data(), n, true, all.data()).ok());
    // One at a time, and in uneven chunks: each row's logits must match the batched ones.
    KvCache kv2 = m->NewKvCache(32);
    std::vector<float> one(V);
    for (int64_t t = 0; t < n; ++t) {
      ASSERT_TRUE(m->Forward(kv2, &toks[t], 1, false, one.data()).ok());
      std::vector<float> row(all.begin() + t * V, all.begin() + (t + 1) * V);
      EXPECT_LT(MaxAbsDiff(row, one), 1e-4) << s.arch << " ref=" << ref << " position " << t;
    }
    KvCache kv3 = m->NewKvCache(32);
    std::vector<float> chunk(5 * V);
    ASSERT_TRUE(m->Forward(kv3, toks.data(), 7, false, one.data()).ok());
    ASSERT_TRUE(m->Forward(kv3, toks.data() + 7, 5, true, chunk.data()).ok());
    std::vector<float> tail(all.begin() + 7 * V, all.end());
    EXPECT_LT(MaxAbsDiff(tail, chunk), 1e-4) << s.arch;
    EXPECT_EQ(kv3.n_past, n);
  }
  std::filesystem::remove(path);
}

TEST_P(TinyArchTest, FastPathTracksReferencePath) {
  TinySpec s;
  s.arch = GetParam();
  const std::string path = WriteTinyModel(s, 11);
  auto fast = LoadTiny(path, false);
  auto ref = LoadTiny(path, true);
  ASSERT_TRUE(fast && ref);
  const std::vector<TokenId> toks = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46};
  const int64_t n = static_cast<int64_t>(toks.size()), V = s.vocab;
  KvCache k1 = fast->NewKvCache(n), k2 = ref->NewKvCache(n);
  std::vector<float> a(n * V), b(n * V);
  ASSERT_TRUE(fast->Forward(k1, toks.data(), n, true, a.data()).ok());
  ASSERT_TRUE(ref->Forward(k2, toks.data(), n, true, b.data()).ok());
  double err = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) { err += (a[i] - b[i]) * (a[i] - b[i]); norm += b[i] * b[i]; }
  // int8 activations with per-group scales on Q8/g64 weights: relative error ~2-3% on these
  // random models (2.2-2.4% with 32-wide activation groups), far below what a wrong kernel or
  // layout gives (~100%).
  EXPECT_LT(std::sqrt(err / norm), 0.035) << s.arch;
}

TEST_P(TinyArchTest, ContextOverflowAndBadTokensAreErrors) {
  TinySpec s;
  s.arch = GetParam();
  const std::string path = WriteTinyModel(s, 3);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  KvCache kv = m->NewKvCache(4);
  std::vector<float> logits(s.vocab);
  const std::vector<TokenId> five = {1, 2, 3, 4, 5};
  Status st = m->Forward(kv, five.data(), 5, false, logits.data());
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(kv.n_past, 0);
  const TokenId bad = static_cast<TokenId>(s.vocab);
  EXPECT_FALSE(m->Forward(kv, &bad, 1, false, logits.data()).ok());
  EXPECT_EQ(kv.n_past, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyArchTest, ::testing::Values("llama", "qwen2", "gemma3"));

TEST(Gemma3SlidingWindow, TokensBeyondTheReceptiveFieldAreInvisible) {
  // 2 sliding layers (layers 0..4 of every 6 slide) with window 3: position p sees p-2..p in
  // each layer, so its logits depend on tokens p-4..p only.
  TinySpec s;
  s.arch = "gemma3";
  s.sliding_window = 3;
  const std::string path = WriteTinyModel(s, 5);
  for (bool ref : {true, false}) {
  SCOPED_TRACE(ref ? "reference path" : "fast path");
  auto m = LoadTiny(path, ref);
  ASSERT_TRUE(m);
  std::vector<TokenId> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<TokenId> b = a;
  b[0] = 40;  // differs only at position 0
  const int64_t n = static_cast<int64_t>(a.size()), V = s.vocab;
  KvCache ka = m->NewKvCache(n), kb = m->NewKvCache(n);
  std::vector<float> la(n * V), lb(n * V);
  ASSERT_TRUE(m->Forward(ka, a.data(), n, true, la.data()).ok());
  ASSERT_TRUE(m->Forward(kb, b.data(), n, true, lb.data()).ok());
  auto row_diff = [&](int64_t p) {
    std::vector<float> ra(la.begin() + p * V, la.begin() + (p + 1) * V), rb(lb.begin() + p * V, lb.begin() + (p + 1) * V);
    return MaxAbsDiff(ra, rb);
  };
  EXPECT_GT(row_diff(4), 1e-4) << "position 4 is within reach of position 0";
  for (int64_t p = 5; p < n; ++p) EXPECT_EQ(row_diff(p), 0.0) << "position " << p << " must not see position 0";
  }
  std::filesystem::remove(path);
}

// Steady decode must not touch the heap: after warm-up (workspaces sized), several 1-row
// decode steps and 8-row verify steps run with zero calls to operator new (counted by the
// replacement at the bottom of this file).
TEST_P(TinyArchTest, SteadyDecodeDoesNotAllocate) {
  TinySpec s;
  s.arch = GetParam();
  if (s.arch == "gemma3") s.sliding_window = 4;
  const std::string path = WriteTinyModel(s, 21);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  KvCache kv = m->NewKvCache(64);
  std::vector<TokenId> toks = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  std::vector<float> logits(8 * s.vocab);
  ASSERT_TRUE(m->Forward(kv, toks.data(), 12, false, logits.data()).ok());
  ASSERT_TRUE(m->Forward(kv, toks.data(), 1, false, logits.data()).ok());    // warm-up: 1 row
  ASSERT_TRUE(m->Forward(kv, toks.data(), 8, true, logits.data()).ok());     // warm-up: 8 rows
  kv.n_past -= 8;
  const int64_t before = AllocCount();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(m->Forward(kv, &toks[i], 1, false, logits.data()).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m->Forward(kv, toks.data() + i, 8, true, logits.data()).ok());
    kv.n_past -= 8;  // a rejected draft rolls back
  }
  EXPECT_EQ(AllocCount() - before, 0) << s.arch;
  // The counter works: an allocation in the window is seen.
  const int64_t c0 = AllocCount();
  auto* probe = new std::vector<int>(100);
  EXPECT_GE(AllocCount() - c0, 2);
  delete probe;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace mr

// Counting replacements of the global allocation functions for this test binary (the
// allocation test above reads the count; everything else is unaffected).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  mr::g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  mr::g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
