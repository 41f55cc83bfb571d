// llama (SmolLM2 and other Llama-family checkpoints): pre-norm blocks, SwiGLU, rotary embeddings
// on adjacent pairs (the GGUF converter permutes Q/K rows for that layout), no biases.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadLlamaConfig(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "llama", cfg));
  cfg->arch = Arch::kLlama;
  cfg->rope_neox = false;
  cfg->act = Activation::kSilu;
  return Status::Ok();
}

}  // namespace mr
