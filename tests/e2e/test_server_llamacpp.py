"""llama.cpp's own endpoints end to end (/completion, /infill, /tokenize, /detokenize, /props):
plain HTTP, as llama.vscode and llama.vim send it, against `mererun serve` on
qwen2.5-coder-0.5b-instruct (fill-in-the-middle and repository-level markers).

The expected values come from outside the endpoint under test: token ids from `mererun tokenize`,
greedy texts from /v1/completions (the same prompt through another endpoint), the repository-level
prompt written out here from llama.cpp's documented layout, and the cuts (n_indent, stop words)
recomputed from the uncut text."""
import json

import pytest
import requests

PROMPT = "class Point:\n    def __init__(self, x, y):\n"


@pytest.fixture(scope="module")
def server(coder_server):
    return coder_server


def post(server, path, body, status=200):
    r = requests.post(server.base_url + path, json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def stream(server, path, body):
    r = requests.post(server.base_url + path, json={**body, "stream": True}, stream=True, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]



def test_tokenize_and_detokenize_agree_with_the_cli(server, cli_tokenize):
    text = "def f(x):\n    return x  # ünïcode <|im_start|>"
    want = cli_tokenize(text)
    assert post(server, "/tokenize", {"content": text}) == {"tokens": want}
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == want
    # A piece is its text, or its bytes where it is not valid UTF-8 on its own.
    assert b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                    for p in pieces).decode() == text
    # A control token's text stays text unless the caller asks for special parsing.
    special = post(server, "/tokenize", {"content": "<|im_start|>", "parse_special": True})["tokens"]
    assert special == cli_tokenize("<|im_start|>", "--parse-special") and len(special) == 1
    assert len(post(server, "/tokenize", {"content": "<|im_start|>"})["tokens"]) > 1
    assert post(server, "/detokenize", {"tokens": want})["content"] == text
    err = post(server, "/detokenize", {"tokens": [want[0], 10**9]}, status=400)
    assert "not a token id" in err["error"]["message"]
    post(server, "/tokenize", {"content": 5}, status=400)


def test_props_name_the_context_and_defaults(server):
    r = requests.get(server.base_url + "/props", timeout=30)
    assert r.status_code == 200
    p = r.json()
    assert p["default_generation_settings"]["n_ctx"] == 2048 and p["total_slots"] >= 1
    assert p["model_alias"] == "qwen2.5-coder-0.5b-instruct"


def test_completion_is_the_openai_endpoints_greedy_text(server, cli_tokenize):
    oai = post(server, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 20, "temperature": 0})
    want = oai["choices"][0]["text"]
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 20, "temperature": 0, "return_tokens": True})
    assert r["content"] == want and r["stop"] is True and r["stop_type"] == "limit"
    assert r["tokens_predicted"] == 20 and r["tokens_evaluated"] == len(cli_tokenize(PROMPT))
    assert r["prompt"] == PROMPT and r["generation_settings"]["n_predict"] == 20
    assert post(server, "/detokenize", {"tokens": r["tokens"]})["content"] == want
    t = r["timings"]
    assert t["predicted_n"] == 20 and t["predicted_ms"] > 0 and t["prompt_n"] + t["cache_n"] == r["tokens_evaluated"]
    # The same prompt as token ids, and as ids and text mixed (each part tokenized on its own).
    ids = cli_tokenize(PROMPT)
    assert post(server, "/completion", {"prompt": ids, "n_predict": 20, "temperature": 0})["content"] == want
    head, tail = "class Point:\n", "    def __init__(self, x, y):\n"
    mixed = cli_tokenize(head) + [tail]
    by_parts = cli_tokenize(head) + cli_tokenize(tail)
    assert (post(server, "/completion", {"prompt": mixed, "n_predict": 12, "temperature": 0})["content"] ==
            post(server, "/completion", {"prompt": by_parts, "n_predict": 12, "temperature": 0})["content"])
    # Streamed: the chunks' content and tokens make up the same text; the last chunk is the result.
    chunks = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 20, "temperature": 0})
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == want
    toks = [t for c in chunks[:-1] for t in c["tokens"]]
    assert post(server, "/detokenize", {"tokens": toks})["content"] == want
    assert chunks[-1]["tokens_predicted"] == 20 and chunks[-1]["stop_type"] == "limit"


