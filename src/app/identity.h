// What a serving replica is, for a load balancer that must not mix replicas that would answer
// differently: the model file's contents and every setting that changes what a request gets.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace mr {
class Model;
}

namespace mr::app {

// A digest of the file's contents that is cheap at start-up: sha256 over its size, its first
// 4 MiB (the GGUF header, metadata and tensor table) and 32 evenly spaced 64 KiB samples of the
// rest (tensor data: tells apart fine-tunes that share a header). Two files with the same digest
// are the same file for every practical purpose; it is not a defence against a chosen collision.
Result<std::string> SampledFileDigest(const std::string& path);

struct ReplicaSettings {
  std::string model_id;  // the name clients see
  int64_t n_ctx = 0;
  int64_t max_output_tokens = 0;
  std::string drafter;
  std::string draft_tokens;
  double default_temperature = 0;
  double default_top_p = 0;
  int64_t default_top_k = 0;
  double default_min_p = 0;
  std::string pooling;  // how embeddings are pooled (PoolingName)
};

struct ReplicaIdentity {
  nlohmann::ordered_json fields;  // what the hash covers, shown in /health
  std::string hash;               // 16 hex digits of sha256 over fields' canonical text
};

// Covers the model file (sampled digest and size), the arithmetic (weight mode, reference or fast
// path, the MERERUN_* numerics controls that are set) and what requests see (context, output
// clamp, drafter, default sampling). Not the detected CPU variant: replicas on different
// machines of one deployment are interchangeable even when their kernels differ.
Result<ReplicaIdentity> MakeReplicaIdentity(const Model& m, const ReplicaSettings& s);

}  // namespace mr::app
