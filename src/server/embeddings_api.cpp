#include "server/embeddings_api.h"

#include <openssl/evp.h>

#include <cmath>
#include <cstring>

#include "model/model.h"
#include "server/request_fields.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

const char* InputField(EmbeddingApi api) {
  switch (api) {
    case EmbeddingApi::kOllamaLegacy:
      return "prompt";
    default:
      return "input";
  }
}

// One input: a string (tokenized) or token ids. `at`: the field path for messages.
std::optional<ApiError> ParseOneInput(const Json& x, const ServedModel& sm, bool truncate, const std::string& at,
                                      std::vector<TokenId>* out) {
  const int64_t max_tokens = sm.n_ctx - 1;
  if (x.is_string()) {
    std::string text = x.get<std::string>();
    if (text.empty()) return InvalidRequest(at + ": empty input");
    // Bounded before tokenizing: no token is shorter than a byte, few are under 16 bytes of
    // context room. Truncating inputs are cut to that many bytes first.
    const size_t max_bytes = static_cast<size_t>(std::max<int64_t>(max_tokens, 1)) * 16;
    if (text.size() > max_bytes) {
      if (!truncate)
        return InvalidRequest(at + " is too long: " + std::to_string(text.size()) + " bytes cannot fit this model's " +
                              std::to_string(sm.n_ctx) + "-token context");
      text.resize(max_bytes);
    }
    *out = sm.model->tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
  } else if (x.is_array()) {
    if (x.empty()) return InvalidRequest(at + ": empty array of token ids");
    const int64_t n_vocab = sm.model->config().n_vocab;
    for (const Json& t : x) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
        return InvalidRequest(at + ": expected token ids in [0, " + std::to_string(n_vocab) + "), got " +
                              (t.is_number_integer() ? std::to_string(t.get<int64_t>()) : JsonTypeName(t)));
      out->push_back(static_cast<TokenId>(t.get<int64_t>()));
    }
  } else {
    return InvalidRequest(at + ": expected a string or an array of token ids, got " + JsonTypeName(x));
  }
  if (out->empty()) return InvalidRequest(at + ": no tokens");
  if (static_cast<int64_t>(out->size()) > max_tokens) {
    if (!truncate)
      return InvalidRequest(at + ": " + std::to_string(out->size()) + " tokens, but this model's maximum context is " +
                            std::to_string(max_tokens) + " tokens per input");
    out->resize(static_cast<size_t>(max_tokens));
  }
  return std::nullopt;
}

