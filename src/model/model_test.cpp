// Forward-pass tests on tiny random models that the test builds itself (GgufWriter), one per
// architecture, checking properties that fail when the plumbing is wrong: incremental decoding
// with the KV cache equals a batched forward, the fast path tracks the FP32 reference path, and
// gemma3's sliding window hides tokens beyond its receptive field.
#include "model/model.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <random>

#include "base/half.h"
#include "model/forward_ops.h"
#include "model/gguf_writer.h"

namespace mr {
namespace {

std::atomic<int64_t> g_allocs{0};
int64_t AllocCount() {
  return g_allocs.load(std::memory_order_relaxed);
}

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
  std::string arch;  // llama | qwen2 | qwen3 | qwen3moe (4 experts of 128, 2 used) | phi3 (fused) | gemma2 | gemma3
                     // | smollm3 (at least 4 layers) | gpt-oss (qwen3moe's experts, with biases, sinks, YaRN
                     // factor 4 over 64 positions, sliding window 8 on even layers)
  int64_t n_layer = 2, d = 128, n_head = 4, n_head_kv = 2, head_dim = 32, ff = 192, vocab = 64;
  int64_t sliding_window = 0;
  // For malformed-file tests: edits the metadata after it is set, and a tensor's type and
  // bytes (F32 as generated) before it is added.
  std::function<void(gguf::GgufWriter&)> edit_meta;
  std::function<void(const std::string& name, uint32_t* type, std::vector<uint8_t>* bytes)> edit_tensor;
  // Write the matrices as Q4_K (attn_v, ffn_down and output as Q6_K, as a Q4_K_M file does)
  // with random blocks instead of F32; needs d, q_dim, ff multiples of 256.
  bool kquants = false;
  // With kquants: the Q4_K matrices as Q5_K instead (a Q5_K_M file).
  bool q5k = false;
  // Write the matrices as Q5_0 (attn_v, ffn_down and output as Q4_1) with random blocks: the
  // 32-input native formats; needs d, q_dim, ff multiples of 64.
  bool legacy32 = false;
  // Write the matrices as Q4_0 (attn_v, ffn_down and output as Q8_0, as a Q4_0 file's larger
  // types): the signed 32-input native formats; needs d, q_dim, ff multiples of 64.
  bool signed32 = false;
  // Write the matrices as F16 (attn_v, ffn_down and output as BF16): the float native formats.
  bool halves = false;
  // Write the matrices as MXFP4 (the random values through QuantizeKBlocks): gpt-oss's expert
  // format; needs d, q_dim, ff multiples of 64.
  bool mxfp4 = false;
  // Write the MoE experts (qwen3moe, gpt-oss) as MXFP4 3-D tensors, as gpt-oss's files store them.
  bool mxfp4_experts = false;
  // Write rope_freqs.weight (Llama 3.x rope scaling): head_dim / 2 factors from 1 to 8.
  bool rope_freqs = false;
};

constexpr uint32_t kF16 = 1, kBF16 = 30, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
                   kMXFP4 = 39;

void PutF16(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// Random Q4_K blocks (ggml block_q4_K) with centred weights of standard deviation ~ sigma:
// min m = scale sc and dmin = 7.5 d, so w = d sc (q - 7.5).
// fifth: Q5_K blocks instead (qh[32] between the scales and the quants; q - 15.5 uniform, ~9.2).
std::vector<uint8_t> RandomQ4K(int64_t n_blocks, std::mt19937& rng, float sigma, bool fifth = false) {
  std::uniform_int_distribution<int> byte(0, 255), six(32, 63);
  const int64_t bytes = fifth ? 176 : 144;
  std::vector<uint8_t> v(static_cast<size_t>(n_blocks * bytes));
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* x = v.data() + b * bytes;
    const float d = fifth ? sigma / (48.0f * 9.2f) : sigma / (48.0f * 4.6f);
    PutF16(x, d);
    PutF16(x + 2, (fifth ? 15.5f : 7.5f) * d);
    uint8_t* sc = x + 4;
    std::memset(sc, 0, 12);
    for (int j = 0; j < 8; ++j) {  // inverse of ggml get_scale_min_k4 with m = sc
      const int s6 = six(rng);
      if (j < 4) {
        sc[j] = static_cast<uint8_t>(s6);
        sc[j + 4] = static_cast<uint8_t>(s6);
      } else {
        sc[j + 4] = static_cast<uint8_t>((s6 & 0xF) | ((s6 & 0xF) << 4));
        sc[j - 4] |= static_cast<uint8_t>((s6 >> 4) << 6);
        sc[j] |= static_cast<uint8_t>((s6 >> 4) << 6);
      }
    }
    for (int i = 16; i < bytes; ++i) x[i] = static_cast<uint8_t>(byte(rng));
  }
  return v;
}

// Random Q6_K blocks (ggml block_q6_K): w = d sc (q - 32), |sc| in [20, 50] with random signs.
std::vector<uint8_t> RandomQ6K(int64_t n_blocks, std::mt19937& rng, float sigma) {
  std::uniform_int_distribution<int> byte(0, 255), mag(20, 50);
  std::vector<uint8_t> v(static_cast<size_t>(n_blocks * 210));
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* x = v.data() + b * 210;
    for (int i = 0; i < 192; ++i) x[i] = static_cast<uint8_t>(byte(rng));
    for (int i = 0; i < 16; ++i) {
      const int m = mag(rng);
      x[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(byte(rng) & 1 ? m : -m));
    }
    PutF16(x + 208, sigma / (35.0f * 18.5f));
  }
  return v;
}

// Random blocks of a 32-input format (`bytes` each: f16 d, then f16 m when m_over_d is not 0,
// then random quant bytes), with d chosen so the weights' standard deviation is ~sigma given the
// quants' own (q_sd, of q minus its offset).
std::vector<uint8_t> RandomBlocks32(int64_t n_blocks, std::mt19937& rng, int bytes, float sigma, float q_sd,
                                    float m_over_d = 0) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(static_cast<size_t>(n_blocks * bytes));
  const float d = sigma / q_sd;
  const int head = m_over_d != 0 ? 4 : 2;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* x = v.data() + b * bytes;
    PutF16(x, d);
    if (m_over_d != 0) PutF16(x + 2, m_over_d * d);
    for (int i = head; i < bytes; ++i) x[i] = static_cast<uint8_t>(byte(rng));
  }
  return v;
}

// Q5_0 (d, qh, qs): q - 16 uniform in [-16, 15], sd ~9.2.
std::vector<uint8_t> RandomQ50(int64_t n, std::mt19937& rng, float sigma) {
  return RandomBlocks32(n, rng, 22, sigma, 9.2f);
}
// Q4_1 (d, m, qs): q uniform in [0, 15], m = -7.5 d centers them.
std::vector<uint8_t> RandomQ41(int64_t n, std::mt19937& rng, float sigma) {
  return RandomBlocks32(n, rng, 20, sigma, 4.6f, -7.5f);
}
// Q8_0 (d, int8 qs): q uniform in [-128, 127], sd ~73.9.
std::vector<uint8_t> RandomQ80(int64_t n, std::mt19937& rng, float sigma) {
  return RandomBlocks32(n, rng, 34, sigma, 73.9f);
}
// Q4_0 (d, qs): q - 8 uniform in [-8, 7], sd ~4.6.
std::vector<uint8_t> RandomQ40(int64_t n, std::mt19937& rng, float sigma) {
  return RandomBlocks32(n, rng, 18, sigma, 4.6f);
}

