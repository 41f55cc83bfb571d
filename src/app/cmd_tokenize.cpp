// `mererun tokenize -m MODEL [--no-add-special] [--parse-special]`: stdin text -> JSON ids.
// `--decode`: stdin JSON ids -> text.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace mr::app {

int CmdTokenize(const Args& args) {
  Cli cli("tokenize", "Text on stdin -> token ids (a JSON array) on stdout; --decode reverses.");
  CLI::App& app = cli.app();
  std::string model;
  bool decode = false, no_special = false, parse_special = false;
  app.add_option("-m,--model", model, "catalog name or path to a .gguf file")->type_name("MODEL");
  app.add_flag("--decode", decode, "stdin is a JSON array of token ids; print their text");
  app.add_flag("--no-add-special", no_special, "do not add the BOS/EOS tokens the model asks for");
  app.add_flag("--parse-special", parse_special, "turn control-token text such as <|im_start|> into control tokens");
  if (auto rc = cli.Parse(args)) return *rc;
  std::string path;
  auto file = OpenGgufOrReport("tokenize", model, &path);
  if (!file) return model.empty() ? 2 : 1;
  auto tok = Tokenizer::FromGguf(*file);
  if (!tok.ok()) {
    std::fprintf(stderr, "mererun tokenize: %s\n", tok.status().message().c_str());
    return 1;
  }
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (decode) {
    nlohmann::json j = nlohmann::json::parse(input, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      std::fprintf(stderr, "mererun tokenize --decode: stdin must be a JSON array of token ids\n");
      return 1;
    }
    std::vector<TokenId> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (*tok)->vocab_size()) {
        std::fprintf(stderr, "mererun tokenize --decode: invalid token id %s\n", v.dump().c_str());
        return 1;
      }
      ids.push_back(v.get<TokenId>());
    }
    const std::string text = (*tok)->Decode(ids, true);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  const auto ids = (*tok)->Encode(input, !no_special, parse_special);
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

}  // namespace mr::app
