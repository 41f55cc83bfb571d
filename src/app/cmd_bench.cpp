// `mererun bench`: one program that measures, side by side and in the same run,
//   - the machine: streaming memory-read bandwidth and each weight format's matmul effective GB/s;
//   - each model with mererun: prefill tok/s, decode tok/s, and the cost of a verify step of
//     2/4/8 rows (Forward with all_logits) relative to a 1-row step, against the bandwidth
//     roofline (weight_bytes / bandwidth);
//   - the same model figures for llama.cpp (node-llama-cpp, tools/llamacpp/bench.mjs) on the same
//     GGUF and on a Q8_0 rewrite of it (equal bits per weight).
// Repetitions are interleaved (mererun, llama.cpp GGUF, llama.cpp Q8_0, mererun, ...) so that
// load from other processes hits both sides alike; figures are medians over repetitions.
// Prints a table on stdout and the full record as JSON (--json FILE).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "app/bench_env.h"
#include "app/bench_micro.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"
#include "model/catalog.h"
#include "model/chat_format.h"
#include "model/model.h"
#include "server/output_constraint.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mr::app {
namespace {

constexpr const char* kCmd = "bench";

// Prompt text for prefill (repeated until long enough); plain prose, tokenized with the model's
// own tokenizer so both engines see the same ids.
constexpr const char* kPromptText =
    "The history of computing is a history of memory. Early machines stored a few thousand words "
    "in mercury delay lines and magnetic drums, and programmers arranged their instructions so "
    "that the next word would arrive under the read head just as it was needed. Today a laptop "
    "holds billions of bytes, yet the same question decides how fast a program runs: how many "
    "bytes must travel from memory to the processor for each unit of useful work? ";

struct Options {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  int reps = 3;
  bool quick = false;
  bool llamacpp = true;
  std::string json_path;
  int prompt_tokens = 512;
  int decode_tokens = 128;
  std::vector<int> verify_rows = {1, 2, 4, 8};
  int verify_iters = 5;  // timed verify steps per row count per repetition
  int64_t membw_bytes = 1ll << 30;
  int64_t matmul_rotate_bytes = 256ll << 20;
  int matmul_iters = 30;
};

// Samples of one engine configuration (model file x thread count), gathered over repetitions.
struct Samples {
  std::vector<double> prefill_tok_s, decode_tok_s;
  std::map<int, std::vector<double>> verify_ms;  // rows -> per-step ms
};

json Summarize(const Samples& s, int threads, double weight_bytes, double bw_gbps) {
  json j;
  j["threads"] = threads;
  j["prefill_tok_s"] = Median(s.prefill_tok_s);
  j["decode_tok_s"] = Median(s.decode_tok_s);
  j["prefill_tok_s_all"] = s.prefill_tok_s;
  j["decode_tok_s_all"] = s.decode_tok_s;
  json ms = json::object(), ratio = json::object();
  const double ms1 = s.verify_ms.count(1) ? Median(s.verify_ms.at(1)) : 0;
  for (const auto& [n, v] : s.verify_ms) {
    ms[std::to_string(n)] = Median(v);
    if (ms1 > 0) ratio[std::to_string(n)] = Median(v) / ms1;
  }
  j["verify_ms"] = ms;
  j["verify_ratio_vs_1"] = ratio;
  if (bw_gbps > 0 && weight_bytes > 0) {
    const double roof = bw_gbps * 1e9 / weight_bytes;
    j["roofline_tok_s"] = roof;
    j["roofline_pct"] = 100.0 * Median(s.decode_tok_s) / roof;
  }
  return j;
}

// One repetition of mererun on a loaded model: prefill, decode, verify steps.
Status RunMererunRep(Model& m, const std::vector<TokenId>& prompt, const Options& o, Samples* s) {
  const int64_t n_vocab = m.config().n_vocab;
  const int max_verify = *std::max_element(o.verify_rows.begin(), o.verify_rows.end());
  KvCache kv = m.NewKvCache(static_cast<int64_t>(prompt.size()) + o.decode_tokens + max_verify + 1);
  std::vector<float> logits(static_cast<size_t>(n_vocab * max_verify));
  auto t0 = std::chrono::steady_clock::now();
  MR_RETURN_IF_ERROR(m.Forward(kv, prompt.data(), static_cast<int64_t>(prompt.size()), false, logits.data()));
  s->prefill_tok_s.push_back(static_cast<double>(prompt.size()) / SecondsSince(t0));
  auto argmax = [&]() {
    return static_cast<TokenId>(std::max_element(logits.begin(), logits.begin() + n_vocab) - logits.begin());
  };
  TokenId next = argmax();
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.decode_tokens; ++i) {
    MR_RETURN_IF_ERROR(m.Forward(kv, &next, 1, false, logits.data()));
    next = argmax();
  }
  s->decode_tok_s.push_back(o.decode_tokens / SecondsSince(t0));
  // Verify steps at the context reached: n rows with logits for every row, then roll back.
  const int64_t base = kv.n_past;
  std::vector<TokenId> draft(prompt.begin(), prompt.begin() + max_verify);
  for (int it = 0; it < o.verify_iters; ++it) {
    for (int n : o.verify_rows) {  // interleaved so drift in machine load hits every n alike
      kv.n_past = base;
      t0 = std::chrono::steady_clock::now();
      MR_RETURN_IF_ERROR(m.Forward(kv, draft.data(), n, true, logits.data()));
      s->verify_ms[n].push_back(SecondsSince(t0) * 1e3);
    }
  }
  return Status::Ok();
}

