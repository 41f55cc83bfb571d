#!/usr/bin/env python3
"""Reference outputs for mererun's Jinja engine (src/model/jinja.cpp), rendered by python3 jinja2.

Renders every tests/fixtures/jinja/templates/*.jinja with every context in
tests/fixtures/jinja/cases.json the way transformers' apply_chat_template configures jinja2, and writes
tests/fixtures/jinja/expected.json. Our engine plays no part, so the fixtures check it independently.

  scripts/jinja_fixtures.py            rewrite expected.json
  scripts/jinja_fixtures.py --check    exit 1 if expected.json is not what jinja2 renders now
  scripts/jinja_fixtures.py --extract-catalog [DIR]
                                       copy tokenizer.chat_template out of the GGUF files in DIR
                                       (default ~/.cache/mererun/models) into templates/catalog-*.jinja
"""
import argparse
import json
import os
import pathlib
import re
import struct
import sys
from datetime import datetime

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "jinja"
# strftime_now must not depend on the day the fixtures are made; the C++ test passes the same date.
FIXED_NOW = datetime(2026, 1, 15)


def make_env():
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all():
    env = make_env()
    cases = json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8"))
    out = {}
    for path in sorted((FIXTURES / "templates").glob("*.jinja")):
        template = env.from_string(path.read_text(encoding="utf-8"))
        results = {}
        for name, context in cases.items():
            try:
                results[name] = {"text": template.render(**context)}
            except Exception as e:  # the engine must fail on the same pairs
                results[name] = {"error": str(e)}
        out[path.name] = results
    return json.dumps(out, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def gguf_chat_template(path):
    """Returns tokenizer.chat_template from a GGUF file's metadata, or None."""
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # metadata sits at the front, before the tensors
    if data[:4] != b"GGUF":
        return None
    off = 8
    _, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16

    def read_str(off):
        (n,) = struct.unpack_from("<Q", data, off)
        return data[off + 8:off + 8 + n], off + 8 + n

    def skip(kind, off):
        if kind in fixed:
            return None, off + fixed[kind]
        if kind == 8:
            return read_str(off)
        if kind == 9:
            elem, n = struct.unpack_from("<IQ", data, off)
            off += 12
            for _ in range(n):
                _, off = skip(elem, off)
            return None, off
        raise ValueError(f"{path}: unknown GGUF value type {kind}")

    for _ in range(n_kv):
        key, off = read_str(off)
        (kind,) = struct.unpack_from("<I", data, off)
        value, off = skip(kind, off + 4)
        if key == b"tokenizer.chat_template":
            return value.decode("utf-8")
    return None


def extract_catalog(directory):
    for path in sorted(pathlib.Path(directory).glob("*.gguf")):
        template = gguf_chat_template(path)
        if template is None:
            print(f"{path.name}: no chat template")
            continue
        # "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" -> "catalog-qwen2.5-coder-0.5b-instruct.jinja"
        stem = re.sub(r"[.-](q\d\w*|f16|bf16|f32)$", "", path.stem, flags=re.I).lower()
        dest = FIXTURES / "templates" / f"catalog-{stem}.jinja"
        dest.write_text(template, encoding="utf-8")
        print(f"{path.name} -> {dest.name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if expected.json is out of date")
    parser.add_argument("--extract-catalog", nargs="?", const=os.path.expanduser("~/.cache/mererun/models"),
                        metavar="DIR", help="extract chat templates from the GGUF files in DIR")
    args = parser.parse_args()
    if args.extract_catalog:
        extract_catalog(args.extract_catalog)
        return 0
    rendered = render_all()
    expected_path = FIXTURES / "expected.json"
    if args.check:
        if not expected_path.exists() or expected_path.read_text(encoding="utf-8") != rendered:
            print(f"{expected_path} is out of date: run scripts/jinja_fixtures.py", file=sys.stderr)
            return 1
        print(f"{expected_path} matches jinja2")
        return 0
    expected_path.write_text(rendered, encoding="utf-8")
    print(f"wrote {expected_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
