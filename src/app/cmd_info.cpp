// `mererun info -m MODEL`: architecture, sizes, tensor types, chat template.
#include <cstdio>
#include <map>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "model/gguf.h"

namespace mr::app {

int CmdInfo(const Args& args) {
  Cli cli("info", "Summarise a model file: architecture, sizes, tensor types, tokenizer, chat template.");
  std::string model;
  cli.app().add_option("-m,--model", model, "catalog name or path to a .gguf file")->type_name("MODEL");
  if (auto rc = cli.Parse(args)) return *rc;
  std::string path;
  auto file = OpenGgufOrReport("info", model, &path);
  if (!file) return model.empty() ? 2 : 1;
  const gguf::GgufFile& f = *file;
  const std::string arch = f.GetString("general.architecture").value_or("?");
  std::printf("file:          %s (%zu bytes, GGUF v%u, alignment %llu)\n", path.c_str(), f.file_size(), f.version(),
              static_cast<unsigned long long>(f.alignment()));
  std::printf("name:          %s\n", f.GetString("general.name").value_or("?").c_str());
  std::printf("architecture:  %s\n", arch.c_str());
  for (const char* k : {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                        "attention.head_count_kv", "context_length", "attention.sliding_window", "rope.freq_base"}) {
    const std::string key = arch + "." + k;
    if (auto v = f.GetFloat(key)) std::printf("%-25s %g\n", (std::string(k) + ":").c_str(), *v);
  }
  int64_t params = 0;
  std::map<std::string, int> types;
  for (const auto& t : f.tensors()) {
    params += t.n_elements;
    types[gguf::TypeName(t.type)]++;
  }
  std::printf("tensors:       %zu (%.1fM parameters)\n", f.tensors().size(), params / 1e6);
  std::printf("tensor types: ");
  for (const auto& [name, count] : types) std::printf(" %s×%d", name.c_str(), count);
  std::printf("\n");
  std::printf("tokenizer:     %s (pre: %s), %zu tokens\n", f.GetString("tokenizer.ggml.model").value_or("?").c_str(),
              f.GetString("tokenizer.ggml.pre").value_or("-").c_str(),
              f.GetStringArray("tokenizer.ggml.tokens") ? f.GetStringArray("tokenizer.ggml.tokens")->size() : 0);
  auto tmpl = f.GetString("tokenizer.chat_template");
  std::printf("chat template: %s\n", tmpl ? ("yes (" + std::to_string(tmpl->size()) + " chars)").c_str() : "none");
  return 0;
}

}  // namespace mr::app
