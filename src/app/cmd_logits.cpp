// `mererun logits -m MODEL --tokens tokens.json --out FILE`: raw logits at every position of
// each token sequence, for parity checks against llama.cpp (scripts/parity.py).
// Output: "MRLG", u32 version=1, u32 n_vocab, u32 n_prompts, u32 n_positions per prompt, then
// per prompt per position n_vocab float32 (little endian).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"

namespace mr::app {

int CmdLogits(const Args& args) {
  Cli cli("logits",
          "Dump raw float32 logits at every position of each token sequence (parity checks, scripts/parity.py).");
  CLI::App& app = cli.app();
  ModelArgs margs;
  AddModelOptions(app, &margs);
  std::string tokens_path, out_path;
  app.add_option("--tokens", tokens_path, "JSON file: an array of token-id arrays (required)");
  app.add_option("-o,--out", out_path, "output file (required)");
  if (auto rc = cli.Parse(args)) return *rc;
  if (tokens_path.empty() || out_path.empty()) {
    std::fprintf(stderr, "mererun logits: --tokens FILE and --out FILE are required\n");
    return 2;
  }
  std::ifstream in(tokens_path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    std::fprintf(stderr, "mererun logits: %s must hold a JSON array of token-id arrays\n", tokens_path.c_str());
    return 1;
  }
  auto model = LoadModelOrReport("logits", margs);
  if (!model) return 1;
  const int64_t n_vocab = model->config().n_vocab;
  std::vector<std::vector<TokenId>> prompts;
  for (const auto& p : j) {
    if (!p.is_array() || p.empty()) {
      std::fprintf(stderr, "mererun logits: every entry must be a non-empty array of token ids\n");
      return 1;
    }
    prompts.push_back(p.get<std::vector<TokenId>>());
  }
  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (!out) {
    std::fprintf(stderr, "mererun logits: cannot write %s\n", out_path.c_str());
    return 1;
  }
  const uint32_t header[4] = {0x474c524d /* "MRLG" */, 1, static_cast<uint32_t>(n_vocab),
                              static_cast<uint32_t>(prompts.size())};
  std::fwrite(header, 4, 4, out);
  for (const auto& p : prompts) {
    const uint32_t n = static_cast<uint32_t>(p.size());
    std::fwrite(&n, 4, 1, out);
  }
  std::vector<float> logits;
  for (const auto& p : prompts) {
    KvCache kv = model->NewKvCache(static_cast<int64_t>(p.size()));
    logits.resize(p.size() * n_vocab);
    Status st = model->Forward(kv, p.data(), static_cast<int64_t>(p.size()), true, logits.data());
    if (!st.ok()) {
      std::fprintf(stderr, "mererun logits: %s\n", st.message().c_str());
      std::fclose(out);
      return 1;
    }
    std::fwrite(logits.data(), sizeof(float), logits.size(), out);
  }
  std::fclose(out);
  return 0;
}

}  // namespace mr::app
