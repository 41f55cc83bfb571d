// Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/version, /api/ps), for the
// many clients that speak it natively (Open WebUI, Continue, the `ollama` SDKs). Requests are
// translated into the OpenAI ones (same messages, tools and sampling) and parsed by those parsers;
// responses are Ollama's: newline-delimited JSON objects, streamed by default, ending with
// `done: true` and the timing counters (docs/api.md).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

// /api/version: the Ollama API whose shapes this server answers in (clients check it for features).
inline constexpr const char* kOllamaApiVersion = "0.12.0";

struct OllamaOptions {
  bool chat = true;  // /api/chat (else /api/generate)
  bool stream = true;
  bool load_only = false;  // no messages / empty prompt: Ollama's "load the model" request
  std::string model;
};

// {"error": "message"}: Ollama's error body.
std::string OllamaErrorBody(const ApiError& e);

// POST /api/chat and /api/generate.
std::optional<ApiError> ParseOllamaRequest(const nlohmann::ordered_json& body, const ServedModel& sm, bool chat,
                                           ChatRequest* req, OllamaOptions* opts);

class OllamaWriter {
 public:
  explicit OllamaWriter(OllamaOptions opts);
  std::string Start() { return ""; }
  std::string Event(const StreamEvent& ev);  // one NDJSON line when streaming ("" otherwise)
  nlohmann::ordered_json Result() const;     // the whole answer (after kDone), or the load reply

 private:
  nlohmann::ordered_json Line(nlohmann::ordered_json message_or_text, bool done) const;
  nlohmann::ordered_json Message(const std::string& content, const std::string& thinking,
                                 const nlohmann::ordered_json& tool_calls) const;

  OllamaOptions opts_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::string content_, thinking_;
  nlohmann::ordered_json tool_calls_ = nlohmann::ordered_json::array();
  StreamEvent done_;
};

// GET /api/tags, POST /api/show, GET /api/ps: the served model in Ollama's shapes.
nlohmann::ordered_json OllamaTags(const ServedModel& sm);
nlohmann::ordered_json OllamaShow(const ServedModel& sm);
nlohmann::ordered_json OllamaPs(const ServedModel& sm);

}  // namespace mr::server
