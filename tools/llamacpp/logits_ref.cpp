// The llama.cpp reference distributions of logits_ref.mjs, computed without JavaScript: the same
// llama.cpp build (node-llama-cpp's own libllama / libggml, tools/llamacpp/node_modules), the same
// tokenization, context settings and probability arithmetic, the same outputs (tokens.json,
// ref.bin "LCRF" v1, meta.json). Built by tools/llamacpp/build_logits_ref.sh; scripts/parity.py
// uses it when it is built and falls back on logits_ref.mjs otherwise.
//
//   logits_ref MODEL.gguf PROMPTS.jsonl OUT_DIR [--limit N] [--threads N] [--context-size N]
//              [--mass F] [--min-k N] [--max-k N] [--backend-dir DIR]
//
// Why: node-llama-cpp hands every position's whole distribution to JavaScript as a Map (a
// 151,936-entry Map per position for a Qwen vocabulary), which cost ~80 ms a position, 145 s of
// a 1,850-position parity run; the forward passes themselves take a few seconds.
//
// What is reproduced from node-llama-cpp 3.21.1 (llama/addon, dist/evaluator), checked by
// tests/e2e/test_parity.py::test_native_reference_matches_the_node_reference:
// - tokens: common_tokenize(text, add_special = false, parse_special = true) (AddonModel::
//   Tokenize), then BOS prepended when llama_vocab_get_add_bos and the BOS is a control token,
//   EOS appended when llama_vocab_get_add_eos and both BOS and EOS are control tokens (the
//   LlamaModelTokens getters);
// - context: n_ctx = n_batch = n_ubatch = max(256, longest prompt), one sequence, flash attention
//   off, swa_full off, no_perf; each prompt is one batch on a cleared memory, logits at every
//   position;
// - the distribution: the candidates (id order, raw logits of llama_get_logits_ith) sorted by
//   logit with std::sort, float32 softmax in that order (AddonContext SampleToken), then the
//   float64 renormalisation and top-K reduction of logits_ref.mjs.
// node-llama-cpp runs two contexts of one thread each; ggml's CPU ops give each output element to
// one thread, so the thread count does not change the numbers (docs/parity.md).

#include <llama.h>

#include "ref_common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;

[[noreturn]] void Fail(const std::string& message, int code = 2) {
  std::fprintf(stderr, "[logits_ref] %s\n", message.c_str());
  std::exit(code);
}

struct Args {
  std::vector<std::string> positional;
  long limit = 0, threads = 2, context_size = 0, min_k = 32, max_k = 4096;
  double mass = 0.999999;
  std::string backend_dir;
};

constexpr const char* kUsage =
    "usage: logits_ref MODEL.gguf PROMPTS.jsonl OUT_DIR [--limit N] [--threads N] [--context-size N] "
    "[--mass F] [--min-k N] [--max-k N] [--backend-dir DIR]";

double Number(const std::string& flag, const char* v) {
  if (v == nullptr) Fail(flag + " needs a number");
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(d)) Fail(flag + " needs a number: got '" + v + "'");
  return d;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (s == "-h" || s == "--help") {
      std::printf("%s\n", kUsage);
      std::exit(0);
    } else if (s == "--limit") {
      a.limit = static_cast<long>(Number(s, next)), ++i;
    } else if (s == "--threads") {
      a.threads = static_cast<long>(Number(s, next)), ++i;
    } else if (s == "--parallel") {  // accepted for logits_ref.mjs's command line; one context here
      Number(s, next), ++i;
    } else if (s == "--context-size") {
      a.context_size = static_cast<long>(Number(s, next)), ++i;
    } else if (s == "--mass") {
      a.mass = Number(s, next), ++i;
    } else if (s == "--min-k") {
      a.min_k = static_cast<long>(Number(s, next)), ++i;
    } else if (s == "--max-k") {
      a.max_k = static_cast<long>(Number(s, next)), ++i;
    } else if (s == "--backend-dir") {
      if (next == nullptr) Fail("--backend-dir needs a directory");
      a.backend_dir = next, ++i;
    } else if (s.rfind("--", 0) == 0) {
      Fail("unknown option " + s + "\n" + kUsage);
    } else {
      a.positional.push_back(s);
    }
  }
  if (a.positional.size() != 3) Fail(kUsage);
  if (!(a.mass > 0 && a.mass <= 1)) Fail("--mass must be in (0, 1]");
  if (a.min_k < 1 || a.max_k < a.min_k) Fail("need 1 <= --min-k <= --max-k");
  if (a.threads < 1) Fail("--threads must be >= 1");
  return a;
}

