// `mererun run -m MODEL -p TEXT [-n N] [-c CTX] [--raw]`: greedy completion and its speed (gpt-oss:
// the final channel on stdout, the analysis channel on stderr, no harmony markers).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "app/model_opts.h"
#include "model/chat_format.h"
#include "server/chat_session.h"
#include "server/output_parser.h"

namespace mr::app {

int CmdRun(const Args& args) {
  Cli cli("run", "Greedy completion of a prompt, printed as it is generated, with its speed on stderr.");
  CLI::App& app = cli.app();
  ModelArgs margs;
  AddModelOptions(app, &margs);
  std::string prompt;
  int n_predict = 64, n_ctx_arg = 0;
  bool raw = false;
  app.add_option("-p,--prompt", prompt, "prompt text (required)");
  app.add_option("-n,--n-predict", n_predict, "tokens to generate at most")->check(InRange(0, 1 << 24));
  app.add_option("-c,--ctx", n_ctx_arg, "context length (0: prompt + n-predict, within the model's)")
      ->check(AtLeast(0));
  app.add_flag("--raw", raw, "no chat template: the prompt is the raw text");
  if (auto rc = cli.Parse(args)) return *rc;
  if (prompt.empty()) {
    std::fprintf(stderr, "mererun run: -p TEXT is required\n");
    return 2;
  }
  auto model = LoadModelOrReport("run", margs);
  if (!model) return 1;
  const Tokenizer& tok = model->tokenizer();
  const ChatFamily family = raw ? ChatFamily::kNone : DetectChatFamily(model->file());
  const std::string text = family == ChatFamily::kNone
                               ? prompt
                               : RenderChat(family, model->file(), {ChatMessage{"user", prompt, {}, {}, {}}});
  std::vector<TokenId> ids = tok.Encode(text, /*add_special=*/true, /*parse_special=*/family != ChatFamily::kNone);
  const int64_t n_ctx =
      n_ctx_arg > 0 ? n_ctx_arg
                    : std::min<int64_t>(model->config().n_ctx_train, static_cast<int64_t>(ids.size()) + n_predict + 1);
  if (static_cast<int64_t>(ids.size()) + n_predict > n_ctx) {
    std::fprintf(stderr, "mererun run: prompt is too long: %zu tokens + %d > %lld context\n", ids.size(), n_predict,
                 (long long)n_ctx);
    return 1;
  }
  KvCache kv = model->NewKvCache(n_ctx);
  std::vector<float> logits(model->config().n_vocab);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Status st = model->Forward(kv, ids.data(), static_cast<int64_t>(ids.size()), false, logits.data());
  if (!st.ok()) {
    std::fprintf(stderr, "mererun run: %s\n", st.message().c_str());
    return 1;
  }
  const auto t1 = Clock::now();
  // gpt-oss answers in harmony channels: the final channel's text goes to stdout, the analysis
  // (reasoning) to stderr, and the markers to neither (the server's output parser, fed whole
  // UTF-8 characters). Every other family prints the generated text as it is.
  std::optional<server::OutputParser> harmony;
  if (family == ChatFamily::kHarmony) {
    server::OutputParser::Options o;
    o.harmony = true;
    harmony.emplace(std::move(o));
  }
  std::string pending;  // bytes of an unfinished UTF-8 character (harmony)
  std::vector<server::ParsedEvent> events;
  const auto print = [&](std::string_view piece, bool finish) {
    if (!harmony) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      pending += piece;
      const size_t n = finish ? pending.size() : server::CompleteUtf8Prefix(pending);
      events.clear();
      harmony->Feed(std::string_view(pending).substr(0, n), &events);
      if (finish) harmony->Finish(&events);
      pending.erase(0, n);
      for (const server::ParsedEvent& e : events)  // no tools are declared: no calls, only text
        std::fwrite(e.text.data(), 1, e.text.size(), e.kind == server::ParsedEvent::Kind::kReasoning ? stderr : stdout);
    }
    std::fflush(stdout);
  };
  int generated = 0;
  for (; generated < n_predict; ++generated) {
    const TokenId next = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (tok.IsEndOfGeneration(next)) break;
    print(tok.TokenToPiece(next, false), false);
    if (generated + 1 == n_predict) {
      ++generated;
      break;
    }
    st = model->Forward(kv, &next, 1, false, logits.data());
    if (!st.ok()) {
      std::fprintf(stderr, "\nmererun run: %s\n", st.message().c_str());
      return 1;
    }
  }
  print("", true);
  const auto t2 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("\n");
  std::fprintf(stderr,
               "[run] prompt %zu tokens in %.2f s (%.1f tok/s); generated %d tokens in %.2f s (%.1f tok/s); %s path, "
               "%s, %d threads\n",
               ids.size(), prefill_s, ids.size() / prefill_s, generated, decode_s,
               generated > 0 ? generated / decode_s : 0.0, model->ref_path() ? "reference" : "fast",
               CpuVariantName(model->cpu_variant()), model->n_threads());
  return 0;
}

}  // namespace mr::app
