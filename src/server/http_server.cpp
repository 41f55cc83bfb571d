#include "server/http_server.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>

#include "base/log.h"
#include "server/anthropic_api.h"
#include "server/connection.h"
#include "server/embeddings_api.h"
#include "server/http_transport.h"
#include "server/llamacpp_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

enum class Api { kAnthropic, kOpenAI, kOllama };

bool IsOllamaPath(const std::string& path) {
  return path.rfind("/api/", 0) == 0;
}

// llama.cpp's own endpoints (llamacpp_api.h); their errors have the OpenAI shape, as llama.cpp's do.
bool IsLlamaPath(const std::string& path) {
  return path == "/completion" || path == "/completions" || path == "/infill" || path == "/tokenize" ||
         path == "/detokenize" || path == "/props" || path == "/embedding" || path == "/embeddings";
}

// The embedding endpoints (embeddings_api.h).
std::optional<EmbeddingApi> EmbeddingApiOfPath(const std::string& path) {
  if (path == "/v1/embeddings") return EmbeddingApi::kOpenAI;
  if (path == "/embedding" || path == "/embeddings") return EmbeddingApi::kLlama;
  if (path == "/api/embed") return EmbeddingApi::kOllama;
  if (path == "/api/embeddings") return EmbeddingApi::kOllamaLegacy;
  return std::nullopt;
}

Api ApiOfPath(const std::string& path) {
  if (IsOllamaPath(path)) return Api::kOllama;
  return path.rfind("/v1/chat/", 0) == 0 || path.rfind("/v1/completions", 0) == 0 ||
                 path.rfind("/v1/responses", 0) == 0 || path == "/v1/embeddings" || IsLlamaPath(path)
             ? Api::kOpenAI
             : Api::kAnthropic;
}

void SetError(HttpResponse& res, Api api, const ApiError& e) {
  res.status = HttpStatus(e.type);
  if (e.retry_after_s > 0) res.SetHeader("retry-after", std::to_string(e.retry_after_s));
  res.SetContent(api == Api::kOpenAI   ? OpenAIErrorBody(e)
                 : api == Api::kOllama ? OllamaErrorBody(e)
                                       : AnthropicErrorBody(e),
                 "application/json");
}

// Long text (request bodies, prompts) to stderr at debug level, untruncated.
// The engine's own timing of a finished (non-streamed) generation, for throughput probes
// (docs/api.md): decode tok/s = x-mererun-decode-tokens / x-mererun-decode-seconds.
void SetTimingHeaders(const StreamEvent& done, HttpResponse& res) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6f", done.prefill_s);
  res.SetHeader("x-mererun-prefill-seconds", buf);
  std::snprintf(buf, sizeof(buf), "%.6f", done.decode_s);
  res.SetHeader("x-mererun-decode-seconds", buf);
  res.SetHeader("x-mererun-decode-tokens", std::to_string(done.generated));
  res.SetHeader("x-mererun-draft-tokens", std::to_string(done.drafted));
  res.SetHeader("x-mererun-accepted-tokens", std::to_string(done.accepted));
  // Per draft position: "accepted/proposed" pairs, comma-separated.
  std::string at;
  for (size_t i = 0; i < done.proposed_at.size() && i < done.accepted_at.size(); ++i)
    at += (i ? "," : "") + std::to_string(done.accepted_at[i]) + "/" + std::to_string(done.proposed_at[i]);
  if (!at.empty()) res.SetHeader("x-mererun-acceptance-by-position", at);
  res.SetHeader("x-mererun-peak-rss-bytes", std::to_string(done.peak_rss_bytes));
  res.SetHeader("x-mererun-kv-peak-bytes", std::to_string(done.kv_peak_bytes));
  res.SetHeader("x-mererun-process-peak-rss-bytes", std::to_string(done.process_peak_rss_bytes));
}

void LogLong(const char* what, const std::string& text) {
  if (!MR_LOG_ENABLED(kDebug)) return;
  std::fprintf(stderr, "D [http] %s (%zu bytes):\n", what, text.size());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fputc('\n', stderr);
}

// The requests counted in mererun_requests_total.
bool IsGenerationPath(const std::string& path) {
  return path == "/v1/messages" || path == "/v1/chat/completions" || path == "/v1/completions" ||
         path == "/v1/responses" || path == "/completion" || path == "/completions" || path == "/infill" ||
         path == "/api/chat" || path == "/api/generate" || EmbeddingApiOfPath(path).has_value();
}

// /v1/responses/{id} and below (not /v1/responses/input_tokens).
bool IsStoredResponsePath(const std::string& path) {
  return path.rfind("/v1/responses/", 0) == 0 && path != "/v1/responses/input_tokens";
}

Outcome OutcomeOfStatus(int status) {
  if (status == 429) return Outcome::kRateLimited;
  if (status == 529) return Outcome::kOverloaded;
  if (status >= 500) return Outcome::kError;
  if (status >= 400) return Outcome::kInvalid;
  return Outcome::kOk;
}