struct Prompt {
  std::string id, text;
};

std::vector<Prompt> ReadPrompts(const std::string& file, long limit) {
  std::ifstream in(file);
  if (!in) Fail("prompts file not found: " + file);
  std::vector<Prompt> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    json obj;
    try {
      obj = json::parse(line);
    } catch (const std::exception& e) {
      Fail(file + ":" + std::to_string(n) + ": not JSON: " + e.what());
    }
    if (!obj.is_object() || !obj.contains("text") || !obj["text"].is_string() || obj["text"].get<std::string>().empty())
      Fail(file + ":" + std::to_string(n) + ": missing \"text\"");
    std::string id = "line" + std::to_string(n);
    if (obj.contains("id") && obj["id"].is_string()) id = obj["id"].get<std::string>();
    out.push_back({id, obj["text"].get<std::string>()});
  }
  if (limit > 0 && static_cast<long>(out.size()) > limit) out.resize(static_cast<size_t>(limit));
  return out;
}

std::string Sha256File(const std::string& file) {  // sha256sum(1): the model file can be gigabytes
  const std::string cmd = "sha256sum '" + file + "'";
  if (file.find('\'') != std::string::npos) Fail("path has a quote: " + file);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) Fail("cannot run sha256sum");
  char buf[65] = {};
  const size_t n = std::fread(buf, 1, 64, p);
  pclose(p);
  if (n != 64) Fail("sha256sum failed on " + file);
  return std::string(buf, 64);
}

bool IsControl(const llama_vocab* vocab, llama_token t) {
  if (t < 0) return false;
  const auto attr = llama_vocab_get_attr(vocab, t);
  return (attr & LLAMA_TOKEN_ATTR_CONTROL) || (attr & LLAMA_TOKEN_ATTR_UNDEFINED);
}

std::vector<llama_token> Tokenize(const llama_vocab* vocab, const std::string& text) {
  std::optional<std::vector<llama_token>> ids = TokenizeRef(vocab, text, false, true);
  if (!ids) Fail("tokenization failed");
  return *ids;
}

struct Record {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  double tail = 0;
};

// One position: AddonContext::SampleToken's sort and float32 softmax, then logits_ref.mjs's TopK.
Record Distribution(const float* logits, int32_t n_vocab, const Args& a, std::vector<llama_token_data>& cand,
                    std::vector<float>& probs) {
  cand.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand[static_cast<size_t>(i)] = {i, logits[i], 0.0f};
  std::sort(cand.begin(), cand.end(), [](const llama_token_data& x, const llama_token_data& y) { return x.logit > y.logit; });
  probs.resize(cand.size());
  float max_logit = cand.empty() ? -INFINITY : cand[0].logit;
  for (size_t i = 0; i < cand.size(); ++i) max_logit = std::max(max_logit, cand[i].logit);
  if (max_logit != -INFINITY) {
    float sum = 0.0f;
    for (size_t i = 0; i < cand.size(); ++i) {
      probs[i] = expf(cand[i].logit - max_logit);
      sum += probs[i];
    }
    for (float& p : probs) p /= sum;
  } else {
    for (size_t i = 0; i < cand.size(); ++i) probs[i] = cand[i].logit;
  }
  double total = 0;
  for (float p : probs) total += static_cast<double>(p);
  if (!(total > 0)) Fail("distribution sums to " + std::to_string(total), 1);
  Record r;
  double covered = 0;
  bool done = false;
  for (size_t i = 0; i < cand.size(); ++i) {
    const double p = static_cast<double>(probs[i]) / total;
    if (!done && p > 0) {
      r.ids.push_back(cand[i].id);
      r.logprobs.push_back(static_cast<float>(std::log(p)));
      covered += p;
      const long k = static_cast<long>(r.ids.size());
      done = (covered >= a.mass && k >= a.min_k) || k >= a.max_k;
    } else {
      done = true;
      r.tail += p;
    }
  }
  return r;
}

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof v);
}

std::string CpuBackendName() {
  for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
    ggml_backend_reg_t reg = ggml_backend_reg_get(i);
    for (size_t d = 0; d < ggml_backend_reg_dev_count(reg); ++d) {
      ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, d);
      if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) return ggml_backend_reg_name(reg);
    }
  }
  return "";
}

std::string g_cpu_backend_path;

