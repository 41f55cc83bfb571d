// qwen2 (Qwen2 / Qwen2.5): llama-like blocks with Q/K/V biases, NeoX-style rotary embeddings
// (pairs (i, i + d/2)), tied embeddings in the small models (no output.weight).
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadQwen2Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "qwen2", cfg));
  cfg->arch = Arch::kQwen2;
  cfg->rope_neox = true;
  cfg->qkv_bias = true;
  cfg->act = Activation::kSilu;
  return Status::Ok();
}

}  // namespace mr