// The Q8_0 rewrite of `path` under the mererun cache (written once with `mererun convert`).
Result<std::string> Q8_0Path(const std::string& path) {
  const fs::path dir = fs::path(model::ModelCacheDir()).parent_path() / "derived";
  const fs::path out = dir / (fs::path(path).stem().string() + ".q8_0.gguf");
  std::error_code ec;
  if (fs::is_regular_file(out, ec)) return out.string();
  fs::create_directories(dir, ec);
  const fs::path tmp = out.string() + ".tmp" + std::to_string(getpid());
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  std::fprintf(stderr, "[bench] writing %s (mererun convert --type q8_0)\n", out.c_str());
  auto r = RunCapture(ShellQuote(self) + " convert -m " + ShellQuote(path) + " --type q8_0 -o " +
                      ShellQuote(tmp.string()) + " >&2");
  if (!r.ok()) {
    fs::remove(tmp, ec);
    return r.status();
  }
  fs::rename(tmp, out, ec);
  if (ec) return Internal("[bench] cannot rename " + tmp.string() + ": " + ec.message());
  return out.string();
}

// One node invocation of tools/llamacpp/bench.mjs (one repetition, every thread count).
Result<json> RunLlamaCpp(const std::string& gguf, const std::string& tokens_file, const Options& o) {
  const std::string root = RepoRoot();
  const std::string script = root + "/tools/llamacpp/bench.mjs";
  std::error_code ec;
  if (root.empty() || !fs::is_regular_file(script, ec)) return NotFound("[bench] tools/llamacpp/bench.mjs not found");
  if (!fs::is_directory(root + "/tools/llamacpp/node_modules/node-llama-cpp", ec)) {
    return NotFound("[bench] node-llama-cpp is not installed (run scripts/setup.sh, or npm ci in tools/llamacpp)");
  }
  std::string threads, verify;
  for (int t : o.threads) threads += (threads.empty() ? "" : ",") + std::to_string(t);
  for (int n : o.verify_rows) verify += (verify.empty() ? "" : ",") + std::to_string(n);
  const std::string cmd = "node " + ShellQuote(script) + " --model " + ShellQuote(gguf) + " --tokens " +
                          ShellQuote(tokens_file) + " --threads " + threads + " --decode " +
                          std::to_string(o.decode_tokens) + " --verify " + verify + " --verify-iters " +
                          std::to_string(o.verify_iters);
  MR_ASSIGN_OR_RETURN(std::string out, RunCapture(cmd));
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded()) return Internal("[bench] bench.mjs printed no JSON: " + out.substr(0, 200));
  return j;
}

void AddLlamaSamples(const json& run, std::map<int, Samples>* by_threads) {
  for (const json& r : run.at("runs")) {
    Samples& s = (*by_threads)[r.at("threads").get<int>()];
    s.prefill_tok_s.push_back(r.at("prefill_tok_s").get<double>());
    s.decode_tok_s.push_back(r.at("decode_tok_s").get<double>());
    for (const auto& [n, v] : r.at("verify_ms").items()) {
      for (double x : v) s.verify_ms[std::stoi(n)].push_back(x);
    }
  }
}