// Writes a random tiny model to a temp file and returns its path.
std::string WriteTinyModel(const TinySpec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  gguf::GgufWriter w;
  const std::string a = s.arch;
  // smollm3 has at least 4 layers, so that one of them (the 4th) is a NoPE layer.
  const int64_t n_layer = a == "smollm3" ? std::max<int64_t>(s.n_layer, 4) : s.n_layer;
  w.SetString("general.architecture", a);
  w.SetU32(a + ".block_count", static_cast<uint32_t>(n_layer));
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
  const bool oss = a == "gpt-oss";
  const bool moe = a == "qwen3moe" || oss;
  constexpr int64_t kExperts = 4, kExpertFf = 128;
  if (oss) {
    w.SetU32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window ? s.sliding_window : 8));
    w.SetString(a + ".rope.scaling.type", "yarn");
    w.SetF32(a + ".rope.scaling.factor", 4.0f);
    w.SetU32(a + ".rope.scaling.original_context_length", 64);
  }
  if (moe) {
    w.SetU32(a + ".expert_count", kExperts);
    w.SetU32(a + ".expert_used_count", 2);
    w.SetU32(a + ".expert_feed_forward_length", kExpertFf);
  }
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < s.vocab; ++i) tokens.push_back(std::string(1, static_cast<char>('0' + i)));
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "qwen2");
  w.SetArrayStr("tokenizer.ggml.tokens", tokens);
  w.SetArrayI32("tokenizer.ggml.token_type", std::vector<int32_t>(s.vocab, 1));
  w.SetArrayStr("tokenizer.ggml.merges", {});
  if (s.edit_meta) s.edit_meta(w);
  const int64_t d = s.d, q_dim = s.n_head * s.head_dim, kv_dim = s.n_head_kv * s.head_dim;
  auto add = [&](const std::string& name, std::vector<int64_t> dims, std::vector<uint8_t> bytes) {
    uint32_t type = kF32;
    if (s.edit_tensor) s.edit_tensor(name, &type, &bytes);
    ASSERT_TRUE(w.AddTensor(name, type, std::move(dims), std::move(bytes)).ok()) << name;
  };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float sigma = 1.0f / std::sqrt(float(cols));
    const bool second = name.find("attn_v") != std::string::npos || name.find("ffn_down") != std::string::npos ||
                        name == "output.weight";
    if (s.kquants) {
      const int64_t blocks = rows * cols / 256;
      ASSERT_TRUE(w.AddTensor(name, second ? kQ6_K : (s.q5k ? kQ5_K : kQ4_K), {cols, rows},
                              second ? RandomQ6K(blocks, rng, sigma) : RandomQ4K(blocks, rng, sigma, s.q5k))
                      .ok());
      return;
    }
    if (s.legacy32) {
      const int64_t blocks = rows * cols / 32;
      ASSERT_TRUE(w.AddTensor(name, second ? kQ4_1 : kQ5_0, {cols, rows},
                              second ? RandomQ41(blocks, rng, sigma) : RandomQ50(blocks, rng, sigma))
                      .ok());
      return;
    }
    if (s.signed32) {
      const int64_t blocks = rows * cols / 32;
      ASSERT_TRUE(w.AddTensor(name, second ? kQ8_0 : kQ4_0, {cols, rows},
                              second ? RandomQ80(blocks, rng, sigma) : RandomQ40(blocks, rng, sigma))
                      .ok());
      return;
    }
    std::vector<uint8_t> bytes = RandomF32Bytes(rows * cols, rng, sigma);
    if (s.mxfp4) {
      std::vector<float> v(static_cast<size_t>(rows * cols));
      std::memcpy(v.data(), bytes.data(), bytes.size());
      std::vector<uint8_t> q(static_cast<size_t>(rows * cols / 32 * KSuperBytes(KFormat::kMXFP4)));
      ASSERT_TRUE(QuantizeKBlocks(KFormat::kMXFP4, v.data(), q.data(), rows * cols / 32));
      ASSERT_TRUE(w.AddTensor(name, kMXFP4, {cols, rows}, std::move(q)).ok());
      return;
    }
    if (s.halves) {  // the same values rounded to 16 bits
      std::vector<uint8_t> h(static_cast<size_t>(rows * cols * 2));
      for (int64_t i = 0; i < rows * cols; ++i) {
        float v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        const uint16_t x = second ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(h.data() + 2 * i, &x, 2);
      }
      ASSERT_TRUE(w.AddTensor(name, second ? kBF16 : kF16, {cols, rows}, std::move(h)).ok());
      return;
    }
    add(name, {cols, rows}, std::move(bytes));
  };
  auto vec = [&](const std::string& name, int64_t n, float around) {
    std::normal_distribution<float> dist(around, 0.1f);
    std::vector<uint8_t> b(n * 4);
    for (int64_t i = 0; i < n; ++i) {
      float v = dist(rng);
      std::memcpy(b.data() + i * 4, &v, 4);
    }
    add(name, {n}, std::move(b));
  };
  mat("token_embd.weight", s.vocab, d);
  vec("output_norm.weight", d, 1.0f);
  if (s.rope_freqs) {
    std::vector<uint8_t> b(s.head_dim / 2 * 4);
    for (int64_t i = 0; i < s.head_dim / 2; ++i) {
      const float f = 1.0f + 7.0f * static_cast<float>(i) / static_cast<float>(s.head_dim / 2);
      std::memcpy(b.data() + i * 4, &f, 4);
    }
    add("rope_freqs.weight", {s.head_dim / 2}, std::move(b));
  }
  if (a != "qwen2") mat("output.weight", s.vocab, d);  // qwen2 ties embeddings here
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", d, 1.0f);
    vec(p + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), d, 1.0f);
    if (a == "phi3") {  // q, k, v rows in one tensor
      mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d);
    } else {
      mat(p + "attn_q.weight", q_dim, d);
      mat(p + "attn_k.weight", kv_dim, d);
      mat(p + "attn_v.weight", kv_dim, d);
    }
    mat(p + "attn_output.weight", d, q_dim);
    if (moe) {  // router (large, so the top 2 are clear), then experts stacked in a third dim
      add(p + "ffn_gate_inp.weight", {d, kExperts}, RandomF32Bytes(kExperts * d, rng, 3.0f / std::sqrt(float(d))));
      auto experts = [&](const std::string& name, std::vector<int64_t> dims, std::vector<uint8_t> f32) {
        if (!s.mxfp4_experts) return add(name, std::move(dims), std::move(f32));
        const int64_t n = static_cast<int64_t>(f32.size() / 4);
        std::vector<float> v(static_cast<size_t>(n));
        std::memcpy(v.data(), f32.data(), f32.size());
        std::vector<uint8_t> q(static_cast<size_t>(n / 32 * KSuperBytes(KFormat::kMXFP4)));
        ASSERT_TRUE(QuantizeKBlocks(KFormat::kMXFP4, v.data(), q.data(), n / 32));
        ASSERT_TRUE(w.AddTensor(name, kMXFP4, std::move(dims), std::move(q)).ok()) << name;
      };
      for (const char* name : {"ffn_gate_exps.weight", "ffn_up_exps.weight"})
        experts(p + name, {d, kExpertFf, kExperts},
                RandomF32Bytes(kExperts * kExpertFf * d, rng, 1.0f / std::sqrt(float(d))));
      experts(p + "ffn_down_exps.weight", {kExpertFf, d, kExperts},
              RandomF32Bytes(kExperts * kExpertFf * d, rng, 1.0f / std::sqrt(float(kExpertFf))));
      if (oss) {  // router and expert biases, the output bias, a sink logit per head
        add(p + "ffn_gate_inp.bias", {kExperts}, RandomF32Bytes(kExperts, rng, 1.0f));
        add(p + "ffn_gate_exps.bias", {kExpertFf, kExperts}, RandomF32Bytes(kExperts * kExpertFf, rng, 0.5f));
        add(p + "ffn_up_exps.bias", {kExpertFf, kExperts}, RandomF32Bytes(kExperts * kExpertFf, rng, 0.5f));
        add(p + "ffn_down_exps.bias", {d, kExperts}, RandomF32Bytes(kExperts * d, rng, 0.1f));
        vec(p + "attn_output.bias", d, 0.0f);
        add(p + "attn_sinks.weight", {s.n_head}, RandomF32Bytes(s.n_head, rng, 1.0f));
      }
    } else if (a == "phi3") {  // gate rows, then up rows, in ffn_up
      mat(p + "ffn_up.weight", 2 * s.ff, d);
      mat(p + "ffn_down.weight", d, s.ff);
    } else {
      mat(p + "ffn_gate.weight", s.ff, d);
      mat(p + "ffn_up.weight", s.ff, d);
      mat(p + "ffn_down.weight", d, s.ff);
    }
    if (a == "qwen2" || oss) {
      vec(p + "attn_q.bias", q_dim, 0.0f);
      vec(p + "attn_k.bias", kv_dim, 0.0f);
      vec(p + "attn_v.bias", kv_dim, 0.0f);
    }
    if (a == "gemma3" || a == "qwen3" || moe) {
      vec(p + "attn_q_norm.weight", s.head_dim, 1.0f);
      vec(p + "attn_k_norm.weight", s.head_dim, 1.0f);
    }
    if (a == "gemma3" || a == "gemma2") {
      vec(p + "post_attention_norm.weight", d, 1.0f);
      vec(p + "post_ffw_norm.weight", d, 1.0f);
    }
  }
  const std::string path = (std::filesystem::temp_directory_path() / ("mererun_tiny_" + a + "_" + std::to_string(seed) +
                                                                      "_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  EXPECT_TRUE(w.WriteFile(path).ok());
  return path;
}

std::unique_ptr<Model> LoadTiny(const std::string& path, bool ref_path, WeightMode weights = WeightMode::kNative,
                                uint8_t fine_acts = 0, CpuVariant cpu = SelectedCpuVariant()) {
  LoadOptions o;
  o.cpu = cpu;
  o.n_threads = 2;
  o.ref_path = ref_path;
  o.weights = weights;
  o.fine_acts = fine_acts;
  auto m = Model::Load(path, o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// The logits of every position of toks (n x V), from one batched forward over a fresh cache.
std::vector<float> AllLogits(Model& m, const std::vector<TokenId>& toks, int64_t V) {
  const int64_t n = static_cast<int64_t>(toks.size());
  KvCache kv = m.NewKvCache(n);
  std::vector<float> out(n * V);
  EXPECT_TRUE(m.Forward(kv, toks.data(), n, true, out.data()).ok());
  return out;
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
  if (s.arch == "gemma3" || s.arch == "gemma2") s.sliding_window = 5;
  const std::string path = WriteTinyModel(s, 7);
  for (bool ref : {false, true}) {
    auto m = LoadTiny(path, ref);
    ASSERT_TRUE(m);
    const std::vector<TokenId> toks = {1, 5, 9, 2, 33, 17, 4, 60, 8, 8, 3, 12};
    const int64_t n = static_cast<int64_t>(toks.size()), V = s.vocab;
    KvCache kv1 = m->NewKvCache(32);
    std::vector<float> all(n * V);
    ASSERT_TRUE(m->Forward(kv1, toks.data(), n, true, all.data()).ok());
    // One at a time, and in uneven chunks: each row's logits must equal the batched ones bit for bit.
    KvCache kv2 = m->NewKvCache(32);
    std::vector<float> one(V);
    for (int64_t t = 0; t < n; ++t) {
      ASSERT_TRUE(m->Forward(kv2, &toks[t], 1, false, one.data()).ok());
      std::vector<float> row(all.begin() + t * V, all.begin() + (t + 1) * V);
      EXPECT_EQ(MaxAbsDiff(row, one), 0.0f) << s.arch << " ref=" << ref << " position " << t;
    }
    KvCache kv3 = m->NewKvCache(32);
    std::vector<float> chunk(5 * V);
    ASSERT_TRUE(m->Forward(kv3, toks.data(), 7, false, one.data()).ok());
    ASSERT_TRUE(m->Forward(kv3, toks.data() + 7, 5, true, chunk.data()).ok());
    std::vector<float> tail(all.begin() + 7 * V, all.end());
    EXPECT_EQ(MaxAbsDiff(tail, chunk), 0.0f) << s.arch;
    EXPECT_EQ(kv3.n_past, n);
  }
  std::filesystem::remove(path);
}

// Forward runs a long call in passes of kForwardChunk rows (bounded workspaces): the logits of
// every row, and of the last row alone, must be those of calls that each fit in one pass.
TEST(Forward, CallsLongerThanOnePassGiveTheSameLogits) {
  TinySpec s;
  s.arch = "qwen2";
  const std::string path = WriteTinyModel(s, 19);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  const int64_t n = 2 * Model::kForwardChunk + 37, V = s.vocab, piece = 300;
  static_assert(piece < Model::kForwardChunk);
  std::mt19937 rng(3);
  std::vector<TokenId> toks(static_cast<size_t>(n));
  for (auto& t : toks) t = static_cast<TokenId>(rng() % s.vocab);
  KvCache kv1 = m->NewKvCache(n);
  std::vector<float> all(static_cast<size_t>(n * V));
  ASSERT_TRUE(m->Forward(kv1, toks.data(), n, true, all.data()).ok());
  EXPECT_EQ(kv1.n_past, n);
  KvCache kv2 = m->NewKvCache(n);
  std::vector<float> pieces(static_cast<size_t>(n * V));
  for (int64_t r0 = 0; r0 < n; r0 += piece) {
    const int64_t k = std::min(piece, n - r0);
    ASSERT_TRUE(m->Forward(kv2, toks.data() + r0, k, true, pieces.data() + r0 * V).ok());
  }
  EXPECT_EQ(MaxAbsDiff(all, pieces), 0.0);
  KvCache kv3 = m->NewKvCache(n);
  std::vector<float> last(static_cast<size_t>(V));
  ASSERT_TRUE(m->Forward(kv3, toks.data(), n, false, last.data()).ok());
  EXPECT_EQ(kv3.n_past, n);
  EXPECT_EQ(MaxAbsDiff(last, std::vector<float>(all.end() - V, all.end())), 0.0);
  // An overflowing call is refused before any pass runs: the cache is untouched.
  KvCache kv4 = m->NewKvCache(n - 1);
  EXPECT_FALSE(m->Forward(kv4, toks.data(), n, false, last.data()).ok());
  EXPECT_EQ(kv4.n_past, 0);
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
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  // int8 activations with per-group scales on Q8/g64 weights: relative error ~2-3% on these
  // random models (2.2-2.4% with 32-wide activation groups), far below what a wrong kernel or
  // layout gives (~100%). The MoE model sums two experts' quantized outputs per row: 3.6%.
  EXPECT_LT(std::sqrt(err / norm), s.arch == "qwen3moe" || s.arch == "gpt-oss" ? 0.045 : 0.035) << s.arch;
}

// Native matrices stay in their tiles by default (fewer bytes than Q8/g64), track the reference
// path as closely as the Q8/g64 conversion does, and decode row by row equals the batched forward
// bit for bit (the 1-row and multi-row kernel paths agree exactly). F16 / BF16 matrices (halves)
// are more bytes than Q8/g64 and read FP32 activations: far closer to the reference than it.
void ExpectNativeTracksReference(const TinySpec& s, uint32_t seed) {
  const std::string path = WriteTinyModel(s, seed);
  // The precision checks run with FP32 attention: the amx and avx512bf16 variants' BF16 attention
  // adds its own rounding (about 0.2 % of these logits), checked against these numbers below.
  const CpuVariant cpu = GetKernels(SelectedCpuVariant()).attention_bf16 ? CpuVariant::kAvx512 : SelectedCpuVariant();
  auto native = LoadTiny(path, false, WeightMode::kNative, 0, cpu);
  auto q8 = LoadTiny(path, false, WeightMode::kQ8G64, 0, cpu);
  auto ref = LoadTiny(path, true);
  auto fine = LoadTiny(path, false, WeightMode::kNative, kActFineRoles, cpu);
  ASSERT_TRUE(native && q8 && ref && fine);
  EXPECT_EQ(native->native_matrices(), 1 + s.n_layer * 7 + (s.arch == "qwen2" ? 0 : 1));
  EXPECT_EQ(fine->fine_acts(), kActFineRoles);
  EXPECT_EQ(native->fine_acts(), 0);
  EXPECT_EQ(q8->native_matrices(), 0);
  if (s.halves) {
    EXPECT_GT(native->weight_bytes(), q8->weight_bytes());
  } else {
    EXPECT_LT(native->weight_bytes(), q8->weight_bytes());
  }
  const std::vector<TokenId> toks = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 46};
  const int64_t n = static_cast<int64_t>(toks.size()), V = s.vocab;
  auto run = [&](Model& m) { return AllLogits(m, toks, V); };
  const std::vector<float> a = run(*native), b = run(*q8), r = run(*ref), f = run(*fine);
  auto rel = [&](const std::vector<float>& x) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (x[i] - r[i]) * (x[i] - r[i]);
      norm += r[i] * r[i];
    }
    return std::sqrt(err / norm);
  };
  // Native weights leave only the activation rounding: at most the Q8/g64 path's error.
  // MXFP4's values, mostly small multiples of a power of two under a few large codes, lose more
  // to the int8 requantization (measured 0.031-0.037, the other formats 0.021-0.030).
  EXPECT_LT(rel(a), 0.035) << s.arch;
  EXPECT_LT(rel(b), s.mxfp4 ? 0.045 : 0.035) << s.arch;
  EXPECT_LE(rel(a), rel(b) * 1.05) << s.arch;
  // Halves: no activation rounding left, only FP32 summation order (measured ~3e-5).
  if (s.halves) {
    EXPECT_LT(rel(a), 1e-3) << s.arch << " native " << rel(a) << ", q8/g64 " << rel(b);
  }
  // Fine activations (every input as two int8 rows, ~15 bits): the activation rounding all but
  // gone, so at least 10x closer than int8 on quantized weights (measured 19-65x); on F16 / BF16,
  // which read FP32 anyway, the same numbers.
  if (s.halves) {
    EXPECT_EQ(MaxAbsDiff(a, f), 0.0) << s.arch;
  } else {
    EXPECT_LT(rel(f), rel(a) / 10) << s.arch << " fine " << rel(f) << ", int8 " << rel(a);
  }
  std::printf("[%s] relative error vs reference: native %.5f (fine activations %.6f), q8/g64 %.5f\n", s.arch.c_str(),
              rel(a), rel(f), rel(b));
  // The BF16 attention variants (amx, avx512bf16): amx's prefill rows on the AMX matmul kernels
  // (16 rows and more) give the AVX-512 kernels' numbers bit for bit (kquant_test), and
  // avx512bf16's matmuls are avx512's; the model's logits differ by the BF16 attention's rounding:
  // with fine activations within 1 % of the reference's norm (measured 0.15-0.3 %); with int8
  // activations that difference moves the next layers' int8 rounding, which draws its noise anew
  // (amx and avx512 measured 1.7-2.4 % apart), so there the variant must be as close to the
  // reference as avx512 is, within 25 %.
  std::vector<std::unique_ptr<Model>> bf16_models;  // kept for the row checks below
  std::vector<std::vector<float>> bf16_logits;
  bf16_logits.reserve(2 * std::size(kAllCpuVariants));  // stable addresses for row_checks
  for (CpuVariant v : kAllCpuVariants) {
    if (!GetKernels(v).attention_bf16) continue;
    const char* name = CpuVariantName(v);
    if (!CpuSupports(v)) {
      std::printf("[%s] %s: not supported on this CPU, its BF16 attention checks skipped\n", s.arch.c_str(), name);
      continue;
    }
    auto bm = LoadTiny(path, false, WeightMode::kNative, 0, v);
    auto bm_fine = LoadTiny(path, false, WeightMode::kNative, kActFineRoles, v);
    ASSERT_TRUE(bm && bm_fine);
    const std::vector<float>& xa = bf16_logits.emplace_back(run(*bm));
    const std::vector<float>& xf = bf16_logits.emplace_back(run(*bm_fine));
    auto rel_to = [&](const std::vector<float>& x, const std::vector<float>& y) {
      double err = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err += (x[i] - y[i]) * (x[i] - y[i]);
        norm += r[i] * r[i];
      }
      return std::sqrt(err / norm);
    };
    if (s.head_dim % 32 == 0) {
      EXPECT_GT(rel_to(xa, a), 0.0) << s.arch << ": the " << name << " attention rounds to BF16";
    } else {  // other head sizes run the AVX-512 attention: the same numbers bit for bit
      EXPECT_EQ(MaxAbsDiff(xa, a), 0.0) << s.arch << " " << name;
    }
    EXPECT_LT(rel(xa), rel(a) * 1.25) << s.arch << " " << name << " " << rel(xa) << ", avx512 " << rel(a);
    EXPECT_LT(rel_to(xf, f), 0.01) << s.arch << " " << name;
    if (s.halves) {
      EXPECT_EQ(MaxAbsDiff(xa, xf), 0.0) << s.arch << " " << name;
    } else {
      EXPECT_LT(rel(xf), rel(a) / 5) << s.arch << " " << name << " fine " << rel(xf) << ", int8 " << rel(a);
    }
    std::printf("[%s] %s (BF16 attention) vs avx512: int8 %.5f, fine %.5f; %s fine vs reference %.5f\n", s.arch.c_str(),
                name, rel_to(xa, a), rel_to(xf, f), name, rel(xf));
    bf16_models.push_back(std::move(bm));
    bf16_models.push_back(std::move(bm_fine));
  }
  // A row's numbers do not depend on the rows beside it (greedy speculation relies on it), with
  // int8 and with fine activations, and on the BF16 attention variants.
  std::vector<std::pair<Model*, const std::vector<float>*>> row_checks = {{native.get(), &a}, {fine.get(), &f}};
  for (size_t i = 0; i < bf16_models.size(); ++i) row_checks.emplace_back(bf16_models[i].get(), &bf16_logits[i]);
  for (auto [m, all] : row_checks) {
    KvCache kv = m->NewKvCache(n);
    std::vector<float> one(V);
    for (int64_t t = 0; t < n; ++t) {
      ASSERT_TRUE(m->Forward(kv, &toks[t], 1, false, one.data()).ok());
      std::vector<float> row(all->begin() + t * V, all->begin() + (t + 1) * V);
      EXPECT_EQ(MaxAbsDiff(row, one), 0.0f) << s.arch << " position " << t;  // bit-identical
    }
  }
  std::filesystem::remove(path);
}