void Log(ggml_log_level level, const char* text, void*) {
  const std::string s = text ? text : "";
  if (const size_t at = s.find("loaded CPU backend from "); at != std::string::npos) {
    g_cpu_backend_path = s.substr(at + std::strlen("loaded CPU backend from "));
    while (!g_cpu_backend_path.empty() && std::isspace(static_cast<unsigned char>(g_cpu_backend_path.back())))
      g_cpu_backend_path.pop_back();
  }
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fprintf(stderr, "[llama.cpp] %s", text);
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = ParseArgs(argc, argv);
  const std::string model_path = a.positional[0], prompts_path = a.positional[1], out_dir = a.positional[2];
  namespace fs = std::filesystem;
  if (!fs::exists(model_path)) Fail("model file not found: " + model_path);
  const std::vector<Prompt> prompts = ReadPrompts(prompts_path, a.limit);
  if (prompts.empty()) Fail("no prompts in " + prompts_path);
  fs::create_directories(out_dir);
  fs::remove(fs::path(out_dir) / "meta.json");  // written last: marks a complete output

  const auto t_start = std::chrono::steady_clock::now();
  llama_log_set(Log, nullptr);
  ggml_log_set(Log, nullptr);
  std::string backend_dir = a.backend_dir;
  if (backend_dir.empty()) backend_dir = fs::canonical("/proc/self/exe").parent_path().string() + "/bins";
  ggml_backend_load_all_from_path(backend_dir.c_str());
  llama_backend_init();
  const std::string cpu_backend = CpuBackendName();
  if (cpu_backend.empty()) Fail("no CPU backend loaded from " + backend_dir);

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (model == nullptr) Fail("llama.cpp could not load " + model_path, 1);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const llama_token bos = llama_vocab_bos(vocab), eos = llama_vocab_eos(vocab);
  const bool bos_ok = IsControl(vocab, bos), eos_ok = IsControl(vocab, eos);
  const bool add_bos = bos_ok && llama_vocab_get_add_bos(vocab);
  const bool add_eos = bos_ok && llama_vocab_get_add_eos(vocab) && eos_ok;

  std::vector<std::vector<llama_token>> tokens;
  size_t max_len = 0;
  for (const Prompt& p : prompts) {
    std::vector<llama_token> ids = Tokenize(vocab, p.text);
    if (add_bos) ids.insert(ids.begin(), bos);
    if (add_eos) ids.push_back(eos);
    max_len = std::max(max_len, ids.size());
    tokens.push_back(std::move(ids));
  }
  const uint32_t context_size =
      a.context_size > 0 ? static_cast<uint32_t>(a.context_size) : static_cast<uint32_t>(std::max<size_t>(256, max_len));
  if (max_len > context_size)
    Fail("a prompt has " + std::to_string(max_len) + " tokens > --context-size " + std::to_string(context_size));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = context_size;
  cp.n_batch = context_size;
  cp.n_ubatch = context_size;
  cp.n_seq_max = 1;
  cp.n_threads = static_cast<int32_t>(a.threads);
  cp.n_threads_batch = static_cast<int32_t>(a.threads);
  cp.no_perf = true;
  cp.swa_full = false;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) Fail("llama.cpp could not create a context", 1);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  const double load_s = SecondsSince(t_start);

  const auto t_eval = std::chrono::steady_clock::now();
  std::vector<std::vector<std::vector<uint8_t>>> records(prompts.size());
  int64_t n_positions = 0;
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    std::vector<llama_token>& ids = tokens[pi];
    if (const int rc = DecodeOneSequence(ctx, ids); rc != 0) Fail("llama_decode failed (" + std::to_string(rc) + ")", 1);
    // The reductions (a full-vocabulary sort each) on every thread, positions interleaved.
    std::vector<const float*> rows(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      rows[i] = llama_get_logits_ith(ctx, static_cast<int32_t>(i));
      if (rows[i] == nullptr) Fail("prompt " + prompts[pi].id + ": no logits at position " + std::to_string(i), 1);
    }
    records[pi].resize(ids.size());
    std::vector<std::thread> workers;
    for (long t = 0; t < a.threads; ++t) {
      workers.emplace_back([&, t] {
        std::vector<llama_token_data> cand;
        std::vector<float> probs;
        for (size_t i = static_cast<size_t>(t); i < rows.size(); i += static_cast<size_t>(a.threads)) {
          const Record r = Distribution(rows[i], n_vocab, a, cand, probs);
          std::vector<uint8_t>& b = records[pi][i];
          Put<uint32_t>(b, static_cast<uint32_t>(r.ids.size()));
          Put<double>(b, r.tail);
          for (int32_t id : r.ids) Put<int32_t>(b, id);
          for (float lp : r.logprobs) Put<float>(b, lp);
        }
      });
    }
    for (std::thread& w : workers) w.join();
    n_positions += static_cast<int64_t>(ids.size());
    std::fprintf(stderr, "[logits_ref] prompt %zu/%zu (%s): %zu positions\n", pi + 1, prompts.size(),
                 prompts[pi].id.c_str(), ids.size());
  }
  const double eval_s = SecondsSince(t_eval);

  std::vector<uint8_t> header;
  header.insert(header.end(), {'L', 'C', 'R', 'F'});
  Put<uint32_t>(header, 1);
  Put<uint32_t>(header, static_cast<uint32_t>(n_vocab));
  Put<uint32_t>(header, static_cast<uint32_t>(prompts.size()));
  for (const auto& t : tokens) Put<uint32_t>(header, static_cast<uint32_t>(t.size()));
  {
    std::ofstream out(fs::path(out_dir) / "ref.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size()));
    for (const auto& per_pos : records)
      for (const auto& b : per_pos) out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) Fail("cannot write ref.bin in " + out_dir, 1);
  }
  {
    std::ofstream out(fs::path(out_dir) / "tokens.json");
    out << "[\n";
    for (size_t i = 0; i < tokens.size(); ++i) out << json(tokens[i]).dump() << (i + 1 < tokens.size() ? ",\n" : "\n");
    out << "]\n";
  }
  double k_sum = 0, tail_max = 0;
  uint32_t k_max = 0;
  for (const auto& per_pos : records) {
    for (const auto& b : per_pos) {
      uint32_t k;
      double tail;
      std::memcpy(&k, b.data(), 4);
      std::memcpy(&tail, b.data() + 4, 8);
      k_sum += k;
      k_max = std::max(k_max, k);
      tail_max = std::max(tail_max, tail);
    }
  }
  json ids = json::array();
  for (const Prompt& p : prompts) ids.push_back(p.id);
  // The same keys as logits_ref.mjs's meta.json (scripts/parity.py reads model, prompts,
  // n_prompts and the provenance); node_llama_cpp names the package these libraries came from
  // (both set by build_logits_ref.sh from its package.json and llama/llama.cpp.info.json).
  json meta = {
      {"generator", "tools/llamacpp/logits_ref.cpp"},
      {"format", "LCRF v1"},
      {"node_llama_cpp", MR_NODE_LLAMA_CPP},
      {"llama_cpp_release", {{"repo", MR_LLAMA_CPP_REPO}, {"release", MR_LLAMA_CPP_RELEASE}}},
      {"build_type", "prebuilt"},
      {"cpu_backend", g_cpu_backend_path.empty() ? json(cpu_backend) : json(g_cpu_backend_path)},
      {"system_info", llama_print_system_info()},
      {"model",
       {{"path", fs::absolute(model_path).lexically_normal().string()},
        {"size_bytes", fs::file_size(model_path)},
        {"sha256", Sha256File(model_path)}}},
      {"prompts",
       {{"path", fs::absolute(prompts_path).lexically_normal().string()},
        {"sha256", Sha256File(prompts_path)},
        {"limit", a.limit},
        {"ids", ids}}},
      {"n_vocab", n_vocab},
      {"add_bos", add_bos},
      {"add_eos", add_eos},
      {"settings",
       {{"threads", a.threads},
        {"parallel", 1},
        {"threads_per_context", a.threads},
        {"context_size", context_size},
        {"batch_size", context_size},
        {"flash_attention", false},
        {"temperature", 0},
        {"mass", a.mass},
        {"min_k", a.min_k},
        {"max_k", a.max_k}}},
      {"n_prompts", prompts.size()},
      {"n_positions", n_positions},
      {"k_mean", k_sum / static_cast<double>(std::max<int64_t>(1, n_positions))},
      {"k_max", k_max},
      {"tail_mass_max", tail_max},
      {"timings_s",
       {{"load", load_s},
        {"evaluate", eval_s},
        {"ms_per_position", eval_s * 1e3 / static_cast<double>(std::max<int64_t>(1, n_positions))}}},
  };
  std::ofstream(fs::path(out_dir) / "meta.json") << meta.dump(2) << "\n";
  std::fprintf(stderr, "[logits_ref] %lld positions, n_vocab %d, mean K %.1f, evaluate %.1f s (%.1f ms/position), backend %s\n",
               static_cast<long long>(n_positions), n_vocab, meta["k_mean"].get<double>(), eval_s,
               meta["timings_s"]["ms_per_position"].get<double>(), meta["cpu_backend"].get<std::string>().c_str());
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
