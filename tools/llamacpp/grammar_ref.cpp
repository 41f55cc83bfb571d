// llama.cpp's grammar masks, the oracle for mererun's GBNF support (tests/e2e/test_grammar_parity.py,
// docs/api.md "GBNF grammars"). Built with logits_ref by build_logits_ref.sh against node-llama-cpp's
// own libllama.
//
//   grammar_ref MODEL.gguf GRAMMAR.gbnf [--walks N] [--steps N] [--seed N] [--backend-dir DIR]
//
// Loads the model's vocabulary, builds llama.cpp's grammar sampler (llama_sampler_init_grammar,
// root "root") and walks it: at each step every token of the vocabulary is a candidate, the
// sampler masks them, and the walk takes one allowed token at random (never an end-of-generation
// or control token; it stops when none is left, or at random once the grammar is complete).
// Prints one JSON line per walk: {"tokens": [...], "allowed": [RANGES per step]}, the state of step
// i being the state after tokens[0..i); RANGES is a list of [first, last] token id ranges. A first
// line {"n_vocab": N, "special": RANGES, "eog": RANGES} names the tokens to leave out of a
// comparison (control, unknown, unused and end-of-generation tokens, whose text llama.cpp matches
// as plain text) and the end-of-generation ones (allowed when the grammar is complete).
// Exit status 1 when llama.cpp refuses the grammar.

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;

[[noreturn]] void Fail(const std::string& message, int code = 2) {
  std::fprintf(stderr, "[grammar_ref] %s\n", message.c_str());
  std::exit(code);
}

json Ranges(const std::vector<int>& ids) {
  json out = json::array();
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    out.push_back({ids[i], ids[j]});
    i = j + 1;
  }
  return out;
}

void Quiet(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fprintf(stderr, "[llama.cpp] %s", text);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  long walks = 4, steps = 24, seed = 1;
  std::string backend_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if ((s == "--walks" || s == "--steps" || s == "--seed" || s == "--backend-dir") && next == nullptr)
      Fail(s + " needs a value");
    if (s == "--walks") {
      walks = std::atol(next), ++i;
    } else if (s == "--steps") {
      steps = std::atol(next), ++i;
    } else if (s == "--seed") {
      seed = std::atol(next), ++i;
    } else if (s == "--backend-dir") {
      backend_dir = next, ++i;
    } else {
      pos.push_back(s);
    }
  }
  if (pos.size() != 2) Fail("usage: grammar_ref MODEL.gguf GRAMMAR.gbnf [--walks N] [--steps N] [--seed N]");
  std::ifstream gf(pos[1], std::ios::binary);
  if (!gf) Fail("cannot read " + pos[1]);
  const std::string grammar((std::istreambuf_iterator<char>(gf)), std::istreambuf_iterator<char>());

  llama_log_set(Quiet, nullptr);
  ggml_log_set(Quiet, nullptr);
  namespace fs = std::filesystem;
  if (backend_dir.empty()) backend_dir = fs::canonical("/proc/self/exe").parent_path().string() + "/bins";
  ggml_backend_load_all_from_path(backend_dir.c_str());
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(pos[0].c_str(), mp);
  if (model == nullptr) Fail("llama.cpp could not load " + pos[0]);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  std::vector<char> special(static_cast<size_t>(n_vocab), 0);
  std::vector<int> special_ids, eog_ids;
  for (int t = 0; t < n_vocab; ++t) {
    const int attr = llama_vocab_get_attr(vocab, t);
    if (llama_vocab_is_eog(vocab, t)) eog_ids.push_back(t);
    if (llama_vocab_is_eog(vocab, t) ||
        (attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN | LLAMA_TOKEN_ATTR_UNUSED)) != 0) {
      special[static_cast<size_t>(t)] = 1;
      special_ids.push_back(t);
    }
  }
  std::printf("%s\n", json{{"n_vocab", n_vocab}, {"special", Ranges(special_ids)}, {"eog", Ranges(eog_ids)}}.dump().c_str());

  std::mt19937 rng(static_cast<unsigned>(seed));
  std::vector<llama_token_data> data(static_cast<size_t>(n_vocab));
  for (long w = 0; w < walks; ++w) {
    llama_sampler* g = llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
    if (g == nullptr) Fail("llama.cpp refused the grammar", 1);
    json tokens = json::array(), allowed = json::array();
    for (long step = 0; step <= steps; ++step) {
      for (int t = 0; t < n_vocab; ++t) data[static_cast<size_t>(t)] = {t, 0.0f, 0.0f};
      llama_token_data_array cur = {data.data(), data.size(), -1, false};
      llama_sampler_apply(g, &cur);
      std::vector<int> ok, pick;
      bool complete = false;
      for (size_t i = 0; i < cur.size; ++i) {
        if (std::isinf(cur.data[i].logit)) continue;
        const int t = cur.data[i].id;
        ok.push_back(t);
        if (llama_vocab_is_eog(vocab, t)) complete = true;
        if (!special[static_cast<size_t>(t)]) pick.push_back(t);
      }
      std::sort(ok.begin(), ok.end());
      allowed.push_back(Ranges(ok));
      if (step == steps || pick.empty() || (complete && rng() % 4 == 0)) break;
      const int t = pick[rng() % pick.size()];
      tokens.push_back(t);
      llama_sampler_accept(g, t);
    }
    llama_sampler_free(g);
    std::printf("%s\n", json{{"tokens", tokens}, {"allowed", allowed}}.dump().c_str());
    std::fflush(stdout);
  }
  llama_model_free(model);
  return 0;
}
