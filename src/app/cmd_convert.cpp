// `mererun convert -m MODEL --type f32|f16|q8_0|q4_k|q6_k|q4_k_m -o OUT.gguf`: rewrite a GGUF with
// every matrix (2-D tensor whose rows are a multiple of 32) converted to one type (or the Q4_K_M
// mix); metadata copied as is. Used to compare with llama.cpp at equal bits per weight (q8_0), to
// run it on exact weights (f32) for parity checks, and to give the generated test models the
// families' usual quant types (kernels/kquant.h QuantizeKBlocks).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "kernels/kquant.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace mr::app {
namespace {

// ggml type ids of the output types (gguf.h's tensor types).
constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ4K = 12, kQ6K = 14;

// The type of one tensor under --type: vectors, MoE routers (and matrices whose rows do not split
// into the type's blocks) become f32 or the next type that fits; q4_k_m keeps llama.cpp's Q4_K_M choice in
// its simplest form: Q6_K for the output / embedding tables, attn_v and ffn_down, Q4_K elsewhere.
uint32_t TensorType(const gguf::TensorInfo& t, const std::string& type) {
  const bool matrix = t.dims.size() >= 2 && t.cols() % 32 == 0;
  // The MoE router stays F32 under every type, as llama.cpp's converter and llama-quantize keep
  // it: a rounded router picks other experts at near-ties.
  const bool router = t.name.find("ffn_gate_inp") != std::string::npos;
  if (!matrix || router || type == "f32") return kF32;
  if (type == "f16") return kF16;
  if (type == "q8_0" || t.cols() % 256 != 0) return kQ8_0;
  if (type == "q4_k") return kQ4K;
  if (type == "q6_k") return kQ6K;
  const bool wide = t.name == "output.weight" || t.name == "token_embd.weight" ||
                    t.name.find("attn_v.weight") != std::string::npos || t.name.find("ffn_down") != std::string::npos;
  return wide ? kQ6K : kQ4K;
}

KFormat FormatOf(uint32_t ggml_type) {
  return ggml_type == kQ4K    ? KFormat::kQ4K
         : ggml_type == kQ6K  ? KFormat::kQ6K
         : ggml_type == kQ8_0 ? KFormat::kQ8_0
                              : KFormat::kF16;
}

}  // namespace

int CmdConvert(const Args& args) {
  Cli cli("convert", "Rewrite a GGUF with every matrix in one type (vectors become f32); metadata copied as is.");
  CLI::App& app = cli.app();
  std::string model, type = "q8_0", out;
  app.add_option("-m,--model", model, "catalog name or path to a .gguf file (required)")->type_name("MODEL");
  app.add_option("--type", type,
                 "matrix type (q4_k_m: Q6_K for the embedding / output tables, attn_v and ffn_down, Q4_K for the "
                 "rest; matrices whose rows are not a multiple of 256 become q8_0 under the K types)")
      ->check(CLI::IsMember({"f32", "f16", "q8_0", "q4_k", "q6_k", "q4_k_m"}));
  app.add_option("-o,--out", out, "output .gguf file (required)");
  if (auto rc = cli.Parse(args)) return *rc;
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "mererun convert: -m MODEL and -o OUT.gguf are required\n");
    return 2;
  }
  std::string path;
  auto file = OpenGgufOrReport("convert", model, &path);
  if (!file) return 1;
  const gguf::GgufFile& f = *file;
  gguf::GgufWriter w(3);
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.file_type") continue;  // no longer true
    Status st = w.SetValue(key, value);
    if (!st.ok()) {
      std::fprintf(stderr, "mererun convert: %s\n", st.message().c_str());
      return 1;
    }
  }
  std::vector<float> buf;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const uint32_t dst_type = TensorType(t, type);
    buf.resize(static_cast<size_t>(t.n_elements));
    Status st = DequantizeRow(t.type, t.data, buf.data(), t.n_elements);
    if (!st.ok()) {
      std::fprintf(stderr, "mererun convert: tensor '%s': %s\n", t.name.c_str(), st.message().c_str());
      return 1;
    }
    std::vector<uint8_t> bytes;
    if (dst_type == kF32) {
      bytes.resize(buf.size() * 4);
      std::memcpy(bytes.data(), buf.data(), bytes.size());
    } else {
      const KFormat kf = FormatOf(dst_type);
      const int64_t blocks = t.n_elements / KSuperInputs(kf);
      bytes.resize(static_cast<size_t>(blocks * KSuperBytes(kf)));
      QuantizeKBlocks(kf, buf.data(), bytes.data(), blocks);
    }
    st = w.AddTensor(t.name, dst_type, t.dims, std::move(bytes));
    if (!st.ok()) {
      std::fprintf(stderr, "mererun convert: %s\n", st.message().c_str());
      return 1;
    }
  }
  // LLAMA_FTYPE_ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_S (q4_k), MOSTLY_Q6_K, MOSTLY_Q4_K_M.
  const uint32_t ftype = type == "f32"    ? 0
                         : type == "f16"  ? 1
                         : type == "q8_0" ? 7
                         : type == "q4_k" ? 14
                         : type == "q6_k" ? 18
                                          : 15;
  w.SetU32("general.file_type", ftype);
  Status st = w.WriteFile(out);
  if (!st.ok()) {
    std::fprintf(stderr, "mererun convert: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "mererun convert: wrote %s (%zu tensors, matrices as %s)\n", out.c_str(), f.tensors().size(),
               type.c_str());
  return 0;
}

}  // namespace mr::app