void CountRequest(ServerMetrics* m, Api api, Outcome o) {
  if (m != nullptr)
    m->requests[api == Api::kAnthropic ? 0 : 1][static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
}

// One generation request's entry in mererun_requests_total, counted when the last owner lets go:
// the handler for a plain response, the streaming provider (kept by the response until the
// stream is over) for SSE.
struct RequestCount {
  RequestCount(ServerMetrics* metrics, Api a) : m(metrics), api(a) {}
  ~RequestCount() { CountRequest(m, api, job && job->cancelled ? Outcome::kCancelled : outcome); }
  RequestCount(const RequestCount&) = delete;
  RequestCount& operator=(const RequestCount&) = delete;
  ServerMetrics* m;
  Api api;
  Outcome outcome = Outcome::kError;  // until the handler returns (it may throw)
  std::shared_ptr<EngineJob> job;     // once submitted: a cancelled job means the client left
};

// Whether `ev` ends the response: an error, or the end of its last open choice (a writer that
// writes several, Choices, counts them; the others have one).
template <typename Writer>
bool StreamOver(const Writer& w, const StreamEvent& ev) {
  if (ev.kind == StreamEvent::Kind::kError) return true;
  if (ev.kind != StreamEvent::Kind::kDone) return false;
  if constexpr (requires { w.open(); }) {
    return w.open() <= 1;  // this kDone closes the last one
  } else {
    return true;
  }
}

// What a writer sends while its stream is idle (ResponsesWriter's in_progress events); "" for
// the writers that send nothing (the Anthropic stream has its pings, Stream's `pings`).
template <typename Writer>
std::string KeepAlive(Writer& w) {
  if constexpr (requires { w.KeepAlive(); }) {
    return w.KeepAlive();
  } else {
    return "";
  }
}

// OpenAI's n: one writer per choice (OpenAIWriter or CompletionWriter, options index i,
// choice_of_many when n > 1, one id), events routed by StreamEvent::choice; the stream ends once
// every choice has, with one usage chunk (every choice's tokens) and [DONE].
template <typename W>
class Choices {
 public:
  Choices(std::vector<std::shared_ptr<W>> ws, const char* chunk_object)
      : ws_(std::move(ws)), open_(ws_.size()), chunk_object_(chunk_object) {}
  size_t open() const { return open_; }
  std::string Start() {
    std::string s;
    for (const auto& w : ws_) s += w->Start();
    return s;
  }
  std::string Event(const StreamEvent& ev) {
    W& w = *ws_[static_cast<size_t>(std::clamp<int>(ev.choice, 0, static_cast<int>(ws_.size()) - 1))];
    if (ev.kind != StreamEvent::Kind::kDone) return w.Event(ev);
    output_tokens_ += ev.output_tokens;
    open_ -= open_ > 0 ? 1 : 0;
    std::string s = w.Event(ev);
    if (ws_.size() > 1 && open_ == 0) s += w.EndOfChoices(chunk_object_, output_tokens_);
    return s;
  }
  nlohmann::ordered_json Completion() {
    nlohmann::ordered_json c = ws_[0]->Completion();
    if (ws_.size() == 1) return c;
    for (size_t i = 1; i < ws_.size(); ++i) c["choices"].push_back(ws_[i]->Completion()["choices"][0]);
    c["usage"]["completion_tokens"] = output_tokens_;
    c["usage"]["total_tokens"] = c["usage"]["prompt_tokens"].get<int64_t>() + output_tokens_;
    return c;
  }

 private:
  std::vector<std::shared_ptr<W>> ws_;
  size_t open_;
  const char* chunk_object_;
  int64_t output_tokens_ = 0;
};

bool IsLoopbackBind(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool AllDigits(std::string_view s, size_t max_len) {
  return !s.empty() && s.size() <= max_len &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// 127.a.b.c with every part a decimal 0..255 (no leading zeros, which some resolvers read as octal).
bool IsLoopbackIpv4(std::string_view h) {
  int parts = 0;
  size_t pos = 0;
  while (pos <= h.size()) {
    const size_t dot = std::min(h.find('.', pos), h.size());
    const std::string_view part = h.substr(pos, dot - pos);
    if (!AllDigits(part, 3) || (part.size() > 1 && part[0] == '0') || std::stoi(std::string(part)) > 255) return false;
    if (parts == 0 && part != "127") return false;
    ++parts;
    pos = dot + 1;
  }
  return parts == 4;
}

}  // namespace

bool IsAllowedHostHeader(const std::string& header, const std::vector<std::string>& allowed) {
  std::string host = Lower(header);
  if (!host.empty() && host[0] == '[') {  // [::1]:8080
    const size_t end = host.find(']');
    if (end == std::string::npos) return false;
    const std::string rest = host.substr(end + 1);
    if (!rest.empty() && (rest[0] != ':' || !AllDigits(std::string_view(rest).substr(1), 5))) return false;
    host = host.substr(1, end - 1);
    return host == "::1" || std::find(allowed.begin(), allowed.end(), "[" + host + "]") != allowed.end();
  }
  if (host == "::1") return true;  // unbracketed, as some clients send it
  const size_t colon = host.find(':');
  if (colon != std::string::npos) {
    if (!AllDigits(std::string_view(host).substr(colon + 1), 5)) return false;
    host.resize(colon);
  }
  if (host == "localhost" || IsLoopbackIpv4(host)) return true;
  for (const std::string& a : allowed)
    if (!host.empty() && Lower(a) == host) return true;
  return false;
}

bool IsAllowedOrigin(const std::string& origin, const std::vector<std::string>& allowed) {
  const std::string o = Lower(origin);
  for (const std::string& a : allowed)
    if (a == "*" || Lower(a) == o) return true;
  return false;
}

bool IsJsonContentType(const std::string& content_type) {
  std::string media = Lower(content_type.substr(0, content_type.find(';')));
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.pop_back();
  size_t lead = 0;
  while (lead < media.size() && (media[lead] == ' ' || media[lead] == '\t')) ++lead;
  return media.substr(lead) == "application/json";
}

std::string QueryParam(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = target.substr(q + 1);
  rest = rest.substr(0, rest.find('#'));
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) != name) continue;
    if (eq == std::string_view::npos) return {};
    std::string out;
    const std::string_view v = pair.substr(eq + 1);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == '+') {
        out += ' ';
      } else if (v[i] == '%' && i + 2 < v.size() && hex(v[i + 1]) >= 0 && hex(v[i + 2]) >= 0) {
        out += static_cast<char>(hex(v[i + 1]) * 16 + hex(v[i + 2]));
        i += 2;
      } else {
        out += v[i];
      }
    }
    return out;
  }
  return {};
}

