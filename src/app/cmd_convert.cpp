// `mererun convert -m MODEL --type f32|f16|q8_0 -o OUT.gguf`: rewrite a GGUF with every matrix
// (2-D tensor whose rows are a multiple of 32) converted to one type; metadata copied as is.
// Used to compare with llama.cpp at equal bits per weight (q8_0) and to run it on exact
// weights (f32) for parity checks.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "base/half.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace mr::app {
namespace {

// ggml's block_q8_0: f16 d, int8 qs[32]; d = amax / 127, q = round(x / d) (quantize_row_q8_0_ref).
void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* src = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = F32ToF16(d);
    uint8_t* blk = out + b * 34;
    std::memcpy(blk, &dh, 2);
    for (int i = 0; i < 32; ++i) blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[i] * id)));
  }
}

}  // namespace

int CmdConvert(const Args& args) {
  Cli cli("convert", "Rewrite a GGUF with every matrix in one type (vectors become f32); metadata copied as is.");
  CLI::App& app = cli.app();
  std::string model, type = "q8_0", out;
  app.add_option("-m,--model", model, "catalog name or path to a .gguf file (required)")->type_name("MODEL");
  app.add_option("--type", type, "matrix type")->check(CLI::IsMember({"f32", "f16", "q8_0"}));
  app.add_option("-o,--out", out, "output .gguf file (required)");
  if (auto rc = cli.Parse(args)) return *rc;
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "mererun convert: -m MODEL and -o OUT.gguf are required\n");
    return 2;
  }
  uint32_t out_type;
  if (type == "f32")
    out_type = 0;
  else if (type == "f16")
    out_type = 1;
  else if (type == "q8_0")
    out_type = 8;
  else {
    std::fprintf(stderr, "mererun convert: --type must be f32, f16 or q8_0 (got '%s')\n", type.c_str());
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
    const bool matrix = t.dims.size() >= 2 && t.cols() % 32 == 0;
    const uint32_t dst_type = matrix ? out_type : 0;  // vectors (norms, biases) become f32
    buf.resize(static_cast<size_t>(t.n_elements));
    Status st = DequantizeRow(t.type, t.data, buf.data(), t.n_elements);
    if (!st.ok()) {
      std::fprintf(stderr, "mererun convert: tensor '%s': %s\n", t.name.c_str(), st.message().c_str());
      return 1;
    }
    std::vector<uint8_t> bytes;
    if (dst_type == 0) {
      bytes.resize(buf.size() * 4);
      std::memcpy(bytes.data(), buf.data(), bytes.size());
    } else if (dst_type == 1) {
      bytes.resize(buf.size() * 2);
      for (size_t i = 0; i < buf.size(); ++i) {
        const uint16_t h = F32ToF16(buf[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    } else {
      bytes.resize(buf.size() / 32 * 34);
      QuantizeQ8_0(buf.data(), static_cast<int64_t>(buf.size()), bytes.data());
    }
    st = w.AddTensor(t.name, dst_type, t.dims, std::move(bytes));
    if (!st.ok()) {
      std::fprintf(stderr, "mererun convert: %s\n", st.message().c_str());
      return 1;
    }
  }
  w.SetU32("general.file_type",
           out_type == 0 ? 0 : (out_type == 1 ? 1 : 7));  // LLAMA_FTYPE_ALL_F32/MOSTLY_F16/MOSTLY_Q8_0
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
