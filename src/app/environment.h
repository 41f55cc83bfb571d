// The MERERUN_* environment variables: read once, here, at start-up, validated, and handed to
// the layers below as plain settings (nothing below app/ reads the environment).
//
//   MERERUN_LOG            error | warn | info | debug            log level (default warn)
//   MERERUN_THREADS        N >= 1                                  compute threads (default: physical cores)
//   MERERUN_CPU            scalar | avx2 | avx512 | avx512bf16 | amx   kernel variant (default: the best supported)
//   MERERUN_WEIGHTS        native | q8g64                          weight layout (default native)
//   MERERUN_ACTS           int8 | fine | ROLE+ROLE+...             matrices whose input is read as two int8
//                          (roles: qkv, o, glu, down, logits)      rows, ~15 bits (model.h ActRole; default down)
//   MERERUN_PATH           fast | ref                              forward path (default fast)
//   MERERUN_DRAFT          off | ngram | model | chain | model:NAME | ngram+model:NAME
//   MERERUN_DRAFT_TOKENS   auto | auto:KMAX | N                    (spec_config.h)
//   MERERUN_HOME           where models and the signing key live (default ~/.cache/mererun)
//   MERERUN_CATALOG        the model catalog file
//   MERERUN_API_KEY        serve --api-key
//   MERERUN_PYTHON         the Python used by `pull` and the Python-backed `qualify` commands
#pragma once

#include <map>
#include <string>

#include "base/status.h"

namespace mr::app {

// Reads and applies the variables above; an invalid value is an error naming the variable and
// its allowed values (never a silent default).
Status ApplyEnvironment();

// The numerics- and scheduling-affecting variables that are set, name -> value, for /health and
// the bench and qualify JSON.
std::map<std::string, std::string> ControlEnvironment();

// The Python interpreter for `pull` (pip) and the Python-backed `qualify` commands:
// MERERUN_PYTHON, else "python3".
std::string PythonExecutable();

}  // namespace mr::app
