// llama.cpp's pooled embeddings, the oracle of tests/e2e/test_embeddings.py: the same llama.cpp
// build as logits_ref (node-llama-cpp's own libllama / libggml), a context with embeddings on and
// the pooling type asked for, one sequence per text on a cleared memory, and
// llama_get_embeddings_seq's vector (the output-normed hidden states pooled, not normalized),
// as llama-server's send_embedding reads it before common_embd_normalize. Built by
// tools/llamacpp/build_logits_ref.sh.
//
//   embed_ref MODEL.gguf TEXTS.jsonl (mean|cls|last) [--threads N] [--backend-dir DIR]
//
// TEXTS.jsonl: one {"text": "..."} per line. Tokens: llama_tokenize(add_special = true,
// parse_special = false): the model's own BOS / EOS rule, and text never read as special tokens
// (the server's rule; llama-server parses them). Prints one JSON object on stdout:
// {"llama_cpp": RELEASE, "pooling": P, "results": [{"tokens": [...], "embedding": [...]}, ...]}.

#include <llama.h>

#include "ref_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;

[[noreturn]] void Fail(const std::string& message, int code = 2) {
  std::fprintf(stderr, "[embed_ref] %s\n", message.c_str());
  std::exit(code);
}

void Log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fprintf(stderr, "[llama.cpp] %s", text);
}

std::vector<llama_token> Tokenize(const llama_vocab* vocab, const std::string& text) {
  std::optional<std::vector<llama_token>> ids = TokenizeRef(vocab, text, true, false);
  if (!ids) Fail("tokenization failed");
  return *ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  int threads = 2;
  std::string backend_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (s == "--backend-dir" && i + 1 < argc) {
      backend_dir = argv[++i];
    } else if (s.rfind("--", 0) == 0) {
      Fail("unknown option " + s);
    } else {
      pos.push_back(s);
    }
  }
  if (pos.size() != 3 || threads < 1)
    Fail("usage: embed_ref MODEL.gguf TEXTS.jsonl (mean|cls|last) [--threads N] [--backend-dir DIR]");
  enum llama_pooling_type pooling = LLAMA_POOLING_TYPE_MEAN;
  if (pos[2] == "mean") {
    pooling = LLAMA_POOLING_TYPE_MEAN;
  } else if (pos[2] == "cls") {
    pooling = LLAMA_POOLING_TYPE_CLS;
  } else if (pos[2] == "last") {
    pooling = LLAMA_POOLING_TYPE_LAST;
  } else {
    Fail("pooling must be mean, cls or last: got " + pos[2]);
  }
  std::ifstream in(pos[1]);
  if (!in) Fail("texts file not found: " + pos[1]);
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    const json obj = json::parse(line);
    texts.push_back(obj.at("text").get<std::string>());
  }
  if (texts.empty()) Fail("no texts in " + pos[1]);

  namespace fs = std::filesystem;
  llama_log_set(Log, nullptr);
  ggml_log_set(Log, nullptr);
  if (backend_dir.empty()) backend_dir = fs::canonical("/proc/self/exe").parent_path().string() + "/bins";
  ggml_backend_load_all_from_path(backend_dir.c_str());
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(pos[0].c_str(), mp);
  if (model == nullptr) Fail("llama.cpp could not load " + pos[0], 1);
  const llama_vocab* vocab = llama_model_get_vocab(model);

  std::vector<std::vector<llama_token>> tokens;
  size_t max_len = 0;
  for (const std::string& t : texts) {
    tokens.push_back(Tokenize(vocab, t));
    if (tokens.back().empty()) Fail("a text has no tokens");
    max_len = std::max(max_len, tokens.back().size());
  }
  llama_context_params cp = llama_context_default_params();
  const auto n = static_cast<uint32_t>(std::max<size_t>(256, max_len));
  cp.n_ctx = cp.n_batch = cp.n_ubatch = n;  // pooling needs the whole sequence in one micro-batch
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.no_perf = true;
  cp.embeddings = true;
  cp.pooling_type = pooling;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) Fail("llama.cpp could not create a context", 1);
  const int n_embd = llama_model_n_embd(model);

  json results = json::array();
  for (const std::vector<llama_token>& ids : tokens) {
    if (const int rc = DecodeOneSequence(ctx, ids); rc != 0) Fail("llama_decode failed (" + std::to_string(rc) + ")", 1);
    const float* e = llama_get_embeddings_seq(ctx, 0);
    if (e == nullptr) Fail("no pooled embedding", 1);
    results.push_back({{"tokens", ids}, {"embedding", std::vector<float>(e, e + n_embd)}});
  }
  const json out = {{"llama_cpp", MR_LLAMA_CPP_RELEASE}, {"pooling", pos[2]}, {"results", results}};
  std::printf("%s\n", out.dump().c_str());
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