def test_stop_words_probabilities_and_response_fields(server):
    free = post(server, "/completion", {"prompt": PROMPT, "n_predict": 30, "temperature": 0})["content"]
    assert "\n" in free
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 30, "temperature": 0, "stop": ["\n"],
                                     "n_probs": 3})
    assert r["content"] == free[:free.index("\n")]
    assert r["stop_type"] == "word" and r["stopping_word"] == "\n"
    probs = r["completion_probabilities"]
    assert len(probs) == r["tokens_predicted"]
    for p in probs:  # greedy: each chosen token is its row's best, the alternatives sorted
        tops = [t["logprob"] for t in p["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and p["logprob"] == pytest.approx(tops[0])
        assert p["top_logprobs"][0]["id"] == p["id"] and bytes(p["bytes"]).decode() == p["token"]
    assert "".join(p["token"] for p in probs).startswith(r["content"])
    chunks = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 30, "temperature": 0, "stop": ["\n"],
                                            "n_probs": 3})
    assert [p["id"] for c in chunks for p in c["completion_probabilities"]] == [p["id"] for p in probs]
    f = post(server, "/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0,
                                     "response_fields": ["content", "timings/predicted_n", "nope"]})
    assert set(f) == {"content", "predicted_n"} and f["predicted_n"] == 4


def test_n_indent_ends_the_completion_at_its_block(server):
    free = post(server, "/completion", {"prompt": PROMPT, "n_predict": 60, "temperature": 0})["content"]
    lines = free.split("\n")
    # The expected cut, from the uncut text: the first line after a newline whose indentation is
    # under 8 once it has a character other than a space or tab (a blank line's is its newline).
    cut = None
    for i, line in enumerate(lines[1:], start=1):
        checked = line.strip(" \t") != "" or i < len(lines) - 1
        if checked and len(line) - len(line.lstrip(" \t")) < 8:
            cut = i
            break
    if cut is None:
        pytest.skip("the greedy text never leaves the block")
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 60, "temperature": 0, "n_indent": 8})
    assert r["content"] == "\n".join(lines[:cut]) + "\n" and r["stop_type"] == "limit"


def test_t_max_predict_ms_stops_after_a_newline(server):
    free = post(server, "/completion", {"prompt": PROMPT, "n_predict": 40, "temperature": 0, "return_tokens": True})
    pieces = [post(server, "/detokenize", {"tokens": [t]})["content"] for t in free["tokens"]]
    first = next(i for i, p in enumerate(pieces) if "\n" in p)
    assert first > 0  # the clock starts at the first token: a later one runs past 1 ms
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 40, "temperature": 0, "t_max_predict_ms": 1})
    # Past 1 ms, the first token that brings a newline is the last.
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == first + 1
    assert r["content"] == "".join(pieces[:first + 1])


def test_infill_builds_the_repository_level_prompt(server, cli_tokenize):
    prefix, suffix = "def fib(n):\n    ", "\n\nprint(fib(10))\n"
    extra = [{"filename": "a.py", "text": "A = 1\n"}, {"filename": "b.py", "text": "B = 2\n", "time": 3}]
    r = post(server, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
                                 "prompt": "if", "n_predict": 16, "temperature": 0})
    want = ("<|repo_name|>myproject\n<|file_sep|>a.py\nA = 1\n<|file_sep|>b.py\nB = 2\n<|file_sep|>filename\n"
            "<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>if")
    assert r["prompt"] == want and r["truncated"] is False
    # Built from parts, so markers in the files' text stay text: the count is the parts' own.
    n = (1 + len(cli_tokenize("myproject\n")) + 3 + len(cli_tokenize("a.py\n")) +
         len(cli_tokenize("A = 1\n")) + len(cli_tokenize("b.py\n")) +
         len(cli_tokenize("B = 2\n")) + len(cli_tokenize("filename\n")) + 3 +
         len(cli_tokenize(prefix)) + len(cli_tokenize(suffix)) + len(cli_tokenize("if")))
    assert r["tokens_evaluated"] == n
    # Without other files it is /v1/completions' fill-in-the-middle prompt: the same greedy text.
    plain = post(server, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 16,
                                     "temperature": 0})
    oai = post(server, "/v1/completions", {"model": "m", "prompt": prefix, "suffix": suffix, "max_tokens": 16,
                                           "temperature": 0})
    assert plain["content"] == oai["choices"][0]["text"]
    # A marker typed in the code is text, never a control token.
    forged = post(server, "/infill", {"input_prefix": "x = '<|fim_middle|>'", "n_predict": 1, "temperature": 0})
    assert forged["tokens_evaluated"] == 3 + len(cli_tokenize("x = '<|fim_middle|>'"))


