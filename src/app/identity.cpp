#include "app/identity.h"

#include <algorithm>
#include <fstream>
#include <vector>

#include "app/environment.h"
#include "base/sha256.h"
#include "model/gguf.h"
#include "model/model.h"

namespace mr::app {

Result<std::string> SampledFileDigest(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return IoError("cannot open " + path + " to compute its digest");
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  Sha256 h;
  h.Update("mererun-sampled-digest-v1 " + std::to_string(size) + "\n");
  std::vector<char> buf;
  auto read = [&](uint64_t off, uint64_t n) -> bool {
    n = std::min<uint64_t>(n, size - std::min(off, size));
    buf.resize(n);
    f.seekg(static_cast<std::streamoff>(off));
    f.read(buf.data(), static_cast<std::streamsize>(n));
    if (static_cast<uint64_t>(f.gcount()) != n) return false;
    h.Update(buf.data(), n);
    return true;
  };
  constexpr uint64_t kHead = 4ull << 20, kSample = 64ull << 10, kSamples = 32;
  bool ok = read(0, kHead);
  if (size > kHead) {
    const uint64_t span = size - kHead;
    for (uint64_t i = 0; ok && i < kSamples; ++i) ok = read(kHead + span * i / kSamples, kSample);
  }
  if (!ok) return IoError("cannot read " + path + " to compute its digest");
  return h.FinalHex();
}

Result<ReplicaIdentity> MakeReplicaIdentity(const Model& m, const ReplicaSettings& s) {
  auto digest = SampledFileDigest(m.file().path());
  if (!digest.ok()) return digest.status();
  ReplicaIdentity id;
  nlohmann::ordered_json env = nlohmann::ordered_json::object();
  for (const auto& [k, v] : ControlEnvironment())
    if (k != "MERERUN_THREADS") env[k] = v;  // threads change speed, not answers
  id.fields = {{"model", s.model_id},
               {"file_bytes", m.file().file_size()},
               {"file_digest", *digest},
               {"weights", WeightModeName(m.weight_mode())},
               {"acts", FineActsName(m.fine_acts())},
               {"path", m.ref_path() ? "ref" : "fast"},
               {"n_ctx", s.n_ctx},
               {"max_output_tokens", s.max_output_tokens},
               {"drafter", s.drafter},
               {"draft_tokens", s.draft_tokens},
               {"default_sampling",
                {{"temperature", s.default_temperature},
                 {"top_p", s.default_top_p},
                 {"top_k", s.default_top_k},
                 {"min_p", s.default_min_p}}},
               {"pooling", s.pooling},
               {"environment", env}};
  id.hash = Sha256Hex(id.fields.dump()).substr(0, 16);
  return id;
}

}  // namespace mr::app
