#include "app/model_opts.h"

#include <cstdio>
#include <map>

#include "app/commands.h"

namespace mr::app {

void AddModelOptions(CLI::App& app, ModelArgs* a) {
  app.add_option("-m,--model", a->model, "catalog name (see `mererun list`) or path to a .gguf file")
      ->type_name("MODEL");
  app.add_option("-t,--threads", a->threads, "worker threads (0: MERERUN_THREADS, else the physical cores)")
      ->check(AtLeast(1));
  app.add_flag("--ref", a->ref, "use the scalar reference path instead of the fast kernels");
  static const std::map<std::string, WeightMode> kWeightModes = {{"native", WeightMode::kNative},
                                                                 {"q8g64", WeightMode::kQ8G64}};
  app.add_option("--weights", a->weights,
                 "fast-path weights: native (Q4_K, Q5_K, Q6_K, Q5_0, Q4_1, Q8_0, Q4_0, F16, BF16 and MXFP4 keep "
                 "the file's own words) or q8g64 (every matrix converted to Q8/g64); default MERERUN_WEIGHTS, "
                 "else native")
      ->transform(CLI::CheckedTransformer(kWeightModes, CLI::ignore_case).description(""))
      ->type_name("native|q8g64")
      ->default_str(WeightModeName(a->weights));
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

Pooling ChoosePooling(const std::string& flag, const Model& m) {
  if (flag == "mean") return Pooling::kMean;
  if (flag == "cls") return Pooling::kCls;
  if (flag == "last") return Pooling::kLast;
  return m.config().pooling != Pooling::kNone ? m.config().pooling : Pooling::kMean;
}

}  // namespace mr::app
