// `mererun embed -m MODEL [TEXT...]`: the embedding of each text (the arguments, else each line
// of stdin), as the server's /v1/embeddings computes it (docs/api.md, "Embeddings"): the model's
// BOS/EOS rule, no special tokens parsed, the output-normed hidden states pooled, then
// normalized (llama.cpp's embd_normalize rules). Prints one JSON object; with --similarity also
// the cosine similarity of every pair (llama-embedding's matrix).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "runtime/sequence.h"
#include "server/embeddings_api.h"

namespace mr::app {
namespace {

// The pooled embedding of `ids` (not normalized), prefilled in passes of Model::kForwardChunk rows.
Result<std::vector<float>> Embed(Model& m, Sequence& seq, const std::vector<TokenId>& ids, Pooling pooling) {
  GenerateParams p;
  p.max_tokens = 0;
  p.embed = pooling;
  MR_RETURN_IF_ERROR(seq.Start(ids, p));
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  while (!seq.done()) {
    Result<Sequence::StepRows> r = seq.NextRows(Model::kForwardChunk);
    if (!r.ok()) return r.status();
    if (seq.done()) break;
    MR_RETURN_IF_ERROR(m.Forward(seq.kv(), r->tokens, r->n, r->all_logits, logits.data(), r->hidden));
    MR_RETURN_IF_ERROR(seq.Consume(logits.data(), [](TokenId) { return false; }));
  }
  if (seq.embedding().empty()) return Internal("no embedding (the context filled up?)");
  return seq.embedding();
}

}  // namespace

int CmdEmbed(const Args& args) {
  Cli cli("embed", "Embeddings of texts (the arguments, else each line of stdin) as JSON on stdout.");
  CLI::App& app = cli.app();
  ModelArgs margs;
  AddModelOptions(app, &margs);
  std::vector<std::string> texts;
  std::string pooling_arg;
  int normalize = 2;
  bool similarity = false;
  app.add_option("texts", texts, "texts to embed (default: each line of stdin)");
  app.add_option("--pooling", pooling_arg, "mean, cls or last (default: the model file's pooling type, else mean)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  app.add_option("--normalize", normalize,
                 "-1 none, 0 max-abs to the int16 range, 1 taxicab, 2 Euclidean, p > 2 p-norm (llama.cpp's "
                 "--embd-normalize)")
      ->check(CLI::Range(-1, 64))
      ->capture_default_str();
  app.add_flag("--similarity", similarity, "also print the cosine similarity of every pair of texts");
  if (auto rc = cli.Parse(args)) return *rc;
  if (texts.empty()) {
    for (std::string line; std::getline(std::cin, line);)
      if (!line.empty()) texts.push_back(line);
  }
  if (texts.empty()) {
    std::fprintf(stderr, "mererun embed: no texts (give them as arguments or lines on stdin)\n");
    return kUsageError;
  }
  auto model = LoadModelOrReport("embed", margs);
  if (!model) return 1;
  const Pooling pooling = ChoosePooling(pooling_arg, *model);
  int64_t longest = 1;
  std::vector<std::vector<TokenId>> ids;
  for (const std::string& t : texts) {
    ids.push_back(model->tokenizer().Encode(t, /*add_special=*/true, /*parse_special=*/false));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.back().size()));
  }
  Sequence seq(*model, longest + 1);
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  std::vector<std::vector<float>> unit;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (ids[i].empty()) {
      std::fprintf(stderr, "mererun embed: text %zu has no tokens\n", i);
      return 1;
    }
    Result<std::vector<float>> e = Embed(*model, seq, ids[i], pooling);
    if (!e.ok()) {
      std::fprintf(stderr, "mererun embed: text %zu: %s\n", i, e.status().message().c_str());
      return 1;
    }
    std::vector<float> u = *e;
    server::NormalizeEmbedding(2, &u);
    unit.push_back(std::move(u));
    server::NormalizeEmbedding(normalize, &*e);
    items.push_back({{"text", texts[i]}, {"tokens", ids[i].size()}, {"embedding", *e}});
  }
  nlohmann::ordered_json out = {{"model", margs.model},
                                {"pooling", PoolingName(pooling)},
                                {"normalize", normalize},
                                {"dimensions", model->config().d_model},
                                {"embeddings", std::move(items)}};
  if (similarity) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& a : unit) {
      nlohmann::ordered_json row = nlohmann::ordered_json::array();
      for (const auto& b : unit) {
        double dot = 0;
        for (size_t k = 0; k < a.size(); ++k) dot += static_cast<double>(a[k]) * b[k];
        row.push_back(dot);
      }
      rows.push_back(std::move(row));
    }
    out["similarity"] = std::move(rows);
  }
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace mr::app
