#!/usr/bin/env bash
# The whole test suite: set-up (scripts/setup.sh), pull the catalog models the tests use, the
# unit tests (ctest) and the end-to-end tests (pytest against build/bin/mererun).
# QUICK=1: unit-labelled ctest tests and pytest -m "not slow" only. In CI (CI=true) or with
# MERERUN_ASAN=1 the unit tests also run under ASan+UBSan (preset asan, build-asan/).
# Exits non-zero if any step or test failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh || { echo "[test] set-up failed" >&2; exit 1; }

MODELS=(smollm2-135m-instruct gemma3-270m qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct)
echo "[test] pulling models: ${MODELS[*]}"
build/bin/mererun pull "${MODELS[@]}" || { echo "[test] model pull failed" >&2; exit 1; }
# Vocabulary-only GGUFs of the Llama 3 and Qwen3 tokenizers (npm packages, installed by setup.sh)
# for the tokenizer tests: about a second.
python3 scripts/hf_tokenizer_gguf.py --all || { echo "[test] tokenizer conversion failed" >&2; exit 1; }
# llama.cpp's own vocabulary-only GGUFs of the Phi-3 and Llama 2 SentencePiece tokenizers, from the
# llama-cpp-python sdist on PyPI (pinned, checked by SHA-256; 77 MB once, then nothing).
python3 scripts/llamacpp_vocab.py || { echo "[test] llama.cpp vocabulary download failed" >&2; exit 1; }

failed=()
jobs="${MERERUN_JOBS:-2}"
bash scripts/format.sh --check || failed+=("format")
if [ "${QUICK:-0}" = 1 ]; then
  ctest --preset release -L unit --parallel "$jobs" || failed+=("ctest")
  pytest_sel=(-m "not slow")
else
  ctest --preset release --parallel "$jobs" || failed+=("ctest")
  pytest_sel=()
fi

# ASan+UBSan build of the unit tests: in CI, or when MERERUN_ASAN=1 (about 10 minutes of build
# on 2 cores; the tests themselves take under a minute).
if [ "${CI:-}" = true ] || [ "${MERERUN_ASAN:-0}" = 1 ]; then
  echo "[test] building the asan preset (log: build-asan.log)"
  if { cmake --preset asan && cmake --build --preset asan -j"$jobs"; } >build-asan.log 2>&1; then
    ctest --preset asan -L unit --parallel "$jobs" || failed+=("ctest (asan+ubsan)")
  else
    tail -40 build-asan.log >&2
    failed+=("asan build")
  fi
fi

# libFuzzer targets on their committed seed corpora: in CI (or MERERUN_FUZZ=1), FUZZ_SECONDS
# each (default 45 here; scripts/fuzz.sh alone defaults to 60). About 10 minutes of build.
if [ "${CI:-}" = true ] || [ "${MERERUN_FUZZ:-0}" = 1 ]; then
  echo "[test] fuzzing (log: build-fuzz/fuzz-*.log)"
  FUZZ_SECONDS="${FUZZ_SECONDS:-45}" bash scripts/fuzz.sh || failed+=("fuzz")
fi

python3 -m pytest tests/e2e -q "${pytest_sel[@]}"
rc=$?

# The hostile-input end-to-end tests again against the ASan+UBSan binary (a sanitizer finding in
# a server log fails the test that started it; timing-bound tests are left to the release run).
# The other server tests would take too long under ASan for CI's budget on 2 cores.
if [ -x build-asan/bin/mererun ] && { [ "${CI:-}" = true ] || [ "${MERERUN_ASAN:-0}" = 1 ]; }; then
  echo "[test] end-to-end server tests under ASan+UBSan"
  MERERUN_BIN=build-asan/bin/mererun ASAN_OPTIONS=detect_leaks=0 python3 -m pytest -q \
      tests/e2e/test_server_hostile.py -k "not overload and not sigterm and not second_signal" || failed+=("pytest (asan)")
fi
# Exit 5 means no test was collected: a broken selection, so it counts as a failure too.
[ $rc -eq 0 ] || failed+=("pytest (exit $rc)")

if [ ${#failed[@]} -gt 0 ]; then
  echo "[test] FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "[test] all tests passed"
