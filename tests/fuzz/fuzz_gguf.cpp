// libFuzzer target: GGUF parse, then (when it parses) a whole model load from the same bytes and
// one forward step. Hostile model files must give a load error, never a crash, a hang or a
// huge allocation. Seeds: tests/fuzz/corpus/gguf (tiny models of each architecture).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz_common.h"
#include "model/gguf.h"
#include "model/model.h"

// MERERUN_FUZZ_WRITE_SEEDS=DIR: write the seed corpus (tiny models, whole and cut short) and exit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("MERERUN_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
  auto put = [&](const std::string& name, const std::vector<uint8_t>& bytes, size_t n) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(std::min(n, bytes.size())));
  };
  const std::vector<uint8_t> llama = mr::fuzz::TinyModelImage(1, "llama");
  put("tiny_llama", llama, llama.size());
  put("tiny_llama_head", llama, 4096);  // metadata and tensor infos, data cut off
  const std::vector<uint8_t> gemma = mr::fuzz::TinyModelImage(2, "gemma3");
  put("tiny_gemma3", gemma, gemma.size());
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = mr::gguf::GgufFile::Parse(data, size);
  if (!f.ok()) return 0;
  static const std::string path = "/dev/shm/mererun_fuzz_gguf_" + std::to_string(getpid()) + ".gguf";
  FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return 0;
  std::fwrite(data, 1, size, out);
  std::fclose(out);
  mr::LoadOptions o;
  o.n_threads = 1;
  auto m = mr::Model::Load(path, o);
  if (!m.ok()) return 0;
  mr::Model& model = **m;
  const std::vector<mr::TokenId> ids = model.tokenizer().Encode("hello <|im_start|>", true, true);
  if (ids.empty()) return 0;
  mr::KvCache kv =
      mr::KvCache::Allocate(model.config().n_layer, 64, model.config().n_head_kv * model.config().head_dim);
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  (void)model.Forward(kv, ids.data(), 1, /*all_logits=*/false, logits.data());
  return 0;
}