bool ApiKeyMatches(const std::string& presented, const std::string& expected) {
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(presented.data()), presented.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

struct HttpServer::Impl {
  ServedModel sm;
  ServerOptions opts;
  std::unique_ptr<HttpTransport> transport;
  std::unique_ptr<ResponseStore> responses;  // stored /v1/responses

  // Per-request state shared between the handler and the streaming provider.
  // One request's jobs (OpenAI's n: one per choice, all on one channel) and its socket.
  struct Pending {
    std::shared_ptr<EventChannel> channel = std::make_shared<EventChannel>();
    std::shared_ptr<EngineJob> job;                  // the first
    std::vector<std::shared_ptr<EngineJob>> others;  // the other choices'
    int fd = -1;
    void Cancel() const { CancelExcept(-1); }
    // A choice failed: the others stop (its own job has ended; it is not counted as cancelled).
    void CancelExcept(int choice) const {
      if (choice != 0) job->Cancel();
      for (size_t i = 0; i < others.size(); ++i)
        if (static_cast<int>(i) + 1 != choice) others[i]->Cancel();
    }
  };

  Json ModelEntry() const {
    char created[32];
    std::time_t t = static_cast<std::time_t>(sm.created_unix);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
    // The context window and the output limit (the prompt needs at least one token of room).
    const int64_t max_out = sm.max_output_tokens > 0 ? std::min(sm.max_output_tokens, sm.n_ctx - 1) : sm.n_ctx - 1;
    return {{"type", "model"},       {"id", sm.id},
            {"display_name", sm.id}, {"created_at", created},
            {"lifecycle", "active"}, {"max_input_tokens", sm.n_ctx - 1},
            {"max_tokens", max_out}, {"context_window", sm.n_ctx},
            {"object", "model"},     {"created", sm.created_unix},
            {"owned_by", "mererun"}};
  }

  // Submits the prepared chat; on error the response is already set.
  bool Submit(HttpResponse& res, Api api, const HttpRequest& req, PreparedChat prepared, Pending* p) {
    p->fd = req.fd;
    std::shared_ptr<EngineJob> job;
    if (auto e = StartChat(sm, std::move(prepared), p->channel, &job)) {
      if (p->job) p->Cancel();  // the choices already submitted
      SetError(res, api, *e);
      return false;
    }
    if (p->job) {
      p->others.push_back(std::move(job));
    } else {
      p->job = std::move(job);
    }
    return true;
  }

  // Non-streaming: wait for the outcome, watching the socket; false when the client left.
  template <typename Writer>
  bool Collect(Pending& p, Writer& w, StreamEvent* last) {
    // The socket is checked every 100 ms whether or not events arrive: a fast model produces
    // tokens more often than that, and the check must not depend on a quiet channel.
    auto next_check = Clock::now();
    for (;;) {
      StreamEvent ev;
      if (p.channel->Pop(&ev, std::chrono::milliseconds(100))) {
        if (StreamOver(w, ev)) {
          if (ev.kind == StreamEvent::Kind::kError) p.CancelExcept(ev.choice);
          *last = std::move(ev);
          return !p.job->cancelled || last->kind == StreamEvent::Kind::kError;
        }
        w.Event(ev);
      }
      if (Clock::now() >= next_check) {
        next_check = Clock::now() + std::chrono::milliseconds(100);
        if (!p.job->cancelled && PeerClosed(p.fd)) {
          MR_LOGI("http", "client went away; cancelling its generation");
          p.Cancel();
        }
      }
    }
  }

  // Streaming: SSE from the channel, with pings; false (and cancel) when the client left.
  // `pings` (Anthropic): the stream opens with message_start once the engine has started the
  // request (its usage then has the real cache counts), with pings while it is queued (the
  // official SDKs skip pings wherever they come); otherwise the writer's start goes out at once,
  // and the writer's KeepAlive() (if any) whenever nothing was written for the ping interval.
  template <typename Writer>
  void Stream(HttpResponse& res, std::shared_ptr<Pending> p, std::shared_ptr<Writer> w, bool pings,
              std::shared_ptr<RequestCount> count) {
    const int ping_ms = opts.ping_interval_ms;
    res.SetHeader("Cache-Control", "no-cache");
    res.content_type = std::is_same_v<Writer, OllamaWriter> ? "application/x-ndjson" : "text/event-stream";
    res.stream = [p, w, pings, ping_ms, count](const BodyWriter& write) {
      auto send = [&](const std::string& s) { return s.empty() || write(s); };
      auto cancel = [&] {
        MR_LOGI("http", "client went away during a stream; cancelling its generation");
        p->Cancel();
        return false;
      };
      // A failure ends this stream (and its generation) only.
      try {
        bool started = !pings;
        if (started && !send(w->Start())) return cancel();
        auto last_write = Clock::now();
        for (;;) {
          StreamEvent ev;
          if (p->channel->Pop(&ev, std::chrono::milliseconds(100))) {
            if (!started) {
              // kStarted carries the counts; an end before it (cancelled or refused while
              // queued) still opens the message first.
              if (ev.kind == StreamEvent::Kind::kStarted) w->Event(ev);
              if (!send(w->Start()) || !send(AnthropicWriter::Ping())) return cancel();
              started = true;
              last_write = Clock::now();
              if (ev.kind == StreamEvent::Kind::kStarted) continue;
            }
            const bool end = StreamOver(*w, ev);
            const std::string s = w->Event(ev);
            if (!send(s)) return cancel();
            if (!s.empty()) last_write = Clock::now();
            if (end) {
              if (ev.kind == StreamEvent::Kind::kError) {
                count->outcome = Outcome::kError;
                p->CancelExcept(ev.choice);
              }
              return true;
            }
          } else {
            if (PeerClosed(p->fd)) return cancel();
            if (Clock::now() - last_write > std::chrono::milliseconds(ping_ms)) {
              const std::string ping = pings ? AnthropicWriter::Ping() : KeepAlive(*w);
              if (!send(ping)) return cancel();
              if (!ping.empty()) last_write = Clock::now();
            }
          }
        }
      } catch (const std::exception& e) {
        MR_LOGE("http", "stream failed: %s", e.what());
        count->outcome = Outcome::kError;
        p->Cancel();
        return false;
      }
    };
    // Also when the stream never ran (the head could not be written).
    res.on_stream_end = [p](bool completed) {
      if (!completed) p->Cancel();
    };
  }

  // The response of submitted jobs: a stream, or the collected answer (`body(writer)`) with the
  // timing headers; an engine error as the API's error.
  template <typename W, typename Body>
  void Answer(HttpResponse& res, Api api, std::shared_ptr<Pending> p, std::shared_ptr<W> w, bool stream, bool pings,
              std::shared_ptr<RequestCount> count, Body body) {
    if (stream) return Stream(res, p, w, pings, std::move(count));
    StreamEvent last;
    if (!Collect(*p, *w, &last)) return;
    if (last.kind == StreamEvent::Kind::kError) return SetError(res, api, last.error);
    SetTimingHeaders(last, res);
    w->Event(last);
    res.SetContent(DumpWireJson(body(*w)), "application/json");
  }

  // `count` (null for count_tokens) is told the outcome of a plain response here; a streamed one
  // tells its own.
  void Messages(const HttpRequest& req, HttpResponse& res, bool count_only, std::shared_ptr<RequestCount> count) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kAnthropic, *e);
    ChatRequest chat;
    AnthropicOptions aopts;
    if (auto e = ParseAnthropicRequest(body, sm, count_only, &chat, &aopts)) {
      MR_LOGI("http", "400: %s", e->message.c_str());
      return SetError(res, Api::kAnthropic, *e);
    }
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared, !count_only)) return SetError(res, Api::kAnthropic, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    if (count_only) {
      Json r = {{"input_tokens", n_prompt}};
      if (!prepared.context_management.is_null())
        r["context_management"] = {{"original_input_tokens", prepared.context_management["original_input_tokens"]}};
      res.SetContent(r.dump(), "application/json");
      return;
    }
    if (!prepared.context_management.is_null())
      aopts.context_management = {{"applied_edits", prepared.context_management["applied_edits"]}};
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kAnthropic, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    auto w = std::make_shared<AnthropicWriter>(sm, aopts, n_prompt);
    Answer(res, Api::kAnthropic, p, w, aopts.stream, /*pings=*/true, std::move(count),
           [](AnthropicWriter& x) { return x.Message(); });
  }

  using OpenAIParser = std::optional<ApiError> (*)(const Json&, const ServedModel&, ChatRequest*, OpenAIOptions*);

  // Both OpenAI endpoints: parse, prepare, submit, then stream or collect. `make(options,
  // prompt tokens, echo)` builds the response writer once PrepareChat has checked the prompt
  // (`echo`: the raw prompt when the request asked for it echoed; its ids are then in the vocabulary).
  template <typename MakeWriter>
  void OpenAIGenerate(const HttpRequest& req, HttpResponse& res, std::shared_ptr<RequestCount> count,
                      OpenAIParser parse, MakeWriter make) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOpenAI, *e);
    ChatRequest chat;
    OpenAIOptions oopts;
    if (auto e = parse(body, sm, &chat, &oopts)) return SetError(res, Api::kOpenAI, *e);
    RawPrompt echo;
    if (oopts.echo) echo = chat.raw;
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared)) return SetError(res, Api::kOpenAI, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    // n choices: n sequences of the same prompt (each prefills it: they start together).
    std::vector<PreparedChat> choices(static_cast<size_t>(oopts.n));
    for (int i = 1; i < oopts.n; ++i)
      if (auto e = PrepareChoice(prepared, i, &choices[static_cast<size_t>(i)])) return SetError(res, Api::kOpenAI, *e);
    choices[0] = std::move(prepared);
    auto p = std::make_shared<Pending>();
    for (PreparedChat& c : choices)
      if (!Submit(res, Api::kOpenAI, req, std::move(c), p.get())) return;
    count->job = p->job;
    using W = typename decltype(make(oopts, n_prompt, echo))::element_type;
    std::vector<std::shared_ptr<W>> writers;
    oopts.choice_of_many = oopts.n > 1;
    for (int i = 0; i < oopts.n; ++i) {
      oopts.index = i;
      writers.push_back(make(oopts, n_prompt, echo));
      oopts.id = writers.back()->id();  // one id for every choice
    }
    auto w = std::make_shared<Choices<W>>(std::move(writers), W::kChunkObject);
    Answer(res, Api::kOpenAI, p, w, oopts.stream, /*pings=*/false, std::move(count),
           [](Choices<W>& x) { return x.Completion(); });
  }

  // llama.cpp's /completion and /infill: parse, prepare, submit, then stream or collect.
  void LlamaGenerate(const HttpRequest& req, HttpResponse& res, std::shared_ptr<RequestCount> count, bool infill) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOpenAI, *e);
    ChatRequest chat;
    LlamaOptions lopts;
    if (auto e = ParseLlamaCompletion(body, sm, infill, &chat, &lopts)) return SetError(res, Api::kOpenAI, *e);
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared)) return SetError(res, Api::kOpenAI, *e);
    auto w = std::make_shared<LlamaWriter>(std::move(lopts), sm, prepared);
    const bool stream = w->streaming();
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kOpenAI, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    Answer(res, Api::kOpenAI, p, w, stream, /*pings=*/false, std::move(count),
           [](LlamaWriter& x) { return x.Result(); });
  }

  // Ollama's /api/chat and /api/generate (streamed unless "stream": false).
  void OllamaGenerate(const HttpRequest& req, HttpResponse& res, std::shared_ptr<RequestCount> count, bool chat) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOllama, *e);
    ChatRequest request;
    OllamaOptions oopts;
    if (auto e = ParseOllamaRequest(body, sm, chat, &request, &oopts)) return SetError(res, Api::kOllama, *e);
    auto w = std::make_shared<OllamaWriter>(oopts);
    if (oopts.load_only) {  // the model is loaded: nothing to generate
      res.SetContent(DumpWireJson(w->Result()) + (oopts.stream ? "\n" : ""),
                     oopts.stream ? "application/x-ndjson" : "application/json");
      return;
    }
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(request), &prepared)) return SetError(res, Api::kOllama, *e);
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kOllama, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    Answer(res, Api::kOllama, p, w, oopts.stream, /*pings=*/false, std::move(count),
           [](OllamaWriter& x) { return x.Result(); });
  }

  // OpenAI's Responses API: POST /v1/responses (`count` non-null), or /v1/responses/input_tokens.
  void Responses(const HttpRequest& req, HttpResponse& res, std::shared_ptr<RequestCount> count) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    const bool count_only = count == nullptr;
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOpenAI, *e);
    ChatRequest chat;
    ResponsesOptions ropts;
    if (auto e = ParseResponsesRequest(body, sm, responses.get(), &chat, &ropts))
      return SetError(res, Api::kOpenAI, *e);
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared, !count_only)) return SetError(res, Api::kOpenAI, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    if (count_only) {
      res.SetContent(Json{{"object", "response.input_tokens"}, {"input_tokens", n_prompt}}.dump(), "application/json");
      return;
    }
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kOpenAI, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    const bool stream = ropts.stream;
    auto w = std::make_shared<ResponsesWriter>(std::move(ropts), n_prompt, responses.get());
    Answer(res, Api::kOpenAI, p, w, stream, /*pings=*/false, std::move(count),
           [](ResponsesWriter& x) { return x.Response(); });
  }

  // /v1/responses/{id} (GET, DELETE), /v1/responses/{id}/input_items (GET) and .../cancel (POST):
  // the stored responses (on a worker thread: a long conversation's items are megabytes of JSON).
  void StoredResponseRoute(const HttpRequest& req, HttpResponse& res) {
    const std::string rest = req.path.substr(std::string("/v1/responses/").size());
    const size_t slash = rest.find('/');
    const std::string id = rest.substr(0, slash);
    const std::string sub = slash == std::string::npos ? "" : rest.substr(slash + 1);
    const char* allow = sub.empty() ? "GET, DELETE" : sub == "input_items" ? "GET" : sub == "cancel" ? "POST" : "";
    if (id.empty() || *allow == '\0')
      return SetError(res, Api::kOpenAI, {ApiErrorType::kNotFound, "no such endpoint: " + req.method + " " + req.path});
    const bool allowed = sub.empty()            ? req.method == "GET" || req.method == "DELETE"
                         : sub == "input_items" ? req.method == "GET"
                                                : req.method == "POST";
    if (!allowed) {
      SetError(res, Api::kOpenAI, {ApiErrorType::kNotFound, "method " + req.method + " is not allowed on " + req.path});
      res.status = 405;
      res.SetHeader("Allow", allow);
      return;
    }
    const ApiError not_found{ApiErrorType::kNotFound, "Response with id '" + id.substr(0, 64) + "' not found."};
    if (req.method == "DELETE") {
      if (!responses->Delete(id)) return SetError(res, Api::kOpenAI, not_found);
      res.SetContent(Json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}}.dump(), "application/json");
      return;
    }
    const std::optional<StoredResponse> r = responses->Get(id);
    if (!r) return SetError(res, Api::kOpenAI, not_found);
    if (sub == "cancel")
      return SetError(res, Api::kOpenAI,
                      InvalidRequest("Only responses created with background: true can be cancelled."));
    if (sub.empty()) {
      if (QueryParam(req.target, "stream") == "true")
        return SetError(res, Api::kOpenAI, InvalidRequest("stream: a stored response is returned whole"));
      res.SetContent(DumpWireJson(r->response), "application/json");
      return;
    }
    const std::string order = QueryParam(req.target, "order"), limit = QueryParam(req.target, "limit");
    int64_t n = 20;
    if (!limit.empty()) {
      const auto [ptr, ec] = std::from_chars(limit.data(), limit.data() + limit.size(), n);
      if (ec != std::errc() || ptr != limit.data() + limit.size()) n = 0;  // refused below
    }
    Json list;
    if (auto e = ResponseInputItemList(*r, order.empty() ? "desc" : order, n, QueryParam(req.target, "after"), &list))
      return SetError(res, Api::kOpenAI, *e);
    res.SetContent(DumpWireJson(list), "application/json");
  }

  // The embedding endpoints: one engine job per input (prefill only, pooled hidden states),
  // at most max_active of them queued or running at a time, so a request of many inputs neither
  // fills the queue nor gets 429 for its own inputs; the results in input order. A client that
  // leaves cancels what is still running.
  void Embeddings(const HttpRequest& req, HttpResponse& res, Api api, EmbeddingApi kind) {
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, api, *e);
    EmbeddingRequest er;
    if (auto e = ParseEmbeddingRequest(body, sm, kind, &er)) return SetError(res, api, *e);
    struct State {
      std::mutex mu;
      std::condition_variable cv;
      std::vector<JobResult> results;
      size_t finished = 0;
      std::optional<mr::Status> error;  // the first input that failed
    };
    const size_t n = er.inputs.size();
    auto st = std::make_shared<State>();
    st->results.resize(n);  // filled by index as inputs finish
    std::vector<std::shared_ptr<EngineJob>> jobs;
    auto cancel = [&jobs] {
      for (const auto& j : jobs) j->Cancel();
    };
    const size_t window = static_cast<size_t>(std::max(1, sm.engine->Status().max_active));
    const auto t0 = Clock::now();
    for (;;) {
      size_t finished = 0;
      {
        std::lock_guard<std::mutex> lock(st->mu);
        finished = st->finished;
        if (st->error) {
          cancel();
          return SetError(res, api, EngineFailure(*st->error));
        }
      }
      if (finished == n) break;
      while (jobs.size() < n && jobs.size() - finished < window) {
        auto job = std::make_shared<EngineJob>();
        const size_t i = jobs.size();
        job->prompt = er.inputs[i];
        job->params.max_tokens = 0;
        job->params.embed = sm.pooling;
        job->on_token = [](TokenId) { return false; };
        job->on_done = [st, i](const Result<JobResult>& r) {
          std::lock_guard<std::mutex> lock(st->mu);
          if (r.ok()) {
            st->results[i] = r.value();
          } else if (!st->error) {
            st->error = r.status();
          }
          ++st->finished;
          st->cv.notify_all();
        };
        if (auto refused = AdmissionError(sm.engine->Submit(job))) {
          if (jobs.size() > finished) break;  // ours are still queued or running: wait for them
          cancel();
          return SetError(res, api, *refused);
        }
        jobs.push_back(std::move(job));
      }
      std::unique_lock<std::mutex> lock(st->mu);
      st->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return st->finished != finished; });
      lock.unlock();
      if (PeerClosed(req.fd)) return cancel();
    }
    std::vector<std::vector<float>> out(n);
    for (size_t i = 0; i < n; ++i) {
      JobResult& r = st->results[i];
      if (r.stop == StopCause::kCancelled || r.embedding.empty())
        return SetError(res, api, {ApiErrorType::kApi, "input " + std::to_string(i) + " was not evaluated"});
      out[i] = std::move(r.embedding);
    }
    res.SetContent(
        DumpWireJson(EmbeddingResponse(er, std::move(out), std::chrono::duration<double>(Clock::now() - t0).count())),
        "application/json");
  }

  // llama.cpp's /tokenize and /detokenize.
  void Tokens(const HttpRequest& req, HttpResponse& res) {
    Json body, out;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOpenAI, *e);
    if (auto e = req.path == "/tokenize" ? LlamaTokenize(body, sm, &out) : LlamaDetokenize(body, sm, &out))
      return SetError(res, Api::kOpenAI, *e);
    res.SetContent(DumpWireJson(out), "application/json");
  }

  // GET /health: 200 with the engine's state when it accepts requests; 529 (overloaded, with
  // retry-after) while loading or draining, so a load balancer takes the replica out; with
  // `?identity=HASH`, 409 when this replica is another model or configuration.
  void Health(const HttpRequest& req, HttpResponse& res) const {
    const EngineStatus st = sm.engine != nullptr ? sm.engine->Status() : EngineStatus{};
    const bool ready = st.state == EngineState::kReady;
    const char* status = ready ? "ok" : EngineStateName(st.state);
    Json body = {{"status", status},
                 {"model", sm.id},
                 {"identity_hash", sm.identity_hash},
                 {"identity", sm.identity},
                 {"active", st.active},
                 {"queued", st.queued},
                 {"max_active", st.max_active},
                 {"max_queued", st.max_queued},
                 {"n_ctx", st.n_ctx},
                 {"speculation", {{"drafter", sm.drafter}, {"draft_tokens", sm.draft_tokens}}},
                 {"environment", sm.environment}};
    const std::string want = QueryParam(req.target, "identity");
    if (!want.empty() && want != sm.identity_hash) {
      body["status"] = "identity_mismatch";
      body["error"] = "this replica serves identity " + sm.identity_hash + " (model " + sm.id +
                      "), the check expects " + want.substr(0, 64);
      res.status = 409;
    } else if (!ready) {
      res.status = 529;
      res.SetHeader("retry-after", "1");
    }
    res.SetContent(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  }

  // On an I/O thread, for every request: the checks that refuse it, the cheap GETs, and an early
  // 429/529 when the engine is full. Generation and count_tokens go on to Worker.
  bool Quick(HttpRequest& req, HttpResponse& res) {
    res.SetHeader("request-id", RandomId("req_"));
    const Api api = ApiOfPath(req.path);
    MR_LOGI("http", "%s %s", req.method.c_str(), req.target.c_str());
    auto refuse = [&](const ApiError& e) {
      SetError(res, api, e);
      if (req.method == "POST" && IsGenerationPath(req.path))
        CountRequest(sm.metrics, api, OutcomeOfStatus(res.status));
      return true;
    };
    // DNS rebinding: a page whose name now resolves to 127.0.0.1 still sends its own name.
    if (IsLoopbackBind(opts.host) && req.Has("Host") && !IsAllowedHostHeader(req.Header("Host"), opts.allow_hosts))
      return refuse({ApiErrorType::kPermission, "Host '" + req.Header("Host") +
                                                    "' is not a loopback name; this server only answers local clients "
                                                    "(serve --allow-host NAME admits another name)"});
    // Browsers send Origin on cross-origin requests (and on every POST): a web page the user
    // opens must not drive the server unless --allow-origin names it. No page is served from
    // here, so no Origin is ever our own.
    if (req.Has("Origin")) {
      const std::string origin = req.Header("Origin");
      if (!IsAllowedOrigin(origin, opts.allow_origins))
        return refuse({ApiErrorType::kPermission, "requests from web pages (Origin '" + origin +
                                                      "') are refused; serve --allow-origin ORIGIN allows one"});
      res.SetHeader("Access-Control-Allow-Origin", origin);
      res.SetHeader("Vary", "Origin");
      if (req.method == "OPTIONS") {  // CORS preflight of an allowed origin
        res.SetHeader("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.SetHeader("Access-Control-Allow-Headers", req.Has("Access-Control-Request-Headers")
                                                          ? req.Header("Access-Control-Request-Headers")
                                                          : "content-type, x-api-key, authorization");
        res.SetHeader("Access-Control-Max-Age", "600");
        res.status = 204;
        return true;
      }
    }
    if (req.method == "HEAD") {
      res.status = 200;
      return true;
    }
    // Only JSON bodies: a form or text/plain POST is what a page can send without a preflight.
    if (req.method == "POST" && !IsJsonContentType(req.Header("Content-Type")))
      return refuse(InvalidRequest("Content-Type must be application/json, got '" + req.Header("Content-Type") + "'"));
    // /health and /metrics answer without the key (as llama.cpp's /health does): probes and
    // scrapers rarely carry one, and neither shows request content (docs/api.md).
    const bool open_path = req.method == "GET" && (req.path == "/health" || req.path == "/metrics");
    if (!opts.api_key.empty() && !open_path) {
      const std::string auth = req.Header("Authorization");
      const std::string bearer = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
      if (!ApiKeyMatches(req.Header("x-api-key"), opts.api_key) && !ApiKeyMatches(bearer, opts.api_key))
        return refuse(
            {ApiErrorType::kAuthentication, "invalid API key: send it as x-api-key or Authorization: Bearer"});
    }
    if (IsStoredResponsePath(req.path)) return false;  // Worker
    const bool post_route = IsGenerationPath(req.path) || req.path == "/v1/messages/count_tokens" ||
                            req.path == "/v1/responses/input_tokens" || req.path == "/tokenize" ||
                            req.path == "/detokenize" || req.path == "/api/show";
    const bool get_route = req.path == "/health" || req.path == "/metrics" || req.path == "/v1/models" ||
                           req.path == "/props" || req.path == "/api/tags" || req.path == "/api/version" ||
                           req.path == "/api/ps" || (req.path.rfind("/v1/models/", 0) == 0 && req.path.size() > 11);
    if (!post_route && !get_route)
      return refuse({ApiErrorType::kNotFound, "no such endpoint: " + req.method + " " + req.path});
    if (req.method != (post_route ? "POST" : "GET")) {
      refuse({ApiErrorType::kNotFound, "method " + req.method + " is not allowed on " + req.path});
      res.status = 405;
      res.SetHeader("Allow", post_route ? "POST" : "GET, HEAD");
      return true;
    }
    if (req.path == "/health") {
      Health(req, res);
    } else if (req.path == "/metrics") {
      static const ServerMetrics kNone;
      const EngineStatus st = sm.engine != nullptr ? sm.engine->Status() : EngineStatus{};
      res.SetContent(RenderPrometheus(sm.metrics != nullptr ? *sm.metrics : kNone, st) +
                         "# HELP mererun_http_connections_open Open HTTP connections (this one included).\n"
                         "# TYPE mererun_http_connections_open gauge\nmererun_http_connections_open " +
                         std::to_string(transport->open_connections()) + "\n",
                     "text/plain; version=0.0.4; charset=utf-8");
    } else if (req.path == "/v1/models") {
      const Json body = {{"object", "list"},
                         {"data", Json::array({ModelEntry()})},
                         {"has_more", false},
                         {"first_id", sm.id},
                         {"last_id", sm.id}};
      res.SetContent(body.dump(), "application/json");
    } else if (req.path == "/api/tags" || req.path == "/api/ps" || req.path == "/api/version") {
      const Json body = req.path == "/api/tags" ? OllamaTags(sm)
                        : req.path == "/api/ps" ? OllamaPs(sm)
                                                : Json{{"version", kOllamaApiVersion}};
      res.SetContent(DumpWireJson(body), "application/json");
    } else if (req.path == "/api/show") {
      res.SetContent(DumpWireJson(OllamaShow(sm)), "application/json");  // any name: the served model
    } else if (req.path == "/props") {
      const EngineStatus st = sm.engine != nullptr ? sm.engine->Status() : EngineStatus{};
      res.SetContent(DumpWireJson(LlamaProps(sm, st.max_active)), "application/json");
    } else if (get_route) {
      res.SetContent(ModelEntry().dump(), "application/json");  // any id names the served model
    } else if (IsGenerationPath(req.path) && sm.engine != nullptr) {
      // A full engine refuses here, before the body is parsed or a thread started, so a burst
      // is refused at once; Submit checks again (this is only an early answer).
      if (auto e = AdmissionError(sm.engine->Precheck())) return refuse(*e);
      return false;
    } else {
      return false;
    }
    return true;
  }

  // On a thread of its own: generation and count_tokens.
  void Worker(HttpRequest& req, HttpResponse& res) {
    if (req.path == "/v1/messages/count_tokens") return Messages(req, res, true, nullptr);
    if (req.path == "/tokenize" || req.path == "/detokenize") return Tokens(req, res);
    if (req.path == "/v1/responses/input_tokens") return Responses(req, res, nullptr);
    if (IsStoredResponsePath(req.path)) return StoredResponseRoute(req, res);
    const Api api = ApiOfPath(req.path);
    auto count = std::make_shared<RequestCount>(sm.metrics, api);
    if (const std::optional<EmbeddingApi> e = EmbeddingApiOfPath(req.path)) {
      Embeddings(req, res, api, *e);
    } else if (req.path == "/api/chat" || req.path == "/api/generate") {
      OllamaGenerate(req, res, count, req.path == "/api/chat");
    } else if (req.path == "/v1/responses") {
      Responses(req, res, count);
    } else if (req.path == "/completion" || req.path == "/completions" || req.path == "/infill") {
      LlamaGenerate(req, res, count, req.path == "/infill");
    } else if (req.path == "/v1/completions") {
      OpenAIGenerate(
          req, res, count, ParseCompletionRequest,
          [&](const OpenAIOptions& o, int64_t n_prompt, const RawPrompt& echo) {
            return std::make_shared<CompletionWriter>(
                o, n_prompt,
                echo.ids.empty() ? echo.text : sm.model->tokenizer().Decode(echo.ids, /*render_special=*/false));
          });
    } else if (api == Api::kOpenAI) {
      OpenAIGenerate(req, res, count, ParseOpenAIRequest,
                     [](const OpenAIOptions& o, int64_t n_prompt, const RawPrompt&) {
                       return std::make_shared<OpenAIWriter>(o, n_prompt);
                     });
    } else {
      Messages(req, res, false, count);
    }
    count->outcome = OutcomeOfStatus(res.status);  // a streamed response holds its own reference
  }

  // Refused by the transport before any handler ran (malformed, too large, too many
  // connections): the API's own error envelope, and a finished generation request in metrics.
  void Refused(int status, const std::string& why, const HttpRequest& partial, HttpResponse& res) {
    const Api api = ApiOfPath(partial.path);
    ApiError e = InvalidRequest(why);
    if (status == 413 || status == 431) e.type = ApiErrorType::kRequestTooLarge;
    if (status == 503) e = {ApiErrorType::kOverloaded, why, 1};
    if (status >= 500 && status != 503) e.type = ApiErrorType::kApi;
    SetError(res, api, e);
    res.status = status;
    res.SetHeader("request-id", RandomId("req_"));
    if (partial.method == "POST" && IsGenerationPath(partial.path))
      CountRequest(sm.metrics, api, OutcomeOfStatus(status));
  }

  void Setup() {
    TransportOptions t;
    t.host = opts.host;
    t.port = opts.port;
    t.io_threads = opts.io_threads;
    t.max_connections = opts.max_connections;
    t.max_header_bytes = opts.max_header_bytes;
    t.max_body_bytes = opts.max_body_bytes;
    t.header_timeout = std::chrono::milliseconds(opts.header_timeout_ms);
    t.body_timeout = std::chrono::milliseconds(opts.body_timeout_ms);
    t.keep_alive = std::chrono::milliseconds(opts.keep_alive_ms);
    t.write_timeout = std::chrono::milliseconds(opts.write_timeout_ms);
    HttpTransport::Handlers h;
    h.quick = [this](HttpRequest& req, HttpResponse& res) { return Quick(req, res); };
    h.worker = [this](HttpRequest& req, HttpResponse& res) { Worker(req, res); };
    h.refused = [this](int status, const std::string& why, const HttpRequest& partial, HttpResponse& res) {
      Refused(status, why, partial, res);
    };
    transport = std::make_unique<HttpTransport>(std::move(t), std::move(h));
    responses = std::make_unique<ResponseStore>(opts.responses_store_count,
                                                static_cast<size_t>(std::max(opts.responses_store_mb, 0)) << 20);
  }
};

HttpServer::HttpServer(ServedModel sm, ServerOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->sm = std::move(sm);
  impl_->opts = std::move(opts);
  impl_->Setup();
}

HttpServer::~HttpServer() = default;

Status HttpServer::Run(const std::function<void(int port)>& on_listening) {
  return impl_->transport->Run(on_listening);
}

void HttpServer::Stop() {
  impl_->transport->Stop();
}

}  // namespace mr::server
