#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang-14, ASan+UBSan) and runs each one on a copy
# of its committed seed corpus (tests/fuzz/corpus/TARGET), new inputs kept in build-fuzz/corpus.
#   FUZZ_SECONDS=N   time per target (default 60)
#   FUZZ_RUNS=N      executions per target instead (e.g. 1000000); with FUZZ_SECONDS also set,
#                    whichever comes first
#   FUZZ_TARGETS="gguf requests"  a subset
#   FUZZ_SUMMARY=PATH  where the JSON summary goes (default build-fuzz/fuzz-summary.json)
# Prints one line per target (executions, seconds, exec/s, findings, outcome) and the JSON
# summary (CPU, commit with -dirty when the tree had changes, per target: executions, seconds,
# exec/s, findings, rc); exits non-zero when a target found a crash (the reproducer is left in
# build-fuzz/ as crash-* / leak-* / timeout-* / oom-*).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

targets=(${FUZZ_TARGETS:-gguf requests tokenizer output template gbnf})
jobs="${MERERUN_JOBS:-2}"
if ! command -v clang++-14 >/dev/null 2>&1; then
  echo "[fuzz] clang++-14 is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
{ cmake --preset fuzz && cmake --build --preset fuzz -j"$jobs" --target "${targets[@]/#/fuzz_}"; } >build-fuzz.log 2>&1 || {
  tail -40 build-fuzz.log >&2
  echo "[fuzz] build failed (log: build-fuzz.log)" >&2
  exit 1
}
limit=(-max_total_time="${FUZZ_SECONDS:-60}")
if [ -n "${FUZZ_RUNS:-}" ]; then
  limit=(-runs="$FUZZ_RUNS")
  [ -n "${FUZZ_SECONDS:-}" ] && limit+=(-max_total_time="$FUZZ_SECONDS")
fi
failed=0
summary="["
out="${FUZZ_SUMMARY:-build-fuzz/fuzz-summary.json}"
commit=$(git describe --always --dirty --abbrev=7 2>/dev/null)
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  mkdir -p "$work"
  log="build-fuzz/fuzz-$t.log"
  marker="build-fuzz/.fuzz-start-$t"
  touch "$marker"
  start=$(date +%s)
  # -rss_limit_mb: a hostile input must not make the process balloon; -timeout: nor hang it.
  (cd build-fuzz && ASAN_OPTIONS=detect_leaks=1 "bin/fuzz_$t" "${limit[@]}" -rss_limit_mb=3072 -timeout=30 \
      -max_len=200000 -print_final_stats=1 "corpus/$t" "../tests/fuzz/corpus/$t") >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(( ${execs:-0} / (secs > 0 ? secs : 1) ))
  findings=$(find build-fuzz -maxdepth 1 -newer "$marker" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  rm -f "$marker"
  outcome=ok
  if [ $rc -ne 0 ]; then outcome="FAILED (rc $rc, see $log)"; failed=1; tail -30 "$log" >&2; fi
  printf '[fuzz] %-10s %10s executions in %5ss (%s/s), %s findings: %s\n' "$t" "${execs:-?}" "$secs" "$rate" "$findings" "$outcome"
  summary+="{\"target\":\"$t\",\"executions\":${execs:-0},\"seconds\":$secs,\"exec_per_s\":$rate,\"findings\":$findings,\"rc\":$rc},"
done
summary="${summary%,}]"
echo "{\"cpu\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')\",\"commit\":\"$commit\",\"targets\":$summary}" >"$out"
exit $failed
