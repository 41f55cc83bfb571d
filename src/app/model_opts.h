// Shared by the subcommands that load a model: -m, --threads, --ref, --weights, and loading with a clear error.
#pragma once

#include <memory>
#include <string>

#include "app/cli.h"
#include "model/gguf.h"
#include "model/model.h"

namespace mr::app {

struct ModelArgs {
  std::string model;
  int threads = 0;
  bool ref = false;
  WeightMode weights = DefaultWeightMode();  // --weights native|q8g64
};

// Adds -m/--model, -t/--threads (>= 1; default 0: MERERUN_THREADS, else the physical cores) and
// --ref bound to *a.
void AddModelOptions(CLI::App& app, ModelArgs* a);
// Resolve and load; prints "mererun CMD: error" and returns nullptr on failure.
std::unique_ptr<Model> LoadModelOrReport(const char* cmd, const ModelArgs& a);
// The pooling of embeddings: `flag` ("mean", "cls", "last"; a CLI11 IsMember check keeps out
// anything else) when given, else the model file's pooling type, else mean.
Pooling ChoosePooling(const std::string& flag, const Model& m);
// Resolve and open the GGUF of `model` (catalog name or path) without loading weights. On
// failure prints "mererun CMD: error" and returns nullptr; sets *path to the resolved file.
std::unique_ptr<gguf::GgufFile> OpenGgufOrReport(const char* cmd, const std::string& model, std::string* path);

}  // namespace mr::app
