#!/usr/bin/env bash
# Builds tools/llamacpp/build/logits_ref (logits_ref.cpp), build/grammar_ref (grammar_ref.cpp,
# llama.cpp's grammar masks) and build/embed_ref (embed_ref.cpp, its pooled embeddings) against node-llama-cpp's own prebuilt
# llama.cpp (its libllama / libggml for this platform, and the headers of the same release from
# the package's llama/gitRelease.bundle). scripts/setup.sh runs it after `npm ci`; it does nothing
# when the binary is newer than its inputs. Needs g++ and nlohmann-json (installed by setup.sh).
set -euo pipefail
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")"
nlc=node_modules/node-llama-cpp
bins=$(ls -d node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 2>/dev/null || true)
if [ ! -f "$nlc/package.json" ] || [ -z "$bins" ] || [ ! -f "$bins/libllama.v0.4.0.so" ]; then
  echo "[logits_ref] node-llama-cpp's linux-x64 binaries are not installed (npm ci in tools/llamacpp)" >&2
  exit 1
fi
fresh() { [ -x "build/$1" ] && [ "build/$1" -nt "$1.cpp" ] && [ "build/$1" -nt ref_common.h ] && [ "build/$1" -nt "$nlc/package.json" ] && [ "build/$1" -nt "$self" ]; }
if fresh logits_ref && fresh grammar_ref && fresh embed_ref; then
  exit 0
fi
mkdir -p build
src=build/llama.cpp-src
info=$nlc/llama/llama.cpp.info.json
release=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["tag"])' "$info")
repo=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["llamaCppGithubRepo"])' "$info")
version=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["version"])' "$nlc/package.json")
if [ ! -f "$src/.release" ] || [ "$(cat "$src/.release")" != "$version $release" ]; then
  rm -rf "$src"
  git -c advice.detachedHead=false clone --quiet "$nlc/llama/gitRelease.bundle" "$src"
  echo "$version $release" >"$src/.release"
fi
lib=$(cd "$bins" && pwd)
# The backends (libggml-cpu-*.so) are loaded at run time from bins/ beside the binary.
ln -sfn "$lib" build/bins
for tool in logits_ref grammar_ref embed_ref; do
  out=build/$tool
  g++ -std=c++17 -O2 -Wall -o "$out.tmp" "$tool.cpp" \
    -I"$src/include" -I"$src/ggml/include" \
    -DMR_NODE_LLAMA_CPP="\"$version\"" -DMR_LLAMA_CPP_REPO="\"$repo\"" -DMR_LLAMA_CPP_RELEASE="\"$release\"" \
    "$lib/libllama.v0.4.0.so" "$lib/libggml.v0.4.0.so" "$lib/libggml-base.so" -Wl,-rpath,"$lib"
  mv "$out.tmp" "$out"
  echo "[logits_ref] built $out (llama.cpp $release from node-llama-cpp $version)"
done
