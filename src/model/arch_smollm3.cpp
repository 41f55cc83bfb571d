// smollm3 (SmolLM3): Llama's block (pre-norm, SwiGLU, rotary embeddings on adjacent pairs, the
// converter's permuted Q/K rows) with no positional encoding in every fourth layer ("NoPE": layers
// 3, 7, 11, ... attend on content alone). The period is not in the file: llama.cpp fixes it at 4
// for this architecture (hparams.n_no_rope_layer_step), as SmolLM3's config does
// (no_rope_layer_interval 4). llama.cpp's smollm3 graph applies no rope_freqs factors and this
// loader reads no biases, so files with either are refused rather than run differently.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadSmolLM3Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "smollm3", cfg));
  cfg->arch = Arch::kSmolLM3;
  cfg->rope_neox = false;
  cfg->act = Activation::kSilu;
  constexpr int64_t kNoRopeStep = 4;
  for (int64_t l = 0; l < cfg->n_layer; ++l) cfg->layer_no_rope[l] = (l + 1) % kNoRopeStep == 0;
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    return Unsupported("[model] smollm3: tensor 'rope_freqs.weight' (rope scaling) is not supported");
  }
  for (const char* bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"}) {
    const std::string name = std::string("blk.0.") + bias;
    if (f.FindTensor(name) != nullptr) return Unsupported("[model] smollm3: tensor '" + name + "' is not supported");
  }
  return Status::Ok();
}

}  // namespace mr