// The roofline's bandwidth: the better of the best wall-clock repetition and the CPU-time
// median (bandwidth while running). It bounds what the machine can do; on a shared machine
// the wall-clock median mostly measures the neighbours.
double BandwidthFor(const json& machine, int threads) {
  double bw = 0;
  for (const json& m : machine.at("mem_bandwidth")) {
    if (m.at("threads").get<int>() == threads) bw = m.at("gbps_roofline").get<double>();
  }
  if (bw == 0) {  // a thread count not measured: the best measured one
    for (const json& m : machine.at("mem_bandwidth")) bw = std::max(bw, m.at("gbps_roofline").get<double>());
  }
  return bw;
}

json MeasureMachine(const Options& o) {
  json machine;
  machine["mem_bandwidth"] = json::array();
  for (int t : o.threads) {
    std::fprintf(stderr, "[bench] memory bandwidth, %d thread(s)\n", t);
    const MemBandwidth bw = MeasureMemBandwidth(t, o.membw_bytes, std::max(5, 3 * o.reps));
    machine["mem_bandwidth"].push_back({{"threads", t},
                                        {"buffer_bytes", bw.buffer_bytes},
                                        {"reps", bw.reps},
                                        {"gbps_median", bw.gbps_median},
                                        {"gbps_max", bw.gbps_max},
                                        {"gbps_cpu_median", bw.gbps_cpu_median},
                                        {"gbps_roofline", std::max(bw.gbps_max, bw.gbps_cpu_median)}});
  }
  const KernelTable& k = GetKernels(SelectedCpuVariant());
  machine["matmul"] = {
      {"cpu_variant", CpuVariantName(k.variant)}, {"prefetch_bytes", kernel_prefetch_bytes}, {"points", json::array()}};
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{8960, 1536}, {1536, 8960}};
  std::vector<WeightFormat> formats = {WeightFormat::kQ8G64};
  for (KFormat kf : kAllKFormats) formats.push_back(NativeWeightFormat(kf));
  for (WeightFormat f : formats) {
    for (const auto& [rows, cols] : shapes) {
      for (int t : o.threads) {
        std::fprintf(stderr, "[bench] matmul %s %lldx%lld, %d thread(s)\n", WeightFormatName(f), (long long)rows,
                     (long long)cols, t);
        for (const MatmulPoint& p :
             MeasureMatmul(k, f, rows, cols, {1, 2, 4, 8, 64}, t, o.matmul_iters, o.matmul_rotate_bytes)) {
          const double bw = BandwidthFor(machine, t);
          // 64 rows: a prefill chunk, compute-bound (GOPS: 2 x rows x cols x activation rows per second).
          std::fprintf(stderr, "[bench]   %d row(s): %.2f GB/s (%.0f%% of memory bandwidth), %.0f GOPS\n", p.n_act_rows,
                       p.gbps_median, bw > 0 ? 100.0 * p.gbps_median / bw : 0.0, p.gops_median);
          machine["matmul"]["points"].push_back({{"format", p.format},
                                                 {"rows", p.rows},
                                                 {"cols", p.cols},
                                                 {"act_rows", p.n_act_rows},
                                                 {"threads", p.n_threads},
                                                 {"iters", p.iters},
                                                 {"ms", p.ms_median},
                                                 {"gbps", p.gbps_median},
                                                 {"gbps_cpu", p.gbps_cpu_median},
                                                 {"gops", p.gops_median},
                                                 {"pct_of_mem_bandwidth", bw > 0 ? 100.0 * p.gbps_median / bw : 0.0}});
        }
      }
    }
  }
  return machine;
}

// Everything about one model: mererun per thread count, llama.cpp on the GGUF and its Q8_0.
// The cost of constrained decoding's per-step mask (TokenConstraint::Apply) along `text`, the
// output of `req` tokenized by the model's own tokenizer. Reported per step and as a fraction of
// a decode step.
json MeasureMasks(const Model& m, double decode_tok_s, const server::ConstraintRequest& req, const std::string& text);

