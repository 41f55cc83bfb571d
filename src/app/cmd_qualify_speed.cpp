// `mererun qualify speed`: the throughput probe. Runs workloads against a reference and a
// candidate decoding configuration in reference / candidate / reference blocks: in-process, or
// with --http over HTTP against one `mererun serve` per configuration (started from this binary
// with the configuration as MERERUN_DRAFT / MERERUN_DRAFT_TOKENS, or given by URL), timed by the
// server's x-mererun-* response headers, with each server's peak RSS per request. Each block
// runs every workload 1 + N times and drops the first (warm-up). Reports per-block medians of
// decode tok/s (generated tokens / time of the complete decode loop, excluding load and
// prefill), prefill and wall time, the pooled reference median, the change in %, and a verdict
// against a frozen criterion: the candidate median beats both reference-block medians on every
// workload and gains >= --min-gain % (default 5) over the pooled reference median.
//
// A configuration is "key=value,..." with keys draft (0|off|ngram|model:NAME|ngram+model:NAME)
// and k (auto|auto:KMAX|N); the env-style names MERERUN_DRAFT and MERERUN_DRAFT_TOKENS are
// accepted for them.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "app/bench_env.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"
#include "app/http_client.h"
#include "app/model_opts.h"
#include "app/spec_config.h"
#include "kernels/ops.h"
#include "model/chat_format.h"
#include "runtime/generator.h"
#include "runtime/speculative.h"

namespace mr::app {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A configuration's drafters, owned.
struct DrafterSet {
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<OwnedDrafter> owned;
  Drafter* drafter = nullptr;
};

bool BuildDrafters(const DecodeConfig& c, const Model& target, int threads, int64_t n_ctx, DrafterSet* d) {
  if (c.use_model && !c.draft_model.empty()) {
    ModelArgs a;
    a.model = c.draft_model;
    a.threads = threads;
    d->draft_model = LoadModelOrReport("qualify speed", a);
    if (!d->draft_model) return false;
  }
  auto r = MakeDrafter(c, target, d->draft_model.get(), n_ctx);
  if (!r.ok()) {
    std::fprintf(stderr, "mererun qualify speed: %s\n", r.status().message().c_str());
    return false;
  }
  d->owned = std::move(r).value();
  d->drafter = d->owned.get();
  return true;
}

struct Workload {
  std::string name, file;
  std::string text;  // user message
  int64_t max_tokens = 512;
  std::vector<TokenId> prompt;
};

bool LoadWorkload(const fs::path& path, Workload* w, std::string* err) {
  std::ifstream in(path);
  if (!in) {
    *err = "cannot read " + path.string();
    return false;
  }
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *err = path.string() + ": not a JSON object";
    return false;
  }
  w->file = path.string();
  w->name = j.value("name", path.stem().string());
  w->max_tokens = j.value("max_tokens", 512);
  if (j.contains("prompt")) {
    w->text = j.value("prompt", "");
  } else {
    const fs::path f = path.parent_path() / j.value("prompt_file", "");
    std::ifstream fin(f, std::ios::binary);
    if (!fin) {
      *err = path.string() + ": cannot read prompt_file " + f.string();
      return false;
    }
    std::stringstream body;
    body << fin.rdbuf();
    w->text = j.value("prompt_before", "") + body.str() + j.value("prompt_after", "");
  }
  if (w->text.empty()) {
    *err = path.string() + ": empty prompt";
    return false;
  }
  return true;
}

fs::path DefaultWorkloadDir() {
  // <repo>/bench/workloads next to build/bin/mererun, else relative to the working directory.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path p = exe.parent_path().parent_path().parent_path() / "bench" / "workloads";
    if (fs::is_directory(p, ec)) return p;
  }
  return "bench/workloads";
}

}  // namespace

