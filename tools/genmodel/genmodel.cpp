// mererun_genmodel: writes a GGUF of a given architecture with seeded random weights at real
// shapes and a real tokenizer, for proving an architecture's forward pass against llama.cpp
// (tests/e2e/test_model_families.py, docs/models.md) where the registries hold no weights.
//
//   mererun_genmodel --arch qwen3|qwen3moe|qwen2|llama|smollm3|phi3|gemma2|gpt-oss --vocab-from FILE.gguf --out PATH
//                    [--layers N] [--d D] [--heads H] [--kv-heads K] [--head-dim HD] [--ff F]
//                    [--type f16|f32] [--seed S] [--rope-base B] [--rope-freqs llama31|linear]
//                    [--tied] [--experts E --experts-used K --expert-ff F]
//                    [--logit-sd S] [--sliding-window W] [--attn-softcap C] [--final-softcap C]
//                    [--post-norm-mean M]   (the last four: gemma2)
//                    [--yarn-factor F --yarn-orig-ctx N] [--expert-type f16|mxfp4]   (gpt-oss)
//
// The tokenizer (every tokenizer.* key, the chat template included) is copied from
// --vocab-from as llama.cpp's converter writes it. Weights: matrices N(0, 1/cols) so each
// projection keeps the activations' scale; the output matrix (or the tied embedding) N(0, 16/d)
// so logits have a standard deviation near 4 (a peaked next-token distribution, whose argmax is
// not a near-tie; --logit-sd sets that 4); norms 1 + N(0, 0.1); biases N(0, 0.1). --rope-freqs writes a rope_freqs.weight
// (Llama 3.x rope scaling): llama31 is Llama 3.1's profile (factor 1 for high frequencies, 8 for
// low ones, smooth in between), which changes nothing measurable over a short prompt; linear
// runs from 1 (pair 0) to 8 (the last pair), so every pair's factor shows within a few tokens.
// gpt-oss: as the released files, untied, q/k/v and output biases, attention sinks N(0, 4), the
// FFN's norm stored as post_attention_norm, YaRN rope scaling (--yarn-factor over --yarn-orig-ctx
// positions: 32 and 4096 by default), sliding-window layers (--sliding-window) alternating with
// global ones from layer 0, router and expert biases, experts in MXFP4 (--expert-type) whose gate
// and up weights are N(0, 9/d) so the clamped SwiGLU's limits (7) bind on some inputs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "kernels/kquant.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace {

constexpr uint32_t kGgmlTypeMxfp4 = 39;  // ggml_type GGML_TYPE_MXFP4