// A realistic tool call under tool_choice auto (lazy: the mask applies from the open tag on): an
// agent's shell command with a long string argument, a number and a nested object.
json MeasureConstraint(const Model& m, double decode_tok_s) {
  using Json = nlohmann::ordered_json;
  server::ConstraintRequest req;
  ChatTool bash;
  bash.name = "Bash";
  bash.parameters = Json::parse(R"({"type": "object", "properties": {
      "command": {"type": "string", "description": "The command to execute"},
      "timeout": {"type": "number", "maximum": 600000},
      "description": {"type": "string"},
      "env": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}},
      "required": ["command"], "additionalProperties": false})");
  ChatTool read;
  read.name = "Read";
  read.parameters = Json::parse(R"({"type": "object", "properties": {"file_path": {"type": "string"},
      "offset": {"type": "integer"}, "limit": {"type": "integer"}}, "required": ["file_path"]})");
  req.tools = {read, bash};
  const std::string call =
      "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"cd /work/project && python3 -m pytest "
      "tests/test_parser.py -x -q 2>&1 | tail -n 40; grep -rn \\\"def parse\\\" src/ | head\", \"timeout\": 120000, "
      "\"description\": \"Run the failing parser tests and find the parse functions\", \"env\": {\"name\": "
      "\"PYTHONPATH\", \"value\": \"src\"}}}\n</tool_call>";
  return MeasureMasks(m, decode_tok_s, req, call);
}

// A GBNF grammar (the `grammar` field): JSON written in GBNF in llama.cpp's style, whose strings
// are a plain character class (no free-string shortcut), along a JSON answer.
json MeasureGbnf(const Model& m, double decode_tok_s) {
  server::ConstraintRequest req;
  req.format = server::OutputFormat::kGrammar;
  req.grammar = R"(root ::= "{" ws (member ("," ws member)*)? "}"
member ::= string ws ":" ws value ws
value ::= "{" ws (member ("," ws member)*)? "}" | "[" ws (value ws ("," ws value ws)*)? "]" | string | number | "true" | "false" | "null"
string ::= "\"" ([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]+)?
ws ::= [ \t\n]{0,8}
)";
  const std::string answer =
      "{\"city\": \"Lisbon\", \"days\": 4, \"weather\": [{\"day\": \"Monday\", \"high\": 21.5, \"sky\": "
      "\"sunny with a light breeze from the Atlantic\"}, {\"day\": \"Tuesday\", \"high\": 19, \"sky\": \"overcast, "
      "rain in the evening\"}], \"umbrella\": true, \"notes\": null}";
  return MeasureMasks(m, decode_tok_s, req, answer);
}

json MeasureMasks(const Model& m, double decode_tok_s, const server::ConstraintRequest& req, const std::string& text) {
  const Tokenizer& tok = m.tokenizer();
  const int64_t n_vocab = m.config().n_vocab;
  auto t0 = std::chrono::steady_clock::now();
  auto masker = std::make_shared<const TokenMasker>(tok, n_vocab);
  const double build_ms = SecondsSince(t0) * 1e3;
  t0 = std::chrono::steady_clock::now();
  auto c = server::BuildOutputConstraint(req, masker);
  const double compile_ms = SecondsSince(t0) * 1e3;
  if (!c.ok() || *c == nullptr) return {{"error", c.ok() ? "no constraint" : c.status().message()}};
  const std::vector<TokenId> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/true);
  std::vector<float> logits(static_cast<size_t>(n_vocab), 0.0f);
  std::vector<uint8_t> scratch;
  // The first call walks the vocabulary at every state (cold); the masker keeps each state's
  // mask, so the same call again (an agent calling the same tool) is measured apart (repeat).
  std::vector<double> us, repeat_us;
  int64_t constrained = 0;
  TokenConstraint& tc = **c;
  for (int rep = 0; rep < 3; ++rep) {
    TokenConstraint run = tc;
    for (TokenId t : ids) {
      if (run.active()) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto s0 = std::chrono::steady_clock::now();
        run.Apply(logits.data(), &scratch);
        (rep == 0 ? us : repeat_us).push_back(SecondsSince(s0) * 1e6);
        if (rep == 0) constrained += 1;
        if (std::isinf(logits[t])) return {{"error", "the text's own token was masked"}};
      }
      run.Accept(t);
    }
  }
  auto mean_of = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / static_cast<double>(v.size());
  };
  std::sort(us.begin(), us.end());
  const double mean = mean_of(us), repeat = mean_of(repeat_us);
  const double step_us = decode_tok_s > 0 ? 1e6 / decode_tok_s : 0;
  return {{"masker_build_ms", build_ms},
          {"grammar_compile_ms", compile_ms},
          {"call_tokens", ids.size()},
          {"constrained_steps", constrained},
          {"mask_us_mean", mean},
          {"mask_us_p50", us.empty() ? 0 : us[us.size() / 2]},
          {"mask_us_max", us.empty() ? 0 : us.back()},
          {"mask_us_mean_repeat", repeat},
          {"decode_step_us", step_us},
          {"mask_over_decode_step", step_us > 0 ? mean / step_us : 0}};
}