// The native-format tests run on llama, qwen2 and qwen3, which cover the formats. k256: widths
// for the K-quants' 256-input blocks; else widths that are not multiples of 256 (as
// Qwen2.5-0.5B's 896) for the 32-input blocks.
bool NativeFormatArch(const std::string& arch) {
  return arch != "gemma3" && arch != "gemma2" && arch != "qwen3moe" && arch != "smollm3" && arch != "gpt-oss";
}
TinySpec NativeSpec(const std::string& arch, bool k256) {
  TinySpec s;
  s.arch = arch;
  s.d = k256 ? 256 : 192;
  s.head_dim = k256 ? 64 : 48;
  s.ff = k256 ? 512 : 320;
  return s;
}
constexpr const char* kNativeSkip = "llama, qwen2, qwen3 cover the native formats";

TEST_P(TinyArchTest, NativeKQuantWeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), true);
  s.kquants = true;
  ExpectNativeTracksReference(s, 41);
}

TEST_P(TinyArchTest, NativeQ5KWeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), true);
  s.kquants = true;
  s.q5k = true;
  ExpectNativeTracksReference(s, 45);
}

TEST_P(TinyArchTest, NativeQ50Q41WeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), false);
  s.legacy32 = true;
  ExpectNativeTracksReference(s, 43);
}

TEST_P(TinyArchTest, NativeQ40Q80WeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), false);
  s.signed32 = true;
  ExpectNativeTracksReference(s, 47);
}

TEST_P(TinyArchTest, NativeF16BF16WeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), false);
  s.halves = true;
  ExpectNativeTracksReference(s, 49);
}

TEST_P(TinyArchTest, NativeMXFP4WeightsTrackReferencePath) {
  if (!NativeFormatArch(GetParam())) GTEST_SKIP() << kNativeSkip;
  TinySpec s = NativeSpec(GetParam(), false);
  s.mxfp4 = true;
  ExpectNativeTracksReference(s, 51);
}