def test_infill_trims_to_the_context(server, cli_tokenize):
    # -c 2048 and n_predict 16: the prefix keeps its last 3/4 of the 2,031-token batch at most.
    lines = [f"value_{i} = compute({i}, {i * 7})\n" for i in range(400)]
    prefix = "".join(lines)
    assert len(cli_tokenize(prefix)) > 3000
    extra = [{"filename": f"f{i}.py", "text": f"# file {i}\n" + "x = 1\n" * 60} for i in range(12)]
    r = post(server, "/infill", {"input_prefix": prefix, "input_suffix": "", "input_extra": extra, "n_predict": 16,
                                 "temperature": 0})
    assert r["truncated"] is True and r["tokens_evaluated"] + 16 <= 2048
    p = r["prompt"]
    assert lines[-1] in p and lines[0] not in p  # the code next to the cursor is kept
    assert "<|file_sep|>f11.py" not in p or "<|file_sep|>f0.py" not in p  # the oldest files go first
    warm = post(server, "/infill", {"input_prefix": "", "input_suffix": "", "input_extra": extra[:2],
                                    "n_predict": 0, "samplers": [], "t_max_predict_ms": 1, "cache_prompt": True})
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    # An n_predict past the context is clamped (as on every endpoint), not refused.
    big = post(server, "/infill", {"input_prefix": "def f():\n    ", "n_predict": 10**6, "temperature": 0,
                                   "t_max_predict_ms": 1})
    assert big["generation_settings"]["n_predict"] <= 2048 - big["tokens_evaluated"]


def test_llama_vscode_request_and_sampler_chain(server):
    """The body llama.vscode sends: top_k 40, top_p 0.99 and the infill sampler, no temperature."""
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "input_extra": [], "prompt": "",
            "n_predict": 32, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 2500, "n_indent": 4, "seed": 7}
    a, b = post(server, "/infill", body), post(server, "/infill", body)
    assert a["content"] == b["content"]  # seeded
    g = a["generation_settings"]
    assert g["temperature"] == 1.0 and g["top_k"] == 40 and g["top_p"] == 0.99 and g["samplers"][-1] == "infill"
    assert {"content", "timings", "tokens_cached", "truncated"} <= set(a)
    # The one-letter chain spells the same samplers.
    assert post(server, "/infill", {**body, "samplers": "kpi"})["content"] == a["content"]


@pytest.mark.parametrize("body,field", [
    ({"dry_multiplier": 0.5}, "dry_multiplier"),
    ({"mirostat": 2}, "mirostat"),
    ({"typical_p": 0.5}, "typical_p"),
    ({"grammar": "root ::= \"a"}, "grammar: line 1, column 10: unterminated string literal"),
    ({"grammar": "root ::= \"a\"", "grammar_lazy": True}, "grammar_lazy"),
    ({"grammar": "root ::= \"a\"", "json_schema": {}}, "one output format per request"),
    ({"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
    ({"samplers": ["top_k", "magic"]}, "samplers"),
    ({"n_probs": 99}, "n_probs"),
    ({"n_predict": -5}, "n_predict"),
    ({"logit_bias": [[1, 2, 3]]}, "logit_bias"),
    ({"input_extra": [{"filename": "x"}]}, "input_extra"),
])
def test_unsupported_or_malformed_options_are_named(server, body, field):
    err = post(server, "/infill", {"input_prefix": "x", **body}, status=400)
    assert field in err["error"]["message"]


def test_off_values_logit_bias_and_json_schema(server):
    # llama.vscode's chat-edit defaults: the unimplemented samplers at their off values pass.
    post(server, "/completion", {"prompt": "x", "n_predict": 1, "typical_p": 1, "xtc_probability": 0,
                                 "dry_multiplier": 0, "dynatemp_range": 0, "mirostat": 0})
    first = post(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "return_tokens": True})
    banned = first["tokens"][0]
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "return_tokens": True,
                                     "logit_bias": [[banned, False]]})
    assert r["tokens"][0] != banned
    text = post(server, "/detokenize", {"tokens": [banned]})["content"]
    r = post(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "return_tokens": True,
                                     "logit_bias": [[text, -100]]})
    assert r["tokens"][0] != banned
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    r = post(server, "/completion", {"prompt": "A point as JSON: ", "n_predict": 40, "temperature": 0,
                                     "json_schema": schema})
    assert isinstance(json.loads(r["content"])["x"], int)
