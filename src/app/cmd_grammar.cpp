// `mererun grammar FILE.gbnf`: checks a GBNF grammar the way the server compiles the `grammar`
// field (runtime/gbnf.h) and prints its error with line and column, or "ok".
//   --text TEXT     whether TEXT is a sentence of the grammar (or only a prefix of one)
//   -m MODEL --masks WALKS.jsonl
//                   the token masks along token sequences: for each JSON line {"tokens": [...]}
//                   one line {"allowed": [RANGES per step], "accepting": [...]}, step i being the
//                   state after tokens[0..i) (RANGES: [first, last] token id ranges), after a first
//                   line {"never_utf8": RANGES, "partial_end": RANGES}: the tokens with a byte no
//                   well-formed UTF-8 text holds (C0, C1, F5-FF) or a NUL, and those that end inside
//                   a character, where llama.cpp's matcher approximates (docs/api.md). The oracle
//                   test compares the masks with llama.cpp's (tools/llamacpp/grammar_ref.cpp).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/gbnf.h"
#include "runtime/grammar.h"

namespace mr::app {
namespace {

nlohmann::json Ranges(const std::vector<uint8_t>& mask) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < mask.size();) {
    if (mask[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < mask.size() && mask[j + 1] != 0) ++j;
    out.push_back({i, j});
    i = j + 1;
  }
  return out;
}

int Masks(const Grammar& g, const std::string& model, const std::string& walks_path) {
  std::string path;
  auto file = OpenGgufOrReport("grammar", model, &path);
  if (!file) return 1;
  auto tok = Tokenizer::FromGguf(*file);
  if (!tok.ok()) {
    std::fprintf(stderr, "mererun grammar: %s\n", tok.status().message().c_str());
    return 1;
  }
  const TokenMasker masker(**tok, (*tok)->vocab_size());
  std::ifstream in(walks_path);
  if (!in) {
    std::fprintf(stderr, "mererun grammar: cannot read %s\n", walks_path.c_str());
    return 1;
  }
  std::vector<uint8_t> never(static_cast<size_t>(masker.n_vocab()), 0), partial(never.size(), 0);
  for (TokenId t = 0; t < masker.n_vocab(); ++t) {
    const std::string& p = masker.piece(t);
    for (char ch : p) {
      const auto c = static_cast<uint8_t>(ch);
      if (c == 0 || c == 0xC0 || c == 0xC1 || c >= 0xF5) never[static_cast<size_t>(t)] = 1;
    }
    // Ends inside a character: a lead byte within the last 3 bytes whose sequence is cut off.
    for (size_t k = 1; k <= 3 && k <= p.size(); ++k) {
      const auto c = static_cast<uint8_t>(p[p.size() - k]);
      if ((c & 0xC0) == 0x80) continue;
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      partial[static_cast<size_t>(t)] = len > k ? 1 : 0;
      break;
    }
  }
  std::printf("%s\n", nlohmann::json{{"never_utf8", Ranges(never)}, {"partial_end", Ranges(partial)}}.dump().c_str());
  std::vector<uint8_t> mask;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json w = nlohmann::json::parse(line, nullptr, false);
    if (w.is_discarded() || !w.is_object() || !w.contains("tokens")) continue;
    GrammarState s = g.Start();
    nlohmann::json allowed = nlohmann::json::array(), accepting = nlohmann::json::array();
    const nlohmann::json& tokens = w["tokens"];
    for (size_t i = 0; i <= tokens.size(); ++i) {
      masker.Mask(s, &mask);
      allowed.push_back(Ranges(mask));
      accepting.push_back(s.accepting());
      if (i == tokens.size()) break;
      const int64_t t = tokens[i].is_number_integer() ? tokens[i].get<int64_t>() : -1;
      if (t < 0 || t >= masker.n_vocab()) {
        std::fprintf(stderr, "mererun grammar: token %s out of range\n", tokens[i].dump().c_str());
        return 1;
      }
      s.AdvanceAll(masker.piece(static_cast<TokenId>(t)));  // a refused token leaves a dead state
    }
    std::printf("%s\n", nlohmann::json{{"allowed", allowed}, {"accepting", accepting}}.dump().c_str());
  }
  return 0;
}

}  // namespace

int CmdGrammar(const Args& args) {
  Cli cli("grammar", "Check a GBNF grammar as the server's `grammar` field compiles it.");
  CLI::App& app = cli.app();
  std::string grammar_path, text, model, walks;
  app.add_option("grammar", grammar_path, "the grammar file (GBNF, rule `root` first or anywhere)")
      ->required()
      ->type_name("FILE.gbnf");
  app.add_option("--text", text, "report whether TEXT is a sentence of the grammar")->type_name("TEXT");
  app.add_option("-m,--model", model, "catalog name or path to a .gguf file (with --masks)")->type_name("MODEL");
  app.add_option("--masks", walks, "JSONL of {\"tokens\": [...]}: print the token masks along each")
      ->type_name("WALKS.jsonl");
  if (auto rc = cli.Parse(args)) return *rc;
  const bool has_text = app.count("--text") > 0;
  std::ifstream in(grammar_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "mererun grammar: cannot read %s\n", grammar_path.c_str());
    return 1;
  }
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> root = GbnfExpr(b, source);
  if (!root.ok()) {
    std::fprintf(stderr, "mererun grammar: %s: %s\n", grammar_path.c_str(), root.status().message().c_str());
    return 1;
  }
  const std::shared_ptr<const Grammar> g = b.Build(*root);
  if (!walks.empty()) {
    if (model.empty()) {
      std::fprintf(stderr, "mererun grammar: --masks needs -m MODEL\n");
      return kUsageError;
    }
    return Masks(*g, model, walks);
  }
  if (!has_text) {
    std::printf("ok\n");
    return 0;
  }
  GrammarState s = g->Start();
  for (size_t i = 0; i < text.size(); ++i) {
    if (!s.Advance(static_cast<uint8_t>(text[i]))) {
      std::printf("no: byte %zu does not fit the grammar\n", i);
      return 1;
    }
  }
  std::printf(s.accepting() ? "yes\n" : "no: a prefix of a sentence, incomplete\n");
  return s.accepting() ? 0 : 1;
}

}  // namespace mr::app