Result<json> BenchModel(const std::string& name, const std::string& path, const Options& o, const json& machine) {
  json jm;
  jm["name"] = name;
  jm["path"] = path;
  MR_ASSIGN_OR_RETURN(std::string sha, ModelFileSha256(path));
  jm["sha256"] = sha;
  std::error_code ec;
  jm["file_bytes"] = fs::file_size(path, ec);

  std::map<int, std::unique_ptr<Model>> models;
  for (int t : o.threads) {
    LoadOptions lo;
    lo.n_threads = t;
    const auto t0 = std::chrono::steady_clock::now();
    MR_ASSIGN_OR_RETURN(models[t], Model::Load(path, lo));
    std::fprintf(stderr, "[bench] %s: loaded for %d thread(s) in %.1f s\n", name.c_str(), t, SecondsSince(t0));
  }
  Model& m0 = *models.begin()->second;
  jm["arch"] = m0.config().arch_name;
  jm["weight_bytes"] = m0.weight_bytes();
  jm["cpu_variant"] = CpuVariantName(m0.cpu_variant());
  jm["acts"] = FineActsName(m0.fine_acts());

  // Prompt ids: the model's tokenizer over repeated prose, BOS as the model asks for it.
  std::string text;
  std::vector<TokenId> prompt;
  while (static_cast<int>(prompt.size()) < o.prompt_tokens) {
    text += kPromptText;
    prompt = m0.tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
  }
  prompt.resize(static_cast<size_t>(o.prompt_tokens));
  jm["prompt_tokens"] = o.prompt_tokens;
  jm["decode_tokens"] = o.decode_tokens;
  jm["verify_context"] = o.prompt_tokens + o.decode_tokens;

  // llama.cpp inputs: the same ids in a file, and the Q8_0 rewrite.
  std::string tokens_file, q8_path;
  json llama = json::object();
  if (o.llamacpp) {
    tokens_file = (fs::temp_directory_path() / ("mererun-bench-" + std::to_string(getpid()) + ".json")).string();
    std::ofstream(tokens_file) << json(prompt).dump();
    auto q8 = Q8_0Path(path);
    if (q8.ok()) {
      q8_path = *q8;
    } else {
      llama["q8_0_error"] = q8.status().message();
      std::fprintf(stderr, "[bench] %s\n", q8.status().message().c_str());
    }
  }
  std::map<int, Samples> ours;
  std::map<std::string, std::map<int, Samples>> theirs;  // "gguf" / "q8_0" -> threads -> samples
  std::map<std::string, json> their_meta;
  std::string llama_error;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (int t : o.threads) {
      std::fprintf(stderr, "[bench] %s: mererun, %d thread(s), rep %d/%d\n", name.c_str(), t, rep + 1, o.reps);
      MR_RETURN_IF_ERROR(RunMererunRep(*models[t], prompt, o, &ours[t]));
    }
    if (!o.llamacpp || !llama_error.empty()) continue;
    for (const auto& [label, file] : {std::pair<std::string, std::string>{"gguf", path}, {"q8_0", q8_path}}) {
      if (file.empty()) continue;
      std::fprintf(stderr, "[bench] %s: llama.cpp (%s), rep %d/%d\n", name.c_str(), label.c_str(), rep + 1, o.reps);
      auto r = RunLlamaCpp(file, tokens_file, o);
      if (!r.ok()) {
        llama_error = r.status().message();
        std::fprintf(stderr, "%s\n", llama_error.c_str());
        break;
      }
      AddLlamaSamples(*r, &theirs[label]);
      their_meta[label] = (*r).value("meta", json::object());
    }
  }
  if (!tokens_file.empty()) fs::remove(tokens_file, ec);

  jm["mererun"] = json::array();
  for (int t : o.threads) {
    jm["mererun"].push_back(Summarize(ours[t], t, static_cast<double>(m0.weight_bytes()), BandwidthFor(machine, t)));
  }
  jm["constraint"] = MeasureConstraint(m0, jm["mererun"][0]["decode_tok_s"].get<double>());
  jm["constraint_gbnf"] = MeasureGbnf(m0, jm["mererun"][0]["decode_tok_s"].get<double>());
  if (o.llamacpp) {
    if (!llama_error.empty()) llama["error"] = llama_error;
    for (auto& [label, by_t] : theirs) {
      const std::string file = label == "gguf" ? path : q8_path;
      json side = {{"path", file}, {"file_bytes", fs::file_size(file, ec)}, {"meta", their_meta[label]}};
      if (label == "q8_0") {
        auto s = ModelFileSha256(file);
        side["sha256"] = s.ok() ? json(*s) : json(nullptr);
      }
      side["by_threads"] = json::array();
      for (int t : o.threads) {
        // Roofline from the file's size: llama.cpp reads (about) every tensor byte per token.
        side["by_threads"].push_back(
            Summarize(by_t[t], t, static_cast<double>(fs::file_size(file, ec)), BandwidthFor(machine, t)));
      }
      llama[label] = side;
    }
    // Ratios mererun / llama.cpp (> 1: mererun faster; verify ratios compared as they are).
    json ratios = json::array();
    for (size_t i = 0; i < o.threads.size(); ++i) {
      json r = {{"threads", o.threads[i]}};
      const json& a = jm["mererun"][i];
      for (const char* label : {"gguf", "q8_0"}) {
        if (!llama.contains(label)) continue;
        const json& b = llama[label]["by_threads"][i];
        const double bp = b["prefill_tok_s"].get<double>(), bd = b["decode_tok_s"].get<double>();
        r[std::string("prefill_vs_") + label] = bp > 0 ? a["prefill_tok_s"].get<double>() / bp : 0.0;
        r[std::string("decode_vs_") + label] = bd > 0 ? a["decode_tok_s"].get<double>() / bd : 0.0;
      }
      ratios.push_back(r);
    }
    llama["mererun_over_llamacpp"] = ratios;
    jm["llamacpp"] = llama;
  } else {
    jm["llamacpp"] = nullptr;
  }
  return jm;
}

