#!/usr/bin/env bash
# The whole test suite: set-up (scripts/setup.sh), pull the catalog models the tests use, the
# unit tests (ctest) and the end-to-end tests (pytest against build/bin/mererun).
# QUICK=1: unit-labelled ctest tests and pytest -m "not slow" only.
# Exits non-zero if any step or test failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh || { echo "[test] set-up failed" >&2; exit 1; }

MODELS=(smollm2-135m-instruct gemma3-270m qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct)
echo "[test] pulling models: ${MODELS[*]}"
build/bin/mererun pull "${MODELS[@]}" || { echo "[test] model pull failed" >&2; exit 1; }

failed=()
jobs="${MERERUN_JOBS:-2}"
if [ "${QUICK:-0}" = 1 ]; then
  ctest --preset release -L unit --parallel "$jobs" || failed+=("ctest")
  pytest_sel=(-m "not slow")
else
  ctest --preset release --parallel "$jobs" || failed+=("ctest")
  pytest_sel=()
fi

python3 -m pytest tests/e2e -q "${pytest_sel[@]}"
rc=$?
# Exit 5 means no test was collected: a broken selection, so it counts as a failure too.
[ $rc -eq 0 ] || failed+=("pytest (exit $rc)")

if [ ${#failed[@]} -gt 0 ]; then
  echo "[test] FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "[test] all tests passed"