// gpt-oss's experts as its files store them: 3-D MXFP4 tensors, each expert a row view of them
// kept in native MXFP4 tiles on the fast path (2 layers x 3 projections x 4 experts) and
// dequantized exactly on the reference path; the fast path tracks the reference (two-row inputs
// closer than int8), and rows run one at a time give the batch's logits bit for bit.
TEST(GptOss, MXFP4ExpertsRunNativeAndTrackTheReference) {
  TinySpec s;
  s.arch = "gpt-oss";
  s.mxfp4_experts = true;
  const std::string path = WriteTinyModel(s, 53);
  const CpuVariant cpu = GetKernels(SelectedCpuVariant()).attention_bf16 ? CpuVariant::kAvx512 : SelectedCpuVariant();
  auto ref = LoadTiny(path, true);
  auto fast = LoadTiny(path, false, WeightMode::kNative, 0, cpu);
  auto fine = LoadTiny(path, false, WeightMode::kNative, kActFineRoles, cpu);
  ASSERT_TRUE(ref && fast && fine);
  // Per layer 3 x 4 experts in MXFP4; the F32 attention matrices are converted, not native.
  EXPECT_EQ(fast->native_matrices(), s.n_layer * 3 * 4);
  const std::vector<TokenId> toks = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3};
  const int64_t V = s.vocab, n = static_cast<int64_t>(toks.size());
  const std::vector<float> r = AllLogits(*ref, toks, V), a = AllLogits(*fast, toks, V), f = AllLogits(*fine, toks, V);
  auto rel = [&](const std::vector<float>& x) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (x[i] - r[i]) * (x[i] - r[i]);
      norm += r[i] * r[i];
    }
    return std::sqrt(err / norm);
  };
  EXPECT_LT(rel(a), 0.05);
  EXPECT_LT(rel(f), rel(a));  // two-row inputs only remove rounding
  KvCache kv = fast->NewKvCache(n);
  std::vector<float> one(V);
  for (int64_t t = 0; t < n; ++t) {
    ASSERT_TRUE(fast->Forward(kv, &toks[t], 1, false, one.data()).ok());
    EXPECT_EQ(MaxAbsDiff(std::vector<float>(a.begin() + t * V, a.begin() + (t + 1) * V), one), 0.0) << t;
  }
  std::filesystem::remove(path);
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

// vocab_only (the fuzz targets' tokenizer and template source): the same metadata and
// tokenizer as a full load, no weights, and Forward refused rather than run on empty matrices.
TEST_P(TinyArchTest, VocabOnlyLoadTokenizesAndRefusesForward) {
  TinySpec s;
  s.arch = GetParam();
  const std::string path = WriteTinyModel(s, 9);
  auto full = LoadTiny(path, false);
  ASSERT_TRUE(full);
  LoadOptions o;
  o.n_threads = 1;
  o.vocab_only = true;
  auto m = Model::Load(path, o);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE((*m)->vocab_only());
  EXPECT_FALSE(full->vocab_only());
  EXPECT_EQ((*m)->weight_bytes(), 0u);
  EXPECT_EQ((*m)->config().n_vocab, full->config().n_vocab);
  EXPECT_EQ((*m)->tokenizer().vocab_size(), full->tokenizer().vocab_size());
  EXPECT_EQ((*m)->tokenizer().Encode("0123 45", true, true), full->tokenizer().Encode("0123 45", true, true));
  EXPECT_EQ((*m)->file().GetString("general.architecture"), full->file().GetString("general.architecture"));
  KvCache kv = (*m)->NewKvCache(4);
  std::vector<float> logits(s.vocab);
  const TokenId one = 1;
  const Status st = (*m)->Forward(kv, &one, 1, false, logits.data());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocab_only"), std::string::npos) << st.message();
  EXPECT_EQ(kv.n_past, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyArchTest,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "smollm3",
                                           "gpt-oss"));

// Rope scaling metadata (arch_common.cpp ReadRopeScaling), as llama.cpp's ggml_rope_ext applies
// it. gpt-oss's tiny file: YaRN, factor 4 over an original context of 64, head size 32, base
// 1e4, so YaRN's correction range is pairs 0..5 (floor(32 ln(64 / (32 * 2 pi)) / (2 ln 1e4)) < 0
// -> 0, ceil(32 ln(64 / (2 pi)) / (2 ln 1e4)) = 5): pair 0 keeps its frequency, pairs 5.. are
// divided by 4, the pairs between by factors rising from 1 to 4 (linear in the ramp, which gives
// 1 / (1/4 + 3/4 (1 - i/5))); cos and sin are scaled by 1 + 0.1 ln 4, which multiplies the
// scores by its square. "linear" divides every pair by the factor; other types are refused
// naming the key.
TEST(RopeScaling, YarnAndLinearFactorsAndUnknownTypes) {
  TinySpec s;
  s.arch = "gpt-oss";
  const std::string path = WriteTinyModel(s, 5);
  auto m = LoadTiny(path, /*ref_path=*/false);
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  ASSERT_EQ(c.rope_freq_factors.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const double ramp = i >= 5 ? 0.0 : 1.0 - i / 5.0;  // 1: the original frequency
    const double expect = 1.0 / (0.25 * (1 - ramp) + ramp);
    EXPECT_NEAR(c.rope_freq_factors[static_cast<size_t>(i)], expect, 1e-5 * expect) << "pair " << i;
  }
  const double mscale = 1 + 0.1 * std::log(4.0);
  EXPECT_NEAR(c.attn_scale, mscale * mscale / std::sqrt(32.0), 1e-6);
  std::filesystem::remove(path);

  s.arch = "llama";
  s.edit_meta = [](gguf::GgufWriter& w) {
    w.SetString("llama.rope.scaling.type", "linear");
    w.SetF32("llama.rope.scaling.factor", 2.5f);
  };
  const std::string lin = WriteTinyModel(s, 6);
  auto ml = LoadTiny(lin, /*ref_path=*/true);
  ASSERT_NE(ml, nullptr);
  ASSERT_EQ(ml->config().rope_freq_factors.size(), 16u);
  for (float f : ml->config().rope_freq_factors) EXPECT_EQ(f, 2.5f);
  EXPECT_NEAR(ml->config().attn_scale, 1 / std::sqrt(32.0), 1e-7);
  std::filesystem::remove(lin);

  s.edit_meta = [](gguf::GgufWriter& w) {
    w.SetString("llama.rope.scaling.type", "longrope");
    w.SetF32("llama.rope.scaling.factor", 4.0f);
  };
  const std::string bad = WriteTinyModel(s, 7);
  LoadOptions o;
  o.n_threads = 1;
  auto mb = Model::Load(bad, o);
  ASSERT_FALSE(mb.ok());
  EXPECT_NE(mb.status().message().find("llama.rope.scaling.type"), std::string::npos) << mb.status().message();
  EXPECT_NE(mb.status().message().find("longrope"), std::string::npos) << mb.status().message();
  std::filesystem::remove(bad);
}

// Rope scaling reaches sliding-window layers only where llama.cpp copies it to them (gemma2,
// gpt-oss): Gemma 3's 4B-27B files scale their global layers (linear x8) and leave the sliding
// ones alone. A 2-layer gemma3 file has only sliding layers (layer 5 is the first global one), so
// its logits must not move when linear scaling is added, on either path; YaRN is refused for
// gemma3 naming the key. A factor of 0 means none (llama.cpp), and rope.scaling.attn_factor
// scales q and k whatever the type.
TEST(RopeScaling, SlidingLayersOfGemma3KeepTheirRope) {
  TinySpec s;
  s.arch = "gemma3";
  s.sliding_window = 4;
  const std::string first = WriteTinyModel(s, 8), plain = first + ".plain";  // the next write reuses the name
  std::filesystem::rename(first, plain);
  s.edit_meta = [](gguf::GgufWriter& w) {
    w.SetString("gemma3.rope.scaling.type", "linear");
    w.SetF32("gemma3.rope.scaling.factor", 8.0f);
  };
  const std::string scaled = WriteTinyModel(s, 8);
  const std::vector<TokenId> toks = {1, 5, 9, 2, 7, 3, 11, 4};
  for (bool ref : {true, false}) {
    auto a = LoadTiny(plain, ref), b = LoadTiny(scaled, ref);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->config().rope_freq_factors.size(), 16u);
    EXPECT_EQ(MaxAbsDiff(AllLogits(*a, toks, s.vocab), AllLogits(*b, toks, s.vocab)), 0.0) << (ref ? "ref" : "fast");
  }
  s.edit_meta = [](gguf::GgufWriter& w) {
    w.SetString("gemma3.rope.scaling.type", "yarn");
    w.SetF32("gemma3.rope.scaling.factor", 8.0f);
  };
  const std::string yarn = WriteTinyModel(s, 9);
  LoadOptions o;
  o.n_threads = 1;
  auto y = Model::Load(yarn, o);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("gemma3.rope.scaling.type"), std::string::npos) << y.status().message();

  s.arch = "llama";
  s.edit_meta = [](gguf::GgufWriter& w) {
    w.SetString("llama.rope.scaling.type", "linear");
    w.SetF32("llama.rope.scaling.factor", 0.0f);
    w.SetF32("llama.rope.scaling.attn_factor", 1.5f);
  };
  const std::string zero = WriteTinyModel(s, 10);
  auto z = LoadTiny(zero, /*ref_path=*/true);
  ASSERT_NE(z, nullptr);
  EXPECT_TRUE(z->config().rope_freq_factors.empty());
  EXPECT_NEAR(z->config().attn_scale, 1.5 * 1.5 / std::sqrt(32.0), 1e-6);
  for (const std::string& p : {plain, scaled, yarn, zero}) std::filesystem::remove(p);
}

// Llama 3.x rope scaling: rope_freqs.weight divides each pair's frequency. The factors change the
// logits (they are applied), both paths apply them alike (the fast path tracks the reference),
// and a factor that is not positive is a load error naming the tensor.
TEST(RopeFreqs, AppliedOnBothPathsAndValidated) {
  TinySpec s;
  s.arch = "llama";
  const std::string plain = WriteTinyModel(s, 5) + ".plain";  // the next write reuses the name
  std::filesystem::rename(plain.substr(0, plain.size() - 6), plain);
  s.rope_freqs = true;
  const std::string scaled = WriteTinyModel(s, 5);
  const std::vector<TokenId> toks = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3};
  const int64_t n = static_cast<int64_t>(toks.size());
  auto logits = [&](const std::string& path, bool ref) {
    auto m = LoadTiny(path, ref);
    EXPECT_TRUE(m);
    KvCache kv = m->NewKvCache(n);
    std::vector<float> out(n * s.vocab);
    EXPECT_TRUE(m->Forward(kv, toks.data(), n, true, out.data()).ok());
    return out;
  };
  const auto ref_plain = logits(plain, true), ref_scaled = logits(scaled, true), fast_scaled = logits(scaled, false);
  // Row 0 is at position 0 (no rotation): equal; later rows differ.
  EXPECT_EQ(std::vector<float>(ref_plain.begin(), ref_plain.begin() + s.vocab),
            std::vector<float>(ref_scaled.begin(), ref_scaled.begin() + s.vocab));
  auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (x[i] - y[i]) * (x[i] - y[i]);
      norm += y[i] * y[i];
    }
    return std::sqrt(err / norm);
  };
  EXPECT_GT(rel(ref_plain, ref_scaled), 0.05);                                // the factors move the logits
  EXPECT_LT(rel(fast_scaled, ref_scaled), 0.035);                             // as close as any fast path
  EXPECT_LT(rel(fast_scaled, ref_scaled), 0.5 * rel(ref_plain, ref_scaled));  // and both paths apply them
  s.edit_tensor = [](const std::string& name, uint32_t*, std::vector<uint8_t>* bytes) {
    if (name == "rope_freqs.weight") std::memset(bytes->data() + 8, 0, 4);  // factor 2 = 0
  };
  const std::string bad = WriteTinyModel(s, 5);
  auto r = Model::Load(bad, LoadOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rope_freqs.weight"), std::string::npos) << r.status().message();
  for (const auto& p : {plain, scaled, bad}) std::filesystem::remove(p);
}