std::string Base64Floats(const std::vector<float>& v) {
  const size_t bytes = v.size() * sizeof(float);  // little-endian float32, as OpenAI sends them
  std::string out(4 * ((bytes + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(v.data()), static_cast<int>(bytes));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

std::optional<ApiError> ParseEmbeddingRequest(const Json& body, const ServedModel& sm, EmbeddingApi api,
                                              EmbeddingRequest* out) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  out->api = api;
  out->model = sm.id;
  if (auto e = OptString(body, "model", "", &out->model)) return e;
  const char* field = InputField(api);
  if (api == EmbeddingApi::kLlama && !body.contains("input")) field = "content";
  if (!body.contains(field) || body[field].is_null())
    return InvalidRequest(std::string(field) + ": field required (" +
                          (api == EmbeddingApi::kOllamaLegacy ? "a string" : "a string or an array of inputs") + ")");
  const Json& in = body[field];
  bool truncate = false;
  if (api == EmbeddingApi::kOllama) {
    truncate = true;
    if (auto e = OptBool(body, "truncate", "", &truncate)) return e;
  }
  // One input, or many: an array of strings or of token arrays (an array of numbers is one input).
  std::vector<const Json*> items;
  if (in.is_array() && !in.empty() && !in[0].is_number()) {
    if (api == EmbeddingApi::kOllamaLegacy) return InvalidRequest("prompt: expected a string");
    if (in.size() > kMaxEmbeddingInputs)
      return InvalidRequest(std::string(field) + ": at most " + std::to_string(kMaxEmbeddingInputs) +
                            " inputs per request, got " + std::to_string(in.size()));
    for (const Json& x : in) items.push_back(&x);
  } else {
    if (api == EmbeddingApi::kOllamaLegacy && !in.is_string()) return InvalidRequest("prompt: expected a string");
    items.push_back(&in);
  }
  if ((api == EmbeddingApi::kOllama || api == EmbeddingApi::kOllamaLegacy))
    for (const Json* x : items)
      if (!x->is_string())
        return InvalidRequest(std::string(field) + ": expected a string or an array of strings, got " +
                              JsonTypeName(*x));
  out->inputs.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string at =
        items.size() == 1 && items[0] == &in ? field : std::string(field) + "[" + std::to_string(i) + "]";
    if (auto e = ParseOneInput(*items[i], sm, truncate, at, &out->inputs[i])) return e;
  }
  if (api == EmbeddingApi::kOpenAI && body.contains("encoding_format") && !body["encoding_format"].is_null()) {
    const Json& f = body["encoding_format"];
    if (!f.is_string() || (f != "float" && f != "base64"))
      return InvalidRequest("encoding_format: expected \"float\" or \"base64\"");
    out->base64 = f == "base64";
  }
  if (api == EmbeddingApi::kOpenAI || api == EmbeddingApi::kOllama) {
    if (auto e = OptInt(body, "dimensions", 1, sm.model->config().d_model, &out->dimensions)) return e;
  }
  out->normalize = api == EmbeddingApi::kOllamaLegacy ? -1 : 2;
  if (api == EmbeddingApi::kOpenAI || api == EmbeddingApi::kLlama) {
    int64_t n = out->normalize;
    if (auto e = OptInt(body, "embd_normalize", -1, 64, &n)) return e;
    out->normalize = static_cast<int>(n);
  }
  return std::nullopt;
}

void NormalizeEmbedding(int mode, std::vector<float>* v) {
  double sum = 0.0;
  if (mode == -1) {
    sum = 1.0;
  } else if (mode == 0) {  // max absolute, to the int16 range
    for (float x : *v) sum = std::max(sum, static_cast<double>(std::fabs(x)));
    sum /= 32760.0;
  } else if (mode == 2) {
    for (float x : *v) sum += static_cast<double>(x) * x;
    sum = std::sqrt(sum);
  } else {  // p-norm
    for (float x : *v) sum += std::pow(std::fabs(static_cast<double>(x)), mode);
    sum = std::pow(sum, 1.0 / mode);
  }
  const float scale = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
  for (float& x : *v) x *= scale;
}

Json EmbeddingResponse(const EmbeddingRequest& req, std::vector<std::vector<float>> embeddings, double total_s) {
  int64_t tokens = 0;
  for (const auto& in : req.inputs) tokens += static_cast<int64_t>(in.size());
  for (auto& e : embeddings) {
    if (req.dimensions > 0 && static_cast<size_t>(req.dimensions) < e.size())
      e.resize(static_cast<size_t>(req.dimensions));
    NormalizeEmbedding(req.normalize, &e);
  }
  switch (req.api) {
    case EmbeddingApi::kOpenAI: {
      Json data = Json::array();
      for (size_t i = 0; i < embeddings.size(); ++i) {
        Json item = {{"object", "embedding"}, {"index", i}};
        if (req.base64) {
          item["embedding"] = Base64Floats(embeddings[i]);
        } else {
          item["embedding"] = std::move(embeddings[i]);
        }
        data.push_back(std::move(item));
      }
      return {{"object", "list"},
              {"data", std::move(data)},
              {"model", req.model},
              {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    }
    case EmbeddingApi::kLlama: {
      Json out = Json::array();
      for (size_t i = 0; i < embeddings.size(); ++i)
        out.push_back({{"index", i}, {"embedding", Json::array({std::move(embeddings[i])})}});
      return out;
    }
    case EmbeddingApi::kOllama: {
      const auto ns = static_cast<int64_t>(total_s * 1e9);
      return {{"model", req.model},
              {"embeddings", std::move(embeddings)},
              {"total_duration", ns},
              {"load_duration", 0},
              {"prompt_eval_count", tokens}};
    }
    case EmbeddingApi::kOllamaLegacy:
      break;
  }
  return {{"embedding", embeddings.empty() ? std::vector<float>() : std::move(embeddings[0])}};
}

}  // namespace mr::server
