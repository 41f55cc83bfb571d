#!/usr/bin/env bash
# Set up, fetch the smallest model, run one prompt through it, then serve it over HTTP in the
# foreground (Anthropic Messages + OpenAI chat completions on http://127.0.0.1:8080; Ctrl-C
# stops). Extra arguments go to `mererun run` (e.g. -n 64). SERVE=0: stop after the demo (the
# default when stdin is not a terminal, so scripted runs end); SERVE=1 forces serving; PORT=N.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
build/bin/mererun pull smollm2-135m-instruct
build/bin/mererun run -m smollm2-135m-instruct -p "What is the capital of France?" "$@"
serve_default=0
[ -t 0 ] && serve_default=1
if [ "${SERVE:-$serve_default}" = 1 ]; then
  echo "[run] serving smollm2-135m-instruct; try:"
  echo "  curl -s http://127.0.0.1:${PORT:-8080}/v1/messages -d '{\"model\":\"m\",\"max_tokens\":32,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'"
  exec build/bin/mererun serve -m smollm2-135m-instruct --port "${PORT:-8080}"
fi