// ---- Malformed model files -----------------------------------------------------------------
// Each case is a tiny model with one hostile value. Before the loader validated them, each
// crashed (SIGFPE on head_count_kv = 0, std::bad_alloc on a huge block_count), loaded a broken
// model (NaN weights, context_length 0, a NaN RoPE base) or failed with a message that did not
// name the culprit. Now each must fail to load, naming the key or the tensor.

struct MalformedCase {
  std::string name;
  std::string arch;
  std::function<void(TinySpec&)> setup;
  std::string needle;  // the key or tensor the message must name
};

// One metadata edit.
std::function<void(TinySpec&)> Meta(std::function<void(gguf::GgufWriter&, const std::string& arch)> edit) {
  return [edit](TinySpec& s) {
    const std::string a = s.arch;
    s.edit_meta = [edit, a](gguf::GgufWriter& w) { edit(w, a); };
  };
}

// One tensor edit: `edit` gets the generated F32 values and may change them, the type and the
// bytes (it returns the bytes to store).
std::function<void(TinySpec&)> Tensor(const std::string& name,
                                      std::function<std::vector<uint8_t>(std::vector<float>&, uint32_t*)> edit) {
  return [name, edit](TinySpec& s) {
    s.edit_tensor = [name, edit](const std::string& n, uint32_t* type, std::vector<uint8_t>* bytes) {
      if (n != name) return;
      std::vector<float> f(bytes->size() / 4);
      std::memcpy(f.data(), bytes->data(), bytes->size());
      *bytes = edit(f, type);
    };
  };
}

std::vector<uint8_t> F32Bytes(const std::vector<float>& f) {
  std::vector<uint8_t> b(f.size() * 4);
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

// Q8_0 blocks (ggml block_q8_0: an F16 scale, then 32 int8) of values in row-major order.
std::vector<uint8_t> Q8_0Bytes(const std::vector<float>& f) {
  std::vector<uint8_t> b;
  for (size_t k = 0; k < f.size(); k += 32) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(f[k + i]));
    const float scale = amax / 127.0f;
    const uint16_t h = F32ToF16(scale);
    b.push_back(static_cast<uint8_t>(h));
    b.push_back(static_cast<uint8_t>(h >> 8));
    for (size_t i = 0; i < 32; ++i)
      b.push_back(static_cast<uint8_t>(static_cast<int8_t>(scale > 0 ? std::lround(f[k + i] / scale) : 0)));
  }
  return b;
}

std::vector<MalformedCase> MalformedCases() {
  using W = gguf::GgufWriter;
  using A = const std::string&;
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<MalformedCase> c;
  // -- Hyperparameters
  c.push_back({"HeadCountKvZero", "llama", Meta([](W& w, A a) { w.SetU32(a + ".attention.head_count_kv", 0); }),
               "'llama.attention.head_count_kv'"});
  c.push_back({"HeadCountKvZeroQwen2", "qwen2", Meta([](W& w, A a) { w.SetU32(a + ".attention.head_count_kv", 0); }),
               "'qwen2.attention.head_count_kv'"});
  c.push_back({"HeadCountKvNotADivisor", "llama", Meta([](W& w, A a) { w.SetU32(a + ".attention.head_count_kv", 3); }),
               "'llama.attention.head_count_kv'"});
  c.push_back({"HeadCountKvAboveHeadCount", "llama",
               Meta([](W& w, A a) { w.SetU32(a + ".attention.head_count_kv", 8); }),
               "'llama.attention.head_count_kv'"});
  c.push_back({"HeadCountKvNegative", "llama", Meta([](W& w, A a) { w.SetI32(a + ".attention.head_count_kv", -2); }),
               "'llama.attention.head_count_kv'"});
  c.push_back({"BlockCountHuge", "llama", Meta([](W& w, A a) { w.SetU64(a + ".block_count", 1ull << 40); }),
               "'llama.block_count'"});
  c.push_back({"BlockCountAboveLimit", "gemma3", Meta([](W& w, A a) { w.SetU32(a + ".block_count", 5000); }),
               "'gemma3.block_count'"});
  c.push_back({"EmbeddingNotDivisibleByHeads", "llama", Meta([](W& w, A a) {
                 w.RemoveKey(a + ".attention.key_length");
                 w.RemoveKey(a + ".attention.value_length");
                 w.SetU32(a + ".attention.head_count", 3);
                 w.SetU32(a + ".attention.head_count_kv", 3);
               }),
               "'llama.embedding_length'"});
  c.push_back({"KeyLengthZero", "llama", Meta([](W& w, A a) {
                 w.SetU32(a + ".attention.key_length", 0);
                 w.SetU32(a + ".attention.value_length", 0);
               }),
               "'llama.attention.key_length'"});
  c.push_back({"KeyLengthOdd", "qwen2", Meta([](W& w, A a) {
                 w.SetU32(a + ".attention.key_length", 33);
                 w.SetU32(a + ".attention.value_length", 33);
               }),
               "'qwen2.attention.key_length'"});
  c.push_back({"ContextLengthZero", "llama", Meta([](W& w, A a) { w.SetU32(a + ".context_length", 0); }),
               "'llama.context_length'"});
  c.push_back({"ContextLengthAbove2Pow63", "llama", Meta([](W& w, A a) { w.SetU64(a + ".context_length", ~0ull); }),
               "'llama.context_length'"});
  c.push_back({"RopeFreqBaseNan", "llama", Meta([nan](W& w, A a) { w.SetF32(a + ".rope.freq_base", nan); }),
               "'llama.rope.freq_base'"});
  c.push_back({"RopeFreqBaseNegative", "qwen2", Meta([](W& w, A a) { w.SetF32(a + ".rope.freq_base", -1.0f); }),
               "'qwen2.rope.freq_base'"});
  c.push_back({"RopeFreqBaseString", "llama", Meta([](W& w, A a) { w.SetString(a + ".rope.freq_base", "10000"); }),
               "'llama.rope.freq_base'"});
  c.push_back({"RopeFreqBaseInfGemma3", "gemma3", Meta([inf](W& w, A a) { w.SetF64(a + ".rope.freq_base", inf); }),
               "'gemma3.rope.freq_base'"});
  c.push_back({"RmsEpsilonInf", "llama",
               Meta([inf](W& w, A a) { w.SetF32(a + ".attention.layer_norm_rms_epsilon", inf); }),
               "'llama.attention.layer_norm_rms_epsilon'"});
  c.push_back({"RmsEpsilonZero", "gemma3",
               Meta([](W& w, A a) { w.SetF32(a + ".attention.layer_norm_rms_epsilon", 0.0f); }),
               "'gemma3.attention.layer_norm_rms_epsilon'"});
  c.push_back({"AttnSoftcapNanGemma2", "gemma2",
               Meta([nan](W& w, A a) { w.SetF32(a + ".attn_logit_softcapping", nan); }),
               "'gemma2.attn_logit_softcapping'"});
  c.push_back({"FinalSoftcapNegativeGemma2", "gemma2",
               Meta([](W& w, A a) { w.SetF32(a + ".final_logit_softcapping", -30.0f); }),
               "'gemma2.final_logit_softcapping'"});
  c.push_back({"SlidingWindowNegative", "gemma3",
               Meta([](W& w, A a) { w.SetI32(a + ".attention.sliding_window", -4); }),
               "'gemma3.attention.sliding_window'"});
  c.push_back(
      {"PoolingTypeRank", "qwen3", Meta([](W& w, A a) { w.SetU32(a + ".pooling_type", 4); }), "'qwen3.pooling_type'"});
  c.push_back({"PoolingTypeOutOfRange", "llama", Meta([](W& w, A a) { w.SetI32(a + ".pooling_type", 9); }),
               "'llama.pooling_type'"});
  c.push_back({"PoolingTypeString", "qwen2", Meta([](W& w, A a) { w.SetString(a + ".pooling_type", "last"); }),
               "'qwen2.pooling_type'"});
  c.push_back({"SamplingTemperatureNan", "qwen2", Meta([nan](W& w, A) { w.SetF32("general.sampling.temp", nan); }),
               "'general.sampling.temp'"});
  c.push_back({"SamplingTopPAboveOne", "llama", Meta([](W& w, A) { w.SetF32("general.sampling.top_p", 1.5f); }),
               "'general.sampling.top_p'"});
  c.push_back({"SamplingTopKNegative", "gemma3", Meta([](W& w, A) { w.SetI32("general.sampling.top_k", -1); }),
               "'general.sampling.top_k'"});
  // -- Tensor values and types
  c.push_back({"NanInF32Matrix", "llama",
               Tensor("blk.1.attn_q.weight",
                      [nan](std::vector<float>& f, uint32_t*) {
                        f[3 * 128 + 5] = nan;
                        return F32Bytes(f);
                      }),
               "'blk.1.attn_q.weight' (f32): row 3, column 5"});
  c.push_back({"InfInF16Norm", "qwen2",
               Tensor("output_norm.weight",
                      [](std::vector<float>& f, uint32_t* type) {
                        *type = 1;  // f16
                        std::vector<uint8_t> b;
                        for (size_t i = 0; i < f.size(); ++i) {
                          const uint16_t h = i == 7 ? uint16_t{0x7c00} : F32ToF16(f[i]);  // +inf at 7
                          b.push_back(static_cast<uint8_t>(h));
                          b.push_back(static_cast<uint8_t>(h >> 8));
                        }
                        return b;
                      }),
               "'output_norm.weight' (f16)"});
  c.push_back({"NanScaleInQ8_0Block", "gemma3",
               Tensor("blk.0.ffn_down.weight",
                      [](std::vector<float>& f, uint32_t* type) {
                        *type = 8;  // q8_0
                        std::vector<uint8_t> b = Q8_0Bytes(f);
                        b[2 * 34] = 0x00;  // third block's F16 scale: NaN
                        b[2 * 34 + 1] = 0x7e;
                        return b;
                      }),
               "'blk.0.ffn_down.weight' (q8_0)"});
  // An MXFP4 shared exponent of 0xFF (NaN in the MX spec): in a matrix kept native (ffn_down,
  // 192 inputs: 6 blocks a row) and in one converted to Q8/g64 (ffn_up, whose gate is F32).
  auto mxfp4_nan = [](std::vector<float>& f, uint32_t* type) {
    *type = 39;  // mxfp4
    std::vector<uint8_t> b(f.size() / 32 * 17);
    EXPECT_TRUE(QuantizeKBlocks(KFormat::kMXFP4, f.data(), b.data(), static_cast<int64_t>(f.size() / 32)));
    b[9 * 17] = 0xFF;  // tenth block's E8M0 exponent
    return b;
  };
  c.push_back({"NanExponentInNativeMXFP4Block", "llama", Tensor("blk.1.ffn_down.weight", mxfp4_nan),
               "'blk.1.ffn_down.weight' (mxfp4): [kquant] mxfp4 row 1, block 3: shared exponent e = 0xff (NaN)"});
  c.push_back({"NanExponentInConvertedMXFP4Block", "llama", Tensor("blk.1.ffn_up.weight", mxfp4_nan),
               "'blk.1.ffn_up.weight': [dequant] mxfp4 block 1: shared exponent e = 0xff (NaN)"});
  c.push_back({"NormOfUnconvertibleType", "llama",
               Tensor("blk.0.attn_norm.weight",
                      [](std::vector<float>& f, uint32_t* type) {
                        *type = 26;  // i32: same size, no dequantization
                        return F32Bytes(f);
                      }),
               "'blk.0.attn_norm.weight'"});
  return c;
}

