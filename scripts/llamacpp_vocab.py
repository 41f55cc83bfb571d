#!/usr/bin/env python3
"""Fetches llama.cpp's own vocabulary-only GGUFs of SentencePiece tokenizers that the npm tokenizer
packages cannot provide (they ship Hugging Face BPE files without SentencePiece's piece scores):

- tokenizer-phi3.gguf       llama.cpp's models/ggml-vocab-phi-3.gguf (Phi-3's 32,064-token SPM
                            vocabulary with its scores, token types and chat template);
- tokenizer-llama-spm.gguf  models/ggml-vocab-llama-spm.gguf (Llama 2's 32,000-token SPM vocabulary).

They come from the llama-cpp-python source distribution on PyPI (pinned below, checked by
SHA-256), which vendors llama.cpp with its tokenizer test files. Beside each GGUF the script
leaves llama.cpp's test vectors for it (`.inp`: strings separated by `__ggml_vocab_test__`
lines, `.out`: the reference ids per string, from the Hugging Face tokenizer), which
src/model/tokenizer_test.cpp checks as well as the node-llama-cpp fixtures.
Issue 15: the Phi-3 and Llama-2 tokenizers, proven against llama.cpp.

  python3 scripts/llamacpp_vocab.py [--out-dir DIR]   (default: the model cache's generated/)

Does nothing when the files are present with the pinned contents (no network then).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_tokenizer_gguf import model_cache  # noqa: E402

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# output name -> (file in the sdist's vendor/llama.cpp/models/, its SHA-256)
VOCABS = {
    "tokenizer-phi3.gguf": ("ggml-vocab-phi-3.gguf",
                            "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326"),
    "tokenizer-llama-spm.gguf": ("ggml-vocab-llama-spm.gguf",
                                 "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69"),
}


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def present(out_dir: Path) -> bool:
    for out, (_, digest) in VOCABS.items():
        p = out_dir / out
        if not p.is_file() or sha256(p) != digest:
            return False
        if not p.with_suffix(".gguf.inp").is_file() or not p.with_suffix(".gguf.out").is_file():
            return False
    return True


def fetch(out_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--disable-pip-version-check", "-d", tmp, f"{PACKAGE}=={VERSION}"],
                           capture_output=True, text=True)
        sdist = Path(tmp) / SDIST
        if r.returncode != 0 or not sdist.is_file():
            raise SystemExit(f"pip download {PACKAGE}=={VERSION} failed:\n{r.stdout}{r.stderr}")
        if sha256(sdist) != SDIST_SHA256:
            raise SystemExit(f"{SDIST}: SHA-256 {sha256(sdist)}, expected {SDIST_SHA256}")
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/"
        out_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist, "r:gz") as tf:
            for out, (name, digest) in VOCABS.items():
                for suffix in ("", ".inp", ".out"):
                    member = tf.extractfile(prefix + name + suffix)
                    if member is None:
                        raise SystemExit(f"{SDIST} has no {prefix + name + suffix}")
                    data = member.read()
                    if suffix == "" and hashlib.sha256(data).hexdigest() != digest:
                        raise SystemExit(f"{name}: SHA-256 {hashlib.sha256(data).hexdigest()}, expected {digest}")
                    dest = out_dir / (out + suffix)
                    tmp_dest = dest.with_name(dest.name + ".tmp")
                    tmp_dest.write_bytes(data)
                    tmp_dest.replace(dest)
                print(f"{out_dir / out}: llama.cpp's {name} (from {PACKAGE} {VERSION})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", help="default: MODEL_CACHE/generated")
    a = ap.parse_args()
    out_dir = Path(a.out_dir) if a.out_dir else model_cache() / "generated"
    if present(out_dir):
        return 0
    fetch(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
