"""GBNF grammars (llama.cpp's `grammar`, vLLM's guided_* / structured_outputs; docs/api.md).

Oracles:
- llama.cpp's own grammar sampler (tools/llamacpp/build/grammar_ref, node-llama-cpp's libllama)
  walks each of llama.cpp's example grammars over a real vocabulary; `mererun grammar --masks`
  recomputes the token mask at every step of the same walks, and the two must agree token for
  token, except where llama.cpp matches ill-formed UTF-8 (bytes C0, C1, F5-FF, NUL: mererun never
  lets a token produce them) and on tokens that end inside a character, where llama.cpp's check of
  a partial character against a negated class refuses characters the class allows (mererun is
  exact there: tests in src/runtime/gbnf_test.cpp).
- sampled outputs of the real server at temperature 1 are checked with Python's `re`, `json` and
  set membership, never with mererun itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import openai
import pytest


REPO = Path(__file__).resolve().parents[2]
LLAMACPP = REPO / "tools" / "llamacpp"
GRAMMARS = LLAMACPP / "node_modules" / "node-llama-cpp" / "llama" / "grammars"
GRAMMAR_REF = LLAMACPP / "build" / "grammar_ref"


def _ids(ranges) -> set[int]:
    out: set[int] = set()
    for a, b in ranges:
        out.update(range(a, b + 1))
    return out


def _prereqs():
    if os.environ.get("MERERUN_SKIP_LLAMACPP") == "1":
        pytest.skip("MERERUN_SKIP_LLAMACPP=1")
    if not GRAMMAR_REF.exists() or not GRAMMARS.is_dir():
        pytest.fail(f"{GRAMMAR_REF} or {GRAMMARS} missing: run scripts/setup.sh (npm ci in tools/llamacpp, then "
                    "tools/llamacpp/build_logits_ref.sh), or set MERERUN_SKIP_LLAMACPP=1")


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_token_masks_match_llama_cpp(model, mererun_bin, model_path, tmp_path):
    _prereqs()
    gguf = model_path(model)
    grammars = sorted(GRAMMARS.glob("*.gbnf"))
    assert len(grammars) >= 6, grammars
    steps = excused_ill = excused_partial = 0
    for g in grammars:
        ref = subprocess.run([str(GRAMMAR_REF), str(gguf), str(g), "--walks", "6", "--steps", "24", "--seed", "7"],
                             capture_output=True, text=True, timeout=300)
        assert ref.returncode == 0, (g.name, ref.stderr)
        lines = [json.loads(x) for x in ref.stdout.splitlines()]
        special, eog = _ids(lines[0]["special"]), _ids(lines[0]["eog"])
        walks = lines[1:]
        walk_file = tmp_path / f"{g.stem}.jsonl"
        walk_file.write_text("".join(json.dumps({"tokens": w["tokens"]}) + "\n" for w in walks))
        ours = subprocess.run([str(mererun_bin), "grammar", str(g), "-m", str(gguf), "--masks", str(walk_file)],
                              capture_output=True, text=True, timeout=300)
        assert ours.returncode == 0, (g.name, ours.stderr)
        out = [json.loads(x) for x in ours.stdout.splitlines()]
        never, partial = _ids(out[0]["never_utf8"]), _ids(out[0]["partial_end"])
        assert len(out) - 1 == len(walks)
        for w, (r, o) in enumerate(zip(walks, out[1:])):
            assert len(r["allowed"]) == len(o["allowed"]) == len(r["tokens"]) + 1
            for i, (ra, oa) in enumerate(zip(r["allowed"], o["allowed"])):
                steps += 1
                theirs, mine = _ids(ra), _ids(oa)
                # End of generation: allowed exactly when the grammar is complete, on both sides.
                assert bool(theirs & eog) == o["accepting"][i], (g.name, w, i)
                only_theirs = (theirs - mine) - special
                only_mine = (mine - theirs) - special
                excused_ill += len(only_theirs & never)
                excused_partial += len(only_mine & partial)
                assert not (only_theirs - never), (g.name, w, i, r["tokens"][:i], sorted(only_theirs - never)[:20])
                assert not (only_mine - partial - never), (g.name, w, i, r["tokens"][:i], sorted(only_mine - partial)[:20])
    print(f"{model}: {steps} masks compared over {len(grammars)} grammars; excused tokens: "
          f"{excused_ill} ill-formed UTF-8 (llama.cpp only), {excused_partial} partial characters (mererun only)")
    assert steps >= 8 * len(grammars)


def test_grammar_command_reports_errors_with_positions(mererun_bin, tmp_path):
    g = tmp_path / "bad.gbnf"
    g.write_text('root ::= item+\nitem ::= "- " [a-z+ "\\n"\n')
    r = subprocess.run([str(mererun_bin), "grammar", str(g)], capture_output=True, text=True)
    assert r.returncode == 1 and "line 2, column 15: unterminated character class" in r.stderr, r.stderr
    g.write_text('root ::= ("- " [a-z]+ "\\n"){2}\n')
    assert subprocess.run([str(mererun_bin), "grammar", str(g), "--text", "- ab\n- c\n"]).returncode == 0
    r = subprocess.run([str(mererun_bin), "grammar", str(g), "--text", "- ab\n"], capture_output=True, text=True)
    assert r.returncode == 1 and "incomplete" in r.stdout


# ---- the server ----

LIST = 'root ::= ("- " [a-z ]{1,24} "\\n"){2,4}\n'
LIST_RE = re.compile(r"(- [a-z ]{1,24}\n){2,4}")


@pytest.fixture(scope="module")
def oai(smol_server):
    return openai.OpenAI(base_url=smol_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_llama_cpp_completion_follows_the_grammar_sampled(smol_server):
    done = 0
    for seed in range(8):
        r = httpx.post(smol_server.base_url + "/completion", timeout=120,
                       json={"prompt": "Things to pack for a trip:\n", "grammar": LIST, "n_predict": 160,
                             "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": seed})
        assert r.status_code == 200, r.text
        body = r.json()
        text = body["content"]
        if body["stop_type"] == "limit":  # cut short: what came is still a prefix of a sentence
            continue
        done += 1
        assert body["stop_type"] == "eos", body
        assert LIST_RE.fullmatch(text), repr(text)
    assert done >= 5


def test_chat_guided_grammar_json_streamed(oai):
    grammar = (GRAMMARS / "json.gbnf").read_text() if GRAMMARS.is_dir() else None
    if grammar is None:
        pytest.skip("llama.cpp's grammars are not installed (tools/llamacpp npm ci)")
    for seed in range(3):
        stream = oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Describe a cat as JSON."}], max_tokens=200, stream=True,
            temperature=1.0, seed=seed, extra_body={"guided_grammar": grammar})
        parts, finish = [], None
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        text = "".join(parts)
        if finish == "length":
            continue
        assert finish == "stop"
        assert isinstance(json.loads(text), dict), text


def test_choices_and_schemas_under_vllm_names(oai):
    options = ["red", "green", "blue \"ish\""]
    for seed in range(5):
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Pick a colour."}],
                                        max_tokens=10, temperature=1.0, seed=seed,
                                        extra_body={"guided_choice": options})
        assert r.choices[0].message.content in options, r
        r = oai.completions.create(model="m", prompt="My favourite colour is", max_tokens=10, temperature=1.0,
                                   seed=seed, extra_body={"structured_outputs": {"choice": options}})
        assert r.choices[0].text in options, r
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Give a number."}],
                                    max_tokens=30, temperature=1.0, seed=1, extra_body={"guided_json": schema})
    v = json.loads(r.choices[0].message.content)
    assert set(v) == {"n"} and isinstance(v["n"], int), v


def test_guided_regex_sampled(oai):
    pattern = r"(\d{3}-\d{4}|[A-Z][a-z]{2,8}), (yes|no)"
    for seed in range(6):
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "A phone number or a name?"}],
                                        max_tokens=30, temperature=1.0, seed=seed,
                                        extra_body={"guided_regex": pattern})
        assert r.choices[0].finish_reason == "stop", r
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
        r = oai.completions.create(model="m", prompt="Call me at", max_tokens=30, temperature=1.0, seed=seed,
                                   extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize("body, needle", [
    ({"grammar": 'root ::= "a" |\n  b'}, "grammar: line 2, column 3: undefined rule 'b'"),
    ({"grammar": "root ::= x\nx ::= x \"y\""}, "left-recursive"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "one output format per request"),
    ({"guided_regex": "(a)\\1"}, "regex: line 1, column 4: backreferences are not supported"),
    ({"structured_outputs": {"regex": "a(?=b)"}}, "lookaround"),
    ({"guided_choice": []}, "guided_choice: expected an array of 1 to"),
    ({"guided_json": "[" * 100000 + "]" * 100000}, "guided_json: nested deeper than 64 levels"),
    ({"grammar": 'root ::= "a"', "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "cannot be combined with tools"),
    ({"grammar": 'root ::= <think> "x"'}, "token matches"),
    ({"grammar": "root ::= " + "(" * 20000 + '"a"' + ")" * 20000}, "nested deeper than 128"),
    ({"grammar": "root ::=" + ' ("ab"{2000})' * 100}, "too large once its repetitions are unrolled"),
    ({"guided_grammar": "root ::= [\\u00e9-\\u00e0]"}, "the range's end comes before its start"),
])
def test_bad_grammars_are_400s_and_the_server_goes_on(oai, smol_server, body, needle):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                    extra_body=body)
    assert needle in str(e.value), str(e.value)
    r = httpx.post(smol_server.base_url + "/completion", json={"prompt": "x", "grammar_lazy": True, "grammar": LIST})
    assert r.status_code == 400 and "grammar_lazy" in r.text
    assert httpx.get(smol_server.base_url + "/health").status_code == 200
