#include "app/model_opts.h"

#include <cstdio>
#include <cstdlib>

#include "app/commands.h"

namespace mr::app {

ModelArgs ParseModelArgs(CliArgs& cli) {
  ModelArgs a;
  a.model = cli.Get("-m", "--model");
  a.threads = std::atoi(cli.Get("-t", "--threads", "0").c_str());
  a.ref = cli.Flag("--ref");
  const std::string w = cli.Get("", "--weights");
  if (w == "q8g64") {
    a.weights = WeightMode::kQ8G64;
  } else if (w == "native") {
    a.weights = WeightMode::kNative;
  } else if (!w.empty()) {
    std::fprintf(stderr, "mererun: --weights must be native or q8g64, got '%s'; using %s\n", w.c_str(),
                 WeightModeName(a.weights));
  }
  return a;
}

namespace {

// The file behind "-m MODEL", or "" after printing why there is none.
std::string ResolveOrReport(const char* cmd, const std::string& model) {
  if (model.empty()) {
    std::fprintf(stderr, "mererun %s: -m MODEL is required (a catalog name or a .gguf path)\n", cmd);
    return "";
  }
  std::string err;
  std::string path = ResolveModelPath(model, &err);
  if (path.empty()) std::fprintf(stderr, "mererun %s: %s\n", cmd, err.c_str());
  return path;
}

}  // namespace

std::unique_ptr<Model> LoadModelOrReport(const char* cmd, const ModelArgs& a) {
  const std::string path = ResolveOrReport(cmd, a.model);
  if (path.empty()) return nullptr;
  LoadOptions opts;
  opts.n_threads = a.threads;
  opts.ref_path = a.ref;
  opts.weights = a.weights;
  auto m = Model::Load(path, opts);
  if (!m.ok()) {
    std::fprintf(stderr, "mererun %s: %s\n", cmd, m.status().message().c_str());
    return nullptr;
  }
  return std::move(m).value();
}

std::unique_ptr<gguf::GgufFile> OpenGgufOrReport(const char* cmd, const std::string& model, std::string* path) {
  *path = ResolveOrReport(cmd, model);
  if (path->empty()) return nullptr;
  auto file = gguf::GgufFile::Open(*path);
  if (!file.ok()) {
    std::fprintf(stderr, "mererun %s: %s\n", cmd, file.status().message().c_str());
    return nullptr;
  }
  return std::move(file).value();
}

}  // namespace mr::app