// /proc/loadavg's 1-minute figure: other processes on the machine make every number noisier.
double LoadAverage() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

void PrintTable(const json& j) {
  std::printf("\nmererun bench  %s  commit %s%s\ncpu: %s\n\n", j["date"].get<std::string>().c_str(),
              j["git"]["commit"].is_string() ? j["git"]["commit"].get<std::string>().substr(0, 10).c_str() : "?",
              j["git"]["dirty"].get<bool>() ? " (dirty)" : "", j["cpu"]["model"].get<std::string>().c_str());
  const json& mach = j["machine"];
  for (const json& b : mach["mem_bandwidth"]) {
    std::printf("memory read bandwidth, %d thread(s): %6.1f GB/s (median), %6.1f max, %6.1f by thread CPU time\n",
                b["threads"].get<int>(), b["gbps_median"].get<double>(), b["gbps_max"].get<double>(),
                b["gbps_cpu_median"].get<double>());
  }
  std::printf(
      "\nmatmul kernels (%s, prefetch %lld bytes ahead), weight GB/s in each format's own bytes, wall/CPU-time "
      "(wall as %% of roofline bandwidth):\n",
      mach["matmul"]["cpu_variant"].get<std::string>().c_str(), mach["matmul"].value("prefetch_bytes", 0LL));
  std::printf("%-7s %-12s %7s %19s %19s %19s %19s %12s\n", "format", "shape", "threads", "1 row", "2 rows", "4 rows",
              "8 rows", "64 rows GOPS");
  // One line per (format, shape, threads): its points are consecutive, one per activation-row count.
  const json& pts = mach["matmul"]["points"];
  auto same = [&](size_t a, size_t b) {
    for (const char* key : {"format", "rows", "cols", "threads"}) {
      if (pts[a].value(key, json()) != pts[b].value(key, json())) return false;
    }
    return true;
  };
  for (size_t i = 0; i < pts.size();) {
    size_t end = i + 1;
    while (end < pts.size() && same(i, end)) ++end;
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%lld", pts[i]["rows"].get<long long>(), pts[i]["cols"].get<long long>());
    std::printf("%-7s %-12s %7d", pts[i].value("format", "q8/g64").c_str(), shape, pts[i]["threads"].get<int>());
    for (int want : {1, 2, 4, 8}) {
      const json* p = nullptr;
      for (size_t k = i; k < end; ++k) p = pts[k].value("act_rows", 0) == want ? &pts[k] : p;
      if (p == nullptr) {
        std::printf(" %19s", "-");
      } else {
        std::printf(" %5.1f/%5.1f (%3.0f%%)", (*p)["gbps"].get<double>(), (*p)["gbps_cpu"].get<double>(),
                    (*p)["pct_of_mem_bandwidth"].get<double>());
      }
    }
    const json* wide = nullptr;
    for (size_t k = i; k < end; ++k) wide = pts[k].value("act_rows", 0) == 64 ? &pts[k] : wide;
    if (wide != nullptr) {
      std::printf(" %12.0f", wide->value("gops", 0.0));
    } else {
      std::printf(" %12s", "-");
    }
    std::printf("\n");
    i = end;
  }
  if (!j["models"].empty()) {
    std::printf("\n%-28s %-16s %3s %9s %9s %8s %7s %7s %7s\n", "model", "engine", "thr", "prefill/s", "decode/s",
                "roofline", "v2/v1", "v4/v1", "v8/v1");
    auto row = [](const std::string& model, const std::string& engine, const json& r) {
      auto ratio = [&](const char* n) {
        return r["verify_ratio_vs_1"].contains(n) ? r["verify_ratio_vs_1"][n].get<double>() : 0.0;
      };
      std::printf("%-28s %-16s %3d %9.1f %9.2f %7.0f%% %7.2f %7.2f %7.2f\n", model.c_str(), engine.c_str(),
                  r["threads"].get<int>(), r["prefill_tok_s"].get<double>(), r["decode_tok_s"].get<double>(),
                  r.value("roofline_pct", 0.0), ratio("2"), ratio("4"), ratio("8"));
    };
    for (const json& m : j["models"]) {
      const std::string name = m["name"];
      for (const json& r : m["mererun"]) row(name, "mererun", r);
      if (m["llamacpp"].is_object()) {
        for (const char* label : {"gguf", "q8_0"}) {
          if (!m["llamacpp"].contains(label)) continue;
          for (const json& r : m["llamacpp"][label]["by_threads"]) row(name, std::string("llama.cpp ") + label, r);
        }
        for (const json& r : m["llamacpp"]["mererun_over_llamacpp"]) {
          std::printf("%-28s %-16s %3d", name.c_str(), "mererun/llama", r["threads"].get<int>());
          for (const char* k : {"prefill_vs_gguf", "decode_vs_gguf", "prefill_vs_q8_0", "decode_vs_q8_0"}) {
            if (r.contains(k)) std::printf("  %s %.2fx", k, r[k].get<double>());
          }
          std::printf("\n");
        }
        if (m["llamacpp"].contains("error"))
          std::printf("  llama.cpp: %s\n", m["llamacpp"]["error"].get<std::string>().c_str());
      }
    }
    for (const auto& [key, what] : {std::pair{"constraint", "a tool call (lazy, from the open tag on)"},
                                    std::pair{"constraint_gbnf", "a JSON answer under a GBNF grammar"}}) {
      std::printf("\nconstrained decoding: token mask per step along %s\n", what);
      for (const json& m : j["models"]) {
        if (!m.contains(key)) continue;
        const json& c = m[key];
        if (c.contains("error")) {
          std::printf("%-28s error: %s\n", m["name"].get<std::string>().c_str(), c["error"].get<std::string>().c_str());
          continue;
        }
        std::printf(
            "%-28s mask %6.0f us mean, %6.0f p50, %6.0f max over %lld steps = %.1f%% of a %.0f us decode step "
            "(%d threads); the same text again %.0f us mean; masks built in %.0f ms, grammar in %.1f ms\n",
            m["name"].get<std::string>().c_str(), c["mask_us_mean"].get<double>(), c["mask_us_p50"].get<double>(),
            c["mask_us_max"].get<double>(), c["constrained_steps"].get<long long>(),
            100.0 * c["mask_over_decode_step"].get<double>(), c["decode_step_us"].get<double>(),
            m["mererun"][0]["threads"].get<int>(), c["mask_us_mean_repeat"].get<double>(),
            c["masker_build_ms"].get<double>(), c["grammar_compile_ms"].get<double>());
      }
    }
  }
  std::printf("\nload average (1 min) %.1f at start, %.1f at end on %d logical CPUs\n",
              j["load_average_start"].get<double>(), j["load_average_end"].get<double>(),
              j["cpu"]["logical_cpus"].get<int>());
  std::printf(
      "roofline: decode tok/s as %% of (roofline bandwidth at that thread count / weight bytes per token)\n"
      "roofline bandwidth: the better of the best wall-clock repetition and the median by thread CPU time\n"
      "vN/v1: time of an N-row verify step (all logits) over a 1-row step at the context reached after decode\n");
}

}  // namespace