int CmdQualifySpeed(const Args& args) {
  Cli cli("qualify speed",
          "Decode throughput of a candidate decoding configuration against a reference, in reference / "
          "candidate / reference blocks.\n"
          "CFG: draft=0|ngram|model:NAME|ngram+model:NAME, k=auto|auto:KMAX|N (comma list)");
  CLI::App& app = cli.app();
  ModelArgs margs;
  AddModelOptions(app, &margs);
  std::string ref_text = "draft=0", cand_text = "draft=ngram,k=auto", wl_arg = "short,long,code_edit,prose";
  std::string wl_dir_arg, json_out;
  int n_keep = 3;
  int64_t max_tokens_arg = 0;
  uint64_t seed_value = 0;
  double min_gain_pct = 5;
  bool greedy = false, keep_cache = false, show = false;
  app.add_option("--reference", ref_text, "reference configuration")->type_name("CFG");
  app.add_option("--candidate", cand_text, "candidate configuration")->type_name("CFG");
  app.add_option("-w,--workloads", wl_arg, "workload names (under --workload-dir) or .json paths, comma list");
  app.add_option("--workload-dir", wl_dir_arg, "directory of the named workloads (default: bench/workloads)");
  app.add_option("-n,--n", n_keep, "kept runs per workload per block (after one warm-up run)")->check(AtLeast(1));
  app.add_option("--max-tokens", max_tokens_arg, "override each workload's max_tokens (0: keep)")
      ->check(AtLeast<int64_t>(0));
  CLI::Option* seed_opt = app.add_option("--seed", seed_value, "sample with this seed (default: unseeded)")
                              ->check(AtLeast<uint64_t>(0))
                              ->default_str("");
  app.add_option("--json", json_out, "also write the report as JSON to this file");
  app.add_option("--min-gain", min_gain_pct, "percent gain over the pooled reference median the verdict asks for")
      ->check(InRange(-100.0, 1000.0));
  app.add_flag("--greedy", greedy, "temperature 0 instead of the model's sampling defaults");
  app.add_flag("--keep-cache", keep_cache, "evaluate each workload's prompt once for the whole run");
  app.add_flag("--show", show, "print each generated text to stderr");
  bool http = false;
  std::string ref_url, cand_url;
  std::vector<std::string> server_args;
  int64_t server_ctx = 8192;
  double max_rss_mb = 0;
  app.add_flag("--http", http, "measure over HTTP: one `mererun serve` per configuration (or --*-url)");
  app.add_option("--reference-url", ref_url, "an already running server for the reference (implies --http)")
      ->type_name("URL");
  app.add_option("--candidate-url", cand_url, "an already running server for the candidate (implies --http)")
      ->type_name("URL");
  app.add_option("--server-arg", server_args, "extra argument for the started servers (repeat)")
      ->allow_extra_args(false);
  app.add_option("--server-ctx", server_ctx, "context of the started servers")->check(AtLeast<int64_t>(256));
  app.add_option("--max-rss-mb", max_rss_mb, "resource bound: a request whose server peak RSS exceeds it fails")
      ->check(AtLeast(0.0));
  if (auto rc = cli.Parse(args)) return *rc;
  DecodeConfig ref, cand;
  std::string err;
  if (!ParseConfig(ref_text, &ref, &err) || !ParseConfig(cand_text, &cand, &err)) {
    std::fprintf(stderr, "mererun qualify speed: bad configuration: %s\n", err.c_str());
    return 2;
  }
  for (const DecodeConfig* c : {&ref, &cand}) {
    if (Status st = c->Validate(); !st.ok()) {
      std::fprintf(stderr, "mererun qualify speed: bad configuration '%s': %s\n", c->text.c_str(),
                   st.message().c_str());
      return 2;
    }
  }
  http = http || !ref_url.empty() || !cand_url.empty();
  struct Endpoint {
    std::string host = "127.0.0.1";
    int port = 0;
    ServeProcess proc;  // when started here
  };
  Endpoint ref_ep, cand_ep;
  for (auto [url, ep] : {std::pair{&ref_url, &ref_ep}, std::pair{&cand_url, &cand_ep}}) {
    if (!url->empty() && !ParseHttpUrl(*url, &ep->host, &ep->port)) {
      std::fprintf(stderr, "mererun qualify speed: expected http://HOST:PORT, got '%s'\n", url->c_str());
      return 2;
    }
  }
  if (http && seed_opt->count() > 0)
    std::fprintf(stderr, "mererun qualify speed: --seed is ignored over HTTP (the Messages API has no seed)\n");

  // Workloads: names under the workload directory, or paths to .json files.
  const fs::path wl_dir = wl_dir_arg.empty() ? DefaultWorkloadDir() : fs::path(wl_dir_arg);
  std::vector<Workload> workloads;
  {
    std::stringstream ss(wl_arg);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      fs::path p = item.find(".json") != std::string::npos ? fs::path(item) : wl_dir / (item + ".json");
      Workload w;
      if (!LoadWorkload(p, &w, &err)) {
        std::fprintf(stderr, "mererun qualify speed: workload: %s\n", err.c_str());
        return 2;
      }
      workloads.push_back(std::move(w));
    }
  }
  if (workloads.empty()) {
    std::fprintf(stderr, "mererun qualify speed: no workloads\n");
    return 2;
  }

  for (Workload& w : workloads)
    if (max_tokens_arg > 0) w.max_tokens = max_tokens_arg;
  if (http) {
    // Over HTTP the servers load the model; this process only starts them and sends requests.
    std::vector<std::string> args = {
        "-m", margs.model, "-c", std::to_string(server_ctx), "--weights", WeightModeName(margs.weights)};
    if (margs.threads > 0) args.insert(args.end(), {"-t", std::to_string(margs.threads)});
    if (margs.ref) args.push_back("--ref");
    args.insert(args.end(), server_args.begin(), server_args.end());
    for (auto [cfg, ep] : {std::pair{&ref, &ref_ep}, std::pair{&cand, &cand_ep}}) {
      if (ep->port != 0) continue;
      std::fprintf(stderr, "[qualify] starting a server for '%s'\n", cfg->text.c_str());
      if (Status st = ep->proc.Start(
              args, {{"MERERUN_DRAFT", cfg->DrafterName()}, {"MERERUN_DRAFT_TOKENS", cfg->TokensName()}});
          !st.ok()) {
        std::fprintf(stderr, "mererun qualify speed: %s\n", st.message().c_str());
        return 1;
      }
      ep->port = ep->proc.port();
    }
  }
  std::unique_ptr<Model> model;
  int64_t n_ctx = 0;
  DrafterSet ref_d, cand_d;
  std::unique_ptr<Generator> gen;
  if (!http) {
    model = LoadModelOrReport("qualify speed", margs);
    if (!model) return 1;
    const Tokenizer& tok = model->tokenizer();
    const ChatFamily family = DetectChatFamily(model->file());
    for (Workload& w : workloads) {
      const std::string text = family == ChatFamily::kNone
                                   ? w.text
                                   : RenderChat(family, model->file(), {ChatMessage{"user", w.text, {}, {}, {}}});
      w.prompt = tok.Encode(text, true, family != ChatFamily::kNone);
      n_ctx = std::max<int64_t>(n_ctx, static_cast<int64_t>(w.prompt.size()) + w.max_tokens + 8);
    }
    if (n_ctx > model->config().n_ctx_train) {
      std::fprintf(stderr, "mererun qualify speed: workloads need %lld context, the model has %lld\n", (long long)n_ctx,
                   (long long)model->config().n_ctx_train);
      return 1;
    }
    if (!BuildDrafters(ref, *model, margs.threads, n_ctx, &ref_d) ||
        !BuildDrafters(cand, *model, margs.threads, n_ctx, &cand_d))
      return 1;
    // One Generator for both configurations: with --keep-cache a workload's prompt is evaluated
    // once for the whole run. Its cost controller restarts whenever the drafter changes.
    gen = std::make_unique<Generator>(*model, n_ctx);
  }

  SamplingParams sampling = model ? ModelDefaultSampling(*model) : SamplingParams{};
  if (greedy) sampling.temperature = 0.0f;
  const bool seeded = seed_opt->count() > 0;
  const uint64_t seed0 = seeded ? seed_value : 0;

  struct Block {
    const char* role;
    DecodeConfig* cfg;
    DrafterSet* d;
    Endpoint* ep;
  };
  const Block blocks[3] = {{"reference", &ref, &ref_d, &ref_ep},
                           {"candidate", &cand, &cand_d, &cand_ep},
                           {"reference", &ref, &ref_d, &ref_ep}};
  Generator* const g = gen.get();
  // results[w][b]: kept samples; warmups[w][b]: the excluded first attempts.
  std::vector<std::vector<json>> results(workloads.size(), std::vector<json>(3, json::array()));
  std::vector<std::vector<json>> warmups = results;
  int resource_failures = 0;
  using Clock = std::chrono::steady_clock;
  CostController cand_controller;
  for (int b = 0; b < 3; ++b) {
    const Block& blk = blocks[b];
    if (http) {
      for (size_t wi = 0; wi < workloads.size(); ++wi) {
        const Workload& w = workloads[wi];
        for (int r = 0; r <= n_keep; ++r) {
          json req = {{"model", margs.model},
                      {"max_tokens", w.max_tokens},
                      {"messages", json::array({{{"role", "user"}, {"content", w.text}}})}};
          if (greedy) req["temperature"] = 0;  // otherwise the model's default sampling
          blk.ep->proc.ResetPeakRss();
          auto reply = HttpPostJson(blk.ep->host, blk.ep->port, "/v1/messages", req.dump());
          if (!reply.ok() || reply->status != 200) {
            std::fprintf(stderr, "mererun qualify speed: %s: %s\n", w.name.c_str(),
                         reply.ok() ? ("HTTP " + std::to_string(reply->status) + ": " + reply->body).c_str()
                                    : reply.status().message().c_str());
            return 1;
          }
          const int64_t peak_rss = blk.ep->proc.PeakRssBytes();
          const json body = json::parse(reply->body, nullptr, false);
          auto header = [&](const char* name) {
            const auto it = reply->headers.find(name);
            return it == reply->headers.end() ? std::string() : it->second;
          };
          const double decode_s = std::atof(header("x-mererun-decode-seconds").c_str());
          const int64_t generated = std::atoll(header("x-mererun-decode-tokens").c_str());
          const double tok_s = decode_s > 0 ? generated / decode_s : 0.0;
          std::vector<int64_t> proposed_at, accepted_at;
          std::stringstream at(header("x-mererun-acceptance-by-position"));
          for (std::string pair; std::getline(at, pair, ',');) {
            accepted_at.push_back(std::atoll(pair.c_str()));
            proposed_at.push_back(std::atoll(pair.c_str() + pair.find('/') + 1));
          }
          const bool resource_ok = max_rss_mb <= 0 || (peak_rss >= 0 && peak_rss <= max_rss_mb * 1048576.0);
          json usage = body.is_object() && body.contains("usage") ? body["usage"] : json::object();
          json sample = {{"decode_tok_s", tok_s},
                         {"generated", generated},
                         {"decode_s", decode_s},
                         {"prefill_s", std::atof(header("x-mererun-prefill-seconds").c_str())},
                         {"wall_s", reply->wall_s},
                         {"prompt_tokens", usage.value("input_tokens", 0) + usage.value("cache_read_input_tokens", 0) +
                                               usage.value("cache_creation_input_tokens", 0)},
                         {"reused_tokens", usage.value("cache_read_input_tokens", 0)},
                         {"stop", body.is_object() ? body.value("stop_reason", "") : ""},
                         {"peak_rss_bytes", peak_rss},
                         // The server's own view (docs/api.md, resource headers).
                         {"server_peak_rss_bytes", std::atoll(header("x-mererun-peak-rss-bytes").c_str())},
                         {"kv_peak_bytes", std::atoll(header("x-mererun-kv-peak-bytes").c_str())},
                         {"resource_ok", resource_ok}};
          if (blk.cfg->speculative())
            sample["spec"] = {{"drafted", std::atoll(header("x-mererun-draft-tokens").c_str())},
                              {"accepted", std::atoll(header("x-mererun-accepted-tokens").c_str())},
                              {"proposed_at", proposed_at},
                              {"accepted_at", accepted_at}};
          std::fprintf(stderr,
                       "[qualify] %-9s %-10s %s %d: %lld tokens, decode %.2f tok/s, wall %.2f s, peak RSS %.0f MiB%s\n",
                       blk.role, w.name.c_str(), r == 0 ? "warm-up" : "sample", r, (long long)generated, tok_s,
                       reply->wall_s, peak_rss / 1048576.0, resource_ok ? "" : " (over --max-rss-mb)");
          if (show && body.is_object()) std::fprintf(stderr, "%s\n----\n", body["content"].dump().c_str());
          if (!resource_ok) ++resource_failures;
          (r == 0 ? warmups : results)[wi][b].push_back(sample);
        }
      }
      continue;
    }
    if (blk.d->drafter != nullptr && !keep_cache) {  // start-up warm-up, as the server does (it empties the cache)
      SpecParams sp;
      sp.drafter = blk.d->drafter;
      sp.draft_tokens = blk.cfg->k;
      sp.adaptive = blk.cfg->adaptive;
      auto w = g->WarmUp(sp);
      if (!w.ok()) {
        std::fprintf(stderr, "mererun qualify speed: warm-up: %s\n", w.status().message().c_str());
        return 1;
      }
    }
    for (size_t wi = 0; wi < workloads.size(); ++wi) {
      const Workload& w = workloads[wi];
      for (int r = 0; r <= n_keep; ++r) {
        GenerateParams p;
        p.sampling = sampling;
        p.max_tokens = w.max_tokens;
        p.seeded = seeded;
        p.seed = seed0 + static_cast<uint64_t>(wi * 1000 + r);  // same seeds in every block
        if (blk.d->drafter != nullptr) {
          p.spec.drafter = blk.d->drafter;
          p.spec.draft_tokens = blk.cfg->k;
          p.spec.adaptive = blk.cfg->adaptive;
        }
        if (!keep_cache) g->ResetCache();
        const auto t0 = Clock::now();
        std::vector<TokenId> out_tokens;
        auto res = g->Generate(w.prompt, p, [&](TokenId t) {
          out_tokens.push_back(t);
          return true;
        });
        const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!res.ok()) {
          std::fprintf(stderr, "mererun qualify speed: %s: %s\n", w.name.c_str(), res.status().message().c_str());
          return 1;
        }
        const GenerateStats& s = *res;
        const double tok_s = s.decode_s > 0 ? s.generated / s.decode_s : 0.0;
        std::fprintf(stderr, "[qualify] %-9s %-10s %s %d: %lld tokens, decode %.2f tok/s, prefill %.2f s%s\n", blk.role,
                     w.name.c_str(), r == 0 ? "warm-up" : "sample", r, (long long)s.generated, tok_s, s.prefill_s,
                     s.drafted > 0
                         ? (", accepted " + std::to_string(s.accepted) + "/" + std::to_string(s.drafted)).c_str()
                         : "");
        if (show) std::fprintf(stderr, "%s\n----\n", model->tokenizer().Decode(out_tokens, false).c_str());
        if (r == 0) continue;
        json sample = {{"decode_tok_s", tok_s},
                       {"generated", s.generated},
                       {"decode_s", s.decode_s},
                       {"prefill_s", s.prefill_s},
                       {"wall_s", wall_s},
                       {"prompt_tokens", s.prompt_tokens},
                       {"reused_tokens", s.reused_tokens},
                       {"stop", StopCauseName(s.stop)}};
        if (blk.d->drafter != nullptr) {
          sample["spec"] = {{"spec_steps", s.spec_steps},  {"plain_steps", s.plain_steps},
                            {"drafted", s.drafted},        {"accepted", s.accepted},
                            {"draft_s", s.draft_s},        {"proposed_at", s.proposed_at},
                            {"accepted_at", s.accepted_at}};
        }
        results[wi][b].push_back(sample);
      }
    }
    if (b == 1) cand_controller = g->controller();
  }

  // Summaries and verdict.
  auto medians = [](const json& samples, const char* key) {
    std::vector<double> v;
    for (const json& s : samples) v.push_back(s[key].get<double>());
    return Median(v);
  };
  json out_workloads = json::array();
  bool all_pass = true;
  std::printf("\n%-10s %7s | %9s %9s %9s | %9s %8s | %8s %8s | %-14s %s\n", "workload", "prompt", "ref1", "cand",
              "ref2", "ref pool", "change", "prefill", "prefill", "accepted", "verdict");
  std::printf("%-10s %7s | %9s %9s %9s | %9s %8s | %8s %8s | %-14s\n", "", "tokens", "tok/s", "tok/s", "tok/s", "tok/s",
              "%", "ref s", "cand s", "per position");
  for (size_t wi = 0; wi < workloads.size(); ++wi) {
    const auto& r = results[wi];
    const int64_t prompt_tokens = !http          ? static_cast<int64_t>(workloads[wi].prompt.size())
                                  : r[0].empty() ? 0
                                                 : r[0][0]["prompt_tokens"].get<int64_t>();
    const double m1 = medians(r[0], "decode_tok_s"), mc = medians(r[1], "decode_tok_s"),
                 m2 = medians(r[2], "decode_tok_s");
    json pooled_samples = r[0];
    for (const json& s : r[2]) pooled_samples.push_back(s);
    const double pooled = medians(pooled_samples, "decode_tok_s");
    const double change = pooled > 0 ? 100.0 * (mc / pooled - 1.0) : 0.0;
    const bool pass = mc > m1 && mc > m2 && change >= min_gain_pct;
    all_pass &= pass;
    // Candidate acceptance per draft position, pooled over its samples.
    std::vector<int64_t> prop, acc;
    for (const json& s : r[1]) {
      if (!s.contains("spec")) continue;
      const auto pa = s["spec"]["proposed_at"].get<std::vector<int64_t>>();
      const auto aa = s["spec"]["accepted_at"].get<std::vector<int64_t>>();
      prop.resize(std::max(prop.size(), pa.size()));
      acc.resize(prop.size());
      for (size_t i = 0; i < pa.size(); ++i) prop[i] += pa[i], acc[i] += aa[i];
    }
    std::vector<double> rate;
    std::string rate_text;
    for (size_t i = 0; i < prop.size(); ++i) {
      if (prop[i] == 0) break;  // never reached
      rate.push_back(double(acc[i]) / prop[i]);
      char b[16];
      std::snprintf(b, sizeof b, "%s%.2f", i ? " " : "", rate.back());
      rate_text += b;
    }
    std::printf("%-10s %7zu | %9.2f %9.2f %9.2f | %9.2f %+7.1f%% | %8.2f %8.2f | %-14s %s\n",
                workloads[wi].name.c_str(), static_cast<size_t>(prompt_tokens), m1, mc, m2, pooled, change,
                medians(r[0], "prefill_s"), medians(r[1], "prefill_s"), rate_text.empty() ? "-" : rate_text.c_str(),
                pass ? "pass" : "FAIL");
    json blocks_json = json::array();
    for (int b = 0; b < 3; ++b)
      blocks_json.push_back({{"role", blocks[b].role},
                             {"samples", r[b]},
                             {"median_decode_tok_s", medians(r[b], "decode_tok_s")},
                             {"median_prefill_s", medians(r[b], "prefill_s")},
                             {"median_wall_s", medians(r[b], "wall_s")},
                             {"warmup_samples", warmups[wi][b]}});
    out_workloads.push_back({{"name", workloads[wi].name},
                             {"file", workloads[wi].file},
                             {"prompt_tokens", prompt_tokens},
                             {"max_tokens", workloads[wi].max_tokens},
                             {"blocks", blocks_json},
                             {"pooled_reference_median_tok_s", pooled},
                             {"candidate_median_tok_s", mc},
                             {"change_pct", change},
                             {"candidate_acceptance_per_position", rate},
                             {"pass", pass}});
  }
  if (resource_failures > 0) {
    std::printf("resource monitoring: %d request(s) went over --max-rss-mb %.0f\n", resource_failures, max_rss_mb);
    all_pass = false;
  }
  std::printf(
      "verdict: %s (criterion: candidate beats both reference-block medians on every workload and gains >= %.1f%% "
      "over the pooled reference median%s)\n",
      all_pass ? "PASS" : "FAIL", min_gain_pct, max_rss_mb > 0 ? ", and no request over the RSS bound" : "");

  // The candidate's cost controller after the run: what it measured and what it would choose.
  json controller = nullptr;
  if (cand_d.drafter != nullptr) {
    const CostController& c = cand_controller;
    json fwd = json::array(), acc = json::array(), rate = json::array();
    std::printf("candidate controller: forward ms by rows");
    for (int r = 1; r <= c.k_max() + 1; ++r) {
      fwd.push_back(1e3 * c.forward_cost(r));
      std::printf(" %d:%.1f", r, 1e3 * c.forward_cost(r));
    }
    std::printf("; draft ms/token %.2f; acceptance", 1e3 * c.draft_cost_per_token());
    for (int i = 1; i <= c.k_max(); ++i) {
      acc.push_back(c.acceptance(i));
      std::printf(" %.2f", c.acceptance(i));
    }
    for (int k = 0; k <= c.k_max(); ++k) rate.push_back(c.expected_rate(k));
    std::printf("\n");
    controller = {{"forward_ms_by_rows", fwd},
                  {"draft_ms_per_token", 1e3 * c.draft_cost_per_token()},
                  {"acceptance_ema", acc},
                  {"expected_tok_s_by_k", rate}};
  }
  const json env = ControlEnvironment();
  const json git = GitInfo();
  json report = {{"tool", "mererun qualify speed"},
                 {"commit", git["commit"]},
                 {"dirty", git["dirty"]},
                 {"cpu", CpuInfo()},
                 {"cpu_variant", CpuVariantName(model ? model->cpu_variant() : SelectedCpuVariant())},
                 {"threads", model ? model->n_threads() : margs.threads},
                 {"transport", http ? "http" : "in-process"},
                 {"servers", http ? json{{"reference", ref_url.empty() ? "started" : ref_url},
                                         {"candidate", cand_url.empty() ? "started" : cand_url},
                                         {"server_args", server_args},
                                         {"server_ctx", server_ctx}}
                                  : json(nullptr)},
                 {"resource", {{"max_rss_mb", max_rss_mb}, {"failures", resource_failures}}},
                 {"model", margs.model},
                 {"env", env},
                 {"sampling", http ? json(greedy ? "temperature 0" : "the model's default (server)")
                                   : json{{"temperature", sampling.temperature},
                                          {"top_k", sampling.top_k},
                                          {"top_p", sampling.top_p},
                                          {"min_p", sampling.min_p},
                                          {"seeded", seeded},
                                          {"seed", seed0}}},
                 {"n_per_block", n_keep},
                 {"keep_cache", keep_cache},
                 {"reference", ref.ToJson()},
                 {"candidate", cand.ToJson()},
                 {"criterion", {{"min_gain_pct", min_gain_pct}, {"beats_both_reference_blocks", true}}},
                 {"workloads", out_workloads},
                 {"candidate_controller", controller},
                 {"verdict", all_pass ? "pass" : "fail"}};
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << report.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "mererun qualify speed: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  // A FAIL verdict is a failed check, as a test runner reports it: scripts and CI see it.
  return all_pass ? 0 : kVerdictFailed;
}

}  // namespace mr::app
