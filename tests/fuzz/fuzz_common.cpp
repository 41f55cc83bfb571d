#include "fuzz_common.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "model/gguf_writer.h"
#include "model/test_models.h"

namespace mr::fuzz {

std::vector<uint8_t> TinyModelImage(uint32_t seed, const std::string& a) {
  std::mt19937 rng(seed);
  gguf::GgufWriter w;
  const int64_t d = 32, n_head = 2, n_head_kv = 1, head_dim = 16, ff = 48, vocab = 300;
  w.SetString("general.architecture", a);
  w.SetU32(a + ".block_count", 1);
  w.SetU32(a + ".embedding_length", d);
  w.SetU32(a + ".feed_forward_length", ff);
  w.SetU32(a + ".attention.head_count", n_head);
  w.SetU32(a + ".attention.head_count_kv", n_head_kv);
  w.SetU32(a + ".attention.key_length", head_dim);
  w.SetU32(a + ".attention.value_length", head_dim);
  w.SetU32(a + ".context_length", 128);
  w.SetF32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.SetF32(a + ".rope.freq_base", 10000.0f);
  // Byte-level BPE over single characters plus a few merges and ChatML control tokens.
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int c = 33; c < 127; ++c) {
    tokens.push_back(std::string(1, static_cast<char>(c)));
    types.push_back(1);
  }
  // GPT-2 byte encoder: the bytes outside printable ASCII map to U+0100 + n.
  for (int n = 0; n < 256 - 94 && static_cast<int64_t>(tokens.size()) < vocab - 8; ++n) {
    const int cp = 0x100 + n;
    std::string s;
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    tokens.push_back(s);
    types.push_back(1);
  }
  for (const char* m : {"he", "ll", "hell", "hello", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"}) {
    tokens.push_back(m);
    types.push_back(m[0] == '<' ? (m[1] == '|' ? 3 : 4) : 1);
  }
  while (static_cast<int64_t>(tokens.size()) < vocab) {
    tokens.push_back("<unused" + std::to_string(tokens.size()) + ">");
    types.push_back(5);
  }
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "qwen2");
  w.SetArrayStr("tokenizer.ggml.tokens", tokens);
  w.SetArrayI32("tokenizer.ggml.token_type", types);
  w.SetArrayStr("tokenizer.ggml.merges", {"h e", "l l", "he ll", "hell o"});
  w.SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab - 7));
  w.SetString("tokenizer.chat_template",
              "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  auto bytes = [&](int64_t n, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float v = dist(rng);
      std::memcpy(out.data() + i * 4, &v, 4);
    }
    return out;
  };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) {
    (void)w.AddTensor(name, static_cast<uint32_t>(gguf::TensorType::kF32), {cols, rows},
                      bytes(rows * cols, 1.0f / std::sqrt(float(cols))));
  };
  auto ones = [&](const std::string& name, int64_t n) {
    std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
    const float one = 1.0f;
    for (int64_t i = 0; i < n; ++i) std::memcpy(b.data() + i * 4, &one, 4);
    (void)w.AddTensor(name, static_cast<uint32_t>(gguf::TensorType::kF32), {n}, b);
  };
  mat("token_embd.weight", vocab, d);
  ones("output_norm.weight", d);
  mat("output.weight", vocab, d);
  const std::string p = "blk.0.";
  ones(p + "attn_norm.weight", d);
  ones(p + "ffn_norm.weight", d);
  mat(p + "attn_q.weight", n_head * head_dim, d);
  mat(p + "attn_k.weight", n_head_kv * head_dim, d);
  mat(p + "attn_v.weight", n_head_kv * head_dim, d);
  mat(p + "attn_output.weight", d, n_head * head_dim);
  mat(p + "ffn_gate.weight", ff, d);
  mat(p + "ffn_up.weight", ff, d);
  mat(p + "ffn_down.weight", d, ff);
  return w.Serialize();
}

Model& SharedModel() {
  static std::unique_ptr<Model> model = [] {
    std::string path;
    if (const char* p = std::getenv("MERERUN_FUZZ_MODEL"); p != nullptr && *p != '\0') path = p;
    if (path.empty()) path = FindModelFile("SmolLM2-135M-Instruct.Q4_1.gguf");
    if (path.empty()) {
      path = (std::filesystem::temp_directory_path() / ("mererun_fuzz_tiny_" + std::to_string(getpid()) + ".gguf"))
                 .string();
      const std::vector<uint8_t> img = TinyModelImage(1);
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    }
    // Tokenizer and chat template only: converting SmolLM2's weights under ASan took ~20 s of
    // each run (the targets never call Forward).
    LoadOptions o;
    o.n_threads = 1;
    o.vocab_only = true;
    auto m = Model::Load(path, o);
    if (!m.ok()) {
      std::fprintf(stderr, "[fuzz] cannot load %s: %s\n", path.c_str(), m.status().message().c_str());
      std::abort();
    }
    std::fprintf(stderr, "[fuzz] model: %s\n", path.c_str());
    return std::move(m).value();
  }();
  return *model;
}

}  // namespace mr::fuzz