void PrintTo(const MalformedCase& c, std::ostream* os) {
  *os << c.name;
}

class MalformedModelTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedModelTest, FailsToLoadNamingTheKeyOrTensor) {
  const MalformedCase& c = GetParam();
  TinySpec s;
  s.arch = c.arch;
  c.setup(s);
  const std::string path = WriteTinyModel(s, 41);
  LoadOptions o;
  o.n_threads = 2;
  auto m = Model::Load(path, o);
  std::filesystem::remove(path);
  ASSERT_FALSE(m.ok()) << c.name << " loaded";
  EXPECT_EQ(m.status().message().rfind("[model] ", 0), 0u) << m.status().message();
  EXPECT_NE(m.status().message().find(c.needle), std::string::npos)
      << "message lacks " << c.needle << ": " << m.status().message();
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedModelTest, ::testing::ValuesIn(MalformedCases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& i) { return i.param.name; });

// The validation must not reject what real models contain: every hyperparameter at a boundary
// it allows (no key_length, so head size = embedding_length / head_count; head_count_kv =
// head_count; no context_length; a one-layer model; a Q8_0 matrix) loads and runs.
TEST(MalformedModelTest, BoundaryValuesStillLoad) {
  TinySpec s;
  s.arch = "llama";
  s.n_layer = 1;
  s.n_head_kv = s.n_head;
  s.edit_meta = [](gguf::GgufWriter& w) {
    w.RemoveKey("llama.attention.key_length");
    w.RemoveKey("llama.attention.value_length");
    w.RemoveKey("llama.context_length");
  };
  s.edit_tensor = [](const std::string& name, uint32_t* type, std::vector<uint8_t>* bytes) {
    if (name != "blk.0.ffn_down.weight") return;
    std::vector<float> f(bytes->size() / 4);
    std::memcpy(f.data(), bytes->data(), bytes->size());
    *type = 8;
    *bytes = Q8_0Bytes(f);
  };
  const std::string path = WriteTinyModel(s, 43);
  auto m = LoadTiny(path, false);
  std::filesystem::remove(path);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->config().head_dim, s.d / s.n_head);
  EXPECT_EQ(m->config().n_ctx_train, 2048);
  KvCache kv = m->NewKvCache(4);
  std::vector<float> logits(s.vocab);
  const std::vector<TokenId> toks = {1, 2, 3};
  ASSERT_TRUE(m->Forward(kv, toks.data(), 3, false, logits.data()).ok());
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(m->config().pooling, Pooling::kNone);  // a generative model's file has no pooling type
}

// An embedding model's file names its pooling (Qwen3-Embedding: 3, last), llama.cpp's values.
TEST(MalformedModelTest, PoolingTypeIsRead) {
  for (const auto& [value, want] : {std::pair{1u, Pooling::kMean}, {2u, Pooling::kCls}, {3u, Pooling::kLast}}) {
    TinySpec s;
    s.arch = "qwen3";
    const uint32_t v = value;
    s.edit_meta = [v](gguf::GgufWriter& w) { w.SetU32("qwen3.pooling_type", v); };
    const std::string path = WriteTinyModel(s, 44);
    auto m = LoadTiny(path, false);
    std::filesystem::remove(path);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->config().pooling, want);
    EXPECT_STREQ(PoolingName(m->config().pooling), v == 1 ? "mean" : v == 2 ? "cls" : "last");
  }
}

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
      std::vector<float> ra(la.begin() + p * V, la.begin() + (p + 1) * V),
          rb(lb.begin() + p * V, lb.begin() + (p + 1) * V);
      return MaxAbsDiff(ra, rb);
    };
    EXPECT_GT(row_diff(4), 1e-4) << "position 4 is within reach of position 0";
    for (int64_t p = 5; p < n; ++p) EXPECT_EQ(row_diff(p), 0.0) << "position " << p << " must not see position 0";
  }
  std::filesystem::remove(path);
}

// smollm3's NoPE layers: the same weights as smollm3 and as llama (which ropes every layer) give
// the same logits at position 0, where the rotation is the identity, and different ones at every
// later position (the 4th layer attends without positions), on both paths, the fast path
// tracking the reference.
TEST(SmolLM3NoPE, EveryFourthLayerAttendsWithoutPositions) {
  auto write = [](const std::string& arch) {
    TinySpec s;
    s.arch = arch;
    s.n_layer = 4;
    const std::string path = WriteTinyModel(s, 17), own = path + ".nope";
    std::filesystem::rename(path, own);
    return own;
  };
  const std::string smol = write("smollm3"), llama = write("llama");
  const std::vector<TokenId> toks = {3, 1, 4, 1, 5, 9, 2, 6};
  const int64_t n = static_cast<int64_t>(toks.size()), V = TinySpec{}.vocab;
  auto run = [&](const std::string& path, bool ref) {
    auto m = LoadTiny(path, ref);
    EXPECT_TRUE(m);
    EXPECT_EQ(m->config().layer_no_rope, (std::vector<bool>{false, false, false, path == smol}));
    KvCache kv = m->NewKvCache(n);
    std::vector<float> out(n * V);
    EXPECT_TRUE(m->Forward(kv, toks.data(), n, true, out.data()).ok());
    return out;
  };
  std::vector<float> smol_ref;
  for (bool ref : {true, false}) {
    SCOPED_TRACE(ref ? "reference path" : "fast path");
    const std::vector<float> a = run(smol, ref), b = run(llama, ref);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> ra(a.begin() + t * V, a.begin() + (t + 1) * V), rb(b.begin() + t * V, b.begin() + (t + 1) * V);
      if (t == 0) {
        EXPECT_LT(MaxAbsDiff(ra, rb), 1e-6);
      } else {
        EXPECT_GT(MaxAbsDiff(ra, rb), 1e-3) << "position " << t;
      }
    }
    if (ref) {
      smol_ref = a;
    } else {
      double err = 0, norm = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        err += (a[i] - smol_ref[i]) * (a[i] - smol_ref[i]);
        norm += smol_ref[i] * smol_ref[i];
      }
      EXPECT_LT(std::sqrt(err / norm), 0.035);
    }
  }
  std::filesystem::remove(smol);
  std::filesystem::remove(llama);
  // llama.cpp's smollm3 graph applies no rope_freqs factors: a file with them is refused, not run
  // differently.
  TinySpec s;
  s.arch = "smollm3";
  s.rope_freqs = true;
  const std::string path = WriteTinyModel(s, 17);
  LoadOptions o;
  o.n_threads = 1;
  auto m = Model::Load(path, o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("'rope_freqs.weight'"), std::string::npos) << m.status().message();
  std::filesystem::remove(path);
}