int CmdBench(const Args& args) {
  Cli cli(kCmd,
          "Speed against the memory-bandwidth roofline and llama.cpp: prefill and decode tok/s, verify-step "
          "cost, machine bandwidth and matmul figures. Default models: every cached catalog model.");
  CLI::App& app = cli.app();
  Options o;
  std::vector<std::string> models_list;
  bool no_llamacpp = false, machine_only = false;
  app.add_option("-m,--model", o.models, "model to measure (repeatable)")->type_name("MODEL");
  app.add_option("--models", models_list, "models to measure, comma list")->delimiter(',');
  app.add_option("-t,--threads", o.threads, "thread counts, comma list")->delimiter(',')->check(InRange(1, 256));
  CLI::Option* reps_opt = app.add_option("--reps", o.reps, "repetitions (--quick: 1)")->check(InRange(1, 1000));
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  CLI::Option* prompt_opt =
      app.add_option("--prompt-tokens", o.prompt_tokens,
                     "prompt length of the prefill measurement (and the context of the decode and verify steps)")
          ->check(InRange(64, 131072));
  app.add_flag("--quick", o.quick, "small sizes and one repetition (a smoke test, not a measurement)");
  app.add_flag("--no-llamacpp", no_llamacpp, "skip the llama.cpp comparison");
  app.add_flag("--machine-only", machine_only, "bandwidth and matmul figures only, no model");
  if (auto rc = cli.Parse(args)) return *rc;
  for (const std::string& m : NonEmpty(std::move(models_list))) o.models.push_back(m);
  o.llamacpp = !no_llamacpp;
  if (o.quick) {
    if (reps_opt->count() == 0) o.reps = 1;
    if (prompt_opt->count() == 0) o.prompt_tokens = 64;
    o.decode_tokens = 16;
    o.verify_iters = 2;
    o.membw_bytes = 64ll << 20;
    o.matmul_rotate_bytes = 32ll << 20;
    o.matmul_iters = 5;
  }
  // Default model set: every catalog model that is cached.
  std::vector<std::pair<std::string, std::string>> models;  // name, path
  if (machine_only) {
    // bandwidth and matmul figures only
  } else if (o.models.empty()) {
    auto cat = model::LoadDefaultCatalog();
    if (!cat.ok()) {
      std::fprintf(stderr, "mererun bench: %s\n", cat.status().message().c_str());
      return 1;
    }
    for (const model::CatalogEntry& e : cat->models) {
      if (model::IsCachedBySize(e)) models.emplace_back(e.name, model::CachedModelPath(e));
    }
    if (models.empty()) std::fprintf(stderr, "mererun bench: no catalog model is cached; machine figures only\n");
  } else {
    for (const std::string& m : o.models) {
      std::string err;
      const std::string path = ResolveModelPath(m, &err);
      if (path.empty()) {
        std::fprintf(stderr, "mererun bench: %s\n", err.c_str());
        return 1;
      }
      models.emplace_back(m, path);
    }
  }

  json j;
  j["schema"] = "mererun-bench/1";
  j["date"] = UtcNow();
  j["git"] = GitInfo();
  j["cpu"] = CpuInfo();
  j["environment"] = ControlEnvironment();
  j["options"] = {{"threads", o.threads},
                  {"reps", o.reps},
                  {"quick", o.quick},
                  {"llamacpp", o.llamacpp},
                  {"prompt_tokens", o.prompt_tokens},
                  {"decode_tokens", o.decode_tokens},
                  {"verify_rows", o.verify_rows},
                  {"verify_iters", o.verify_iters},
                  {"membw_buffer_bytes", o.membw_bytes},
                  {"matmul_rotate_bytes", o.matmul_rotate_bytes},
                  {"matmul_iters", o.matmul_iters}};
  j["load_average_start"] = LoadAverage();
  j["machine"] = MeasureMachine(o);
  j["models"] = json::array();
  for (const auto& [name, path] : models) {
    auto r = BenchModel(name, path, o, j["machine"]);
    if (!r.ok()) {
      std::fprintf(stderr, "mererun bench: %s: %s\n", name.c_str(), r.status().message().c_str());
      return 1;
    }
    j["models"].push_back(*r);
  }
  j["load_average_end"] = LoadAverage();
  PrintTable(j);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "mererun bench: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
    std::fprintf(stderr, "[bench] wrote %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace mr::app
