// CLI subcommands. Each takes the arguments after the subcommand name and returns the process
// exit code; errors are printed to stderr as "mererun CMD: message".
#pragma once

#include <string>
#include <vector>

namespace mr::app {

using Args = std::vector<std::string>;

int CmdPull(const Args& args);          // cmd_pull.cpp
int CmdList(const Args& args);          // cmd_pull.cpp
int CmdRun(const Args& args);           // cmd_run.cpp
int CmdInfo(const Args& args);          // cmd_info.cpp
int CmdTokenize(const Args& args);      // cmd_tokenize.cpp
int CmdEmbed(const Args& args);         // cmd_embed.cpp: embeddings of texts (as /v1/embeddings)
int CmdGrammar(const Args& args);       // cmd_grammar.cpp: check a GBNF grammar, its token masks
int CmdLogits(const Args& args);        // cmd_logits.cpp: dump logits for parity checks
int CmdConvert(const Args& args);       // cmd_convert.cpp: rewrite a GGUF as f32/f16/q8_0
int CmdServe(const Args& args);         // cmd_serve.cpp: the HTTP server (Anthropic + OpenAI APIs)
int CmdBench(const Args& args);         // cmd_bench.cpp: speed vs memory bandwidth and llama.cpp
int CmdQualify(const Args& args);       // cmd_qualify.cpp: likelihood of two configurations
int CmdQualifySpeed(const Args& args);  // cmd_qualify_speed.cpp: `qualify speed` throughput probe

// Resolve "-m NAME|PATH": an existing file path, or a catalog name whose GGUF is cached.
// Returns the path or an error message (naming `mererun pull NAME` when not yet cached).
std::string ResolveModelPath(const std::string& name_or_path, std::string* error);

}  // namespace mr::app