// gemma2's soft-capping, against the same weights without it (caps of 1e5 change nothing a
// float shows): the output logits are exactly cap * tanh(uncapped / cap), and a small attention
// cap changes every position after the first (the first attends to itself only: its softmax is
// 1 whatever the score), on both paths, the fast path tracking the reference.
TEST(Gemma2SoftCapping, CapsTheLogitsAndTheAttentionScores) {
  auto write = [](float attn_cap, float final_cap) {
    TinySpec s;
    s.arch = "gemma2";
    s.sliding_window = 4;
    s.edit_meta = [=](gguf::GgufWriter& w) {
      w.SetF32("gemma2.attn_logit_softcapping", attn_cap);
      w.SetF32("gemma2.final_logit_softcapping", final_cap);
    };
    // Same seed, so the same weights; WriteTinyModel names files by arch and seed, so each one
    // moves to a name of its own.
    const std::string path = WriteTinyModel(s, 13),
                      own = path + "." + std::to_string(attn_cap) + "_" + std::to_string(final_cap);
    std::filesystem::rename(path, own);
    return own;
  };
  const std::string none = write(1e5f, 1e5f), final_only = write(1e5f, 0.5f), attn_only = write(0.05f, 1e5f);
  const std::vector<TokenId> toks = {3, 1, 4, 1, 5, 9, 2, 6};
  const int64_t n = static_cast<int64_t>(toks.size()), V = TinySpec{}.vocab;
  auto run = [&](const std::string& path, bool ref) {
    auto m = LoadTiny(path, ref);
    EXPECT_TRUE(m);
    KvCache kv = m->NewKvCache(n);
    std::vector<float> out(n * V);
    EXPECT_TRUE(m->Forward(kv, toks.data(), n, true, out.data()).ok());
    return out;
  };
  for (bool ref : {true, false}) {
    SCOPED_TRACE(ref ? "reference path" : "fast path");
    const std::vector<float> base = run(none, ref), capped = run(final_only, ref), attn = run(attn_only, ref);
    double max_base = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      max_base = std::max(max_base, static_cast<double>(std::fabs(base[i])));
      ASSERT_NEAR(capped[i], 0.5 * std::tanh(base[i] / 0.5), 1e-5) << i;
    }
    EXPECT_GT(max_base, 0.5) << "the cap must bind somewhere for the check to mean anything";
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> a(attn.begin() + t * V, attn.begin() + (t + 1) * V),
          b(base.begin() + t * V, base.begin() + (t + 1) * V);
      if (t == 0) {
        EXPECT_EQ(MaxAbsDiff(a, b), 0.0);
      } else {
        EXPECT_GT(MaxAbsDiff(a, b), 1e-4) << "position " << t;
      }
    }
  }
  const std::vector<float> fast = run(attn_only, false), ref = run(attn_only, true);
  double err = 0, norm = 0;
  for (size_t i = 0; i < fast.size(); ++i) {
    err += (fast[i] - ref[i]) * (fast[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 0.035);
  for (const std::string& p : {none, final_only, attn_only}) std::filesystem::remove(p);
}

// A copy of a cache's filled rows (k and v of every layer), to compare contents.
std::vector<uint16_t> KvRows(const KvCache& kv) {
  std::vector<uint16_t> out;
  const size_t n = static_cast<size_t>(kv.n_past * kv.kv_dim);
  for (size_t l = 0; l < kv.k.size(); ++l) {
    out.insert(out.end(), kv.k[l].data(), kv.k[l].data() + n);
    out.insert(out.end(), kv.v[l].data(), kv.v[l].data() + n);
  }
  return out;
}

// Four sequences at different positions, mixing 1-row decodes with multi-row chunks and
// all_logits with last-row logits, in one ForwardBatch: the logits and KV rows must equal those
// of a Forward per sequence. Exact equality: every op is per row (norms, RoPE, attention), and
// the int8 matmul accumulates each row's integer group sums and float scales in the same order
// whatever the number of rows processed alongside it, so batching cannot change a bit.
TEST_P(TinyArchTest, ForwardBatchEqualsForwardPerSequence) {
  TinySpec s;
  s.arch = GetParam();
  if (s.arch == "gemma3" || s.arch == "gemma2") s.sliding_window = 4;
  const std::string path = WriteTinyModel(s, 31);
  for (bool ref : {false, true}) {
    SCOPED_TRACE(ref ? "reference path" : "fast path");
    auto m = LoadTiny(path, ref);
    ASSERT_TRUE(m);
    const int64_t V = s.vocab;
    struct Case {
      std::vector<TokenId> prefix, toks;
      bool all_logits;
    };
    const std::vector<Case> cases = {
        {{}, {4, 8, 15, 16, 23}, true},                    // prefill chunk from position 0
        {{1, 2, 3}, {42}, false},                          // decode
        {{9, 9, 8, 7, 6, 5, 4}, {11, 12, 13}, false},      // chunk, last row only
        {{60, 1, 30, 2, 50, 3, 40, 4, 33, 5}, {7}, true},  // decode, all_logits
    };
    std::vector<KvCache> solo, batch;
    std::vector<float> expect, scratch(16 * V);
    for (const Case& c : cases) {
      solo.push_back(m->NewKvCache(32));
      batch.push_back(m->NewKvCache(32));
      if (!c.prefix.empty()) {
        const int64_t np = static_cast<int64_t>(c.prefix.size());
        ASSERT_TRUE(m->Forward(solo.back(), c.prefix.data(), np, false, scratch.data()).ok());
        ASSERT_TRUE(m->Forward(batch.back(), c.prefix.data(), np, false, scratch.data()).ok());
      }
      const int64_t n = static_cast<int64_t>(c.toks.size()), rows = c.all_logits ? n : 1;
      ASSERT_TRUE(m->Forward(solo.back(), c.toks.data(), n, c.all_logits, scratch.data()).ok());
      expect.insert(expect.end(), scratch.begin(), scratch.begin() + rows * V);
    }
    std::vector<Model::BatchSeq> seqs;
    for (size_t i = 0; i < cases.size(); ++i) {
      seqs.push_back(
          {&batch[i], cases[i].toks.data(), static_cast<int64_t>(cases[i].toks.size()), cases[i].all_logits});
    }
    std::vector<float> got(expect.size(), -1.0f);
    ASSERT_TRUE(m->ForwardBatch(seqs, got.data()).ok());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expect[i]) << s.arch << " logit " << i;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(batch[i].n_past, solo[i].n_past) << "sequence " << i;
      EXPECT_TRUE(KvRows(batch[i]) == KvRows(solo[i])) << s.arch << " KV rows of sequence " << i;
    }
    // A second step: all four decode one token each (the server's steady state).
    const std::vector<TokenId> next = {5, 6, 7, 8};
    std::vector<float> one(V), step(4 * V);
    for (size_t i = 0; i < 4; ++i) {
      seqs[i] = {&batch[i], &next[i], 1, false};
    }
    ASSERT_TRUE(m->ForwardBatch(seqs, step.data()).ok());
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(m->Forward(solo[i], &next[i], 1, false, one.data()).ok());
      for (int64_t j = 0; j < V; ++j) ASSERT_EQ(step[i * V + j], one[j]) << s.arch << " sequence " << i;
      EXPECT_TRUE(KvRows(batch[i]) == KvRows(solo[i])) << s.arch << " KV rows of sequence " << i;
    }
  }
  std::filesystem::remove(path);
}

// Every invalid batch fails with a message and leaves every cache, valid ones included, as it was.
TEST_P(TinyArchTest, ForwardBatchErrorsLeaveCachesUnchanged) {
  TinySpec s;
  s.arch = GetParam();
  const std::string path = WriteTinyModel(s, 33);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  KvCache a = m->NewKvCache(8), b = m->NewKvCache(8);
  std::vector<float> logits(16 * s.vocab);
  const std::vector<TokenId> toks = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(m->Forward(a, toks.data(), 3, false, logits.data()).ok());
  ASSERT_TRUE(m->Forward(b, toks.data(), 6, false, logits.data()).ok());
  const auto ka = KvRows(a), kb = KvRows(b);
  const TokenId bad = static_cast<TokenId>(s.vocab), neg = -1;
  using S = Model::BatchSeq;
  struct Bad {
    const char* what;
    std::vector<S> seqs;
    const char* needle;
  };
  const std::vector<Bad> bads = {
      {"empty batch", {}, "no sequences"},
      {"null cache", {{&a, toks.data(), 1, false}, {nullptr, toks.data(), 1, false}}, "null KV cache"},
      {"no tokens", {{&a, toks.data(), 1, false}, {&b, toks.data(), 0, false}}, "at least 1"},
      {"shared cache",
       {{&a, toks.data(), 1, false}, {&b, toks.data(), 1, false}, {&a, toks.data(), 1, false}},
       "share a KV cache"},
      {"overflow",
       {{&a, toks.data(), 2, true}, {&b, toks.data(), 3, false}},
       "context overflow: 9 positions > 8 (sequence 1 of 2)"},
      {"token too big", {{&a, toks.data(), 1, false}, {&b, &bad, 1, false}}, "out of range"},
      {"negative token", {{&a, &neg, 1, false}}, "out of range"},
  };
  for (const Bad& c : bads) {
    Status st = m->ForwardBatch(c.seqs, logits.data());
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.message();
    EXPECT_EQ(a.n_past, 3) << c.what;
    EXPECT_EQ(b.n_past, 6) << c.what;
    EXPECT_TRUE(KvRows(a) == ka && KvRows(b) == kb) << c.what;
  }
  // Forward keeps its own messages.
  EXPECT_EQ(m->Forward(a, toks.data(), 0, false, logits.data()).message(), "[model] Forward called with no tokens");
  EXPECT_EQ(m->Forward(a, toks.data(), 6, false, logits.data()).message(), "[model] context overflow: 9 positions > 8");
  std::filesystem::remove(path);
}