struct Args {
  std::string arch = "qwen3", vocab_from, out, type = "f16";
  int64_t layers = 28, d = 1024, heads = 16, kv_heads = 8, head_dim = 128, ff = 3072;
  int64_t experts = 8, experts_used = 2, expert_ff = 768;  // qwen3moe
  uint32_t seed = 1;
  double rope_base = 1000000.0;
  std::string rope_freqs;  // "", "llama31" or "linear"
  bool tied = false;
  int64_t logit_sd = 4;                            // the output matrix's sd times sqrt(d)
  int64_t post_norm_mean = 1;                      // gemma2's post-norm weights: N(mean, 0.1)
  int64_t sliding_window = 4096;                   // gemma2
  int64_t attn_softcap = 50, final_softcap = 30;  // gemma2 (the released models' values)
  int64_t yarn_factor = 32, yarn_orig_ctx = 4096;  // gpt-oss
  std::string expert_type = "mxfp4";               // gpt-oss
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "mererun_genmodel: %s\nusage: mererun_genmodel --arch qwen3|qwen3moe|qwen2|llama|smollm3|phi3|gemma2|gpt-oss --vocab-from "
               "FILE.gguf --out PATH [--layers N] [--d D] [--heads H] [--kv-heads K] [--head-dim HD] [--ff F] "
               "[--type f16|f32] [--seed S] [--rope-base B] [--rope-freqs llama31|linear] [--tied] [--experts E "
               "--experts-used K --expert-ff F] [--logit-sd S] [--sliding-window W] [--attn-softcap C] [--final-softcap C] "
               "[--post-norm-mean M] [--yarn-factor F --yarn-orig-ctx N] [--expert-type f16|mxfp4]\n",
               msg);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    auto num = [&]() -> int64_t {
      const std::string v = val();
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (*end != '\0' || x <= 0 || x > (1 << 20)) Usage((k + ": expected a positive integer, got '" + v + "'").c_str());
      return x;
    };
    if (k == "--arch") a.arch = val();
    else if (k == "--vocab-from") a.vocab_from = val();
    else if (k == "--out") a.out = val();
    else if (k == "--type") a.type = val();
    else if (k == "--layers") a.layers = num();
    else if (k == "--d") a.d = num();
    else if (k == "--heads") a.heads = num();
    else if (k == "--kv-heads") a.kv_heads = num();
    else if (k == "--head-dim") a.head_dim = num();
    else if (k == "--ff") a.ff = num();
    else if (k == "--seed") a.seed = static_cast<uint32_t>(num());
    else if (k == "--rope-base") {  // up to 1e9 (SmolLM3: 5e6)
      const std::string v = val();
      char* end = nullptr;
      a.rope_base = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(a.rope_base > 0 && a.rope_base <= 1e9)) Usage(("--rope-base: got '" + v + "'").c_str());
    }
    else if (k == "--rope-freqs") a.rope_freqs = val();
    else if (k == "--tied") a.tied = true;
    else if (k == "--experts") a.experts = num();
    else if (k == "--experts-used") a.experts_used = num();
    else if (k == "--expert-ff") a.expert_ff = num();
    else if (k == "--sliding-window") a.sliding_window = num();
    else if (k == "--logit-sd") a.logit_sd = num();
    else if (k == "--post-norm-mean") a.post_norm_mean = num();
    else if (k == "--attn-softcap") a.attn_softcap = num();
    else if (k == "--final-softcap") a.final_softcap = num();
    else if (k == "--yarn-factor") a.yarn_factor = num();
    else if (k == "--yarn-orig-ctx") a.yarn_orig_ctx = num();
    else if (k == "--expert-type") a.expert_type = val();
    else Usage(("unknown option " + k).c_str());
  }
  if (a.vocab_from.empty() || a.out.empty()) Usage("--vocab-from and --out are required");
  constexpr const char* kArchs[] = {"qwen3", "qwen3moe", "qwen2", "llama", "smollm3", "phi3", "gemma2", "gpt-oss"};
  if (std::find(std::begin(kArchs), std::end(kArchs), a.arch) == std::end(kArchs))
    Usage("--arch must be qwen3, qwen3moe, qwen2, llama, smollm3, phi3, gemma2 or gpt-oss");
  if (a.expert_type != "f16" && a.expert_type != "mxfp4") Usage("--expert-type must be f16 or mxfp4");
  if (a.experts_used > a.experts) Usage("--experts-used must be at most --experts");
  if (a.type != "f16" && a.type != "f32") Usage("--type must be f16 or f32");
  if (a.heads % a.kv_heads != 0) Usage("--heads must be a multiple of --kv-heads");
  if (!a.rope_freqs.empty() && a.rope_freqs != "llama31" && a.rope_freqs != "linear")
    Usage("--rope-freqs must be llama31 or linear");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mr;
  const Args a = Parse(argc, argv);
  auto src = gguf::GgufFile::Open(a.vocab_from);
  if (!src.ok()) {
    std::fprintf(stderr, "mererun_genmodel: %s\n", src.status().message().c_str());
    return 1;
  }
  const gguf::GgufFile& f = **src;
  const auto* tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens) {
    std::fprintf(stderr, "mererun_genmodel: %s has no tokenizer.ggml.tokens\n", a.vocab_from.c_str());
    return 1;
  }
  const int64_t vocab = static_cast<int64_t>(tokens->size());
  gguf::GgufWriter w(3);
  const std::string p = a.arch + ".";
  w.SetString("general.architecture", a.arch);
  w.SetString("general.name", "mererun generated " + a.arch + " (random weights, seed " + std::to_string(a.seed) + ")");
  w.SetU32("general.file_type", a.type == "f16" ? 1 : 0);
  w.SetU32(p + "block_count", static_cast<uint32_t>(a.layers));
  w.SetU32(p + "context_length", 40960);
  w.SetU32(p + "embedding_length", static_cast<uint32_t>(a.d));
  w.SetU32(p + "feed_forward_length", static_cast<uint32_t>(a.ff));
  w.SetU32(p + "attention.head_count", static_cast<uint32_t>(a.heads));
  w.SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(a.kv_heads));
  w.SetU32(p + "attention.key_length", static_cast<uint32_t>(a.head_dim));
  w.SetU32(p + "attention.value_length", static_cast<uint32_t>(a.head_dim));
  w.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(a.head_dim));
  w.SetF32(p + "rope.freq_base", static_cast<float>(a.rope_base));
  w.SetF32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  const bool oss = a.arch == "gpt-oss";
  const bool moe = a.arch == "qwen3moe" || oss, phi3 = a.arch == "phi3", gemma2 = a.arch == "gemma2";
  if (oss) {
    w.SetU32(p + "attention.sliding_window", static_cast<uint32_t>(a.sliding_window));
    w.SetString(p + "rope.scaling.type", "yarn");
    w.SetF32(p + "rope.scaling.factor", static_cast<float>(a.yarn_factor));
    w.SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(a.yarn_orig_ctx));
  }
  if (gemma2) {
    w.SetU32(p + "attention.sliding_window", static_cast<uint32_t>(a.sliding_window));
    w.SetF32(p + "attn_logit_softcapping", static_cast<float>(a.attn_softcap));
    w.SetF32(p + "final_logit_softcapping", static_cast<float>(a.final_softcap));
  }
  if (moe) {
    w.SetU32(p + "expert_count", static_cast<uint32_t>(a.experts));
    w.SetU32(p + "expert_used_count", static_cast<uint32_t>(a.experts_used));
    w.SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(a.expert_ff));
  }
  for (const auto& [key, value] : f.metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    if (Status st = w.SetValue(key, value); !st.ok()) {
      std::fprintf(stderr, "mererun_genmodel: %s\n", st.message().c_str());
      return 1;
    }
  }

  std::mt19937_64 rng(a.seed);
  const bool f16 = a.type == "f16";
  auto add = [&](const std::string& name, std::vector<int64_t> dims, const std::vector<float>& v, bool matrix) {
    std::vector<uint8_t> bytes;
    uint32_t type = 0;  // vectors stay F32, as llama.cpp's converter writes norms and biases
    if (matrix && f16) {
      type = 1;
      bytes.resize(v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = F32ToF16(v[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    } else {
      bytes.resize(v.size() * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
    }
    if (Status st = w.AddTensor(name, type, std::move(dims), std::move(bytes)); !st.ok()) {
      std::fprintf(stderr, "mererun_genmodel: %s\n", st.message().c_str());
      std::exit(1);
    }
  };
  // MXFP4 (gpt-oss's expert format): blocks of 32 rows-major inputs quantized as ggml's converter does.
  using AddFn = std::function<void(const std::string&, std::vector<int64_t>, const std::vector<float>&, bool)>;
  const AddFn add_mxfp4 = [&](const std::string& name, std::vector<int64_t> dims, const std::vector<float>& v, bool) {
        const int64_t nb = static_cast<int64_t>(v.size()) / KSuperInputs(KFormat::kMXFP4);
        std::vector<uint8_t> bytes(static_cast<size_t>(nb * KSuperBytes(KFormat::kMXFP4)));
        if (!QuantizeKBlocks(KFormat::kMXFP4, v.data(), bytes.data(), nb)) {
          std::fprintf(stderr, "mererun_genmodel: MXFP4 quantization failed for %s\n", name.c_str());
          std::exit(1);
        }
        if (Status st = w.AddTensor(name, kGgmlTypeMxfp4, std::move(dims), std::move(bytes)); !st.ok()) {
          std::fprintf(stderr, "mererun_genmodel: %s\n", st.message().c_str());
          std::exit(1);
        }
      };
  auto normal = [&](int64_t n, double mean, double sd) {
    std::normal_distribution<float> dist(static_cast<float>(mean), static_cast<float>(sd));
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
  };
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols, double sd) {
    add(name, {cols, rows}, normal(rows * cols, 0.0, sd), true);
  };
  auto vec = [&](const std::string& name, int64_t n, double mean, double sd) {
    add(name, {n}, normal(n, mean, sd), false);
  };
  const int64_t d = a.d, hd = a.head_dim, q_dim = a.heads * hd, kv_dim = a.kv_heads * hd;
  const double out_sd = static_cast<double>(a.logit_sd) / std::sqrt(static_cast<double>(d));
  mat("token_embd.weight", vocab, d, a.tied ? out_sd : 1.0);
  vec("output_norm.weight", d, 1.0, 0.1);
  if (!a.tied) mat("output.weight", vocab, d, out_sd);
  if (a.rope_freqs == "linear") {
    std::vector<float> rf(static_cast<size_t>(hd / 2));
    for (int64_t i = 0; i < hd / 2; ++i) rf[static_cast<size_t>(i)] = static_cast<float>(1.0 + 7.0 * i / (hd / 2 - 1));
    add("rope_freqs.weight", {hd / 2}, rf, false);
  } else if (a.rope_freqs == "llama31") {  // scale 8, low/high frequency factors 1 and 4, 8192 original context
    std::vector<float> rf(static_cast<size_t>(hd / 2));
    const double low_wl = 8192.0 / 1.0, high_wl = 8192.0 / 4.0;
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double freq = std::pow(a.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double wl = 2 * M_PI / freq;
      double factor = 1.0;
      if (wl > low_wl) {
        factor = 8.0;
      } else if (wl >= high_wl) {
        const double smooth = (8192.0 / wl - 1.0) / (4.0 - 1.0);
        factor = 1.0 / ((1 - smooth) / 8.0 + smooth);
      }
      rf[static_cast<size_t>(i)] = static_cast<float>(factor);
    }
    add("rope_freqs.weight", {hd / 2}, rf, false);
  }
  for (int64_t l = 0; l < a.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", d, 1.0, 0.1);
    if (phi3) {  // q, k and v rows in one tensor
      mat(b + "attn_qkv.weight", q_dim + 2 * kv_dim, d, 1.0 / std::sqrt(static_cast<double>(d)));
    } else {
      mat(b + "attn_q.weight", q_dim, d, 1.0 / std::sqrt(static_cast<double>(d)));
      mat(b + "attn_k.weight", kv_dim, d, 1.0 / std::sqrt(static_cast<double>(d)));
      mat(b + "attn_v.weight", kv_dim, d, 1.0 / std::sqrt(static_cast<double>(d)));
    }
    mat(b + "attn_output.weight", d, q_dim, 1.0 / std::sqrt(static_cast<double>(q_dim)));
    if (oss) {
      vec(b + "attn_output.bias", d, 0.0, 0.1);
      vec(b + "attn_sinks.weight", a.heads, 0.0, 2.0);
    }
    if (a.arch == "qwen2" || oss) {
      vec(b + "attn_q.bias", q_dim, 0.0, 0.1);
      vec(b + "attn_k.bias", kv_dim, 0.0, 0.1);
      vec(b + "attn_v.bias", kv_dim, 0.0, 0.1);
    }
    if (a.arch == "qwen3" || a.arch == "qwen3moe") {
      vec(b + "attn_q_norm.weight", hd, 1.0, 0.1);
      vec(b + "attn_k_norm.weight", hd, 1.0, 0.1);
    }
    if (gemma2) {  // the norms after attention and FFN (llama.cpp's names)
      vec(b + "post_attention_norm.weight", d, static_cast<double>(a.post_norm_mean), 0.1);
      vec(b + "post_ffw_norm.weight", d, static_cast<double>(a.post_norm_mean), 0.1);
    }
    vec(b + (oss ? "post_attention_norm.weight" : "ffn_norm.weight"), d, 1.0, 0.1);
    if (moe) {  // router N(0, 36/d): logits of standard deviation ~6, so the top-k is rarely a near-tie
      add(b + "ffn_gate_inp.weight", {d, a.experts}, normal(a.experts * d, 0.0, 6.0 / std::sqrt(double(d))), false);
      const int64_t e = a.experts, f = a.expert_ff;
      // gpt-oss: gate and up inputs of sd ~3, so the activation's clamp at 7 binds on ~2 % of them,
      // and down weights 1/4 of the usual so the experts' outputs (up to 7 * 8 per unit) stay near
      // the residual's scale: larger ones turn the rare near-tie of the 4th and 5th experts, which
      // the two sides' rounding may order either way, into large jumps of the logits.
      const double in_sd = (oss ? 3.0 : 1.0) / std::sqrt(double(d));
      const double down_sd = (oss ? 0.25 : 1.0) / std::sqrt(double(f));
      const AddFn experts = oss && a.expert_type == "mxfp4" ? add_mxfp4 : AddFn(add);
      experts(b + "ffn_gate_exps.weight", {d, f, e}, normal(e * f * d, 0.0, in_sd), true);
      experts(b + "ffn_up_exps.weight", {d, f, e}, normal(e * f * d, 0.0, in_sd), true);
      experts(b + "ffn_down_exps.weight", {f, d, e}, normal(e * f * d, 0.0, down_sd), true);
      if (oss) {
        add(b + "ffn_gate_inp.bias", {e}, normal(e, 0.0, 1.0), false);
        add(b + "ffn_gate_exps.bias", {f, e}, normal(e * f, 0.0, 0.1), false);
        add(b + "ffn_up_exps.bias", {f, e}, normal(e * f, 0.0, 0.1), false);
        add(b + "ffn_down_exps.bias", {d, e}, normal(e * d, 0.0, 0.1), false);
      }
      continue;
    }
    if (phi3) {  // gate rows, then up rows, in ffn_up
      mat(b + "ffn_up.weight", 2 * a.ff, d, 1.0 / std::sqrt(static_cast<double>(d)));
    } else {
      mat(b + "ffn_gate.weight", a.ff, d, 1.0 / std::sqrt(static_cast<double>(d)));
      mat(b + "ffn_up.weight", a.ff, d, 1.0 / std::sqrt(static_cast<double>(d)));
    }
    mat(b + "ffn_down.weight", d, a.ff, 1.0 / std::sqrt(static_cast<double>(a.ff)));
  }
  if (Status st = w.WriteFile(a.out); !st.ok()) {
    std::fprintf(stderr, "mererun_genmodel: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("%s: %s, %lld layers, d %lld, %lld heads (%lld kv) x %lld, ff %lld, vocab %lld, %s\n", a.out.c_str(),
              a.arch.c_str(), (long long)a.layers, (long long)d, (long long)a.heads, (long long)a.kv_heads,
              (long long)hd, (long long)a.ff, (long long)vocab, a.type.c_str());
  return 0;
}
