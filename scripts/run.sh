#!/usr/bin/env bash
# Set up, fetch the smallest model and run one prompt through it. Extra arguments go to
# `mererun run` (e.g. -n 64).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
build/bin/mererun pull smollm2-135m-instruct
exec build/bin/mererun run -m smollm2-135m-instruct -p "What is the capital of France?" "$@"