// Resident pages of a KV buffer (mincore): the lazy cache costs memory only where written.
int64_t ResidentPages(const KvBuffer& b) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages = (b.size() * 2 + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  if (mincore(const_cast<uint16_t*>(b.data()), b.size() * 2, vec.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

TEST_P(TinyArchTest, KvCacheIsLazyAndReleaseKeepsItUsable) {
  TinySpec s;
  s.arch = GetParam();
  if (s.arch == "smollm3") s.n_layer = 4;  // WriteTinyModel's minimum for it, which the sizes below use
  const std::string path = WriteTinyModel(s, 35);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  const int64_t n_ctx = 4096, kv_dim = s.n_head_kv * s.head_dim;  // 256 KiB per buffer
  KvCache kv = m->NewKvCache(n_ctx);
  EXPECT_EQ(kv.bytes(), static_cast<size_t>(n_ctx * kv_dim * 2 * 2 * s.n_layer));
  EXPECT_EQ(kv.bytes_in_use(), 0u);
  EXPECT_EQ(ResidentPages(kv.k[0]), 0);
  const std::vector<TokenId> toks = {7, 3, 9, 1, 22, 40};
  const int64_t n = static_cast<int64_t>(toks.size());
  std::vector<float> first(s.vocab), again(s.vocab), fresh(s.vocab);
  ASSERT_TRUE(m->Forward(kv, toks.data(), n, false, first.data()).ok());
  EXPECT_EQ(kv.bytes_in_use(), static_cast<size_t>(n * kv_dim * 2 * 2 * s.n_layer));
  const int64_t touched = ResidentPages(kv.k[0]);
  EXPECT_GE(touched, 1);
  EXPECT_LE(touched, 2) << "6 rows of " << kv_dim * 2 << " bytes span at most 2 pages";
  kv.Release();
  EXPECT_EQ(kv.n_past, 0);
  EXPECT_EQ(kv.bytes_in_use(), 0u);
  EXPECT_EQ(ResidentPages(kv.k[0]), 0);
  EXPECT_EQ(kv.k[0][0], 0);  // released pages read as zero, like a fresh cache
  ASSERT_TRUE(m->Forward(kv, toks.data(), n, false, again.data()).ok());
  KvCache kv2 = m->NewKvCache(n_ctx);
  ASSERT_TRUE(m->Forward(kv2, toks.data(), n, false, fresh.data()).ok());
  EXPECT_EQ(again, first);
  EXPECT_EQ(again, fresh);
  // Moves carry the mapping: the moved-to cache keeps the rows, the moved-from one is empty.
  KvCache moved = std::move(kv2);
  EXPECT_TRUE(KvRows(moved) == KvRows(kv));
  EXPECT_EQ(kv2.k.size(), 0u);
  std::filesystem::remove(path);
}

// The pair-word copies of full cache blocks (KvCache::kp, vp) that the avx512bf16 attention reads:
// after a rollback into a block and new tokens written over it (a rejected speculative draft), the
// logits are bit-identical to a fresh cache fed the same tokens, so a stale copy is never read; and
// a copy that is overwritten does change the next step, so the copies are what the step reads.
TEST(KvPairCopies, FollowRollbackAndRewrite) {
  std::optional<CpuVariant> pv;
  for (CpuVariant v : kAllCpuVariants) {
    if (GetKernels(v).kv_block_pairs != nullptr && CpuSupports(v)) pv = v;
  }
  if (!pv) GTEST_SKIP() << "no kernel variant with pair copies runs on this CPU (avx512bf16 needs AVX512-BF16)";
  TinySpec s;
  s.arch = "llama";  // head_dim 32: the BF16 kernel's pair layout
  const std::string path = WriteTinyModel(s, 61);
  auto m = LoadTiny(path, false, WeightMode::kNative, 0, *pv);
  ASSERT_TRUE(m);
  std::mt19937 rng(5);
  std::vector<TokenId> a(100), b(60);
  for (auto& t : a) t = static_cast<TokenId>(rng() % s.vocab);
  for (auto& t : b) t = static_cast<TokenId>(rng() % s.vocab);
  std::vector<float> logits(s.vocab);
  // Decodes toks[from, to) one token a step into kv, the logits of every step appended to out.
  auto decode = [&](KvCache& kv, const std::vector<TokenId>& toks, size_t from, size_t to, std::vector<float>* out) {
    for (size_t i = from; i < to; ++i) {
      ASSERT_TRUE(m->Forward(kv, &toks[i], 1, false, logits.data()).ok());
      if (out) out->insert(out->end(), logits.begin(), logits.end());
    }
  };
  KvCache kv = m->NewKvCache(160);
  ASSERT_TRUE(m->Forward(kv, a.data(), 70, false, logits.data()).ok());
  decode(kv, a, 70, 100, nullptr);
  ASSERT_EQ(kv.pair_blocks.size(), static_cast<size_t>(s.n_layer));
  for (int64_t blocks : kv.pair_blocks) EXPECT_EQ(blocks, 100 / kAttnPairBlock);
  kv.n_past = 40;  // back into block 1 (positions 32..63), whose copy now holds a's tokens
  std::vector<float> rewritten, fresh;
  ASSERT_TRUE(m->Forward(kv, b.data(), 20, false, logits.data()).ok());
  decode(kv, b, 20, 60, &rewritten);
  KvCache kv2 = m->NewKvCache(160);
  ASSERT_TRUE(m->Forward(kv2, a.data(), 40, false, logits.data()).ok());
  ASSERT_TRUE(m->Forward(kv2, b.data(), 20, false, logits.data()).ok());
  decode(kv2, b, 20, 60, &fresh);
  EXPECT_EQ(rewritten, fresh);
  for (int64_t blocks : kv.pair_blocks) EXPECT_EQ(blocks, 100 / kAttnPairBlock);
  // Block 1's K copy of the last layer replaced by block 0's: the next step must see it.
  const int64_t last = s.n_layer - 1;
  for (int64_t h = 0; h < s.n_head_kv; ++h) {
    uint32_t* head = kv.KPairs(last, h, s.head_dim);
    std::copy(head, head + 16 * s.head_dim, head + 16 * s.head_dim);
  }
  const TokenId next = 3;
  std::vector<float> seen(s.vocab), want(s.vocab);
  ASSERT_TRUE(m->Forward(kv, &next, 1, false, seen.data()).ok());
  ASSERT_TRUE(m->Forward(kv2, &next, 1, false, want.data()).ok());
  EXPECT_NE(seen, want) << "the step did not read the cache's pair copies";
  std::filesystem::remove(path);
}

// Steady decode must not touch the heap: after warm-up (workspaces sized), several 1-row
// decode steps and 8-row verify steps run with zero calls to operator new (counted by the
// replacement at the bottom of this file).
TEST_P(TinyArchTest, SteadyDecodeDoesNotAllocate) {
  TinySpec s;
  s.arch = GetParam();
  if (s.arch == "gemma3" || s.arch == "gemma2") s.sliding_window = 4;
  const std::string path = WriteTinyModel(s, 21);
  auto m = LoadTiny(path, false);
  ASSERT_TRUE(m);
  KvCache kv = m->NewKvCache(64);
  std::vector<TokenId> toks = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  std::vector<float> logits(8 * s.vocab);
  ASSERT_TRUE(m->Forward(kv, toks.data(), 12, false, logits.data()).ok());
  ASSERT_TRUE(m->Forward(kv, toks.data(), 1, false, logits.data()).ok());  // warm-up: 1 row
  ASSERT_TRUE(m->Forward(kv, toks.data(), 8, true, logits.data()).ok());   // warm-up: 8 rows
  kv.n_past -= 8;
  const int64_t before = AllocCount();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(m->Forward(kv, &toks[i], 1, false, logits.data()).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m->Forward(kv, toks.data() + i, 8, true, logits.data()).ok());
    kv.n_past -= 8;  // a rejected draft rolls back
  }
  EXPECT_EQ(AllocCount() - before, 0) << s.arch;
  // Batched decode of 4 sequences (one row each) after a warm-up step: no allocation either.
  std::vector<KvCache> caches;
  for (int i = 0; i < 4; ++i) {
    caches.push_back(m->NewKvCache(64));
    ASSERT_TRUE(m->Forward(caches.back(), toks.data() + i, 3 + i, false, logits.data()).ok());
  }
  std::array<Model::BatchSeq, 4> batch;
  for (int i = 0; i < 4; ++i) batch[i] = {&caches[i], &toks[i], 1, false};
  ASSERT_TRUE(m->ForwardBatch(batch, logits.data()).ok());  // warm-up: 4 rows
  const int64_t before_batch = AllocCount();
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(m->ForwardBatch(batch, logits.data()).ok());
  EXPECT_EQ(AllocCount() - before_batch, 0) << s.arch << " batched decode";
  // The counter works: an allocation in the window is seen.
  const int64_t c0 = AllocCount();
  auto* probe = new std::vector<int>(100);
  EXPECT_GE(AllocCount() - c0, 2);
  delete probe;
  std::filesystem::remove(path);
}

// MERERUN_ACTS / qualify's acts=: the names parse back to the same role set, and anything else is
// refused rather than read as a default.
TEST(FineActs, NamesRoundTripAndBadNamesAreRefused) {
  for (int roles = 0; roles <= kActAllRoles; ++roles) {
    uint8_t back = 0xff;
    const std::string name = FineActsName(static_cast<uint8_t>(roles));
    ASSERT_TRUE(ParseFineActs(name, &back)) << name;
    EXPECT_EQ(back, roles) << name;
  }
  uint8_t r = 0;
  EXPECT_TRUE(ParseFineActs("down+qkv", &r));
  EXPECT_EQ(r, kActDown | kActQkv);
  EXPECT_EQ(FineActsName(kActFineRoles), "fine");
  EXPECT_TRUE(ParseFineActs("qkv+o+top", &r));
  EXPECT_EQ(r, kActQkv | kActO | kActTop);
  EXPECT_EQ(FineActsName(0), "int8");
  for (const char* bad : {"", "down,qkv", "down+", "+down", "Down", "int16", "fine+down"}) {
    EXPECT_FALSE(ParseFineActs(bad, &r)) << bad;
  }
}

// The `top` role: the highest logits of each row recomputed in FP32 against the dequantized
// output rows. The hidden state is the same with or without it (no input role changes), so on the
// best tokens the recomputed logits must match the output projection read with two-row (~15-bit)
// activations (`logits`) far more closely than the int8 projection does; the tail keeps int8's
// values, and a row's result does not depend on the rows beside it.
// The default set carries each architecture's own additions (kActArch): gpt-oss reads its expert
// inputs (glu, down) as two rows too, other architectures do not; an explicit set is exact.
TEST(FineActs, DefaultSetAddsTheArchitecturesOwnRoles) {
  for (const char* arch : {"gpt-oss", "qwen3moe"}) {
    TinySpec s;
    s.arch = arch;
    const std::string path = WriteTinyModel(s, 23);
    LoadOptions o;
    o.n_threads = 1;
    auto m = Model::Load(path, o);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const uint8_t base = kActQkv | kActO | kActTop;
    EXPECT_EQ((*m)->fine_acts(), std::string(arch) == "gpt-oss" ? base | kActGlu | kActDown : base) << arch;
    o.fine_acts = kActQkv;
    auto e = Model::Load(path, o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_EQ((*e)->fine_acts(), kActQkv) << arch;
    std::filesystem::remove(path);
  }
}

TEST(FineActs, TopLogitsAreRecomputedExactly) {
  TinySpec s;
  s.arch = "llama";
  const std::string path = WriteTinyModel(s, 21);
  auto plain = LoadTiny(path, false, WeightMode::kNative, 0);
  auto two_rows = LoadTiny(path, false, WeightMode::kNative, kActLogits);
  auto top = LoadTiny(path, false, WeightMode::kNative, kActTop);
  ASSERT_TRUE(plain && two_rows && top);
  const std::vector<TokenId> toks = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7};
  const int64_t n = static_cast<int64_t>(toks.size()), V = s.vocab;
  auto run = [&](Model& m) { return AllLogits(m, toks, V); };
  const std::vector<float> p = run(*plain), f = run(*two_rows), t = run(*top);
  double err_plain = 0, err_top = 0;
  for (int64_t row = 0; row < n; ++row) {
    std::vector<int64_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return f[row * V + a] > f[row * V + b]; });
    for (int64_t j = 0; j < 8; ++j) {  // the row's 8 best tokens
      const int64_t i = row * V + order[j];
      err_plain = std::max(err_plain, static_cast<double>(std::fabs(p[i] - f[i])));
      err_top = std::max(err_top, static_cast<double>(std::fabs(t[i] - f[i])));
    }
  }
  EXPECT_LT(err_top, err_plain / 10) << "top " << err_top << ", int8 output projection " << err_plain;
  // Decoding row by row gives the same logits as the batched forward.
  KvCache kv = top->NewKvCache(n);
  std::vector<float> one(V);
  for (int64_t row = 0; row < n; ++row) {
    ASSERT_TRUE(top->Forward(kv, &toks[row], 1, false, one.data()).ok());
    EXPECT_EQ(MaxAbsDiff(one, std::vector<float>(t.begin() + row * V, t.begin() + (row + 1) * V)), 0.0) << row;
  }
  std::filesystem::remove(path);
}

// The one-pass selection against its definition: filter by the margin, sort by (value desc, id
// asc), keep k. Logits drawn from few distinct values (many ties at the k-th), spread wide or
// narrow against the margin, vocabularies below and above k.
TEST(TopLogits, CandidatesAreTheKBestWithinTheMargin) {
  std::mt19937 rng(7);
  std::vector<int32_t> got;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t vocab = std::uniform_int_distribution<int64_t>(1, 5000)(rng);
    const int k = std::uniform_int_distribution<int>(1, 300)(rng);
    const int levels = std::uniform_int_distribution<int>(1, 200)(rng);
    const float spread = std::uniform_real_distribution<float>(0.5f, 80.0f)(rng);
    std::vector<float> y(static_cast<size_t>(vocab));
    for (float& v : y) v = spread * static_cast<float>(std::uniform_int_distribution<int>(0, levels)(rng)) / levels;
    std::vector<int32_t> want;
    const float mx = *std::max_element(y.begin(), y.end());
    for (int32_t i = 0; i < vocab; ++i)
      if (y[static_cast<size_t>(i)] >= mx - 24.0f) want.push_back(i);
    std::sort(want.begin(), want.end(), [&](int32_t a, int32_t c) {
      return y[static_cast<size_t>(a)] > y[static_cast<size_t>(c)] ||
             (y[static_cast<size_t>(a)] == y[static_cast<size_t>(c)] && a < c);
    });
    if (want.size() > static_cast<size_t>(k)) want.resize(static_cast<size_t>(k));
    std::sort(want.begin(), want.end());
    TopLogitCandidates(y.data(), vocab, k, 24.0f, &got);
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, want) << "trial " << trial << " vocab " << vocab << " k " << k;
  }
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
// The nothrow forms too (std::stable_sort's temporary buffer uses them): a partial replacement
// would pair the library's operator new with this free (ASan: alloc-dealloc-mismatch).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  mr::g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  mr::g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}
