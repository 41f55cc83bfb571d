#!/usr/bin/env bash
# clang-format (Debian's clang-format-14, .clang-format at the root) over every tracked C++ file.
#   scripts/format.sh          rewrite the files in place
#   scripts/format.sh --check  change nothing; list the files that are not formatted, exit 1 if any
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fmt="$(command -v clang-format-14 || command -v clang-format || true)"
if [ -z "$fmt" ]; then
  echo "[format] clang-format-14 is missing (scripts/setup.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' | grep -v '^tools/' )
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf '[format] not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "[format] ${#files[@]} files formatted"
  exit 0
fi
"$fmt" -i "${files[@]}"
echo "[format] formatted ${#files[@]} files"
